"""A GGUF checkpoint turned, once, into a plain transformers folder that loads like any other chat checkpoint.

transformers reads a GGUF file (``from_pretrained(folder, gguf_file=name)``, with the ``gguf`` package), but
dequantising it costs tens of seconds on a CPU, and the model it gives cannot be saved as it is. So
:func:`cached_conversion` converts it once: the GGUF model's weights are loaded into a fresh model built from its
config (without the quantisation record), with nothing missing and nothing left over; model, tokenizer and chat
template are saved in float32 into a temporary folder beside the destination; a manifest of the saved files and
of the GGUF file (sizes, sha256) is written last (:mod:`.folder_manifest`); and the folder is renamed into place.

Every later start only checks the folder against its manifest: sizes and modification times of every file, a
``stat`` each, with a full hash only of a file whose time changed (see :mod:`.folder_manifest`); the full hashes
are computed right after a conversion. A folder without a complete manifest (a conversion killed half-way), with
a file missing, truncated or altered, or made from another GGUF file is converted again, after one warning saying
why. Conversions in several processes at once are serialised by a lock file beside the folder. torch and
transformers are imported only when a conversion runs.
"""

from __future__ import annotations

import copy
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from nego.market.locks import locked

from .base import BackendError
from .folder_manifest import FileRecord, check_folder, record_of, sha256_of, write_manifest

log = logging.getLogger(__name__)


def cached_conversion(gguf: Path, dest: Path, *, expected_sha256: str | None = None) -> Path:
    """``dest``, a transformers folder converted from the GGUF file ``gguf``: as it is when it checks out against
    its manifest, else converted (again). ``expected_sha256``: the hash ``gguf`` must have, checked before a
    conversion loads it. Raises :class:`BackendError` when the file cannot be converted."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with locked(dest.parent / f".{dest.name}.lock"):
        why = check_folder(dest, gguf, expected_sha256)
        if why is None:
            return dest
        if dest.exists():
            log.warning("the converted model at %s is rebuilt from %s: %s", dest, gguf, why)
        else:
            log.warning("converting %s into a transformers folder at %s, once (a minute or so on a CPU)", gguf, dest)
        _remove_leftovers(dest)
        source = record_of(gguf, sha256_of(gguf))
        if expected_sha256 is not None and source.sha256 != expected_sha256:
            raise BackendError(f"{gguf} is damaged or not the expected file: its sha256 is {source.sha256}")
        _convert_and_replace(gguf, source, dest)
    return dest


def _convert_and_replace(gguf: Path, source: FileRecord, dest: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=_work_prefix(dest), dir=dest.parent))
    try:
        convert_gguf(gguf, tmp)
        write_manifest(tmp, source, made_from=gguf.name)
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=_work_prefix(dest), dir=dest.parent))
            dest.rename(old / dest.name)
            tmp.rename(dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def convert_gguf(gguf: Path, out: Path) -> None:
    """Save the GGUF checkpoint ``gguf`` as a float32 transformers folder in ``out`` (model, tokenizer, chat
    template). A file that cannot be read or whose weights do not fit its config raises :class:`BackendError`."""
    try:
        import torch
        import transformers
    except ImportError as e:
        hint = "pip install 'nego[train]'"
        raise BackendError(f"converting {gguf.name} needs torch and transformers: {hint} ({e})") from None
    tokenizer, model = _load_gguf(transformers, torch, gguf)
    if not getattr(tokenizer, "chat_template", None):
        raise BackendError(f"{gguf}: the file holds no chat template")
    plain = _plain_copy(transformers, torch, model)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _load_gguf(transformers: Any, torch: Any, gguf: Path) -> tuple[Any, Any]:
    where = {"gguf_file": gguf.name, "local_files_only": True}
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), **where)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **where)
    except ImportError as e:
        raise BackendError(f"reading {gguf.name} needs the gguf package: pip install 'nego[train]' ({e})") from None
    except Exception as e:  # a truncated or foreign file fails in the GGUF reader with whatever it met first
        raise BackendError(f"{gguf} cannot be read as a GGUF checkpoint ({type(e).__name__}: {str(e)[:200]})") from None
    return tokenizer, model


def _plain_copy(transformers: Any, torch: Any, model: Any) -> Any:
    """A model of the same config without the quantisation record, holding ``model``'s weights (the same tensors, no
    copy), for saving only: it is built on the meta device, so that no time goes into initialising weights that are
    replaced at once, and buffers that are not saved stay there."""
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False, assign=True)
    if missing or unexpected:
        raise BackendError(
            f"the GGUF weights do not fit a fresh {type(plain).__name__}: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    empty = [name for name, tensor in plain.state_dict().items() if tensor.is_meta]
    if empty:
        raise BackendError(f"the GGUF file gave no values for {', '.join(empty[:5])}")
    plain.generation_config = copy.deepcopy(model.generation_config)
    return plain


def _work_prefix(dest: Path) -> str:
    return f".{dest.name}-work-"


def _remove_leftovers(dest: Path) -> None:
    """Temporary folders a killed conversion left beside ``dest`` (only ever touched under the lock)."""
    for leftover in dest.parent.glob(f"{_work_prefix(dest)}*"):
        shutil.rmtree(leftover, ignore_errors=True)
