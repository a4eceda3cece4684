"""Model specs resolve to factories, or fail before any run with an error that says what to do."""

from __future__ import annotations

import pytest
from nego.agents.llm.backends import hf
from nego.agents.llm.negotiator import LLMNegotiator
from nego.agents.model_registry import ModelEntry, register
from nego.agents.model_specs import LLMSettings, ModelSpecError, resolve_model_spec
from nego.agents.registry import resolve
from nego.market.marketplace import Job, Marketplace
from nego.market.types import EndReason
from nego.scenarios.scenario import Role

from ..conftest import make_widget_scenario
from ..fakes.llm_server import prompt_brain, serve

KEY = "sk-spec-CANARY-0042"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "NEGO_VLLM_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NEGO_HOME", str(tmp_path))


def test_api_backends_need_keys_and_never_show_them(monkeypatch):
    with pytest.raises(ModelSpecError, match="export OPENAI_API_KEY"):
        resolve_model_spec("openai:gpt-5-mini")
    with pytest.raises(ModelSpecError, match="export ANTHROPIC_API_KEY"):
        resolve_model_spec("anthropic:claude-haiku-4-5")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    factory = resolve_model_spec("openai:gpt-5-mini")
    assert (factory.spec, factory.kind) == ("openai:gpt-5-mini", "openai")
    neg = factory(Role.SELLER, 3)
    assert isinstance(neg, LLMNegotiator) and neg.use_tools and neg.backend is factory(Role.BUYER, 4).backend
    anth = resolve_model_spec("anthropic:claude-haiku-4-5")
    assert anth.kind == "anthropic" and anth(Role.BUYER, 1).use_tools
    for text in (repr(factory), repr(neg), repr(anth), repr(anth.backend), str(vars(anth.backend))):
        assert KEY not in text


def test_vllm_specs_and_size_aliases(monkeypatch):
    f = resolve_model_spec("vllm:Qwen/Qwen3-8B@http://gpu-box:8000")
    assert (f.kind, f.backend.model, f.backend.base_url) == ("vllm", "Qwen/Qwen3-8B", "http://gpu-box:8000/v1")
    assert f(Role.SELLER, 0).use_tools is False
    with_tools = resolve_model_spec("vllm:m@http://h:1/v1", LLMSettings(tools=True))
    assert with_tools(Role.SELLER, 0).use_tools and with_tools.backend.base_url == "http://h:1/v1"
    with pytest.raises(ModelSpecError, match="vllm:<model>@http://host:port"):
        resolve_model_spec("vllm:no-url")
    with pytest.raises(ModelSpecError, match="must look like http://host:port"):
        resolve_model_spec("vllm:m@gpu-box")
    monkeypatch.setenv("NEGO_VLLM_URL", "http://gpu-box:8000")
    alias = resolve_model_spec("4.5b")
    assert (alias.spec, alias.kind, alias.backend.model) == ("4.5b", "vllm", "google/gemma-4-E4B-it")
    assert resolve_model_spec("31b").backend.model == "google/gemma-4-31B-it"


def test_size_alias_without_a_server_loads_in_process(monkeypatch):
    from nego.agents.llm.backends import hf_loading

    loaded = []

    def fake_from_spec(path_or_id, **kw):
        loaded.append(path_or_id)
        raise hf.BackendError(f"could not load model {path_or_id!r}: HF_HUB_OFFLINE is set")

    monkeypatch.setattr(hf_loading, "gpu_visible", lambda: True)
    monkeypatch.setattr(hf_loading, "resolve_source", lambda p: hf_loading.Source(p, True))
    monkeypatch.setattr(hf.HFBackend, "from_spec", staticmethod(fake_from_spec))
    with pytest.raises(ModelSpecError, match="HF_HUB_OFFLINE"):
        resolve_model_spec("2.3b")
    assert loaded == ["google/gemma-4-E2B-it"]


