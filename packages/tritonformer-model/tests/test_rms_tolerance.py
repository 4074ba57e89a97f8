"""The RMS form of the tolerance rule that the model twins use for parameter gradients."""

import pytest
import torch
from tritonformer_testkit import assert_rms_close_to_reference


def _draws(scale: float, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return scale * 1e-3 * torch.randn(4096, generator=generator, dtype=torch.float64)


def test_same_noise_passes_and_a_systematic_excess_fails():
    reference = torch.randn(4096, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torch_lowp = (reference + _draws(1.0, 1)).float()
    assert_rms_close_to_reference((reference + _draws(1.0, 2)).float(), reference, torch_lowp)
    with pytest.raises(AssertionError, match="RMS error"):
        assert_rms_close_to_reference((reference + _draws(3.0, 2)).float(), reference, torch_lowp)


def test_non_finite_positions_must_match():
    reference = torch.tensor([1.0, float("nan"), float("inf")], dtype=torch.float64)
    with pytest.raises(AssertionError, match="NaN positions"):
        assert_rms_close_to_reference(torch.tensor([1.0, 2.0, float("inf")]), reference, reference.float())
    with pytest.raises(AssertionError, match="inf positions"):
        assert_rms_close_to_reference(torch.tensor([1.0, float("nan"), -float("inf")]), reference, reference.float())
