"""Autoregressive generation with a preallocated KV cache, shared by both models.

    tokens = generate(model, idx, max_new_tokens, temperature, top_k, top_p, eos_token_id, ...)

Prefill: one forward over the prompts through the training kernels (`Transformer`) or SDPA
(`TorchTransformer`), which writes every layer's keys and values into the cache. Decode: each
step feeds one token per row; its keys and values are appended at the row's length and its query
attends to the cache (fused_attention.flash_attention_with_kvcache, or SDPA over the masked
cache). A model takes part through `forward_cached(idx, cache)` and `decode_tables(capacity, device)`.

Batches of prompts of different lengths are right-padded, with `prompt_lengths` giving each
row's length: causal attention keeps every real token from seeing the padding after it, so the
prefill needs no mask; each row then decodes from its own position (RoPE, learned positions and
ALiBi distances all follow the row's length), and its new tokens follow its own prompt in the
result. Past max_seq_len the context is cropped as the model was trained: when a row's cache is
full, every further step recomputes the last max_seq_len tokens of each row (a prefill), so the
tokens equal those of recomputing the cropped context every step.
"""

from __future__ import annotations

import functools
import math
import threading
import weakref
from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ._compat import autocast_state, autocast_without_cache


class KVCache:
    """Keys and values of every layer, (B, capacity, H_kv, D) each, and each row's length.

    Buffers are allocated on their layer's first write, in the dtype of the keys written (the
    model's compute dtype, autocast's included). `decoding` tells the layers whether the current
    forward is a prefill (positions 0 ... S - 1, written from position 0) or a decode step (one
    token per row at position `lengths[b]`). `tables` holds the model's per-position tables for
    decode steps (see `decode_tables`).
    """

    def __init__(self, n_layer: int, batch: int, capacity: int, device: torch.device):
        self.capacity = capacity
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=device)
        self.keys: List[Optional[torch.Tensor]] = [None] * n_layer
        self.values: List[Optional[torch.Tensor]] = [None] * n_layer
        self.decoding = False
        self.tables: Optional[tuple] = None

    def layer(self, index: int) -> LayerCache:
        return LayerCache(self, index)


