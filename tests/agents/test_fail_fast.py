"""Specs and training runs that need a GPU or a download fail at once, before any hub call, saying what to do."""

from __future__ import annotations

import huggingface_hub
import pytest
from nego.agents.llm.backends import hf_loading
from nego.agents.llm.backends.base import BackendError
from nego.agents.model_registry import ModelEntry, register
from nego.agents.model_specs import LLMSettings, ModelSpecError, resolve_model_spec
from nego.training.config import ConfigError, TrainConfig
from nego.training.hf_model import load_chat_model

HUB_CALLS = ("model_info", "try_to_load_from_cache", "hf_hub_download", "snapshot_download")


@pytest.fixture
def no_hub(monkeypatch):
    """Every hub function the loaders could reach raises, so a test fails if one is called."""
    for name in HUB_CALLS:

        def called(*a, _name=name, **k):
            raise AssertionError(f"huggingface_hub.{_name} was called")

        monkeypatch.setattr(huggingface_hub, name, called)
    monkeypatch.delenv("NEGO_VLLM_URL", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(hf_loading, "gpu_visible", lambda: False)


def test_a_size_alias_without_a_gpu_fails_before_the_hub_with_what_to_do(no_hub, no_gpu):
    with pytest.raises(ModelSpecError) as err:
        resolve_model_spec("4.5b", LLMSettings())
    msg = str(err.value)
    assert "needs a CUDA GPU" in msg and "vllm serve google/gemma-4-E4B-it" in msg
    assert all(hint in msg for hint in ("--base-url", "NEGO_VLLM_URL", "vllm:", "openai:", "hf:PATH"))


def test_a_trained_gemma_seller_without_a_gpu_points_at_its_vllm_line(no_hub, no_gpu, monkeypatch, tmp_path):
    monkeypatch.setenv("NEGO_HOME", str(tmp_path))
    register(ModelEntry("4.5b-rl", str(tmp_path / "final"), "4.5b", "hf", {"model": "4.5b"}))
    with pytest.raises(ModelSpecError, match=r"needs a CUDA GPU.*nego models --serve 4\.5b-rl"):
        resolve_model_spec("4.5b-rl", LLMSettings())


def test_training_a_gemma_size_without_a_gpu_says_hf_path_runs_on_cpu(no_hub, no_gpu):
    with pytest.raises(ConfigError, match=r"needs a CUDA GPU.*--model tiny.*--model hf:PATH"):
        load_chat_model(TrainConfig(model="4.5b"))


def test_a_missing_local_path_says_it_does_not_exist_and_never_asks_the_hub(no_hub, tmp_path):
    for spec in (f"hf:{tmp_path / 'missing'}", "hf:./not/here/model"):
        with pytest.raises(ModelSpecError, match=r"no model directory at .*: it does not exist"):
            resolve_model_spec(spec, LLMSettings())
    with pytest.raises(ConfigError, match="it does not exist") as err:
        load_chat_model(TrainConfig(model=f"hf:{tmp_path / 'missing'}"))
    assert "hf download" not in str(err.value)


def test_offline_mode_uses_the_cache_or_fails_without_network(no_hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cached = {"org/cached": "/cache/config.json"}
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: cached.get(repo))
    assert hf_loading.resolve_source("org/cached") == hf_loading.Source("org/cached", True)
    with pytest.raises(BackendError, match=r"HF_HUB_OFFLINE is set.*hf download org/absent"):
        hf_loading.resolve_source("org/absent")


def test_an_unreachable_hub_costs_one_quick_query(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    queries = []

    def unreachable(repo_id, timeout):
        queries.append((repo_id, timeout))
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "model_info", unreachable)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: None)
    with pytest.raises(BackendError, match=r"cannot be reached \(ConnectionError.*hf download org/model"):
        hf_loading.resolve_source("org/model")
    assert queries == [("org/model", hf_loading.HUB_PROBE_TIMEOUT_S)]
    # cached: load from the cache instead of retrying the network
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: "/cache/config.json")
    assert hf_loading.resolve_source("org/model").local_only


def test_a_cpu_only_torch_build_is_recognised_without_asking_cuda(monkeypatch):
    monkeypatch.setattr(hf_loading.importlib.metadata, "version", lambda name: "2.13.0+cpu")
    assert hf_loading.gpu_visible() is False
