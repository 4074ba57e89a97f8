"""Host time per call of fused-gemm's warp-specialized Gluon kernel (kernels.matmul_ws) against the
TMA kernel, both forced through ops.launch.launch_matmul, and torch's F.gelu(F.linear).

    python3 lab/gpu/gemm_ws_host.py      (Triton 3.6 on a Hopper GPU; markdown on stdout)

At 2048 x 1024 x 1024 (bias + GELU, bf16) the kernels take a few microseconds, so the loop of
calls measures the host: median of 7 windows of 200 calls issued without a sync. The forced ws
result is checked against torch's first. A lab tool: prints a table, changes nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from gemm_host_time import _host_us as host_us

from fused_gemm.kernels.common import ACTIVATION_CODES
from fused_gemm.ops.launch import launch_matmul

M, K, N = 2048, 1024, 1024


def main() -> None:
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    gelu = ACTIVATION_CODES["gelu"]

    def forced(path):
        return lambda: launch_matmul(x[None], w.t()[None], c[None], bias=b, activation=gelu, path=path)

    assert forced("ws")() == "ws"
    torch.testing.assert_close(c, F.gelu(F.linear(x, w, b)), atol=3e-2, rtol=3e-2)
    print("| provider | host us per call |")
    print("|---|---:|")
    for name, fn in (("ws (forced)", forced("ws")), ("tma (forced)", forced("tma")),
                     ("torch F.gelu(F.linear)", lambda: F.gelu(F.linear(x, w, b)))):  # fmt: skip
        print(f"| {name} | {host_us(fn):.1f} |", flush=True)


if __name__ == "__main__":
    main()
