"""Training data: token streams, their splits, random batches, and how to turn tokens into text.

Three sources:
- the default corpus: the Python standard library's own source files (every machine that runs
  this has them; nothing to download), as bytes: a 256-token vocabulary;
- a text file of the user's, as UTF-8 bytes (the same byte-level vocabulary);
- pre-tokenized uint16 `.bin` files in nanoGPT's format (a flat array of token ids): a
  directory holding `train.bin` and `val.bin`, or one `.bin` whose last tenth is held out.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import sysconfig
from typing import Callable, List, Optional, Tuple

import numpy as np
import torch

BYTE_VOCAB_SIZE = 256
# The share of a single stream held out for evaluation.
VAL_FRACTION = 0.1


@dataclasses.dataclass
class TokenData:
    """A train and a validation stream of token ids (1-D numpy arrays or memmaps)."""

    train: np.ndarray
    val: np.ndarray
    vocab_size: int  # the smallest vocabulary that holds every token id of the source
    description: str
    decode: Callable[[List[int]], str]
    encode: Optional[Callable[[str], List[int]]]


def stdlib_files() -> List[pathlib.Path]:
    """The top-level .py files of this Python's standard library, sorted by name."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))
    if not files:
        raise FileNotFoundError(f"no Python source files under the standard library directory {stdlib}")
    return files


def decode_bytes(tokens: List[int]) -> str:
    return bytes(tokens).decode("utf-8", errors="replace")


def encode_bytes(text: str) -> List[int]:
    return list(text.encode("utf-8"))


def _split(stream: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    n_val = max(1, int(len(stream) * VAL_FRACTION))
    return stream[:-n_val], stream[-n_val:]


def _byte_data(raw: bytes, description: str) -> TokenData:
    stream = np.frombuffer(raw, dtype=np.uint8)
    train, val = _split(stream)
    return TokenData(train, val, BYTE_VOCAB_SIZE, description, decode_bytes, encode_bytes)


@functools.lru_cache(maxsize=1)
def default_corpus() -> TokenData:
    """The standard library's top-level .py files joined by newlines, read once per process."""
    files = stdlib_files()
    raw = b"\n".join(path.read_bytes() for path in files)
    return _byte_data(raw, f"the Python standard library's source ({len(files)} files under {files[0].parent})")


def _gpt2_codec():
    """tiktoken's GPT-2 codec when it is importable (for text samples of GPT-2-tokenized data)."""
    try:
        import tiktoken

        encoding = tiktoken.get_encoding("gpt2")
    except Exception:  # not installed, or its vocabulary file cannot be fetched here
        return (lambda tokens: "token ids: " + " ".join(map(str, tokens))), None
    return encoding.decode, encoding.encode_ordinary


def _bin_data(train: np.ndarray, val: np.ndarray, description: str) -> TokenData:
    vocab_size = int(max(train.max(initial=0), val.max(initial=0))) + 1
    decode, encode = _gpt2_codec()
    return TokenData(train, val, vocab_size, description, decode, encode)


def load_data(source: Optional[str] = None) -> TokenData:
    """The default corpus (source None), a directory with train.bin/val.bin, a .bin or a text file.

    A missing, unreadable or malformed source raises a one-line FileNotFoundError or ValueError naming the file.
    """
    if source is None:
        return default_corpus()
    path = pathlib.Path(source)
    if path.is_dir():
        train_bin, val_bin = path / "train.bin", path / "val.bin"
        if not (train_bin.is_file() and val_bin.is_file()):
            raise FileNotFoundError(f"{path} is a directory without train.bin and val.bin (nanoGPT's layout)")
        train, val = _read_tokens(train_bin), _read_tokens(val_bin)
        return _bin_data(train, val, f"uint16 tokens from {train_bin} and {val_bin}")
    if not path.exists():
        raise FileNotFoundError(f"no such data file: {path}")
    if not path.is_file():
        raise ValueError(f"data file {path} is not a regular file")
    if path.suffix == ".bin":
        train, val = _split(_read_tokens(path))
        return _bin_data(train, val, f"uint16 tokens from {path} (last {VAL_FRACTION:.0%} held out)")
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read data file {path}: {error.strerror or error}") from None
    if not raw:
        raise ValueError(f"data file {path} is empty")
    return _byte_data(raw, f"the bytes of {path}")


def _read_tokens(path: pathlib.Path) -> np.ndarray:
    """A nanoGPT .bin file (flat uint16 token ids), memory-mapped read-only."""
    try:
        size = path.stat().st_size
        if size == 0:
            raise ValueError(f"data file {path} is empty")
        if size % 2:
            raise ValueError(f"data file {path} has {size} bytes: not a whole number of uint16 tokens (nanoGPT .bin)")
        return np.memmap(path, dtype=np.uint16, mode="r")
    except OSError as error:
        raise ValueError(f"cannot read data file {path}: {error.strerror or error}") from None


def get_batch(
    stream: np.ndarray, batch_size: int, seq_len: int, generator: torch.Generator
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Random windows: inputs x (B, S) and next-token targets y (B, S), int64 on the CPU."""
    if len(stream) < seq_len + 1:
        raise ValueError(f"the stream has {len(stream)} tokens, fewer than seq_len + 1 = {seq_len + 1}")
    starts = torch.randint(len(stream) - seq_len, (batch_size,), generator=generator).tolist()
    windows = np.stack([np.asarray(stream[s : s + seq_len + 1], dtype=np.int64) for s in starts])  # (B, S+1)
    windows = torch.from_numpy(windows)
    return windows[:, :-1], windows[:, 1:]
