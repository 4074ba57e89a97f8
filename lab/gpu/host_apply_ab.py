"""A/B of the runtime's eager_function_apply (the C++ apply of the autograd Functions) against
torch's Python apply, per eager call at tiny shapes (the `host` group's), in one process: the
torch path is forced by making every package's runtime see an active functorch transform.

python3 lab/gpu/host_apply_ab.py   (on a GPU; markdown rows: op, mode, C++ apply us, torch apply us, torch op us)
"""

from __future__ import annotations

import functools
import statistics
import sys

import torch
import torch.nn.functional as F
from tritonformer_testkit.bench import _eager_call, eager_us_per_call

import fused_attention
import fused_gemm
import fused_norm_xent
import fused_rope
import fused_swiglu

PACKAGES = (fused_attention, fused_gemm, fused_norm_xent, fused_rope, fused_swiglu)


def _param(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)


def _torch_apply(on: bool) -> None:
    for package in PACKAGES:
        registration = sys.modules[f"{package.__name__}._runtime.registration"]
        registration._functorch_transforms_active = (lambda: True) if on else (lambda: False)


def cases():
    x, w, b = _param(64, 1024), _param(1024), _param(1024)
    yield (
        "rms_norm",
        functools.partial(fused_norm_xent.rms_norm, x, 1024, w, 1e-6),
        functools.partial(F.rms_norm, x, (1024,), w, 1e-6),
    )
    yield (
        "layer_norm",
        functools.partial(fused_norm_xent.layer_norm, x, 1024, w, b, 1e-6),
        functools.partial(F.layer_norm, x, (1024,), w, b, 1e-6),
    )
    logits, target = _param(64, 1000), torch.randint(0, 1000, (64,), device="cuda")
    yield (
        "cross_entropy",
        functools.partial(fused_norm_xent.cross_entropy, logits, target),
        functools.partial(F.cross_entropy, logits, target),
    )
    a, m = _param(64, 1024), _param(1024, 1024)
    yield "matmul", functools.partial(fused_gemm.matmul, a, m), functools.partial(torch.matmul, a, m)
    wg, wu, wd = _param(1024, 2816), _param(1024, 2816), _param(2816, 1024)
    yield (
        "swiglu_mlp",
        functools.partial(fused_swiglu.swiglu_mlp, a, wg, wu, wd),
        (lambda: (F.silu(a @ wg) * (a @ wu)) @ wd),
    )
    q, k, v = _param(1, 128, 8, 64), _param(1, 128, 8, 64), _param(1, 128, 8, 64)
    yield (
        "flash_attention",
        functools.partial(fused_attention.flash_attention, q, k, v, causal=True, layout="bshd"),
        (
            lambda: F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
        ),
    )
    qr, kr = _param(1, 8, 128, 64), _param(1, 8, 128, 64)
    cos, sin = torch.randn(128, 64, device="cuda"), torch.randn(128, 64, device="cuda")
    yield "rope_qk", functools.partial(fused_rope.apply_rotary_qk, qr, kr, cos, sin), None


def main() -> None:
    print("| op | mode | C++ apply us | torch apply us | torch op us |")
    print("|---|---|---:|---:|---:|")
    for name, ours, theirs in cases():
        for mode in ("fwd", "fwd+bwd"):
            rounds = {"fast": [], "slow": [], "torch": []}
            for _ in range(3):
                for label in ("fast", "slow"):
                    _torch_apply(label == "slow")
                    rounds[label].append(eager_us_per_call(_eager_call(ours, mode)))
                _torch_apply(False)
                if theirs is not None:
                    rounds["torch"].append(eager_us_per_call(_eager_call(theirs, mode)))
            cells = [f"{statistics.median(r):.1f}" if r else "" for r in rounds.values()]
            print(f"| {name} | {mode} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
