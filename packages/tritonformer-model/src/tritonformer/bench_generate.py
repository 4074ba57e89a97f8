"""tritonformer-bench --generate: prefill and decode speed of generation with a KV cache.

    tritonformer-bench --generate [--presets 160M 410M llama-1.4B] [--batches 1 16] [--prompt 512]
                                  [--new-tokens 256] [--providers ...] [--repeats 3] [--out-dir DIR]

Providers, all with bf16 weights, greedy, without eos (every row runs all its new tokens):
- tritonformer: Transformer.generate, each decode step launched eagerly;
- tritonformer+graph: the same with cuda_graph=True (the decode step replayed as a CUDA graph);
- torch, torch+graph: the PyTorch twin (SDPA over its own cache), eager and graphed;
- torch.compile: the twin's decode step under torch.compile, replayed as a CUDA graph
  (cuda_graph=True), its prefill eager;
- hf-llama: transformers' LlamaForCausalLM.generate with a static cache (LLaMA-style presets).

Per row, the median of `--repeats` calls after one warm-up call: the time to the first token (the
prefill and one sampled token), prefill tokens/s (prompt tokens over that time) and decode
tokens/s (the tokens after the first, over the rest of a full call).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
from typing import Callable, List, Optional

import torch

from .bench_common import environment_line, hf_model, hf_skip_reason, release_memory, split_list
from .config import TransformerConfig
from .train import build_model

PROVIDERS = ("tritonformer", "tritonformer+graph", "torch", "torch+graph", "torch.compile", "hf-llama")
# LLaMA-style, so that Hugging Face's LlamaForCausalLM runs every preset beside ours.
PRESETS = ("llama-160M", "llama-410M", "llama-1.4B")


def _seconds(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def _generator(provider: str, config: TransformerConfig) -> Callable[[torch.Tensor, int], object]:
    """generate(prompt, n) of the provider's model (bf16, eval, on the GPU)."""
    if provider == "hf-llama":
        model = hf_model(config).cuda().to(torch.bfloat16).eval()

        def hf_generate(prompt, n):
            return model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                  cache_implementation="static", pad_token_id=0)  # fmt: skip

        return hf_generate
    model = build_model("triton" if provider.startswith("tritonformer") else "torch", config)
    model = model.cuda().to(torch.bfloat16).eval()
    if provider == "torch.compile":
        eager = model.forward_cached
        # Inductor's own CUDA graphs would skip this step (it writes into the cache, an input), so
        # generate captures the compiled step into its graph instead: inductor's fused kernels, one
        # replay per token.
        compiled = torch.compile(eager)

        def forward_cached(idx, cache):
            return compiled(idx, cache) if cache.decoding else eager(idx, cache)

        model.forward_cached = forward_cached
    graph = provider.endswith("+graph") or provider == "torch.compile"
    return lambda prompt, n: model.generate(prompt, n, temperature=0, cuda_graph=graph)


def measure(provider: str, config: TransformerConfig, batch: int, prompt_len: int, new_tokens: int, repeats: int):
    """(time to first token s, prefill tokens/s, decode tokens/s) of one provider at one point."""
    generate = _generator(provider, config)
    prompt = torch.randint(0, config.vocab_size, (batch, prompt_len), device="cuda")
    with torch.no_grad():
        generate(prompt, new_tokens)  # compiles, tunes, captures
        first = statistics.median(_seconds(lambda: generate(prompt, 1)) for _ in range(repeats))
        full = statistics.median(_seconds(lambda: generate(prompt, new_tokens)) for _ in range(repeats))
    return first, batch * prompt_len / first, batch * (new_tokens - 1) / max(full - first, 1e-9)


def skip_reason(provider: str, config: TransformerConfig) -> Optional[str]:
    if provider == "hf-llama":
        return hf_skip_reason(config, liger=False)
    return None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tritonformer-bench --generate", description=__doc__.split("\n")[0])
    p.add_argument("--presets", nargs="+", default=list(PRESETS), metavar="PRESET",
                   help=f"model presets (default: {' '.join(PRESETS)})")  # fmt: skip
    p.add_argument("--batches", nargs="+", type=int, default=[1, 16], metavar="B", help="batch sizes (default: 1 16)")
    p.add_argument("--prompt", type=int, default=512, help="prompt tokens per row (default 512)")
    p.add_argument("--new-tokens", type=int, default=256, help="tokens generated per row (default 256)")
    p.add_argument("--providers", nargs="+", default=list(PROVIDERS), metavar="PROVIDER",
                   help=f"any of {', '.join(PROVIDERS)} (default: all)")  # fmt: skip
    p.add_argument("--repeats", type=int, default=3, help="timed calls per row (default 3)")
    p.add_argument("--out-dir", default="bench-out", help="where generate.md goes")
    return p


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    args.presets, args.providers = split_list(args.presets), split_list(args.providers)
    for name in args.providers:
        if name not in PROVIDERS:
            p.error(f"unknown provider {name!r}; choose from {', '.join(PROVIDERS)}")
    for name in args.presets:
        try:
            TransformerConfig.preset(name)
        except ValueError as error:
            p.error(str(error))
    for flag, values in (("--batches", args.batches), ("--prompt", [args.prompt]), ("--repeats", [args.repeats])):
        if any(v < 1 for v in values):
            p.error(f"{flag} must be >= 1, got {values}")
    if args.new_tokens < 2:
        p.error(f"--new-tokens must be >= 2 (decode speed is measured after the first), got {args.new_tokens}")


def main(argv: Optional[List[str]] = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    _check(p, args)
    if not torch.cuda.is_available():
        print("tritonformer-bench --generate times generation on a CUDA GPU; none is available here", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    environment = environment_line(device, precision="bf16 weights")
    print(environment, flush=True)
    lines = [
        f"{environment}; prompt {args.prompt}, {args.new_tokens} new tokens, greedy", "",
        "| preset | batch | provider | first token ms | prefill tok/s | decode tok/s |",
        "|---|---:|---|---:|---:|---:|",
    ]  # fmt: skip
    for preset in args.presets:
        base = TransformerConfig.preset(preset)
        config = TransformerConfig.preset(preset, max_seq_len=max(base.max_seq_len, args.prompt + args.new_tokens))
        for batch in args.batches:
            for provider in args.providers:
                reason = skip_reason(provider, config)
                if reason is None:
                    try:
                        first, prefill, decode = measure(provider, config, batch, args.prompt, args.new_tokens,
                                                         args.repeats)  # fmt: skip
                        row = f"{first * 1e3:.1f} | {prefill:,.0f} | {decode:,.0f}"
                    except Exception as error:  # one provider's failure must not lose the others' rows
                        row = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:100]} | | "
                else:
                    row = f"skipped: {reason} | | "
                lines.append(f"| {preset} | {batch} | {provider} | {row} |")
                print(lines[-1], flush=True)
                release_memory(device)
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "generate.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'generate.md'}")
    return 0
