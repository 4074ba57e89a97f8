"""One differentiable op, two ways to reach it.

Eager mode calls an autograd.Function whose forward and backward call the launchers directly:
the least host time per call (no dispatcher, no autocast context in the backward unless the
forward ran under autocast, no grad-mode context unless the backward itself is being recorded,
and no autograd node at all when no input requires grad). While torch.compile traces (torch >=
2.4), the same launchers are reached through torch.library custom ops with fake implementations
and registered autograd, so `torch.compile(fullgraph=True)` sees no graph break. Both paths share
the same launchers, the same `setup_context` and the same backward rule; only the callables differ.
"""

from __future__ import annotations

from typing import Callable, Sequence, Tuple

import torch
from torch.autograd.function import once_differentiable

from ._compat import CUSTOM_OP_TAGS, HAS_CUSTOM_OP, custom_bwd, custom_fwd, is_compiling

LIBRARY = "fused_norm_xent"


def differentiable_op(
    name: str,
    *,
    forward: Callable,
    fake_forward: Callable,
    backward: Callable,
    fake_backward: Callable,
    setup_context: Callable,
    backward_rule: Callable,
    n_differentiable_outputs: int,
    differentiable_args: Sequence[int],
    backward_mutates: Sequence[str] = (),
    forward_tags: Sequence[torch.Tag] = (),
) -> Tuple[type, Callable]:
    """Build (Function, apply) for an op made of a forward and a backward launcher.

    forward(*args) -> tuple of new tensors (never an input); the first n_differentiable_outputs
        receive gradients, the rest (statistics, saved buffers, placeholders) do not.
    backward(*args): the backward launcher; it returns new tensors, or writes into the arguments
        named in backward_mutates and returns None.
    differentiable_args: positions of the forward arguments that may require grad (tensors or None).
    forward_tags: torch.Tag values of the forward custom op (where this torch supports tags).
    setup_context(ctx, inputs, output): saves what the backward rule needs (torch.library names the
        third argument `output`).
    backward_rule(ctx, grads, backward, eager) -> one gradient (or None) per forward argument; it
        calls `backward` (the launcher in eager mode, the custom op under torch.compile). eager is
        False while AOTAutograd traces the backward: a rule may then use plain torch ops where the
        eager launcher would write into a saved tensor (Inductor reuses dead buffers by itself).
    """

    @once_differentiable
    def recorded_backward(ctx, *grads):
        return backward_rule(ctx, grads, backward, True)

    class Function(torch.autograd.Function):
        @staticmethod
        @custom_fwd
        def forward(ctx, *args):
            outputs = forward(*args)
            ctx.set_materialize_grads(False)
            if len(outputs) > n_differentiable_outputs:
                ctx.mark_non_differentiable(*outputs[n_differentiable_outputs:])
            setup_context(ctx, args, outputs)
            return outputs

        @staticmethod
        @custom_bwd
        def backward(ctx, *grads):
            if torch.is_grad_enabled():  # create_graph=True: a second backward through this one must raise
                return recorded_backward(ctx, *grads)
            return backward_rule(ctx, grads, backward, True)

    Function.__name__ = Function.__qualname__ = "".join(part.title() for part in name.split("_")) + "Function"

    if not HAS_CUSTOM_OP:  # pragma: no cover - torch < 2.4: the autograd.Function everywhere
        return Function, Function.apply

    tags = {"tags": tuple(forward_tags)} if forward_tags and CUSTOM_OP_TAGS else {}
    forward_op = torch.library.custom_op(f"{LIBRARY}::{name}_fwd", forward, mutates_args=(), **tags)
    forward_op.register_fake(fake_forward)
    backward_op = torch.library.custom_op(f"{LIBRARY}::{name}_bwd", backward, mutates_args=tuple(backward_mutates))
    backward_op.register_fake(fake_backward)
    forward_op.register_autograd(
        lambda ctx, *grads: backward_rule(ctx, grads, backward_op, False), setup_context=setup_context
    )

    def apply(*args):
        if is_compiling():
            return forward_op(*args)
        if torch.is_grad_enabled() and any(args[i] is not None and args[i].requires_grad for i in differentiable_args):
            return Function.apply(*args)
        return forward(*args)  # nothing to differentiate: skip autograd's bookkeeping

    return Function, apply
