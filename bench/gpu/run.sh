#!/usr/bin/env bash
# One GPU check, at most 8 minutes on one H200: a randomly initialised Gemma 4 E4B-shaped seller (the published
# config, no download) trained for 3 GRPO steps with LoRA through `nego train`'s code path (vLLM colocated when an
# installed vLLM knows the architecture, else transformers), registered, then 16 negotiations of
# `nego simulate --sellers NAME-rl`. Prints the preflight plan, step time, generated tokens/s and peak GPU memory;
# the whole output goes to bench/results/gpu_run.txt (or $NEGO_GPU_RUN_OUT).
#
#   bash bench/gpu/run.sh               # on the GPU machine, from the repository root or anywhere
#   bash bench/gpu/run.sh --cpu-smoke   # on a CPU: the same steps on a 1.3M-parameter Gemma 4, to check the script
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)   # the repository root is the package `nego` itself
smoke=0
if [[ "${1:-}" == "--cpu-smoke" ]]; then smoke=1; elif [[ $# -gt 0 ]]; then
  echo "usage: bash bench/gpu/run.sh [--cpu-smoke]" >&2; exit 2
fi
py=${PYTHON:-python}
out=${NEGO_GPU_RUN_OUT:-$here/bench/results/gpu_run.txt}
work=$(mktemp -d /tmp/nego-gpu-run.XXXXXX)
name=gpu-e4b
mkdir -p "$work/home" "$work/path" "$(dirname "$out")"
# `import nego` must find this checkout whatever the folder is called: put it on the path under its own name
ln -s "$here" "$work/path/nego"
export PYTHONPATH="$work/path${PYTHONPATH:+:$PYTHONPATH}" NEGO_HOME="$work/home" COLUMNS=160
export TRL_EXPERIMENTAL_SILENCE=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1

if [[ $smoke == 1 ]]; then
  name=gpu-smoke
  train=(--cpu-smoke --steps 1 --max-rounds 1 --group-size 2 --scenarios-per-step 2 --dev-scenarios 1)
  sim=(--negotiations 2 --max-tokens 8 --buyers tft)
  limit_train=1500 limit_sim=600
else
  train=(--size 4.5b --steps 3 --finetune lora --max-rounds 2 --group-size 4 --scenarios-per-step 2 --dev-scenarios 2)
  sim=(--negotiations 16 --max-tokens 32 --buyers tft,boulware)
  limit_train=330 limit_sim=110
fi

{
  echo "# bench/gpu/run.sh$([[ $smoke == 1 ]] && echo ' --cpu-smoke'): $(date -u +%Y-%m-%dT%H:%MZ), $(uname -m)"
  "$py" - <<'PY'
import importlib, sys
missing = [m for m in ("torch", "transformers", "trl", "peft", "datasets", "polars") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"error: missing {', '.join(missing)}: install nego's training extra (pip install -e '.[train]')")
import torch, transformers, trl
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
vllm = importlib.util.find_spec("vllm") is not None
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, "
      f"trl {trl.__version__}, vllm {'installed' if vllm else 'absent'}; {gpu}")
PY
  echo
  echo "## training: python bench/gpu_train.py ${train[*]} --name $name"
  t0=$SECONDS
  timeout "$limit_train" "$py" "$here/bench/gpu_train.py" "${train[@]}" --name "$name" --work "$work/train"
  echo "training bench: $((SECONDS - t0)) s"
  echo
  echo "## nego simulate --sellers $name-rl --days 1 ${sim[*]}"
  t0=$SECONDS
  timeout "$limit_sim" "$py" -m nego.cli.app simulate --sellers "$name-rl" --days 1 "${sim[@]}" \
    --seed 0 --no-live --out "$work/simulate"
  echo "simulate: $((SECONDS - t0)) s"
} 2>&1 | grep --line-buffered -v -e "FutureWarning" -e "warnings.warn(" -e "it/s\]" -e "s/it\]" | tee "$out" || true
status=${PIPESTATUS[0]}
rm -rf "$work"
exit "$status"
