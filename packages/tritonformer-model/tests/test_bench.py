"""tritonformer-bench's machinery, smoke-tested on the CPU with the plain-PyTorch model."""

import csv
import importlib.util

import pytest
import torch
from tritonformer_testkit import interpreting

from tritonformer import bench


def rows_of(tmp_path):
    return list(csv.DictReader(open(tmp_path / "bench.csv")))


def test_cpu_smoke_run_writes_csv_markdown_and_plot(tmp_path, capsys):
    code = bench.main(
        ["--config", "tiny:16:2", "--providers", "torch,torch+graph", "hf-llama", "--device", "cpu", "--steps", "1",
         "--warmup", "1", "--out-dir", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    rows = rows_of(tmp_path)
    assert [(r["point"], r["provider"]) for r in rows] == [
        ("tiny:16:2", "torch"), ("tiny:16:2", "torch+graph"), ("tiny:16:2", "hf-llama")
    ]  # fmt: skip
    assert rows[0]["status"] == "ok" and float(rows[0]["model_tflops"]) > 0 and float(rows[0]["step_ms"]) > 0
    assert float(rows[0]["seconds"]) > 0
    assert rows[1]["status"] == "skipped: CUDA graphs need a CUDA GPU"
    assert rows[2]["status"] == "skipped: not a LLaMA-style config (rope, rmsnorm, swiglu)"
    table = (tmp_path / "bench.md").read_text()
    assert "| tiny:16:2 | torch |" in table and "model TFLOP/s" in table
    out = capsys.readouterr().out
    assert "tiny:16:2 torch: ok" in out and "tiny:16:2 torch+graph: skipped: CUDA graphs need a CUDA GPU" in out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not (tmp_path / "bench.png").exists()
    else:
        assert (tmp_path / "bench.png").stat().st_size > 0


def test_time_budget_skips_the_rows_it_leaves_out(tmp_path):
    args = ["--config", "tiny:16:2,tiny:8:1", "--providers", "torch", "--device", "cpu", "--out-dir", str(tmp_path)]
    assert bench.main([*args, "--time-budget", "0"]) == 0
    rows = rows_of(tmp_path)
    assert [r["point"] for r in rows] == ["tiny:16:2", "tiny:8:1"]
    assert all(r["status"] == "skipped: time budget of 0 s" for r in rows)


def test_time_budget_expects_a_provider_to_take_as_long_as_its_last_row(tmp_path, monkeypatch):
    def slow_row(point, provider, args, slot):
        seconds = 100.0 if provider == "torch" else 1.0
        clock[0] += seconds
        return bench.Result(str(point), provider, "ok", 1.0, 10.0, 1e3, 1.0, None, "logits", seconds)

    clock = [0.0]
    monkeypatch.setattr(bench, "run_point", slow_row)
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    args = ["--config", "tiny:16:2,tiny:8:1", "--providers", "torch,torch+graph", "--device", "cpu", "--out-dir",
            str(tmp_path), "--time-budget", "150"]  # fmt: skip
    assert bench.main(args) == 0
    # torch's first row (100 s) ends at 100 s; its second would end at 201 s > 150: skipped; torch+graph's run.
    assert [r["status"] for r in rows_of(tmp_path)] == ["ok", "ok", "skipped: time budget of 150 s", "ok"]


def test_a_failing_provider_keeps_the_others(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("capture failed\nsecond line")

    real = bench.training_step

    def training_step(point, provider, *args):
        return broken() if provider == "torch" else real(point, provider, *args)

    monkeypatch.setattr(bench, "training_step", training_step)
    args = ["--config", "tiny:16:2", "--providers", "torch", "torch.compile", "--device", "cpu", "--steps", "1",
            "--warmup", "1", "--out-dir", str(tmp_path)]  # fmt: skip
    monkeypatch.setattr(bench, "skip_reason", lambda provider, config, device: None)
    monkeypatch.setattr(bench.torch, "compile", lambda model: model)  # the row's machinery, not the compiler
    assert bench.main(args) == 0
    rows = rows_of(tmp_path)
    assert rows[0]["status"] == "error: RuntimeError: capture failed"
    assert rows[1]["status"] == "ok"


def test_command_line():
    args = bench.parse_args(["--providers", "tritonformer+graph,torch.compile", "--config", "410M:2048:8"])
    assert args.providers == ["tritonformer+graph", "torch.compile"]
    assert [str(p) for p in args.points] == ["410M:2048:8"]
    args = bench.parse_args(["--config", "410M:2048:8,llama-1.4B:2048:4", "160M:1024:1", "--providers", "all"])
    assert [str(p) for p in args.points] == ["410M:2048:8", "llama-1.4B:2048:4", "160M:1024:1"]
    assert args.providers == list(bench.PROVIDERS)
    defaults = bench.parse_args([])
    assert defaults.providers == list(bench.DEFAULT_PROVIDERS) and (defaults.warmup, defaults.steps) == (2, 5)
    assert [str(p) for p in defaults.points] == list(bench.HEADLINE)
    for bad in (["--providers", "tritonformer,jax"], ["--config", "410M:2048"], ["--warmup", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    with pytest.raises(ValueError, match="unknown provider 'jax'"):
        bench.parse_providers(["jax"])


def test_run_order_puts_liger_last():
    points = [bench.Point("llama-160M", 128, 1), bench.Point("llama-410M", 128, 1)]
    order = bench.run_order(points, ["hf-llama+liger", "tritonformer", "torch"])
    assert [(str(p), v) for p, v in order] == [
        ("llama-160M:128:1", "tritonformer"), ("llama-160M:128:1", "torch"),
        ("llama-410M:128:1", "tritonformer"), ("llama-410M:128:1", "torch"),
        ("llama-160M:128:1", "hf-llama+liger"), ("llama-410M:128:1", "hf-llama+liger"),
    ]  # fmt: skip


def test_providers_share_one_model_per_point():
    slot, cpu = bench.ModelSlot(), torch.device("cpu")
    config = bench.point_config(bench.Point("tiny", 16, 1), "torch", {})
    model = slot.get("torch", config, cpu)
    assert slot.get("torch", config, cpu) is model  # torch, torch+graph, torch.compile at one point
    assert slot.get("torch", config.replace(n_layer=1), cpu) is not model
    assert bench.model_kind("tritonformer+graph") == "triton" and bench.model_kind("torch.compile") == "torch"


def test_points_and_flops():
    assert str(bench.Point.parse("llama-1.4B:2048:4")) == "llama-1.4B:2048:4"
    with pytest.raises(ValueError, match="PRESET:CONTEXT:BATCH"):
        bench.Point.parse("410M:2048")
    with pytest.raises(ValueError, match="unknown preset 'gpt9'"):
        bench.Point.parse("gpt9:2048:1")
    point = bench.Point("410M", 4096, 2)
    config = bench.point_config(point, "tritonformer", {})
    assert config.max_seq_len == 4096 and config.fused_loss
    assert bench.point_config(point, "tritonformer+graph", {}).fused_loss
    assert not bench.point_config(point, "torch.compile", {}).fused_loss
    assert bench.point_config(point, "torch", {}, fused_loss="all").fused_loss
    cpu = torch.device("cpu")
    assert bench.skip_reason("tritonformer+graph", config, cpu) == "CUDA graphs need a CUDA GPU"
    assert bench.skip_reason("tritonformer", config, cpu) == (
        None if interpreting() else TRITON_ON_CPU[len("skipped: ") :]
    )
    llama = bench.point_config(bench.Point("llama-410M", 2048, 1), "hf-llama+tritonformer", {})
    reason = bench.skip_reason("hf-llama+tritonformer", llama, cpu)
    if importlib.util.find_spec("transformers") is None:
        assert reason.startswith("transformers does not import")
    else:
        assert reason == (None if interpreting() else TRITON_ON_CPU[len("skipped: ") :])


TRITON_ON_CPU = (
    "skipped: the Triton kernels need a CUDA GPU (on a CPU, TRITON_INTERPRET=1 runs them in Triton's interpreter)"
)


def test_cpu_skips_the_triton_rows_outside_the_interpreter(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "interpreting", lambda: False)
    args = ["--config", "tiny:16:2", "--providers", "tritonformer,tritonformer+compile,torch", "--device", "cpu",
            "--steps", "1", "--warmup", "1", "--out-dir", str(tmp_path)]  # fmt: skip
    assert bench.main(args) == 0
    assert [r["status"] for r in rows_of(tmp_path)] == [TRITON_ON_CPU, TRITON_ON_CPU, "ok"]


@pytest.mark.kernels
@pytest.mark.skipif(not interpreting(), reason="on a CPU the tritonformer rows run only in Triton's interpreter")
def test_cpu_runs_the_triton_rows_in_the_interpreter(tmp_path):
    args = ["--config", "tiny:16:1", "--providers", "tritonformer", "--device", "cpu", "--steps", "1", "--warmup",
            "1", "--out-dir", str(tmp_path)]  # fmt: skip
    assert bench.main(args) == 0
    (row,) = rows_of(tmp_path)
    assert row["status"] == "ok" and row["loss"] == "fused" and float(row["step_ms"]) > 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "tpu"], "argument --device: unknown device 'tpu'; choose auto, cpu, cuda or cuda:N"),
        (["--device", "auto"], "argument --device: unknown device 'auto'; choose cuda, cuda:N or cpu"),
        (["--steps", "0"], "argument --steps: must be >= 1, got 0"),
        (["--warmup", "-1"], "argument --warmup: must be >= 1, got -1"),
        (["--time-budget=-5"], "argument --time-budget: must be a finite number >= 0, got -5"),
        (["--config", "410M:0:8"], "CONTEXT and BATCH must be >= 1 in '410M:0:8'"),
        (["--config", "410M:2048:-1"], "CONTEXT and BATCH must be >= 1 in '410M:2048:-1'"),
        (["--set", "dropout"], "--set takes OPTION=VALUE, got 'dropout'"),
    ],
)
def test_bad_flags_are_refused_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == f"tritonformer-bench: error: {message}"


@pytest.mark.torch_dynamo  # transformers' model classes import torch._dynamo
def test_hf_rows_build_llama_and_qwen2_models_of_the_config(tmp_path):
    """The plain HF rows on the CPU: a Llama, a Qwen2 (GQA through --set) and a Gemma-2 of the point's shape."""
    pytest.importorskip("transformers", reason="the HF rows need transformers (the model's hf extra)")
    code = bench.main(
        ["--config", "llama-160M:16:1", "--providers", "hf-llama", "hf-qwen2", "hf-gemma2", "--device", "cpu",
         "--steps", "1", "--warmup", "1", "--out-dir", str(tmp_path), "--set", "n_layer=1", "d_model=64", "n_head=4",
         "n_kv_head=2", "d_ff=128", "vocab_size=256"]
    )  # fmt: skip
    assert code == 0
    rows = rows_of(tmp_path)
    assert [(r["provider"], r["status"], r["loss"]) for r in rows] == [
        ("hf-llama", "ok", "logits (HF)"), ("hf-qwen2", "ok", "logits (HF)"), ("hf-gemma2", "ok", "logits (HF)")
    ]  # fmt: skip
    qwen2 = bench.hf_model(bench.point_config(bench.Point("llama-160M", 16, 1), "hf-qwen2", {}), "qwen2")
    assert type(qwen2).__name__ == "Qwen2ForCausalLM" and qwen2.model.layers[0].self_attn.q_proj.bias is not None
    gemma2 = bench.hf_model(bench.point_config(bench.Point("llama-160M", 16, 1), "hf-gemma2", {}), "gemma2")
    assert gemma2.config.attn_logit_softcapping == 50.0 and gemma2.config.head_dim == 64


def test_padded_fine_tuning_batches(capsys):
    """--padding: each row real tokens in [S/4, S] on the chosen side, the same batch for every
    provider; other providers are refused before any work."""
    right = bench.padded_batch(4, 16, "right", torch.device("cpu"))
    left = bench.padded_batch(4, 16, "left", torch.device("cpu"))
    lengths = right.sum(1)
    assert torch.equal(lengths, left.sum(1)) and bool(((lengths >= 4) & (lengths <= 16)).all())
    assert torch.equal(right, bench.padded_batch(4, 16, "right", torch.device("cpu")))
    for row, n in enumerate(lengths.tolist()):
        assert right[row, :n].all() and not right[row, n:].any()
        assert left[row, 16 - n :].all() and not left[row, : 16 - n].any()
    with pytest.raises(SystemExit):
        bench.main(["--padding", "left", "--providers", "torch", "--device", "cpu"])
    assert "--padding applies to the HF providers only (hf-*), got torch" in capsys.readouterr().err


@pytest.mark.torch_dynamo  # transformers' model classes import torch._dynamo
def test_hf_rows_run_on_padded_batches(tmp_path):
    """The HF rows take the mask, and their labels ignore the padding."""
    pytest.importorskip("transformers", reason="the HF rows need transformers (the model's hf extra)")
    code = bench.main(
        ["--config", "llama-160M:16:2", "--providers", "hf-llama", "--device", "cpu", "--steps", "1", "--warmup", "1",
         "--padding", "left", "--out-dir", str(tmp_path), "--set", "n_layer=1", "d_model=64", "n_head=4",
         "d_ff=128", "vocab_size=256"]
    )  # fmt: skip
    assert code == 0 and rows_of(tmp_path)[0]["status"] == "ok"
