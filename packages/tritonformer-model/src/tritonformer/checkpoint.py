"""Training checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint file is a two-line header, `tritonformer checkpoint 2` and `sha256 <hex digest>`, then the
torch.save bytes of the state; the digest covers those bytes, so a damaged or truncated file is refused
instead of loaded. Files of format 1 (a bare torch.save, no header) still load, unverified.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pathlib
import pickle
import tempfile
import time
import zipfile
from typing import Any, Dict, Optional

import torch

from ._compat import TORCH_VERSION

FORMAT_VERSION = 2
MAGIC = b"tritonformer checkpoint"
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's zip archive: a format-1 checkpoint
_TMP_SUFFIX = ".tmp"


class CheckpointError(ValueError):
    """A file that is not a loadable checkpoint of this package; the message names the file and why."""


def _tmp_prefix(path: pathlib.Path) -> str:
    return f".{path.name}."


def save_checkpoint(path: os.PathLike, state: Dict[str, Any]) -> None:
    """Write state atomically: a unique temporary file in the same directory, flushed and fsync'd, then
    renamed over path. A crash mid-write leaves the previous checkpoint intact, and runs that share a
    directory never write into one another's temporary file."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save({"format_version": FORMAT_VERSION, **state}, buffer)
    payload = buffer.getbuffer()
    header = MAGIC + b" %d\nsha256 %s\n" % (FORMAT_VERSION, hashlib.sha256(payload).hexdigest().encode())
    # A run that starts while this one writes removes temporaries older than itself (remove_stale_temporaries):
    # if it took ours between the write and the rename, write it once more.
    for attempt in range(2):
        tmp = _write_temporary(path, header, payload)
        try:
            os.replace(tmp, path)
            break
        except FileNotFoundError:
            if attempt:
                raise
    _fsync_directory(path.parent)


def _write_temporary(path: pathlib.Path, header: bytes, payload: memoryview) -> str:
    fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=_TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if hasattr(os, "fchmod"):  # mkstemp makes the file private; a checkpoint gets the usual mode
                os.fchmod(f.fileno(), 0o666 & ~_umask())
            f.write(header)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_directory(directory: pathlib.Path) -> None:
    """Make the rename itself durable (POSIX); where a directory cannot be opened, nothing to do."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temporaries(path: os.PathLike, before: Optional[float] = None) -> int:
    """Delete the temporary files save_checkpoint(path) leaves behind when a run is killed mid-write, those last
    modified before `before` (a time.time(); None: now). Returns how many were removed."""
    path = pathlib.Path(path)
    before = time.time() if before is None else before
    removed = 0
    for tmp in path.parent.glob(_tmp_prefix(path) + "*" + _TMP_SUFFIX):
        with contextlib.suppress(OSError):  # gone already, or not ours to remove
            if tmp.stat().st_mtime < before:
                tmp.unlink()
                removed += 1
    return removed


def load_checkpoint(path: os.PathLike) -> Dict[str, Any]:
    """Read a checkpoint written by save_checkpoint onto the CPU (tensors, numbers, strings only).

    Raises FileNotFoundError when there is none, CheckpointError (a ValueError) naming the file and what is
    wrong when it is damaged, foreign or of an unknown format.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        with open(path, "rb") as f:
            if f.read(len(_ZIP_MAGIC)) == _ZIP_MAGIC:
                f.seek(0)
                return _unpickle(path, f.read(), expected_version=1)
            f.seek(0)
            format_line, digest_line = f.readline(64), f.readline(128)  # bounded: a foreign file may have no lines
            payload = f.read()
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error.strerror or error}") from None
    _verify(path, format_line, digest_line, payload)
    return _unpickle(path, payload, expected_version=FORMAT_VERSION)


def _verify(path: pathlib.Path, format_line: bytes, digest_line: bytes, payload: bytes) -> None:
    """Check the header and that the payload's sha256 is the one it records."""
    words = format_line.rstrip(b"\n").rsplit(b" ", 1)
    if not format_line.endswith(b"\n") or words[0] != MAGIC or len(words) != 2:
        raise CheckpointError(f"{path} is not a tritonformer checkpoint (no checkpoint header)")
    if words[1] != str(FORMAT_VERSION).encode():
        shown = words[1].decode("ascii", "replace")[:20]
        raise CheckpointError(f"{path} has checkpoint format {shown!r}; this version reads {FORMAT_VERSION} and 1")
    digest = digest_line.rstrip(b"\n").split(b" ")
    if not digest_line.endswith(b"\n") or len(digest) != 2 or digest[0] != b"sha256":
        raise CheckpointError(f"{path} is damaged: its checksum line is unreadable")
    if hashlib.sha256(payload).hexdigest().encode() != digest[1]:
        raise CheckpointError(
            f"{path} is damaged: its contents do not match their sha256 checksum (truncated or overwritten)"
        )


def _unpickle(path: pathlib.Path, payload, expected_version: int) -> Dict[str, Any]:
    safe = {"weights_only": True} if TORCH_VERSION >= (2, 4) else {}
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", **safe)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError, TypeError) as error:
        text = str(error).strip()
        if isinstance(error, pickle.UnpicklingError) or "weights_only" in text:
            reason = "it holds objects other than tensors, numbers, strings and containers"
        else:
            reason = text.splitlines()[0][:200] if text else type(error).__name__
        kind = "is damaged or not a tritonformer checkpoint" if expected_version == 1 else "cannot be loaded"
        raise CheckpointError(f"{path} {kind}: torch.load failed: {reason}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a tritonformer checkpoint (it holds a {type(state).__name__})")
    if "format_version" not in state:
        raise CheckpointError(f"{path} is not a tritonformer checkpoint (it has no format_version)")
    if state["format_version"] != expected_version:
        raise CheckpointError(
            f"{path} is not a tritonformer checkpoint (format_version {state['format_version']!r} in a file of "
            f"format {expected_version})"
        )
    return state
