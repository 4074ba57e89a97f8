"""tritonformer-bench's machinery, smoke-tested on the CPU with the plain-PyTorch model."""

import csv

import pytest

from tritonformer import bench


def test_cpu_smoke_run_writes_csv_markdown_and_plot(tmp_path):
    code = bench.main(
        ["--config", "tiny:16:2", "--providers", "torch", "hf-llama", "--device", "cpu", "--steps", "1",
         "--warmup", "1", "--out-dir", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    rows = list(csv.DictReader(open(tmp_path / "bench.csv")))
    assert [(r["point"], r["provider"]) for r in rows] == [("tiny:16:2", "torch"), ("tiny:16:2", "hf-llama")]
    assert rows[0]["status"] == "ok" and float(rows[0]["model_tflops"]) > 0 and float(rows[0]["step_ms"]) > 0
    assert rows[1]["status"] == "skipped: not a LLaMA-style config (rope, rmsnorm, swiglu)"
    table = (tmp_path / "bench.md").read_text()
    assert "| tiny:16:2 | torch |" in table and "model TFLOP/s" in table
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not (tmp_path / "bench.png").exists()
    else:
        assert (tmp_path / "bench.png").stat().st_size > 0


def test_points_and_flops():
    assert str(bench.Point.parse("llama-1.4B:2048:4")) == "llama-1.4B:2048:4"
    with pytest.raises(ValueError, match="PRESET:CONTEXT:BATCH"):
        bench.Point.parse("410M:2048")
    with pytest.raises(ValueError, match="unknown preset 'gpt9'"):
        bench.Point.parse("gpt9:2048:1")
    point = bench.Point("410M", 4096, 2)
    config = bench.point_config(point, "tritonformer", {})
    assert config.max_seq_len == 4096 and config.fused_loss
    assert not bench.point_config(point, "torch.compile", {}).fused_loss
    assert bench.point_config(point, "torch", {}, fused_loss="all").fused_loss
