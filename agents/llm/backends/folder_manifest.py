"""A manifest of a folder's files, to tell a complete, intact folder from a partial or damaged one.

``manifest.json`` records, for every file of the folder, its size, its sha256 and a stamp (its modification time
in nanoseconds), and for the source the folder was made from, that file's size, sha256 and stamp. It is written
last, so a folder without one was never finished.

Checking is lazy, so that a start does not hash half a gigabyte: a file whose size and stamp are the recorded ones
is taken as written (one ``stat``); a file of the recorded size whose stamp differs (rewritten, touched, copied)
is hashed, and accepted only if its sha256 is the recorded one, after which the manifest takes the new stamp so
the next check is cheap again. A wrong size, a missing file, a file the manifest does not list or a wrong hash
makes the folder damaged. What the cheap path cannot see is a change that keeps both size and modification time
(a byte flipped and the time set back by hand). Standard library only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

MANIFEST = "manifest.json"
SCHEMA = 1
_CHUNK = 1 << 20
_DUMP_PREFIX = ".manifest-"


@dataclass(frozen=True, slots=True)
class FileRecord:
    """What a file was when the manifest was written: size in bytes, sha256 (hex) and modification time (ns)."""

    size: int
    sha256: str
    mtime_ns: int


def sha256_of(path: Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def record_of(path: Path, sha256: str | None = None) -> FileRecord:
    """A record of ``path`` as it is now (``sha256`` when already known, else computed)."""
    stat = path.stat()
    return FileRecord(stat.st_size, sha256 or sha256_of(path), stat.st_mtime_ns)


def write_manifest(folder: Path, source: FileRecord, **about: str) -> None:
    """Hash every file of ``folder`` (plain files only) and write the manifest beside them, atomically; ``about``
    adds free-form fields (what made the folder)."""
    if any(p.is_dir() for p in folder.iterdir()):
        raise ValueError(f"{folder}: a manifest covers plain files only, and the folder has subfolders")
    files = {name: asdict(record_of(folder / name)) for name in sorted(_listed_names(folder))}
    _dump(folder, {"schema": SCHEMA, "source": asdict(source), "files": files, **about})


def check_folder(folder: Path, source: Path | None, source_sha256: str | None = None) -> str | None:
    """None when ``folder`` holds exactly the files its manifest lists, intact, and was made from ``source`` (the
    file of the recorded size and content; with no ``source``, one that was removed since, the record alone) and,
    when ``source_sha256`` is given, from a source of that hash; otherwise why not, in a few words."""
    manifest = _load(folder)
    if isinstance(manifest, str):
        return manifest
    restamp: list[tuple[str | None, Path]] = []  # None: the source
    recorded = FileRecord(**manifest["source"])
    if source_sha256 is not None and recorded.sha256 != source_sha256:
        return "it was made from another source file"
    if source is not None:
        why = _check_file(source, recorded)
        if why == _CHANGED:
            restamp.append((None, source))
        elif why is not None:
            return f"it was made from another source file ({source.name}: {why})"
    listed: dict[str, dict] = manifest["files"]
    extra = _listed_names(folder) - listed.keys()
    if extra:
        return f"it holds files its manifest does not list ({', '.join(sorted(extra))})"
    for name, raw in listed.items():
        why = _check_file(folder / name, FileRecord(**raw))
        if why == _CHANGED:
            restamp.append((name, folder / name))
        elif why is not None:
            return f"{name}: {why}"
    if restamp:
        _restamp(folder, manifest, restamp)
    return None


_CHANGED = "changed"


def _listed_names(folder: Path) -> set[str]:
    """The names a manifest covers: every entry but the manifest itself and a manifest being written."""
    return {p.name for p in folder.iterdir() if p.name != MANIFEST and not p.name.startswith(_DUMP_PREFIX)}


def _check_file(path: Path, expected: FileRecord) -> str | None:
    """None if ``path`` is as recorded by the cheap test; ``_CHANGED`` if only its stamp differs and its bytes are
    still the recorded ones; otherwise what is wrong."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return "missing"
    except OSError as e:
        return f"unreadable ({e.strerror})"
    if stat.st_size != expected.size:
        return f"{stat.st_size} bytes, {expected.size} expected"
    if stat.st_mtime_ns == expected.mtime_ns:
        return None
    try:
        actual = sha256_of(path)
    except OSError as e:
        return f"unreadable ({e.strerror})"
    return _CHANGED if actual == expected.sha256 else "its content differs from the recorded hash"


def _restamp(folder: Path, manifest: dict, paths: list[tuple[str | None, Path]]) -> None:
    """Record new modification times of files just found intact, so the next check is cheap again; a manifest that
    cannot be written (a read-only folder) stays as it is, and the next check hashes those files again."""
    for name, path in paths:
        entry = manifest["source"] if name is None else manifest["files"][name]
        entry["mtime_ns"] = path.stat().st_mtime_ns
    with contextlib.suppress(OSError):
        _dump(folder, manifest)


def _load(folder: Path) -> dict | str:
    path = folder / MANIFEST
    if not folder.is_dir():
        return "it does not exist"
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        return "it has no manifest (an unfinished conversion)"
    except (OSError, ValueError) as e:
        return f"its manifest is unreadable ({type(e).__name__})"
    if not _well_formed(manifest):
        return "its manifest is incomplete"
    return manifest


def _well_formed(manifest: object) -> bool:
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        return False
    files, source = manifest.get("files"), manifest.get("source")
    if not isinstance(files, dict) or not files or any(not _plain_name(n) for n in files):
        return False
    return all(isinstance(r, dict) and set(r) == set(FileRecord.__slots__) for r in [source, *files.values()])


def _plain_name(name: object) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name


def _dump(folder: Path, manifest: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=_DUMP_PREFIX, suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / MANIFEST)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
