"""How much precision fp16 accumulation costs, measured on the CPU with the modelled twin.

    python packages/fused-swiglu/benchmarks/fp16_accumulation_error.py

For each reduction length K (d_model), a (256, K) @ (K, 256) fp16 product with nn.Linear-scaled
weights is accumulated (a) in fp32 and rounded once to fp16, (b) in fp16 by the model of
`fused_swiglu.reference.fp16_accumulate_matmul` (16-wide exact chunks, one rounding per chunk,
to nearest or toward zero). Errors are against float64, relative to the mean |x @ w|. This is
the gate/up projection's error before the activation; the README quotes this table.
"""

import torch

from fused_swiglu.reference import ROUNDINGS, fp16_accumulate_matmul


def relative_errors(approx: torch.Tensor, exact: torch.Tensor) -> tuple:
    error = (approx.double() - exact).abs() / exact.abs().mean()
    return float(error.mean()), float(error.max())


def main() -> None:
    torch.manual_seed(0)
    print("| K | fp32 accumulate: mean / max | fp16, to nearest: mean / max | fp16, toward zero: mean / max |")
    print("|---:|---:|---:|---:|")
    for k in (1024, 2048, 4096, 8192):
        x = torch.randn(256, k).half()
        w = ((torch.rand(k, 256) * 2 - 1) * k**-0.5).half()
        exact = x.double() @ w.double()
        cells = [relative_errors((x.float() @ w.float()).half(), exact)]
        cells += [relative_errors(fp16_accumulate_matmul(x, w, rounding), exact) for rounding in ROUNDINGS]
        print(f"| {k} | " + " | ".join(f"{mean:.1e} / {worst:.1e}" for mean, worst in cells) + " |")


if __name__ == "__main__":
    main()
