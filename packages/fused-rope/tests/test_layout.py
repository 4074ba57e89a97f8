"""The memory-overlap tests of in-place updates against brute force: every element's offset listed."""

import itertools
import random

import pytest
import torch

from fused_rope.ops import _layout
from fused_rope.ops._layout import overlaps_itself, share_memory


def _offsets(shape, stride):
    return [sum(i * s for i, s in zip(index, stride)) for index in itertools.product(*map(range, shape))]


def _random_layout(rng, ndim):
    return tuple(rng.randint(1, 4) for _ in range(ndim)), tuple(rng.randint(0, 12) for _ in range(ndim))


def test_overlaps_itself_matches_brute_force():
    rng = random.Random(0)
    verdicts = set()
    for _ in range(2000):
        shape, stride = _random_layout(rng, rng.randint(1, 4))
        offsets = _offsets(shape, stride)
        expected = len(set(offsets)) != len(offsets)
        assert _layout._overlaps_itself(shape, stride) == expected, (shape, stride)
        verdicts.add(expected)
    assert verdicts == {False, True}


@pytest.mark.parametrize("sizes", [(4, 4), (2, 4), (4, 2), (1, 2)], ids=str)
def test_lattices_meet_matches_brute_force(sizes):
    """Byte sets of two strided layouts (element sizes a_size, b_size; b at byte delta from a)."""
    rng = random.Random(sum(sizes))
    a_size, b_size = sizes
    verdicts = set()
    for _ in range(600):
        ndim = rng.randint(1, 3)
        (a_shape, a_stride), (b_shape, b_stride) = _random_layout(rng, ndim), _random_layout(rng, ndim)
        delta = rng.randint(-60, 60)
        a_bytes = {o * a_size + u for o in _offsets(a_shape, a_stride) for u in range(a_size)}
        b_bytes = {delta + o * b_size + v for o in _offsets(b_shape, b_stride) for v in range(b_size)}
        expected = bool(a_bytes & b_bytes)
        got = _layout._lattices_meet(delta, a_shape, a_stride, a_size, b_shape, b_stride, b_size)
        assert got == expected, (a_shape, a_stride, b_shape, b_stride, delta)
        verdicts.add(expected)
    assert verdicts == {False, True}


def test_tensor_views():
    qkv = torch.zeros(2, 5, 8, 16)
    heads = lambda *s: qkv[:, :, slice(*s)].transpose(1, 2)  # noqa: E731
    assert not share_memory(heads(0, 4), heads(4, 6))  # q, k of a fused projection: interleaved, disjoint
    assert not share_memory(heads(0, 8, 2), heads(1, 8, 2))  # even and odd heads
    assert share_memory(heads(0, 4), heads(3, 5)) and share_memory(heads(0, 4), heads(0, 4))
    assert not share_memory(torch.zeros(3, 4), torch.zeros(3, 4)) and not share_memory(heads(0, 0), heads(0, 4))
    # a float32 view and a bfloat16 view of one buffer: bytes, not elements, decide
    flat = torch.zeros(8)
    assert share_memory(flat[1:2], flat.view(torch.bfloat16)[3:4])
    assert not share_memory(flat[1:2], flat.view(torch.bfloat16)[4:6])
    assert overlaps_itself(torch.zeros(1, 4).expand(3, 4)) and not overlaps_itself(heads(0, 4))
    assert not overlaps_itself(torch.zeros(5, 1).expand(5, 1)) and not overlaps_itself(torch.zeros(3, 4).t())


def test_irregular_strides_are_searched_and_past_the_budget_count_as_overlapping(monkeypatch):
    """Strides the fast test cannot decide are searched exactly; past the search budget the answer
    is the safe one (the in-place update is refused)."""
    shape, stride = (4, 4, 4), (5, 7, 9)  # irregular strides: the fast test does not apply
    offsets = _offsets(shape, stride)
    assert len(set(offsets)) != len(offsets) and _layout._overlaps_itself(shape, stride)
    shape, stride = (2, 3), (3, 2)  # no two offsets equal (0 2 4 3 5 7), found by the search
    assert not _layout._overlaps_itself(shape, stride)
    monkeypatch.setattr(_layout, "OVERLAP_SEARCH_STEPS", 0)
    _layout._overlaps_itself.cache_clear()
    try:
        assert _layout._overlaps_itself(shape, stride)
    finally:
        _layout._overlaps_itself.cache_clear()
