"""Does staggering the second program of each SM make the two-program gemm configs a real ping-pong?

    python3 lab/gpu/gemm_stagger_ab.py LAB_MATMUL_TMA_PY

The hypothesis (NOTES.md, session 12): two 4-warp programs per SM start together and do equal
work, so they reach their epilogues together, and the tensor cores idle through both; a program
that starts a little later keeps its epilogue beside the other's main loop from then on. The
lab file is kernels/matmul_tma.py with a start delay for the second program of an SM, set per
module load by GEMM_STAGGER_NS, GEMM_STAGGER_RULE (0: parity of a per-SM atomic counter,
1: pid >= NUM_SMS, 2: odd pid) and GEMM_STAGGER_COUNTERS (the counters' address).

For each product and epilogue, the two-program configs run pinned with the package's kernel and
with the lab variants, beside the package's one-program 128x256 config, cuBLAS and torch's
unfused sequence, all timed together by the tuner's timer (CUDA-graph replays, interleaved
rounds, medians). A lab tool for the GPU runs recorded in NOTES.md: it prints tables and
changes nothing.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch
import torch.nn.functional as F
from gemm_kernel_ab import EPILOGUES, PRODUCTS, _config, _pinned_launch

from fused_gemm.kernels import matmul_tma
from fused_gemm.kernels.common import ACTIVATION_CODES
from fused_gemm.ops import launch, tuning
from lab import gemm_operands, load_module_as

PING_PONG = [(128, 128, 4, 3, 2), (128, 128, 4, 2, 2), (128, 128, 8, 3, 2)]
ONE_PROGRAM = (128, 256, 8, 3, 1)
# (label, rule, nanoseconds)
VARIANTS = [("smid 3us", 0, 3000), ("smid 10us", 0, 10000), ("pid>=SMs 5us", 1, 5000)]


def _load(path: str, index: int, rule: int, ns: int, counters: torch.Tensor):
    os.environ.update(GEMM_STAGGER_NS=str(ns), GEMM_STAGGER_RULE=str(rule))
    os.environ["GEMM_STAGGER_COUNTERS"] = str(counters.data_ptr())
    return load_module_as(path, "fused_gemm.kernels", f"_stagger_{index}")._matmul_tma_kernel


def _placement(kernel, counters, a, b, c) -> str:
    """How many programs each SM got in one launch (the per-SM counters of rule 0)."""
    all_configs = kernel.configs
    config = _config(kernel, *PING_PONG[0])
    counters.zero_()
    _pinned_launch(kernel, config, a, b, c, dict(bias=None, activation=0, z=None, split=1))()
    torch.cuda.synchronize()
    kernel.configs = all_configs
    counts = counters[counters > 0].tolist()
    histogram = {value: counts.count(value) for value in sorted(set(counts))}
    return f"programs per SM in one launch -> SMs: {histogram} (SMs used {len(counts)})"


def main(lab_path: str) -> None:
    counters = torch.zeros(4096, dtype=torch.int32, device="cuda")
    ours = matmul_tma._matmul_tma_kernel
    labs = [_load(lab_path, i, rule, ns, counters) for i, (_, rule, ns) in enumerate(VARIANTS)]
    kernels = [ours, *labs]
    names = ["base", *(label for label, _, _ in VARIANTS)]
    saved = [list(kernel.configs) for kernel in kernels]
    print("| product | epilogue | config | " + " | ".join(f"{n} ms" for n in names) + " | best lab / base |")
    print("|---|---|---|" + "---:|" * (len(names) + 1))
    for m, k, n in PRODUCTS:
        a, w, b, bias, c, z = gemm_operands(m, k, n)
        if (m, k, n) == PRODUCTS[0]:
            print(_placement(labs[0], counters, a, b, c), flush=True)
        x = a[0]
        for label, has_bias, activation, store_z in EPILOGUES:
            if label not in ("plain", "+bias gelu"):
                continue
            kwargs = dict(bias=bias if has_bias else None, activation=ACTIVATION_CODES[activation],
                          z=z if store_z else None, split=1)  # fmt: skip
            launches, rows = [], []
            for shape in [*PING_PONG, ONE_PROGRAM]:
                row = []
                for kernel, configs in zip(kernels if shape in PING_PONG else kernels[:1], saved):
                    kernel.configs = configs
                    config = _config(kernel, *shape)
                    call = _pinned_launch(kernel, config, a, b, c, kwargs)
                    call()
                    if kernel is ours:
                        reference = c.clone()
                    elif not torch.equal(c, reference):  # same math, same order: bit-identical
                        print(f"lab output differs: {m}x{k}x{n} {label} {shape}", flush=True)
                    c.fill_(float("nan"))
                    row.append(len(launches))
                    launches.append(call)
                rows.append(("{}x{} w{} s{} p{}".format(*shape), row))
            anchors = [("cuBLAS plain", lambda x=x, w=w: F.linear(x, w))]
            if activation is not None:
                anchors.append(("torch F.gelu(F.linear)", lambda x=x, w=w, b=bias: F.gelu(F.linear(x, w, b))))
            for name, fn in anchors:
                rows.append((name, [len(launches)]))
                launches.append(fn)
            samples = tuning.replay_rounds(launches, tuning.ROUNDS)
            ms = [statistics.median(times) for times in samples]
            for name, row in rows:
                cells = [f"{ms[i]:.4f}" for i in row] + [""] * (len(names) - len(row))
                ratio = f"{min(ms[i] for i in row[1:]) / ms[row[0]]:.3f}" if len(row) > 1 else ""
                print(f"| {m}x{k}x{n} | {label} | {name} | " + " | ".join(cells) + f" | {ratio} |", flush=True)
    launch._matmul_tma_kernel = ours
    for kernel, configs in zip(kernels, saved):
        kernel.configs = configs


if __name__ == "__main__":
    main(sys.argv[1])
