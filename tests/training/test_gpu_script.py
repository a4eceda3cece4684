"""bench/gpu/run.sh, the prepared GPU check: its CPU smoke passes end to end, and a part that fails fails the script
and is named."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "run.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash")


def run_script(tmp_path: Path, python: str, *args: str, limit: float = 600) -> tuple[int, str]:
    out = tmp_path / "gpu_run.txt"
    env = {**os.environ, "PYTHON": python, "NEGO_GPU_RUN_OUT": str(out), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=limit, check=False
    )
    assert out.read_text() == done.stdout  # everything shown is what the results file keeps
    return done.returncode, done.stdout


def stand_in_python(tmp_path: Path, train_status: int) -> str:
    """This interpreter, except that bench/gpu_train.py only exits with ``train_status``."""
    path = tmp_path / "python"
    path.write_text(
        "#!/usr/bin/env bash\n"
        f'case "${{1:-}}" in */bench/gpu_train.py) echo "training stand-in"; exit {train_status};; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    path.chmod(0o755)
    return str(path)


@pytest.mark.slow
def test_the_cpu_smoke_trains_registers_and_simulates(tmp_path):
    status, output = run_script(tmp_path, sys.executable, "--cpu-smoke")
    assert status == 0, output[-4000:]
    assert "Traceback" not in output and "FAILED" not in output
    for line in ("## training:", "registered gpu-smoke-rl after 1 GRPO steps", "training bench: ", "## nego simulate"):
        assert line in output
    assert "Summary per seller" in output and "gpu-smoke-rl" in output.split("## nego simulate")[1]
    assert output.rstrip().endswith("all parts passed")


@pytest.mark.parametrize(
    ("train_status", "failed", "simulate"),
    [(3, "training bench", "simulate: skipped"), (0, "simulate", "simulate: failed with exit status")],
)
def test_a_failed_part_fails_the_script_and_is_named(tmp_path, train_status, failed, simulate):
    # a training bench that registers nothing leaves the simulation no model to play: it fails too
    status, output = run_script(tmp_path, stand_in_python(tmp_path, train_status), "--cpu-smoke")
    assert status != 0
    assert simulate in output
    assert output.rstrip().splitlines()[-1] == f"FAILED: {failed}"


def test_an_interpreter_without_the_training_extra_fails_the_environment_check(tmp_path):
    status, output = run_script(tmp_path, shutil.which("false") or "/bin/false", "--cpu-smoke")
    assert status != 0 and "training bench: skipped" in output
    assert output.rstrip().splitlines()[-1] == "FAILED: environment check"


@pytest.mark.parametrize("run_status", [0, 5])
def test_the_smollm2_learning_run_is_one_part_with_its_arguments(tmp_path, run_status):
    """``--smollm2``: the environment check, then bench/smollm2_run.py on eval-1152 with the run's options; the script
    fails, naming the part, when that run fails."""
    path = tmp_path / "python"
    path.write_text(
        "#!/usr/bin/env bash\n"
        f'case "${{1:-}}" in */bench/smollm2_run.py) shift; echo "smollm2 stand-in: $*"; exit {run_status};; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    path.chmod(0o755)
    status, output = run_script(tmp_path, str(path), "--smollm2")
    assert "smollm2 stand-in: --train-args --steps 30" in output and "--suite eval-1152" in output
    if run_status == 0:
        assert status == 0 and output.rstrip().endswith("all parts passed")
    else:
        assert status != 0 and output.rstrip().splitlines()[-1] == "FAILED: smollm2 learning run"
