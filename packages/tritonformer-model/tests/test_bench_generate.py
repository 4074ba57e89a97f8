"""tritonformer-bench --generate: its arguments are checked before any work, and it says plainly
when there is no GPU to time on (the timing itself runs in the GPU rounds)."""

from __future__ import annotations

import pytest
import torch

from tritonformer import bench, bench_generate


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--providers", "nope"], "unknown provider 'nope'"),
        (["--presets", "huge"], "huge"),
        (["--batches", "0"], "--batches must be >= 1"),
        (["--new-tokens", "1"], "--new-tokens must be >= 2"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--generate", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_without_a_gpu_it_says_so(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--generate", "--presets", "160M"]) == 2
    assert "times generation on a CUDA GPU; none is available here" in capsys.readouterr().err


def test_every_provider_has_a_generator_or_a_reason():
    config = bench_generate.TransformerConfig.preset("160M")
    for provider in bench_generate.PROVIDERS:
        reason = bench_generate.skip_reason(provider, config)
        assert reason is None or provider == "hf-llama"
    assert "LLaMA-style" in bench_generate.skip_reason("hf-llama", config)