class LayerCache:
    """One layer's view of a KVCache, as its attention module uses it."""

    __slots__ = ("cache", "index")

    def __init__(self, cache: KVCache, index: int):
        self.cache, self.index = cache, index

    @property
    def decoding(self) -> bool:
        return self.cache.decoding

    @property
    def lengths(self) -> torch.Tensor:
        """(B,) int32: the keys each row holds before this step's token."""
        return self.cache.lengths

    def buffers(self, like: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """This layer's (B, capacity, H_kv, D) key and value buffers, in like's dtype (zeroed when
        allocated, so that masked-out positions hold finite values for SDPA)."""
        cache, i = self.cache, self.index
        keys = cache.keys[i]
        if keys is None or keys.dtype != like.dtype:
            shape = (like.shape[0], cache.capacity, like.shape[2], like.shape[3])
            cache.keys[i] = torch.zeros(shape, dtype=like.dtype, device=like.device)
            cache.values[i] = torch.zeros(shape, dtype=like.dtype, device=like.device)
        return cache.keys[i], cache.values[i]

    def write_prompt(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """A prefill's keys and values (B, S, H_kv, D) at positions 0 ... S - 1."""
        k_cache, v_cache = self.buffers(k)
        k_cache[:, : k.shape[1]].copy_(k)
        v_cache[:, : v.shape[1]].copy_(v)


# ----------------------------------------------------------------------------------------------
# Sampling


def filter_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Logits (B, V) with -inf outside each row's nucleus: the most likely tokens whose probabilities
    sum to at least top_p (the most likely one always kept)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    outside = probs.cumsum(dim=-1) - probs > top_p  # the mass before a token already reaches top_p
    return logits.scatter(-1, order, sorted_logits.masked_fill(outside, float("-inf")))


def sample_next_token(
    logits: torch.Tensor,
    temperature: float,
    top_k: Optional[int],
    top_p: Optional[float],
    generator: Optional[torch.Generator],
) -> torch.Tensor:
    """(B,) int64 tokens from fp32 logits (B, V): argmax for temperature 0, else a draw from the
    softmax of logits / temperature restricted to the top_k tokens, then to the top_p nucleus."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        logits = filter_top_p(logits, top_p)
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)[:, 0]


# ----------------------------------------------------------------------------------------------
# Argument checks (before any forward)


def _check_int(name: str, value, low: int, high: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low or (high is not None and value >= high):
        bound = f">= {low}" if high is None else f"in [{low}, {high})"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def _check_prompt_lengths(prompt_lengths, batch: int, width: int) -> List[int]:
    """The per-row prompt lengths as ints in [1, width] (read back once when given as a tensor)."""
    if prompt_lengths is None:
        return [width] * batch
    if isinstance(prompt_lengths, torch.Tensor):
        if prompt_lengths.dim() != 1 or prompt_lengths.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"prompt_lengths must be a 1-D int tensor or a sequence of ints, got a {prompt_lengths.dtype} tensor "
                f"of shape {tuple(prompt_lengths.shape)}"
            )
        prompt_lengths = prompt_lengths.tolist()
    lengths = list(prompt_lengths)
    if len(lengths) != batch or not all(isinstance(n, int) and not isinstance(n, bool) for n in lengths):
        raise ValueError(f"prompt_lengths must hold one int per prompt row ({batch}), got {prompt_lengths!r}")
    if not all(1 <= n <= width for n in lengths):
        raise ValueError(f"prompt_lengths must lie in [1, {width}] (idx has {width} columns), got {lengths}")
    return lengths


def _check_options(model, idx, max_new_tokens, temperature, top_k, top_p, eos_token_id, pad_token_id) -> None:
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.numel() == 0:
        shape = tuple(idx.shape) if isinstance(idx, torch.Tensor) else type(idx).__name__
        raise ValueError(f"generate needs a prompt idx of shape (batch, seq_len) with at least one token, got {shape}")
    if idx.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"idx must be an int64 (or int32) tensor of token ids, got {idx.dtype}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise TypeError(f"max_new_tokens must be an int, got {type(max_new_tokens).__name__}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not (
        isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and math.isfinite(temperature)
        and temperature >= 0
    ):  # fmt: skip
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be >= 1, got {top_k!r}")
    if top_p is not None and not (
        isinstance(top_p, (int, float)) and not isinstance(top_p, bool) and 0.0 < top_p <= 1.0
    ):  # fmt: skip
        raise ValueError(f"top_p must be a number in (0, 1], got {top_p!r}")
    vocab_size = model.config.vocab_size
    for name, value in (("eos_token_id", eos_token_id), ("pad_token_id", pad_token_id)):
        if value is not None:
            _check_int(name, value, 0, vocab_size)


# ----------------------------------------------------------------------------------------------
# The loop


def _prefill(model, tokens: torch.Tensor, totals: torch.Tensor, longest: int, cache: KVCache) -> torch.Tensor:
    """Run each row's last min(total, max_seq_len) tokens (left-aligned, right-padded with token 0)
    through the model from position 0, filling the cache; returns the fp32 logits (B, V) at each
    row's last token. `longest` bounds the rows' totals (no read back)."""
    width = min(model.config.max_seq_len, longest)
    starts = (totals - width).clamp_min(0)  # (B,)
    columns = torch.arange(width, device=tokens.device)
    window = tokens.gather(1, (starts[:, None] + columns).clamp_max(tokens.shape[1] - 1))  # (B, W)
    window_lengths = totals - starts  # (B,) in [1, W]
    window = torch.where(columns < window_lengths[:, None], window, torch.zeros_like(window))
    cache.decoding = False
    h = model.forward_cached(window, cache)  # (B, W, d)
    cache.lengths.copy_(window_lengths)
    last = h[torch.arange(h.shape[0], device=h.device), window_lengths - 1]  # (B, d)
    return model.lm_head(last).float()


def _decode(model, next_tokens: torch.Tensor, active: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """One token per row at its cache length; active rows advance their length (a finished row's
    next token overwrites the same, unread, position). Returns the fp32 logits (B, V)."""
    cache.decoding = True
    h = model.forward_cached(next_tokens[:, None], cache)  # (B, 1, d)
    cache.lengths += active.to(torch.int32)
    return model.lm_head(h[:, 0]).float()


class DecodeGraph:
    """The decode step captured once into a CUDA graph and replayed for every token: one replay
    costs the host a few microseconds where the step's launches (a dozen per layer) cost it
    milliseconds at batch 1. Its inputs (the tokens, which rows are active) and its logits live
    in static buffers; the cache's buffers and lengths are the ones the graph reads and writes.
    A prefill between steps (when a row's cache is full) writes the same buffers, so the graph
    stays valid for the whole generate call, and for later calls of the same shapes on the same
    parameters (see _take_kept_graph)."""

    WARMUP = 2  # eager steps before the capture: every kernel compiled and tuned outside it

    def __init__(self, model: nn.Module, cache: KVCache, batch: int, token_dtype: torch.dtype, device: torch.device):
        self.tokens = torch.zeros(batch, dtype=token_dtype, device=device)
        # Warm-up steps run with no row active: they write keys and values at each row's current
        # length, which the first real step overwrites, and leave the lengths as they are.
        self.active = torch.zeros(batch, dtype=torch.bool, device=device)
        with autocast_without_cache(device.type):
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(self.WARMUP):
                    _decode(model, self.tokens, self.active, cache)
            torch.cuda.current_stream(device).wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = _decode(model, self.tokens, self.active, cache)

    def __call__(self, next_tokens: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """_decode(model, next_tokens, active, cache); the logits are overwritten by the next call."""
        self.tokens.copy_(next_tokens)
        self.active.copy_(active)
        self.graph.replay()
        return self.logits


class _GraphEntry:
    """A model's last decode graph, the cache it reads and writes, and what they were made for;
    made locked by the generate call that captured it (a lock is held by the call replaying it)."""

    __slots__ = ("key", "cache", "graph", "lock")

    def __init__(self, key: tuple, cache: KVCache, graph: DecodeGraph):
        self.key, self.cache, self.graph = key, cache, graph
        self.lock = threading.Lock()
        self.lock.acquire()


# Each model's last decode graph (a weak key: the entry goes with the model, and the model itself
# stays copyable and picklable).
_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _graph_key(model: nn.Module, batch: int, capacity: int, token_dtype: torch.dtype, device: torch.device) -> tuple:
    """What a captured decode step depends on: the shapes, the autocast state and every parameter's
    and buffer's storage (a graph replays the addresses it captured; a parameter replaced, moved or
    cast is a new address)."""
    tensors = tuple((t.data_ptr(), t.dtype) for t in (*model.parameters(), *model.buffers()))
    return batch, capacity, token_dtype, device, autocast_state(device.type), tensors


def release_decode_graph(model: nn.Module) -> None:
    """Free the decode graph and KV cache that generate(cuda_graph=True) keeps for `model`."""
    _GRAPHS.pop(model, None)


def _take_kept_graph(model: nn.Module, key: tuple) -> Optional[_GraphEntry]:
    """The model's kept decode graph for `key`, locked for this call; None where it has none for
    `key` (one for other shapes or parameters is dropped first, freeing its cache before this call
    makes its own) or another thread is replaying it."""
    entry = _GRAPHS.get(model)
    if entry is None:
        return None
    if entry.key != key:
        if not entry.lock.locked():
            release_decode_graph(model)
        return None
    return entry if entry.lock.acquire(blocking=False) else None


def _keep_graph(model: nn.Module, entry: _GraphEntry) -> None:
    """Keep `entry` for the model's next call, unless the one kept now is being replayed."""
    kept = _GRAPHS.get(model)
    if kept is None or not kept.lock.locked():
        _GRAPHS[model] = entry


@torch.no_grad()
def generate(
    model: nn.Module,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    eos_token_id: Optional[int] = None,
    pad_token_id: Optional[int] = None,
    prompt_lengths: Optional[Union[torch.Tensor, Sequence[int]]] = None,
    generator: Optional[torch.Generator] = None,
    cuda_graph: bool = False,
) -> torch.Tensor:
    """Extend each prompt of idx (B, S) by up to max_new_tokens tokens; see CausalLM.generate."""
    _check_options(model, idx, max_new_tokens, temperature, top_k, top_p, eos_token_id, pad_token_id)
    if not isinstance(cuda_graph, bool):
        raise TypeError(f"cuda_graph must be a bool, got {type(cuda_graph).__name__}")
    if cuda_graph and idx.device.type != "cuda":
        raise ValueError(f"cuda_graph=True replays the decode step as a CUDA graph; idx is on {idx.device}")
    batch, width = idx.shape
    lengths = _check_prompt_lengths(prompt_lengths, batch, width)
    pad = pad_token_id if pad_token_id is not None else (eos_token_id if eos_token_id is not None else 0)
    device = idx.device
    totals = torch.tensor(lengths, dtype=torch.int64, device=device)  # each row's tokens so far
    tokens = torch.full((batch, width + max_new_tokens), pad, dtype=idx.dtype, device=device)
    columns = torch.arange(width, device=device)
    tokens[:, :width] = torch.where(columns < totals[:, None], idx, torch.full_like(idx, pad))
    # The prompts' token ids are checked once (their padding replaced), not at every prefill.
    model._check_token_ids(tokens[:, :width])
    if max_new_tokens == 0:
        return tokens
    longest = max(lengths)
    capacity = min(model.config.max_seq_len, longest + max_new_tokens)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    was_training = model.training
    model.eval()
    graphed = cuda_graph and max_new_tokens > 1 and longest < capacity
    key = _graph_key(model, batch, capacity, idx.dtype, device) if graphed else None
    entry = _take_kept_graph(model, key) if graphed else None
    try:
        cache = entry.cache if entry is not None else KVCache(model.config.n_layer, batch, capacity, device)
        if entry is None:
            cache.tables = model.decode_tables(capacity, device)
        logits = _prefill(model, tokens, totals, longest, cache)
        in_cache = min(longest, capacity)  # bounds every row's cache length
        decode = functools.partial(_decode, model, cache=cache)
        if graphed:
            if entry is None:
                entry = _GraphEntry(key, cache, DecodeGraph(model, cache, batch, idx.dtype, device))
                _keep_graph(model, entry)
            decode = entry.graph
        steps = 0
        for steps in range(1, max_new_tokens + 1):
            next_tokens = sample_next_token(logits, temperature, top_k, top_p, generator).to(idx.dtype)
            active = ~finished
            if eos_token_id is not None:
                # A finished row writes padding at its next column (padding already) and stays put.
                next_tokens = torch.where(active, next_tokens, torch.full_like(next_tokens, pad))
            tokens.scatter_(1, totals[:, None], next_tokens[:, None])
            totals += active
            longest += 1
            if eos_token_id is not None:
                finished |= next_tokens == eos_token_id
                if bool(finished.all()):
                    break
            if steps == max_new_tokens:
                break
            if in_cache >= capacity:  # a row's cache may be full: recompute the cropped context
                logits = _prefill(model, tokens, totals, longest, cache)
                in_cache = min(longest, capacity)
            else:
                logits = decode(next_tokens, active)
                in_cache += 1
    finally:
        model.train(was_training)
        if entry is not None:
            entry.lock.release()
    return tokens[:, : width + steps]
