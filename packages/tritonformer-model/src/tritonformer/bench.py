"""tritonformer-bench: training-step throughput of the GPT against PyTorch, on a CUDA GPU.

    tritonformer-bench                                   # the two headline configs
    tritonformer-bench --providers tritonformer+graph,torch.compile --config 410M:2048:8
    tritonformer-bench --sweep sizes                     # the model size x context sweep
    tritonformer-bench --generate                        # generation: prefill and decode speed

For each config (PRESET:CONTEXT:BATCH) and provider, one training step (forward + backward of
the loss on random tokens, bf16 autocast, fp32 weights; `--optimizer` adds a fused AdamW step)
is timed over `--steps` steps after `--warmup` steps, with CUDA events:

- tritonformer: `Transformer` (the kernel packages), with its fused linear+cross-entropy loss
  (`--fused-loss` says which providers use it);
- tritonformer+graph: the same, its forward and backward replayed from CUDA graphs
  (tritonformer.cuda_graph; the loss and the optimizer eager);
- tritonformer+compile: the same under torch.compile (kernels as custom ops);
- torch: `TorchTransformer` eager (cuBLAS, SDPA); torch+graph, torch.compile: the same, graphed
  or compiled;
- hf-llama, hf-llama+tritonformer, hf-llama+liger: Hugging Face `LlamaForCausalLM` (SDPA) of
  the same shape, plain, with this project's kernels (`tritonformer.hf.apply`) and with
  Liger-Kernel, for the LLaMA-style presets, when `transformers` (and `liger_kernel`) import;
  hf-qwen2, hf-qwen2+tritonformer, hf-qwen2+liger: the same with `Qwen2ForCausalLM` (q/k/v
  biases; `--set n_kv_head=4` makes it a GQA model); hf-gemma2, hf-gemma2+tritonformer,
  hf-gemma2+liger: `Gemma2ForCausalLM` of the same shape with Gemma-2's softcaps and windows
  (eager attention when not patched: SDPA refuses a softcap; GeGLU, which neither patch fuses
  here: Liger's GeGLU does).

Each row is printed as soon as it is measured, and bench.csv and bench.md (in --out-dir) are
rewritten after each row, so an interrupted run keeps what it measured; bench.png (if
matplotlib imports) is drawn at the end. Providers that share a model at a point (tritonformer
and its +graph / +compile variants; torch and its variants) share one build; memory is released
between providers. `--time-budget` skips the rows that would end after that many seconds (a
provider's row is expected to take as long as its previous one; its first row, only to start).

`--padding right|left` makes the HF rows fine-tuning steps: rows of mixed lengths, padded, the
padding masked in attention (varlen attention where tritonformer is patched in) and ignored by
the loss.

`--generate` times generation with a KV cache instead (tritonformer.bench_generate, whose
`--help` lists its options).

Model flops per token: 6N + 12 * L * d * S (N the parameters of the matmuls, the tied or
untied head included, the embedding tables not). Peak GiB: torch.cuda.max_memory_allocated
over the timed steps; for the +graph providers over the capture too (the graphs' memory pool
is allocated while capturing).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import pathlib
import sys
import time
import traceback
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import torch

from .bench_common import environment_line, hf_model, hf_skip_reason, release_memory, split_list
from .config import PRESETS, TransformerConfig
from .cuda_graph import GraphedModel
from .train import (
    HelpFormatter,
    build_model,
    check_device_name,
    interpreting,
    non_negative_float,
    parse_value,
    positive_int,
)

PROVIDERS = (
    "tritonformer", "tritonformer+graph", "tritonformer+compile", "torch", "torch+graph", "torch.compile", "hf-llama",
    "hf-llama+tritonformer", "hf-llama+liger", "hf-qwen2", "hf-qwen2+tritonformer", "hf-qwen2+liger", "hf-gemma2",
    "hf-gemma2+tritonformer", "hf-gemma2+liger",
)  # fmt: skip
# The default run, in this order at each point (Liger's rows after all others: it patches classes).
DEFAULT_PROVIDERS = (
    "tritonformer+graph",
    "tritonformer",
    "torch",
    "torch.compile",
    "hf-llama",
    "hf-llama+tritonformer",
    "hf-llama+liger",
)
HEADLINE = ("410M:2048:8", "llama-1.4B:2048:4")
# Model size x context, GPT-2 style without linear biases, plus LLaMA-style counterparts.
SIZES_SWEEP = (
    "160M:2048:8", "410M:2048:4", "410M:4096:2", "410M:4096:4", "840M:2048:2", "840M:4096:1", "1.4B:2048:2",
    "llama-410M:2048:8", "llama-1.4B:2048:4",
)  # fmt: skip
ANCHOR = "torch.compile"
# Eager runs of the body that make_graphed_callables does before capturing (the bench's own
# eager warm-up steps have compiled and autotuned every kernel by then).
GRAPH_WARMUP = 2


@dataclasses.dataclass
class Point:
    preset: str
    context: int
    batch: int

    @classmethod
    def parse(cls, text: str) -> Point:
        try:
            preset, context, batch = text.split(":")
            point = cls(preset, int(context), int(batch))
        except ValueError:
            raise ValueError(f"a config is PRESET:CONTEXT:BATCH, e.g. 410M:2048:8; got {text!r}") from None
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r} in {text!r}; known: {', '.join(PRESETS)}")
        if point.context < 1 or point.batch < 1:
            raise ValueError(f"CONTEXT and BATCH must be >= 1 in {text!r}")
        return point

    def __str__(self):
        return f"{self.preset}:{self.context}:{self.batch}"


@dataclasses.dataclass
class Result:
    point: str
    provider: str
    status: str  # "ok", "OOM", "skipped: why", "error: what"
    params_millions: Optional[float] = None
    step_ms: Optional[float] = None
    tokens_per_s: Optional[float] = None
    model_tflops: Optional[float] = None
    peak_gib: Optional[float] = None
    loss: Optional[str] = None  # "fused" (no full logits) or "logits"
    seconds: Optional[float] = None  # wall time of the row: build, warm-up (compiles), capture, timing


def model_kind(provider: str) -> str:
    """The model a provider runs: triton (Transformer), torch (TorchTransformer), or the provider (HF)."""
    if provider.startswith("tritonformer"):
        return "triton"
    if provider.startswith("torch"):
        return "torch"
    return provider


def point_config(point: Point, provider: str, overrides: dict, fused_loss: str = "ours") -> TransformerConfig:
    """The config a provider runs at a point: the preset, the context, the loss mode, the overrides."""
    overrides = dict(overrides)
    overrides["max_seq_len"] = max(point.context, PRESETS[point.preset]["max_seq_len"])
    ours = provider.startswith("tritonformer")
    overrides.setdefault("fused_loss", fused_loss == "all" or (fused_loss == "ours" and ours))
    return TransformerConfig.preset(point.preset, **overrides)


TRITON_ON_CPU = "the Triton kernels need a CUDA GPU (on a CPU, TRITON_INTERPRET=1 runs them in Triton's interpreter)"


def skip_reason(provider: str, config: TransformerConfig, device: torch.device) -> Optional[str]:
    """Why a provider cannot run here (None: it can)."""
    if provider.startswith("hf-"):
        reason = hf_skip_reason(config, liger=provider.endswith("liger"))
        if reason is None and provider.endswith("+tritonformer") and device.type != "cuda" and not interpreting():
            reason = (
                "the Triton kernels need a CUDA GPU (on a CPU, TRITON_INTERPRET=1 runs them in Triton's interpreter)"
            )
        return reason
    if provider.endswith("+graph"):
        if device.type != "cuda":
            return "CUDA graphs need a CUDA GPU"
        if config.dropout > 0 or config.attention_dropout > 0:
            return "CUDA graphs need dropout=0 (a replayed step with dropout has not been validated)"
    if provider.startswith("tritonformer") and device.type != "cuda" and not interpreting():
        return TRITON_ON_CPU
    if "compile" in provider and not hasattr(torch, "compile"):
        return "this torch has no torch.compile"
    return None


class ModelSlot:
    """The model of the last provider, reused by the next one when it needs the same (kind, config)."""

    def __init__(self):
        self.key: Optional[Tuple[str, TransformerConfig]] = None
        self.model: Optional[torch.nn.Module] = None

    def get(self, kind: str, config: TransformerConfig, device: torch.device) -> torch.nn.Module:
        if self.model is not None and self.key == (kind, config):
            self.model.zero_grad(set_to_none=True)
            return self.model
        self.clear(device)
        torch.manual_seed(0)
        with device:
            if kind.startswith("hf-"):
                arch, _, patch = kind[len("hf-") :].partition("+")
                self.model = hf_model(config, arch, patch)
            else:
                self.model = build_model(kind, config)
        self.key = (kind, config) if not kind.startswith("hf-") else None  # HF models are not shared
        return self.model

    def clear(self, device: torch.device) -> None:
        self.key, self.model = None, None
        release_memory(device)


def padded_batch(batch: int, context: int, side: str, device: torch.device) -> torch.Tensor:
    """The (batch, context) attention mask of a fine-tuning batch: row b holds a number of real
    tokens drawn in [context / 4, context] (a fixed seed, so every provider sees the same batch),
    padded on `side`; the loss ignores the padding."""
    lengths = torch.randint(context // 4, context + 1, (batch,), generator=torch.Generator().manual_seed(0))
    columns = torch.arange(context)
    real = columns[None, :] < lengths[:, None] if side == "right" else columns[None, :] >= context - lengths[:, None]
    return real.to(device=device, dtype=torch.long)


@dataclasses.dataclass
class TrainingStep:
    """One provider's training step at one point, ready to time."""

    fn: Callable[[], None]  # the timed step
    warm: Callable[[], None]  # a warm-up step (compiles and autotunes)
    prepare: Optional[Callable[[], None]]  # run once after warm-up, before timing (graph capture)
    loss: str  # how the loss is computed
    params_millions: float
    flops: float  # model flops of one step: tokens * (6N + 12 L d S)
    tokens: int


