"""The local model registry: atomic round trips, clear errors, no heavy imports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from nego.agents.model_registry import ModelEntry, RegistryError, list_models, lookup, register, registry_path


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("NEGO_HOME", str(tmp_path / "home"))


def test_register_lookup_and_replace():
    assert lookup("tiny") is None and list_models() == []
    e = ModelEntry("tiny", "/m/tiny", "", "compact", {"lr": 1e-4}, 10, {"utility": 0.5})
    register(e)
    assert lookup("tiny") == e
    register(ModelEntry("tiny-rl", "/m/rl", "tiny", "compact", steps=3))
    register(ModelEntry("tiny", "/m/tiny2", "", "compact"))
    assert [m.name for m in list_models()] == ["tiny", "tiny-rl"]
    assert lookup("tiny").path == "/m/tiny2"
    assert json.loads(registry_path().read_text())["schema_version"] == 1
    assert not [p for p in registry_path().parent.iterdir() if p.name.startswith(".models-")]


def test_bad_entries_and_files_fail_clearly():
    with pytest.raises(ValueError, match="format"):
        ModelEntry("x", "/p", "", "onnx")
    with pytest.raises(ValueError, match="whitespace"):
        ModelEntry("a b", "/p", "", "hf")
    registry_path().parent.mkdir(parents=True)
    registry_path().write_text("{not json")
    with pytest.raises(RegistryError, match="unreadable"):
        lookup("tiny")
    registry_path().write_text(json.dumps({"models": {"t": {"name": "t", "path": "/p"}}}))
    with pytest.raises(RegistryError, match="'t' is malformed"):
        lookup("t")


def test_registry_import_is_light():
    code = "import sys, nego.agents.model_registry; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_concurrent_registrations_all_survive(tmp_path):
    """Two trainings finishing at once in one NEGO_HOME (a sweep's arms, dev arms side by side) must not drop each
    other's entries: the read-modify-write of the registry is serialised across processes."""
    script = (
        "import sys\n"
        "from nego.agents.model_registry import ModelEntry, register\n"
        "w = sys.argv[1]\n"
        "for i in range(25):\n"
        "    register(ModelEntry(f'{w}-{i}', '/p', '', 'compact'))\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, w]) for w in ("a", "b", "c", "d")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    assert len(list_models()) == 100
