"""Checkpoint files: atomic writes through unique temporaries, a checksum, and one clear line for a bad file."""

import os
import time

import pytest
import torch

from tritonformer import checkpoint
from tritonformer._compat import TORCH_VERSION


def state(value: float = 1.0) -> dict:
    return {"step": 3, "model": {"w": torch.full((64, 64), value)}, "settings": {"lr": 1e-3, "name": "x"}}


def saved(tmp_path, value: float = 1.0):
    path = tmp_path / "ckpt.pt"
    checkpoint.save_checkpoint(path, state(value))
    return path


def temporaries(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir() if p.name != "ckpt.pt")


def test_round_trip_with_a_checksum_header(tmp_path):
    path = saved(tmp_path)
    assert path.read_bytes().startswith(b"tritonformer checkpoint 2\nsha256 ")
    loaded = checkpoint.load_checkpoint(path)
    assert loaded["step"] == 3 and loaded["format_version"] == checkpoint.FORMAT_VERSION
    assert torch.equal(loaded["model"]["w"], torch.ones(64, 64)) and loaded["settings"] == {"lr": 1e-3, "name": "x"}
    assert temporaries(tmp_path) == []


def test_writes_go_through_a_unique_fsynced_temporary_then_a_rename(tmp_path, monkeypatch):
    calls = []
    real_replace, real_fsync = os.replace, os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("fsync") or real_fsync(fd))

    def replace(src, dst):
        calls.append(("replace", os.path.basename(src), os.path.dirname(src)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    saved(tmp_path)
    saved(tmp_path)
    renames = [c for c in calls if c != "fsync"]
    assert calls[0] == "fsync" and calls[1][0] == "replace"  # the data reaches the disk before the rename
    assert all(directory == str(tmp_path) for _, _, directory in renames)  # same directory: an atomic rename
    names = [name for _, name, _ in renames]
    assert names[0] != names[1] and all(n.startswith(".ckpt.pt.") and n.endswith(".tmp") for n in names)


def test_a_failed_write_keeps_the_previous_checkpoint_and_no_temporary(tmp_path, monkeypatch):
    path = saved(tmp_path, 1.0)

    def fail(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save_checkpoint(path, state(2.0))
    monkeypatch.undo()
    assert torch.equal(checkpoint.load_checkpoint(path)["model"]["w"], torch.ones(64, 64))
    assert temporaries(tmp_path) == []


def test_stale_temporaries_older_than_the_run_are_removed(tmp_path):
    old = tmp_path / ".ckpt.pt.abc123.tmp"
    fresh = tmp_path / ".ckpt.pt.def456.tmp"
    other = tmp_path / ".other.pt.abc123.tmp"
    for p in (old, fresh, other):
        p.write_bytes(b"partial")
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    os.utime(other, (an_hour_ago, an_hour_ago))
    started = time.time() - 60
    assert checkpoint.remove_stale_temporaries(tmp_path / "ckpt.pt", before=started) == 1
    assert not old.exists() and fresh.exists() and other.exists()  # newer ones belong to a running writer


def test_a_writer_whose_temporary_another_run_removed_writes_it_again(tmp_path, monkeypatch):
    """Two runs in one directory: the second removes temporaries older than itself as it starts, which may
    take the first's just before its rename; the first must still save, not crash."""
    real = checkpoint._write_temporary
    removed = []

    def write_then_lose_it(*args):
        tmp = real(*args)
        if not removed:
            removed.append(checkpoint.remove_stale_temporaries(tmp_path / "ckpt.pt", before=time.time() + 1))
        return tmp

    monkeypatch.setattr(checkpoint, "_write_temporary", write_then_lose_it)
    path = saved(tmp_path, 5.0)
    assert removed == [1]
    assert torch.equal(checkpoint.load_checkpoint(path)["model"]["w"], torch.full((64, 64), 5.0))
    assert temporaries(tmp_path) == []


def overwrite(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        assert f.seek(offset) == offset and f.read(len(data)) != data  # a real change
        f.seek(offset)
        f.write(data)


def test_a_damaged_checkpoint_is_refused_naming_the_file(tmp_path):
    path = saved(tmp_path)
    overwrite(path, path.stat().st_size // 2, b"\xab" * 64)
    with pytest.raises(checkpoint.CheckpointError) as error:
        checkpoint.load_checkpoint(path)
    assert str(error.value) == (
        f"{path} is damaged: its contents do not match their sha256 checksum (truncated or overwritten)"
    )


def test_a_truncated_checkpoint_is_refused(tmp_path):
    path = saved(tmp_path)
    os.truncate(path, path.stat().st_size - 100)
    with pytest.raises(checkpoint.CheckpointError, match="is damaged: its contents do not match"):
        checkpoint.load_checkpoint(path)


def test_a_damaged_header_is_refused(tmp_path):
    path = saved(tmp_path)
    overwrite(path, len(b"tritonformer checkpoint 2\nsha256 "), b"zz")
    with pytest.raises(checkpoint.CheckpointError, match="is damaged: its contents do not match"):
        checkpoint.load_checkpoint(path)
    overwrite(path, len(b"tritonformer checkpoint "), b"7")
    with pytest.raises(checkpoint.CheckpointError, match="has checkpoint format '7'; this version reads 2 and 1"):
        checkpoint.load_checkpoint(path)


class NotAllowed:
    pass


@pytest.mark.parametrize(
    "content, message",
    [
        (b"hello world\n" * 10, "is not a tritonformer checkpoint (no checkpoint header)"),
        (b"", "is not a tritonformer checkpoint (no checkpoint header)"),
        ({"weights": torch.ones(2)}, "is not a tritonformer checkpoint (it has no format_version)"),
        (torch.ones(2), "is not a tritonformer checkpoint (it holds a Tensor)"),
        pytest.param(
            {"x": NotAllowed()},
            "holds objects other than tensors, numbers, strings and containers",
            marks=pytest.mark.skipif(
                TORCH_VERSION < (2, 4), reason="torch < 2.4: checkpoints load without weights_only (enabled from 2.4)"
            ),
        ),
        (b"PK\x03\x04 not really a zip archive", "is damaged or not a tritonformer checkpoint: torch.load failed"),
    ],
    ids=["text", "empty", "foreign-dict", "tensor", "arbitrary-object", "broken-zip"],
)
def test_a_foreign_file_is_refused_in_one_line(tmp_path, content, message):
    path = tmp_path / "ckpt.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    with pytest.raises(checkpoint.CheckpointError) as error:
        checkpoint.load_checkpoint(path)
    text = str(error.value)
    assert text.startswith(str(path)) and message in text and "\n" not in text
    assert "weights_only" not in text  # never a hint to load with fewer safety checks


def test_format_1_checkpoints_without_a_checksum_still_load(tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.save({"format_version": 1, **state(4.0)}, path)  # what save_checkpoint wrote before the header
    loaded = checkpoint.load_checkpoint(path)
    assert loaded["format_version"] == 1 and torch.equal(loaded["model"]["w"], torch.full((64, 64), 4.0))


def test_a_missing_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        checkpoint.load_checkpoint(tmp_path / "ckpt.pt")