def training_step(
    point: Point,
    provider: str,
    config: TransformerConfig,
    device: torch.device,
    optimizer: bool = False,
    model: Optional[torch.nn.Module] = None,
    padding: str = "none",
) -> TrainingStep:
    """The provider's training step at the point (forward + backward under bf16 autocast, then
    zero_grad; with optimizer, a fused AdamW step too), on `model` (built here when None).
    padding ("right" or "left", HF providers only): a fine-tuning batch, see padded_batch.
    Raises NotImplementedError when the Triton model lacks a kernel API the config needs."""
    hf = provider.startswith("hf-")
    if model is None:
        model = ModelSlot().get(model_kind(provider), config, device)
    idx = torch.randint(0, config.vocab_size, (point.batch, point.context), device=device)
    targets = torch.roll(idx, -1, dims=1)
    hf_inputs = {"input_ids": idx, "labels": idx}
    if padding != "none":
        mask = padded_batch(point.batch, point.context, padding, device)
        hf_inputs = {"input_ids": idx, "attention_mask": mask, "labels": idx.masked_fill(mask == 0, -100)}
    fused_adam = {"fused": True} if device.type == "cuda" else {}
    adam = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused_adam) if optimizer else None

    def make_step(forward):
        def step():
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = forward(**hf_inputs).loss if hf else forward(idx, targets)[1]
            loss.backward()
            if adam is not None:
                adam.step()
            model.zero_grad(set_to_none=True)

        return step

    eager = make_step(model)
    if provider.endswith("+graph"):
        fn = make_step(GraphedModel(model, warmup=GRAPH_WARMUP))
        warm, prepare = eager, fn  # the first graphed step captures
    else:
        fn = make_step(torch.compile(model)) if "compile" in provider else eager
        warm, prepare = fn, None
    loss = None
    if hf:
        loss = {"": "logits (HF)", "tritonformer": "fused (tritonformer)", "liger": "fused (Liger)"}[
            provider.partition("+")[2]
        ]
    tokens = point.batch * point.context
    return TrainingStep(
        fn=fn,
        warm=warm,
        prepare=prepare,
        loss=loss or ("fused" if config.fused_loss else "logits"),
        params_millions=config.num_params(matmul_only=False) / 1e6,  # the same for every provider
        flops=config.flops_per_token(point.context) * tokens,
        tokens=tokens,
    )


