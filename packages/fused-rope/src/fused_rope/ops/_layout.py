"""Small tensor-layout helpers shared by the launchers, and the memory-overlap tests of in-place updates."""

import functools
import math
import operator
from typing import Dict, List, Tuple

import torch


def contiguous_strides(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    """The strides of a contiguous tensor of `shape`."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def empty_contiguous(x: torch.Tensor) -> torch.Tensor:
    """An uninitialized contiguous tensor of x's shape, dtype and device (also a fake implementation)."""
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def output_like(x: torch.Tensor) -> torch.Tensor:
    """An uninitialized tensor for the result of transforming x (also the fake implementation).

    x's own strides when x is dense with a contiguous last dim (a (B, H, S, D) view of
    (B, S, H, D) memory stays one), else contiguous (an expanded gradient, a strided last dim),
    so the real and the fake implementations agree.
    """
    if x.stride(-1) == 1:
        return torch.empty_like(x)
    return empty_contiguous(x)


def output_strides(shape: Tuple[int, ...], stride: Tuple[int, ...], dtype: torch.dtype) -> Tuple[int, ...]:
    """The strides output_like gives a tensor of this shape, strides and dtype (torch's empty_like
    decides them from the layout alone: a meta tensor stands in)."""
    return output_like(torch.empty_strided(shape, stride, dtype=dtype, device="meta")).stride()


# Steps the exact overlap search below may take before it gives up and answers "may overlap";
# the layouts attention code makes (slices and transposes of one buffer) take a handful.
OVERLAP_SEARCH_STEPS = 10_000


class _SearchTooLong(Exception):
    pass


def _reaches(target: int, terms: List[Tuple[int, int, int]]) -> bool:
    """Whether target = sum(c * x) for some integers lo <= x <= hi, over terms (c, lo, hi), c > 0.

    A depth-first search from the largest c, each level bounded by what the smaller terms can
    still add (for strides of a non-overlapping layout at most two values per level) and by
    their gcd. Raises _SearchTooLong past OVERLAP_SEARCH_STEPS.
    """
    terms = sorted(terms, reverse=True)
    n = len(terms)
    low, high, gcds = [0] * (n + 1), [0] * (n + 1), [0] * (n + 1)
    for i in reversed(range(n)):
        c, lo, hi = terms[i]
        low[i], high[i], gcds[i] = low[i + 1] + c * lo, high[i + 1] + c * hi, math.gcd(gcds[i + 1], c)
    steps = 0

    def search(i: int, rest: int) -> bool:
        nonlocal steps
        if rest < low[i] or rest > high[i] or (gcds[i] and rest % gcds[i]):
            return False
        if i == n:
            return True  # rest == 0: low[n] == high[n] == 0
        steps += 1
        if steps > OVERLAP_SEARCH_STEPS:
            raise _SearchTooLong
        c, lo, hi = terms[i]
        first, last = max(lo, -((high[i + 1] - rest) // c)), min(hi, (rest - low[i + 1]) // c)
        return any(search(i + 1, rest - c * x) for x in range(first, last + 1))

    return search(0, target)


@functools.lru_cache(maxsize=256)
def _overlaps_itself(shape: Tuple[int, ...], stride: Tuple[int, ...]) -> bool:
    dims = sorted((s, n) for n, s in zip(shape, stride) if n > 1)
    if not dims:
        return False
    if dims[0][0] == 0:
        return True  # an expanded dim: all its indices are one element
    extent = 0
    for s, n in dims:
        if s <= extent:
            break
        extent += (n - 1) * s
    else:
        return False  # each stride passes every offset the smaller ones reach: offsets are distinct
    try:
        # Two index vectors meet iff a nonzero difference d has sum(d * stride) == 0; take the
        # first nonzero d (in dims' order) positive.
        return any(
            _reaches(0, [(s, 1 if j == k else 1 - n, n - 1) for j, (s, n) in enumerate(dims) if j >= k])
            for k in range(len(dims))
        )
    except _SearchTooLong:
        return True


def overlaps_itself(x: torch.Tensor) -> bool:
    """Whether two elements of x are one memory location (an expanded view, or strides that
    meet); a layout too irregular to decide within OVERLAP_SEARCH_STEPS counts as overlapping."""
    return not x.is_contiguous() and _overlaps_itself(x.shape, x.stride())


@functools.lru_cache(maxsize=256)
def _lattices_meet(delta: int, a_shape, a_stride, a_size: int, b_shape, b_stride, b_size: int) -> bool:
    """Whether a byte of an element of a (shape, strides, element size), at address 0, is a byte
    of an element of b, at address delta."""
    ranges: Dict[int, List[int]] = {}  # coefficient (bytes) -> [lo, hi] of its summed indices

    def add(c: int, lo: int, hi: int) -> None:
        if c and hi > lo:
            span = ranges.setdefault(c, [0, 0])
            span[0], span[1] = span[0] + lo, span[1] + hi

    for n, s in zip(a_shape, a_stride):
        add(s * a_size, 0, n - 1)  # + index of a
    for n, s in zip(b_shape, b_stride):
        add(s * b_size, 1 - n, 0)  # - index of b
    add(1, 1 - b_size, a_size - 1)  # + byte within a's element - byte within b's
    try:
        return _reaches(delta, [(c, lo, hi) for c, (lo, hi) in ranges.items()])
    except _SearchTooLong:
        return True


def share_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether an element of a and one of b share a byte of memory (a is b, or overlapping
    views); other storages or disjoint address ranges answer at once, interleaved views (q and
    k slices of one qkv buffer) by an exact search, cached per layout."""
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False  # separate allocations (as torch's own overlap check assumes)
    a_shape, a_stride, b_shape, b_stride = a.shape, a.stride(), b.shape, b.stride()
    if 0 in a_shape or 0 in b_shape:
        return False
    a_size, b_size, a_start, b_start = a.element_size(), b.element_size(), a.data_ptr(), b.data_ptr()
    # Bytes from the first element to the end of the last (strides are >= 0).
    a_span = (sum(map(operator.mul, a_shape, a_stride)) - sum(a_stride) + 1) * a_size
    b_span = (sum(map(operator.mul, b_shape, b_stride)) - sum(b_stride) + 1) * b_size
    if a_start + a_span <= b_start or b_start + b_span <= a_start:
        return False
    return _lattices_meet(b_start - a_start, a_shape, a_stride, a_size, b_shape, b_stride, b_size)
