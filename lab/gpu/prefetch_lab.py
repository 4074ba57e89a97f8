"""Can L2 prefetches of upcoming weights, issued on a parallel branch, shorten a batch-1 decode step?

    python3 lab/gpu/prefetch_lab.py      (on a GPU; markdown on stdout)

The llama-1.4B decode step reads about 2.6 GB of weights; at the copy ceiling that is about
0.65 ms, and the step takes about 1.4 ms. Each product's kernel starts with a ramp (launch, first
loads from HBM) and the small kernels between them (norms, RoPE, attention at a short cache)
leave HBM mostly idle. Here forward pre-hooks fork a side stream inside the captured decode step
and launch a kernel that only issues `prefetch.global.L2::evict_last` for the first part (or all)
of the weights the next kernels will read; the branch joins before the next fork. The graph then
runs the prefetch beside the main chain. Variants are measured in turn in one process (graph
replay median, microseconds per step), each twice, alternating, and the logits of every variant
must equal those without prefetch bit for bit. A lab tool: it changes nothing.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
import triton.testing

LINES_PER_PROGRAM = 512
LINE = 128


@triton.jit
def _prefetch_kernel(ptr, flag_ptr, n_lines, LINES: tl.constexpr, LINE_BYTES: tl.constexpr):
    lines = tl.program_id(0) * LINES + tl.arange(0, LINES)
    lines = tl.minimum(lines, n_lines - 1)
    addresses = ptr + lines.to(tl.int64) * LINE_BYTES
    r = tl.inline_asm_elementwise(
        "prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l", [addresses], dtype=tl.int32,
        is_pure=False, pack=1,
    )  # fmt: skip
    # Never taken (r is 0); keeps the asm's result used.
    tl.store(flag_ptr + tl.arange(0, LINES), r, mask=r != 0)


FLAG = {}


def prefetch(t: torch.Tensor, fraction: float = 1.0) -> None:
    flat = t.detach().reshape(-1).view(torch.uint8)
    n_lines = max(1, int(flat.numel() * fraction) // LINE)
    flag = FLAG.setdefault(t.device, torch.zeros(LINES_PER_PROGRAM, dtype=torch.int32, device=t.device))
    grid = (triton.cdiv(n_lines, LINES_PER_PROGRAM),)
    _prefetch_kernel[grid](flat, flag, n_lines, LINES=LINES_PER_PROGRAM, LINE_BYTES=LINE, num_warps=4)


class Prefetcher:
    """Forward pre-hooks that fork a side stream at chosen modules and prefetch chosen weights there."""

    def __init__(self, model, plan):
        self.side = torch.cuda.Stream()
        self.open = False
        self.handles = []
        blocks = model.blocks
        for i, block in enumerate(blocks):
            nxt = blocks[i + 1] if i + 1 < len(blocks) else None
            for point, module in (("attn", block.attn), ("proj", block.attn.proj), ("mlp", block.mlp)):
                items = [item for item in plan.get(point, []) if item[0] != "next_qkv" or nxt is not None]
                tensors = []
                for name, fraction in items:
                    tensors.append((self._tensor(block, nxt, name), fraction))
                self.handles.append(module.register_forward_pre_hook(functools.partial(self.hook, tensors)))
        self.handles.append(model.lm_head.register_forward_pre_hook(functools.partial(self.hook, [])))

    @staticmethod
    def _tensor(block, nxt, name):
        return {
            "proj": lambda: block.attn.proj.weight,
            "gate": lambda: block.mlp.w_gate,
            "up": lambda: block.mlp.w_up,
            "down": lambda: block.mlp.w_down,
            "next_qkv": lambda: nxt.attn.qkv.weight,
        }[name]()

    def hook(self, tensors, module, args):
        current = torch.cuda.current_stream()
        if self.open:
            current.wait_stream(self.side)
            self.open = False
        if tensors:
            self.side.wait_stream(current)
            with torch.cuda.stream(self.side):
                for t, fraction in tensors:
                    prefetch(t, fraction)
            self.open = True

    def remove(self):
        for h in self.handles:
            h.remove()


PLANS = {
    "none": {},
    "proj at attn": {"attn": [("proj", 1.0)]},
    "proj + gate/up 25% at attn": {"attn": [("proj", 1.0), ("gate", 0.25), ("up", 0.25)]},
    "proj + gate/up 50% at attn": {"attn": [("proj", 1.0), ("gate", 0.5), ("up", 0.5)]},
    "proj + gate/up 25% at attn, down 50% at mlp": {
        "attn": [("proj", 1.0), ("gate", 0.25), ("up", 0.25)],
        "mlp": [("down", 0.5)],
    },
    "proj + gate/up 25% at attn, down 50% + next qkv 25% at mlp": {
        "attn": [("proj", 1.0), ("gate", 0.25), ("up", 0.25)],
        "mlp": [("down", 0.5), ("next_qkv", 0.25)],
    },
    "gate/up 25% at proj": {"proj": [("gate", 0.25), ("up", 0.25)]},
}


@torch.no_grad()
def main() -> None:
    from decode_lab import _models, prefilled, prompt_tokens

    from tritonformer import generation

    config, ours, _ = _models()
    tokens = prompt_tokens(config)
    cache, next_tokens, active = prefilled(ours, tokens)
    graphs, reference = {}, None
    for name, plan in PLANS.items():
        prefetcher = Prefetcher(ours, plan)
        graph = generation.DecodeGraph(ours, cache, 1, tokens.dtype, torch.device("cuda"))
        prefetcher.remove()
        logits = graph(next_tokens, active).clone()
        if reference is None:
            reference = logits
        graphs[name] = (graph, bool(torch.equal(logits, reference)))
    print("| variant | replay us per step (first) | (second) | logits equal |")
    print("|---|---:|---:|---|")
    times = {name: [] for name in PLANS}
    for _ in range(2):
        for name, (graph, _) in graphs.items():
            replay = functools.partial(graph, next_tokens, active)
            times[name].append(triton.testing.do_bench(replay, warmup=10, rep=100, return_mode="median") * 1e3)
    for name, (_graph, equal) in graphs.items():
        print(f"| {name} | {times[name][0]:.0f} | {times[name][1]:.0f} | {equal} |", flush=True)


if __name__ == "__main__":
    main()