def time_training_steps(step: TrainingStep, warmup: int, steps: int, device: torch.device) -> tuple:
    """(ms per step, peak GiB allocated during prepare and the timed steps); on a CPU (a smoke
    test) no peak."""
    for _ in range(warmup):
        step.warm()
    if device.type != "cuda":
        if step.prepare is not None:
            step.prepare()
        started = time.perf_counter()
        for _ in range(steps):
            step.fn()
        return (time.perf_counter() - started) / steps * 1e3, None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    if step.prepare is not None:
        step.prepare()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step.fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps, torch.cuda.max_memory_allocated() / 2**30


def run_point(point: Point, provider: str, args: argparse.Namespace, slot: Optional[ModelSlot] = None) -> Result:
    """Measure one row; any failure becomes the row's status (the run goes on)."""
    started = time.perf_counter()
    slot = slot or ModelSlot()
    config = point_config(point, provider, args.overrides, args.fused_loss)
    result = Result(str(point), provider, "ok")
    device = torch.device(args.device)
    reason = skip_reason(provider, config, device)
    if reason:
        result.status = f"skipped: {reason}"
        return result
    step = None
    try:
        model = slot.get(model_kind(provider), config, device)
        step = training_step(point, provider, config, device, args.optimizer, model, args.padding)
        result.loss, result.params_millions = step.loss, step.params_millions
        ms, peak = time_training_steps(step, args.warmup, args.steps, device)
        result.step_ms, result.peak_gib = ms, peak
        result.tokens_per_s = step.tokens / ms * 1e3
        result.model_tflops = step.flops / ms / 1e9
    except torch.cuda.OutOfMemoryError:
        result.status = "OOM"
        slot.clear(device)
    except NotImplementedError as error:  # a kernel package API the Triton model needs is missing
        result.status = f"skipped: {error}"
    except Exception as error:  # noqa: BLE001 - one failing provider must not lose the others' rows
        result.status = f"error: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        traceback.print_exc(file=sys.stderr)
        slot.clear(device)
    finally:
        step = None
        release_memory(device)
        result.seconds = time.perf_counter() - started
    return result


