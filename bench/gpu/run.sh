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
#   bash bench/gpu/run.sh --smollm2     # instead: a real model's learning run, at most 9 minutes: SmolLM2-135M-Instruct
#                                       # warm-started and trained for 30 GRPO steps (vLLM when installed), then
#                                       # evaluated on eval-1152 beside the rule sellers (bench/smollm2_run.py);
#                                       # output to bench/results/gpu_smollm2.txt
#
# Exits 0 only when every part passed: the environment check, the training bench and the simulation. A part that
# fails is named on the last line (`FAILED: ...`), and the simulation is skipped when there is no trained model.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)   # the repository root is the package `nego` itself
smoke=0 smollm2=0
if [[ "${1:-}" == "--cpu-smoke" ]]; then smoke=1; elif [[ "${1:-}" == "--smollm2" ]]; then smollm2=1; elif [[ $# -gt 0 ]]; then
  echo "usage: bash bench/gpu/run.sh [--cpu-smoke | --smollm2]" >&2; exit 2
fi
py=${PYTHON:-python}
default_out=$here/bench/results/gpu_run.txt
[[ $smoke == 1 ]] && default_out=${TMPDIR:-/tmp}/nego-gpu-run-smoke.txt   # a CPU smoke never replaces GPU results
[[ $smollm2 == 1 ]] && default_out=$here/bench/results/gpu_smollm2.txt
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
  # a shipped scenario cut to 2 rounds: a random model never agrees, so each negotiation runs to the deadline
  sed 's/^max_rounds = .*/max_rounds = 2/' "$here/scenarios/data/used_bike.toml" > "$work/bike-2-rounds.toml"
  sim=(--negotiations 2 --max-tokens 8 --max-retries 0 --buyers tft --scenarios "$work/bike-2-rounds.toml")
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
from importlib.metadata import version  # the installed versions, without importing transformers and trl here
import torch
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
vllm = importlib.util.find_spec("vllm") is not None
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {version('transformers')}, "
      f"trl {version('trl')}, vllm {'installed' if vllm else 'absent'}; {gpu}")
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

# the SmolLM2 learning run: the shipped model's warm start, GRPO at a learning rate for a 135M model (1e-5, an arm
# of its own: the chat default 1e-6 is Gemma's), evaluation on the full suite with many negotiations in flight
smollm2_parts() {
  echo "# bench/gpu/run.sh --smollm2: $(date -u +%Y-%m-%dT%H:%MZ), $(uname -m)"
  part "environment check" 300 "$py" -c "$check"
  local vllm="" args
  "$py" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)" && vllm="--use-vllm"
  args="--steps 30 --group-size 8 --scenarios-per-step 8 --dev-scenarios 16 --lr 1e-5 --threads 8 $vllm"
  echo
  if [[ ${#failed[@]} == 0 ]]; then
    part "smollm2 learning run" 540 "$py" "$here/bench/smollm2_run.py" --train-args "$args" --suite eval-1152 \
      --eval-args "--concurrency 512" --work "$work/smollm2" --out "$work/smollm2.txt"
  else
    echo "smollm2 learning run: skipped"
  fi
  echo
  if [[ ${#failed[@]} == 0 ]]; then echo "all parts passed"; else echo "FAILED: ${failed[*]}"; fi
  return "${#failed[@]}"
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
parts=all_parts
[[ $smollm2 == 1 ]] && parts=smollm2_parts
$parts 2>&1 | grep --line-buffered -v -e "FutureWarning" -e "warnings.warn(" -e "it/s\]" -e "s/it\]" | tee "$out"
status=("${PIPESTATUS[@]}")
set -e -o pipefail
if [[ ${status[2]} != 0 ]]; then
  echo "bench/gpu/run.sh: could not write $out" >&2
  exit 1
fi
exit "$(( status[0] == 0 ? 0 : 1 ))"