def test_registry_names_and_other_forms(monkeypatch):
    with pytest.raises(ModelSpecError, match=r"no trained model '4\.5b-rl'.*nego train --model 4\.5b"):
        resolve_model_spec("4.5b-rl")
    with pytest.raises(ModelSpecError, match="no trained model 'tiny'"):
        resolve_model_spec("tiny")
    register(ModelEntry("12b-rl", "/ckpt/12b-rl", "12b", "hf"))
    f = resolve_model_spec("12b-rl", LLMSettings(vllm_url="http://gpu:8000"))
    assert (f.spec, f.kind, f.backend.model) == ("12b-rl", "vllm", "/ckpt/12b-rl")
    assert resolve_model_spec("remote:http://127.0.0.1:8765").kind == "remote"
    with pytest.raises(ModelSpecError, match="http://host:port"):
        resolve_model_spec("remote:ftp://x")
    with pytest.raises(ModelSpecError, match="names no model"):
        resolve_model_spec("openai:")
    with pytest.raises(ModelSpecError, match="neither a built-in template"):
        resolve_model_spec("vllm:m@http://h:1", LLMSettings(template="missing-template"))
    assert resolve_model_spec("boulware") is None and resolve_model_spec("5b") is None


async def test_specs_play_in_the_marketplace(monkeypatch):
    plan = {
        "seller": [{"price": p, "quantity": 10, "warranty": "1y"} for p in (150, 120, 100)],
        "buyer": [{"price": p, "quantity": 10, "warranty": "2y"} for p in (60, 90, 110)],
    }
    async with serve(prompt_brain(plan, {"seller": 0.6, "buyer": 0.55})) as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.openai_url)
        jobs = [Job(make_widget_scenario(), "openai:fake-model", "linear", seed) for seed in range(3)]
        market = Marketplace(resolve)
        results = await market.run(jobs)
        await market.factory("openai:fake-model").aclose()
    assert all(r.outcome.end_reason is not EndReason.ERROR for r in results)
    assert results[0].usage_seller.calls >= 1 and len(srv.requests) == sum(r.usage_seller.calls for r in results)


def test_resolving_specs_imports_no_sdk_until_one_is_needed():
    import subprocess
    import sys

    code = (
        "import sys; from nego.agents.model_specs import resolve_model_spec; import nego.agents.llm.negotiator; "
        "assert resolve_model_spec('boulware') is None and resolve_model_spec('remote:http://h:1') is not None; "
        "heavy = [m for m in ('openai', 'anthropic', 'torch', 'transformers') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize(("spec", "sdk", "module"), [("openai:m", "openai", "openai_backend"),
                                                     ("anthropic:m", "anthropic", "anthropic_backend")])  # fmt: skip
def test_a_missing_sdk_fails_at_resolution_with_the_install_hint(monkeypatch, spec, sdk, module):
    import sys

    import nego.agents.llm.backends as backends

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("NEGO_OPENAI_CLIENT", "sdk")  # the lean client needs no SDK (next test)
    monkeypatch.setitem(sys.modules, sdk, None)  # as if the SDK were not installed
    monkeypatch.delitem(sys.modules, f"nego.agents.llm.backends.{module}", raising=False)
    monkeypatch.delattr(backends, module, raising=False)
    with pytest.raises(ModelSpecError, match=rf"needs the '{sdk}' package.*pip install 'nego\[llm\]'"):
        resolve_model_spec(spec)


@pytest.mark.parametrize("spec", ["openai:m", "vllm:m@http://127.0.0.1:9"])
def test_the_lean_client_is_the_default_and_plays_without_the_sdk(monkeypatch, spec):
    import sys

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.delenv("NEGO_OPENAI_CLIENT", raising=False)
    monkeypatch.setitem(sys.modules, "openai", None)  # as if the SDK were not installed
    assert type(resolve_model_spec(spec).backend).__name__ == "LeanOpenAIBackend"
    monkeypatch.setenv("NEGO_OPENAI_CLIENT", "sdk")
    monkeypatch.delitem(sys.modules, "openai")
    assert type(resolve_model_spec(spec).backend).__name__ == "OpenAIBackend"
    assert type(resolve_model_spec(spec, LLMSettings.from_env(client="lean")).backend).__name__ == "LeanOpenAIBackend"
    with pytest.raises(ValueError, match="one of lean, sdk, got 'fast'"):
        LLMSettings.from_env(client="fast")
