"""The shared dropout key: its words, where they come from, and the checks of seed and offset.
(The masks themselves are checked in the packages whose kernels use them.)"""

from __future__ import annotations

import pytest
import torch

from kernel_runtime.dropout import check_seed, dropout_rng, dropout_threshold_and_scale, seed_words


def test_seed_words_are_the_seed_halves_and_the_offset_as_int32():
    seed = (0x7BCDEF01 << 32) | 0x89ABCDEF
    assert seed_words(seed, 2**32 - 1) == (0x89ABCDEF - 2**32, 0x7BCDEF01, -1)
    words = dropout_rng(torch.device("cpu"), seed, 5)
    assert words.dtype == torch.int32 and words.tolist() == [0x89ABCDEF - 2**32, 0x7BCDEF01, 5]


def test_drawn_words_follow_torch_manual_seed():
    torch.manual_seed(3)
    first, second = dropout_rng(torch.device("cpu"), None, 0), dropout_rng(torch.device("cpu"), None, 0)
    torch.manual_seed(3)
    assert torch.equal(first, dropout_rng(torch.device("cpu"), None, 0)) and not torch.equal(first, second)


def test_threshold_and_scale():
    assert dropout_threshold_and_scale(0.0) == (0, 1.0)
    assert dropout_threshold_and_scale(0.25) == (2**29, 1 / 0.75)
    assert dropout_threshold_and_scale(1.0) == (2**31 - 1, 0.0)


@pytest.mark.parametrize(
    "seed, offset, error, message",
    [
        (-1, 0, ValueError, r"^seed=-1 must be >= 0"),
        (2**63, 0, ValueError, r"^seed=9223372036854775808 must be <= 9223372036854775807"),
        (True, 0, TypeError, r"^seed must be an int, got bool"),
        (None, 2**32, ValueError, r"^seed_offset=4294967296 must be <= 4294967295"),
        (None, 1.0, TypeError, r"^seed_offset must be an int, got float"),
    ],
)
def test_check_seed(seed, offset, error, message):
    with pytest.raises(error, match=message):
        check_seed(seed, offset)
    check_seed(None, 0)
    check_seed(2**63 - 1, 2**32 - 1)
