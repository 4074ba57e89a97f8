"""Data-parallel training with PyTorch's own engines (DDP, FSDP2), checked against one process.

    torchrun --nproc_per_node 2 -m tritonformer.distributed --engine ddp
    torchrun --nproc_per_node 2 -m tritonformer.distributed --engine fsdp2 --preset tiny-llama

Every rank builds the same model from the same seed and takes its slice of one global batch
(windows of the default corpus). The wrapped model trains for --steps AdamW steps; the loss of
the global batch is the mean of the ranks' losses (each rank holds as many tokens). Rank 0
also trains an unwrapped copy on the whole global batch, as a single-GPU run would, and
compares the two loss curves: the command exits 1 if a step differs by more than --rtol,
and prints one JSON line with both curves. NCCL on CUDA devices, gloo on CPUs.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys

import torch
import torch.distributed as dist

from . import data
from ._compat import fully_shard
from .config import PRESETS, TransformerConfig
from .train import MODELS, build_model, parse_value

ENGINES = ("ddp", "fsdp2")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tritonformer.distributed", description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=ENGINES, default="ddp")
    p.add_argument("--model", choices=MODELS, default="triton")
    p.add_argument("--preset", choices=list(PRESETS), default="tiny")
    p.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="OPTION=VALUE")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch-per-rank", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--dtype", choices=("auto", "fp32", "bf16"), default="auto",
                   help="bf16: autocast; auto: bf16 for the Triton model, fp32 for the twin")  # fmt: skip
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--rtol", type=float, default=None,
                   help="largest relative loss difference allowed (default: 1e-4 in fp32; 1e-2 in bf16, where "
                        "the Triton model's loss is itself bf16)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.dtype == "auto":
        args.dtype = "bf16" if args.model == "triton" else "fp32"
    if args.rtol is None:
        args.rtol = 1e-2 if args.dtype == "bf16" else 1e-4
    args.overrides = {k: parse_value(v) for k, _, v in (item.partition("=") for item in args.overrides)}
    return args


def wrap(model: torch.nn.Module, engine: str, device: torch.device) -> torch.nn.Module:
    """DDP, or FSDP2 with each block sharded on its own and the rest (embeddings, head) at the root."""
    if engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    shard = fully_shard()
    if shard is None:
        raise RuntimeError(f"torch {torch.__version__} has no FSDP2 fully_shard (torch >= 2.4 needed)")
    for block in model.blocks:
        shard(block)
    return shard(model)


def train_losses(model, batches, lr: float, autocast_dtype, device: torch.device, reduce: bool) -> list:
    """Loss of each step's batch before its AdamW step; with reduce, the mean over the ranks."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for x, y in batches:
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype != torch.float32):
            _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.detach().float()
        if reduce:
            dist.all_reduce(value)
            value /= dist.get_world_size()
        losses.append(value.item())
    return losses


def main(argv=None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    autocast_dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    try:
        config = TransformerConfig.preset(args.preset, **args.overrides)
        torch.manual_seed(args.seed)
        model = build_model(args.model, config).to(device)  # the same weights on every rank
        single = copy.deepcopy(model) if rank == 0 else None

        corpus = data.default_corpus()
        generator = torch.Generator().manual_seed(args.seed)
        global_batch = args.batch_per_rank * world
        batches = [data.get_batch(corpus.train, global_batch, args.seq_len, generator) for _ in range(args.steps)]
        batches = [(x.to(device), y.to(device)) for x, y in batches]
        mine = slice(rank * args.batch_per_rank, (rank + 1) * args.batch_per_rank)
        local = [(x[mine], y[mine]) for x, y in batches]

        wrapped = wrap(model, args.engine, device)
        parallel = train_losses(wrapped, local, args.lr, autocast_dtype, device, reduce=True)
        ok = torch.ones((), device=device)
        if rank == 0:
            reference = train_losses(single, batches, args.lr, autocast_dtype, device, reduce=False)
            worst = max(abs(a - b) / abs(b) for a, b in zip(parallel, reference))
            ok.fill_(float(worst <= args.rtol))
            print(json.dumps({
                "engine": args.engine, "model": args.model, "preset": args.preset, "world_size": world,
                "global_batch": global_batch, "dtype": args.dtype, "parallel_losses": parallel,
                "single_losses": reference, "max_relative_difference": worst, "rtol": args.rtol,
                "match": bool(worst <= args.rtol),
            }), flush=True)  # fmt: skip
        dist.broadcast(ok, src=0)
        # Every rank past its last collective before any tears the group down.
        dist.barrier()
        return 0 if ok.item() == 1 else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    code = main()
    # Leave without interpreter finalization: a gloo worker thread can still hold tensors there, and a
    # thread that needs the GIL while the interpreter finalizes aborts the whole process
    # ("terminate called without an active exception") after the run has already succeeded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
