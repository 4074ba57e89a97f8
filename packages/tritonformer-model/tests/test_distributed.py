"""DDP and FSDP2 training steps under torchrun: the losses match one process on the same global batch."""

import json
import os
import subprocess
import sys

import pytest
import torch

from tritonformer._compat import fully_shard

# Largest relative loss difference between the data-parallel run and one process, per step.
# fp32 (the PyTorch twin) differs only in the order of the gradient reductions: measured 2e-7 on
# 2 CPU processes (gloo). Under bf16 autocast the Triton model's loss is itself bf16 (fused_norm_xent
# returns it in the logits' dtype), so the mean of the ranks' losses and the one-process loss
# differ by up to about one bf16 ulp of the loss: measured 3.0e-3 (DDP and FSDP2, interpreted, gloo).
RTOL = {"fp32": 1e-4, "bf16": 1e-2}


def torchrun(*args: str, nproc: int = 2, env=None) -> dict:
    """Run tritonformer.distributed on nproc processes; its JSON line, or fail with its output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **(env or {})}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    result = subprocess.run(
        [*command, "-m", "tritonformer.distributed", *args], capture_output=True, text=True, env=env, timeout=300
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert result.returncode == 0 and lines, f"exit {result.returncode}\n{result.stdout}\n{result.stderr[-4000:]}"
    return json.loads(lines[-1])


def needs_fsdp2(engine):
    if engine == "fsdp2" and fully_shard() is None:
        pytest.skip(f"torch {torch.__version__} has no FSDP2 fully_shard (torch >= 2.4)")


@pytest.mark.torch_dynamo
def test_fsdp2_on_two_cpu_processes():
    """The command's own check on 2 CPU processes (gloo), plain-PyTorch model (about 15 s: one
    engine here; both engines run with the Triton model on 2 GPUs below)."""
    needs_fsdp2("fsdp2")
    out = torchrun("--engine", "fsdp2", "--model", "torch", "--preset", "tiny-llama", "--steps", "3",
                   "--rtol", str(RTOL["fp32"]), env={"TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": ""})  # fmt: skip
    assert out["match"] and out["world_size"] == 2 and len(out["parallel_losses"]) == 3


@pytest.mark.gpu(reason="DDP and FSDP2 over NCCL need 2 CUDA GPUs")
@pytest.mark.parametrize("model, dtype", [("triton", "bf16"), ("torch", "fp32")])
@pytest.mark.parametrize("engine", ["ddp", "fsdp2"])
@pytest.mark.parametrize("preset", ["tiny", "tiny-llama"])
def test_two_gpus(engine, preset, model, dtype):
    """The Triton model under bf16 autocast (its attention is fp16/bf16 only); the twin in fp32."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA GPUs, this machine has {torch.cuda.device_count()}")
    needs_fsdp2(engine)
    out = torchrun("--engine", engine, "--model", model, "--preset", preset, "--dtype", dtype,
                   "--batch-per-rank", "8", "--seq-len", "64", "--rtol", str(RTOL[dtype]))  # fmt: skip
    assert out["match"], out