def _fmt(value: Optional[float], spec: str) -> str:
    return "" if value is None else format(value, spec)


def markdown(results: List[Result], environment: str) -> str:
    anchors: Dict[str, Result] = {r.point: r for r in results if r.provider == ANCHOR and r.status == "ok"}
    lines = [
        f"{environment}\n",
        f"| config (preset:context:batch) | provider | params (M) | loss | step ms | tokens/s | model TFLOP/s "
        f"| peak GiB | vs {ANCHOR} |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.status != "ok":
            lines.append(f"| {r.point} | {r.provider} | {_fmt(r.params_millions, '.1f')} | {r.status} ||||||")
            continue
        anchor = anchors.get(r.point)
        ratio = anchor.step_ms / r.step_ms if anchor else None
        lines.append(
            f"| {r.point} | {r.provider} | {_fmt(r.params_millions, '.1f')} | {r.loss} | {r.step_ms:.1f} "
            f"| {r.tokens_per_s:,.0f} | {r.model_tflops:.1f} | {_fmt(r.peak_gib, '.1f')} | {_fmt(ratio, '.2f')} |"
        )
    return "\n".join(lines) + "\n"


def write_csv(results: List[Result], path: pathlib.Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[field.name for field in dataclasses.fields(Result)])
        writer.writeheader()
        for r in results:
            writer.writerow(dataclasses.asdict(r))


def plot(results: List[Result], path: pathlib.Path, title: str) -> Optional[str]:
    """A grouped bar chart of model TFLOP/s; returns why not when matplotlib does not import."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        return f"matplotlib is not importable ({error}): no PNG written (pip install matplotlib)"
    points = list(dict.fromkeys(r.point for r in results))
    providers = list(dict.fromkeys(r.provider for r in results))
    width = 0.8 / max(1, len(providers))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(points) * max(1, len(providers)) / 3), 4.5))
    for i, provider in enumerate(providers):
        values = {r.point: r.model_tflops for r in results if r.provider == provider and r.status == "ok"}
        xs = [j + i * width for j, p in enumerate(points) if p in values]
        ax.bar(xs, [values[p] for p in points if p in values], width, label=provider)
    ax.set_xticks([j + width * (len(providers) - 1) / 2 for j in range(len(points))])
    ax.set_xticklabels(points, rotation=15)
    ax.set_ylabel("model TFLOP/s (6N + 12 L d S per token)")
    ax.set_title(title, fontsize=8, wrap=True)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def parse_providers(values: Optional[Iterable[str]]) -> List[str]:
    names = split_list(values)
    if not names:
        return list(DEFAULT_PROVIDERS)
    if names == ["all"]:
        return list(PROVIDERS)
    unknown = [name for name in names if name not in PROVIDERS]
    if unknown:
        raise ValueError(f"unknown provider {unknown[0]!r}; choose from {', '.join(PROVIDERS)} (or all)")
    return list(dict.fromkeys(names))


def device_name(text: str) -> str:
    """cpu, cuda or cuda:N (there is no auto: this command times GPUs)."""
    try:
        if text == "auto":
            raise ValueError("unknown device 'auto'; choose cuda, cuda:N or cpu")
        check_device_name(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tritonformer-bench", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)  # fmt: skip
    p.add_argument("--config", "--configs", dest="config", nargs="+", action="extend", metavar="PRESET:CONTEXT:BATCH",
                   help=f"points to time, space- or comma-separated (default: {' '.join(HEADLINE)})")  # fmt: skip
    p.add_argument("--generate", action="store_true",
                   help="time generation with a KV cache instead (options: --generate --help)")  # fmt: skip
    p.add_argument("--sweep", choices=("headline", "sizes"), default="headline",
                   help="a named set of points, when --config is not given")  # fmt: skip
    p.add_argument("--providers", "--provider", dest="providers", nargs="+", action="extend", metavar="PROVIDER",
                   help=f"space- or comma-separated, run in this order, or 'all' "
                   f"(default: {','.join(DEFAULT_PROVIDERS)}; all: {','.join(PROVIDERS)})")  # fmt: skip
    p.add_argument("--fused-loss", choices=("ours", "all", "none"), default="ours",
                   help="which providers compute the loss with fused linear+cross-entropy")  # fmt: skip
    p.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[], metavar="OPTION=VALUE",
                   help="TransformerConfig options for every point, e.g. activation_checkpointing=true")  # fmt: skip
    p.add_argument("--padding", choices=("none", "right", "left"), default="none",
                   help="HF rows only: fine-tuning batches, each row a random number of real tokens in "
                   "[context/4, context] padded on this side (masked in attention, ignored by the loss)")  # fmt: skip
    p.add_argument("--optimizer", action="store_true", help="include a fused AdamW step in each timed step")
    p.add_argument("--warmup", type=positive_int, default=2,
                   help="untimed steps first (the first compiles and autotunes)")  # fmt: skip
    p.add_argument("--steps", type=positive_int, default=5, help="timed steps")
    p.add_argument("--time-budget", type=non_negative_float, default=None, metavar="SECONDS",
                   help="skip the rows expected to end after this many seconds: those starting later, and "
                   "those whose provider's previous row took longer than what is left")  # fmt: skip
    p.add_argument("--out-dir", default="bench-out", help="where bench.csv, bench.md and bench.png go")
    p.add_argument("--device", type=device_name, default="cuda",
                   help="cuda or cuda:N; cpu only smoke-tests this command (no peak memory; the tritonformer rows "
                   "run only under TRITON_INTERPRET=1)")  # fmt: skip
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        args.providers = parse_providers(args.providers)
        names = split_list(args.config) or (SIZES_SWEEP if args.sweep == "sizes" else HEADLINE)
        args.points = [Point.parse(name) for name in names]
    except ValueError as error:
        p.error(str(error))
    overrides = {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep:
            p.error(f"--set takes OPTION=VALUE, got {item!r}")
        overrides[key] = parse_value(value)
    args.overrides = overrides
    if args.padding != "none":
        others = [name for name in args.providers if not name.startswith("hf-")]
        if others:
            p.error(f"--padding applies to the HF providers only (hf-*), got {', '.join(others)}")
    return args


def run_order(points: List[Point], providers: List[str]) -> List[Tuple[Point, str]]:
    """Point by point in the given provider order; Liger's rows last (it patches the Llama
    classes of the whole process, so every plain row must run before it)."""
    runs = [(point, provider) for point in points for provider in providers]
    return sorted(runs, key=lambda run: run[1].endswith("+liger"))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--generate" in argv:
        from . import bench_generate

        return bench_generate.main([arg for arg in argv if arg != "--generate"])
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("tritonformer-bench times training steps on a CUDA GPU; none is available here", file=sys.stderr)
        return 2
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        print(f"tritonformer-bench: error: {args.device}: torch sees {torch.cuda.device_count()} CUDA GPU(s)",
              file=sys.stderr)  # fmt: skip
        return 2
    started = time.perf_counter()
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    environment = environment_line(device)
    print(environment, flush=True)
    by_run: Dict[Tuple[str, str], Result] = {}
    last_seconds: Dict[str, float] = {}  # each provider's last row: what its next row is expected to take
    slot = ModelSlot()
    for point, provider in run_order(args.points, args.providers):
        expected_end = time.perf_counter() - started + last_seconds.get(provider, 0.0)
        if args.time_budget is not None and expected_end > args.time_budget:
            result = Result(str(point), provider, f"skipped: time budget of {args.time_budget:g} s")
        else:
            result = run_point(point, provider, args, slot)
            last_seconds[provider] = result.seconds or 0.0
        by_run[str(point), provider] = result
        print(f"{point} {provider}: {result.status} {_fmt(result.step_ms, '.1f')} ms "
              f"{_fmt(result.model_tflops, '.1f')} TFLOP/s {_fmt(result.peak_gib, '.1f')} GiB "
              f"({_fmt(result.seconds, '.0f')} s)", flush=True)  # fmt: skip
        measured = [by_run[key] for key in ((str(p), v) for p in args.points for v in args.providers) if key in by_run]
        write_csv(measured, out / "bench.csv")
        (out / "bench.md").write_text(markdown(measured, environment))
    slot.clear(device)
    results = [by_run[str(point), provider] for point in args.points for provider in args.providers]
    table = markdown(results, environment)
    print(table)
    why_not = plot(results, out / "bench.png", environment)
    print(why_not or f"wrote {out / 'bench.csv'}, {out / 'bench.md'} and {out / 'bench.png'}")
    print(f"{time.perf_counter() - started:.0f} s in all", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
