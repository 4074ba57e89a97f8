"""Training steps whose forward and backward replay CUDA graphs: no Python between the kernels.

Why: on the H100 box each fused op's Python and launch path costs about 0.3-0.5 ms per forward
call and 1-2 ms per forward + backward (the kernel benchmarks' "host us/call" column), and a
24-layer GPT makes hundreds of such calls per step: more host time than the GPU needs for the
step at 410M-1.4B, so the GPU waits. A CUDA graph records the launches once; a replay is one call.

    graphed = GraphedModel(model)                  # captures at the first training call
    for x, y in batches:                           # every batch the same (B, S)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, loss = graphed(x, y)           # model(x, y), the body replayed
        loss.backward()                            # the body's backward replayed
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)      # required: see below

What is captured (torch.cuda.make_graphed_callables): `model.hidden_states` (embeddings, blocks,
final norm) as one forward and one backward graph, reading the token ids from a static buffer
that each call copies into. Before capturing, the body runs `warmup` times eagerly on a side
stream, so that every Triton kernel is compiled and autotuned (autotuning times candidates with
host synchronizations, which capture forbids). The first training call captures under the
autocast state it is made in (autocast's weight-cast cache off, as capture requires); later
calls must be made in the same state.

What stays eager, between the two replays: `model.output` (head and loss). fused_norm_xent's
cross-entropy validates the targets by reading their range back to the host, one
synchronization per call that cannot be captured (and that a replay would silently skip), and
it has no option to leave the check out. It is a few launches per step (chunked matmuls and one
kernel per chunk) against hundreds in the body, and its synchronization waits only for the
forward replay, while the chunks it has queued keep the GPU busy. The optimizer step, gradient
clipping and a GradScaler stay eager too (fused AdamW: a few multi-tensor launches).

Limits, checked:
- one (B, S) per GraphedModel: another shape raises (make another GraphedModel for it);
- dropout and attention_dropout must be 0: the dropout kernels draw their masks' keys on the device, as torch's
  dropout does (a replay draws new ones), but a replayed training step with dropout has not been
  checked against the eager model on a GPU, nor activation checkpointing's RNG stash inside a
  capture;
- not under torch.compile (it makes its own graphs: mode="reduce-overhead");
- gradients are written into the graph's static buffers, which the next replay overwrites:
  each training call needs the parameters' .grad to be None (zero_grad(set_to_none=True)), so
  gradient accumulation over micro-batches is not supported (a call raises otherwise).
In eval mode or without grad the call is the eager model(idx, targets).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn
from torch.cuda import make_graphed_callables

from ._base import CausalLM
from ._compat import autocast_dtype

DEFAULT_WARMUP = 3


def check_graphable(model: nn.Module) -> None:
    """Raise ValueError if the model cannot train through CUDA graphs (see the module docstring)."""
    if not isinstance(model, CausalLM):
        raise TypeError(f"model must be a Transformer or TorchTransformer, got {type(model).__name__}")
    if model.config.dropout > 0 or model.config.attention_dropout > 0:
        raise ValueError(
            f"CUDA graphs need dropout=0 and attention_dropout=0 (got {model.config.dropout}, "
            f"{model.config.attention_dropout}): a replayed training step with dropout has not been validated "
            "against the eager model"
        )


class _HiddenStates(nn.Module):
    """model.hidden_states as a module: what make_graphed_callables captures, with the model's parameters."""

    def __init__(self, model: CausalLM):
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model.hidden_states(idx)  # (B, S, d)


class GraphedModel:
    """`model(idx, targets)` for training, with the body's forward and backward replayed from CUDA graphs.

    model: a Transformer or TorchTransformer on a CUDA device, dropout 0. warmup: eager runs of
    the body (forward and backward, on a side stream) before it is captured.
    """

    def __init__(self, model: CausalLM, warmup: int = DEFAULT_WARMUP):
        check_graphable(model)
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1 (kernels compile and autotune there, not in a graph), got {warmup}")
        self.model = model
        self.warmup = warmup
        self.shape: Optional[Tuple[int, int]] = None  # (B, S) of the captured graphs
        self.amp: Optional[torch.dtype] = None  # the autocast dtype they were captured under
        self._body = None  # the graphed _HiddenStates, once captured

    @property
    def captured(self) -> bool:
        return self._body is not None

    def __call__(
        self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None
    ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """As model(idx, targets); in training mode with grad enabled the body is a graph replay."""
        model = self.model
        if not (model.training and torch.is_grad_enabled()):
            return model(idx, targets)
        model._check_idx(idx)
        amp = autocast_dtype(idx.device.type)
        if self._body is None:
            self._check_device(idx)
            self._check_grads_cleared()
            self._body = self._capture(idx)
            self.shape, self.amp = tuple(idx.shape), amp
        else:
            self._check_call(idx, amp)
            self._check_grads_cleared()
        return model.output(self._body(idx), targets)

    def _check_device(self, idx: torch.Tensor) -> None:
        if idx.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; idx is on {idx.device}")
        for name, p in self.model.named_parameters():
            if p.device != idx.device:
                raise ValueError(f"the model's {name} is on {p.device}, idx on {idx.device}: move the model first")

    def _check_call(self, idx: torch.Tensor, amp: Optional[torch.dtype]) -> None:
        if tuple(idx.shape) != self.shape:
            raise ValueError(
                f"the CUDA graphs were captured for idx of shape {self.shape}; got {tuple(idx.shape)} "
                "(one GraphedModel per batch shape)"
            )
        if amp != self.amp:
            raise ValueError(
                f"the CUDA graphs were captured under autocast dtype {self.amp}; this call runs under {amp}"
            )

    def _check_grads_cleared(self) -> None:
        for name, p in self.model.named_parameters():
            if p.grad is not None:
                raise ValueError(
                    f"{name}.grad is set: the graphed backward writes gradients into static buffers that the next "
                    "replay overwrites, so each step must start from zero_grad(set_to_none=True) (no accumulation)"
                )

    def _capture(self, idx: torch.Tensor):
        """Warm up and capture the body's forward and backward under the current autocast dtype."""
        device_type = idx.device.type
        amp = autocast_dtype(device_type)
        body = _HiddenStates(self.model)
        torch.cuda.empty_cache()  # cached blocks of earlier eager steps: the graphs get a pool of their own
        with torch.autocast(device_type, dtype=amp or torch.bfloat16, enabled=amp is not None, cache_enabled=False):
            graphed = make_graphed_callables(
                body,
                (idx.clone(),),  # the static input buffer
                num_warmup_iters=self.warmup,
                allow_unused_input=True,  # an untied head's weight is not used by the body
            )
        torch.cuda.empty_cache()  # the cached blocks of the warm-up's side stream
        return graphed
