#!/usr/bin/env bash
# One GPU check, at most 8 minutes on one H200: a randomly initialised Gemma 4 E4B-shaped seller (the published
# config, no download) trained for 3 GRPO steps with LoRA through `nego train`'s code path (vLLM colocated when an
# installed vLLM knows the architecture, else transformers), registered, then 16 negotiations of
# `nego simulate --sellers NAME-rl`. Prints the preflight plan, step time, generated tokens/s and peak GPU memory;
# the whole output goes to bench/results/gpu_run.txt (or $NEGO_GPU_RUN_OUT).
#
#   bash bench/gpu/run.sh               # on the GPU machine, from the repository root or anywhere
#   bash bench/gpu/run.sh --cpu-smoke   # on a CPU: the same steps on a 1.7M-parameter Gemma 4, to check the script
#                                       # (shorter replies and fewer retries; output to a temporary file by default)
#
# Exits 0 only when every part passed: the environment check, the training bench and the simulation. A part that
# fails is named on the last line (`FAILED: ...`), and the simulation is skipped when there is no trained model.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)   # the repository root is the package `nego` itself
smoke=0
if [[ "${1:-}" == "--cpu-smoke" ]]; then smoke=1; elif [[ $# -gt 0 ]]; then
  echo "usage: bash bench/gpu/run.sh [--cpu-smoke]" >&2; exit 2
fi
py=${PYTHON:-python}
default_out=$here/bench/results/gpu_run.txt
[[ $smoke == 1 ]] && default_out=${TMPDIR:-/tmp}/nego-gpu-run-smoke.txt   # a CPU smoke never replaces GPU results
out=${NEGO_GPU_RUN_OUT:-$default_out}
work=$(mktemp -d /tmp/nego-gpu-run.XXXXXX)
trap 'rm -rf "$work"' EXIT
name=gpu-e4b
mkdir -p "$work/home" "$work/path" "$(dirname "$out")"
# `import nego` must find this checkout whatever the folder is called: put it on the path under its own name
ln -s "$here" "$work/path/nego"
export PYTHONPATH="$work/path${PYTHONPATH:+:$PYTHONPATH}" NEGO_HOME="$work/home" COLUMNS=160
export TRL_EXPERIMENTAL_SILENCE=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1

if [[ $smoke == 1 ]]; then
  name=gpu-smoke
  train=(--cpu-smoke --steps 1 --max-rounds 1 --group-size 2 --scenarios-per-step 2 --dev-scenarios 1
    --turn-tokens 16 --train-scenarios 2 --episodes 16)
  sim=(--negotiations 2 --max-tokens 8 --max-retries 0 --buyers tft)
  limit_train=1500 limit_sim=600
else
  train=(--size 4.5b --steps 3 --finetune lora --max-rounds 2 --group-size 4 --scenarios-per-step 2 --dev-scenarios 2)
  sim=(--negotiations 16 --max-tokens 32 --buyers tft,boulware)
  limit_train=330 limit_sim=110
fi

# the environment check: the training extra is installed; versions and the GPU
read -r -d '' check <<'PY' || true
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

failed=()

# part NAME LIMIT COMMAND...: run one part under a time limit, print its wall time, and remember it if it failed
part() {
  local label=$1 limit=$2 t0=$SECONDS rc=0
  shift 2
  timeout "$limit" "$@" || rc=$?
  if [[ $rc == 0 ]]; then
    echo "$label: $((SECONDS - t0)) s"
  else
    echo "$label: failed with exit status $rc$([[ $rc == 124 ]] && echo " (past its $limit s limit)") after $((SECONDS - t0)) s"
    failed+=("$label")
  fi
}

# every part in order, each only when the ones before it passed; the exit status is the number of failed parts
all_parts() {
  echo "# bench/gpu/run.sh$([[ $smoke == 1 ]] && echo ' --cpu-smoke'): $(date -u +%Y-%m-%dT%H:%MZ), $(uname -m)"
  part "environment check" 300 "$py" -c "$check"
  echo
  echo "## training: python bench/gpu_train.py ${train[*]} --name $name"
  if [[ ${#failed[@]} == 0 ]]; then
    part "training bench" "$limit_train" "$py" "$here/bench/gpu_train.py" "${train[@]}" --name "$name" --work "$work/train"
  else
    echo "training bench: skipped"
  fi
  echo
  echo "## nego simulate --sellers $name-rl --days 1 ${sim[*]}"
  if [[ ${#failed[@]} == 0 ]]; then
    part "simulate" "$limit_sim" "$py" -m nego.cli.app simulate --sellers "$name-rl" --days 1 "${sim[@]}" \
      --seed 0 --no-live --out "$work/simulate"
  else
    echo "simulate: skipped (no trained model to play)"
  fi
  echo
  if [[ ${#failed[@]} == 0 ]]; then
    echo "all parts passed"
  else
    local names
    names=$(printf ', %s' "${failed[@]}")
    echo "FAILED: ${names:2}"
  fi
  return "${#failed[@]}"
}

set +e +o pipefail   # the status that counts is all_parts', not the filter's (grep exits 1 when it drops every line)
all_parts 2>&1 | grep --line-buffered -v -e "FutureWarning" -e "warnings.warn(" -e "it/s\]" -e "s/it\]" | tee "$out"
status=("${PIPESTATUS[@]}")
set -e -o pipefail
if [[ ${status[2]} != 0 ]]; then
  echo "bench/gpu/run.sh: could not write $out" >&2
  exit 1
fi
exit "$(( status[0] == 0 ? 0 : 1 ))"
