"""One set of launchers, two ways in: autograd Functions in eager mode, custom ops under torch.compile.

Eager calls go straight to an autograd.Function whose forward and backward call the launchers:
the dispatcher of a torch.library custom op costs several microseconds a call, which small
launches feel. While torch.compile traces (torch >= 2.4), the same launchers are reached through
custom ops with fake implementations, so `torch.compile(fullgraph=True)` sees no graph break.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Sequence, Tuple

import torch
from torch.autograd.function import once_differentiable

from .compat import HAS_CUSTOM_OP, custom_bwd, custom_fwd, is_compiling

# Whether a functorch transform (vmap, grad, ...) is active; never on torch without the query.
_functorch_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


def needs_autograd(*tensors) -> bool:
    """Whether a call on `tensors` (None entries skipped) must record an autograd node: grad mode
    is on and one of them requires grad. Without one, the forward runs with no Function at all."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def eager_function_apply(function: type) -> Callable:
    """`function.apply` (a torch.autograd.Function whose forward takes ctx) for eager calls,
    positional arguments only.

    torch's apply is a Python layer (functorch's checks, dead functorch wrappers unwrapped) over
    the C++ apply; the layer costs 2.4 us of a 6.6 us call on a desktop CPU. The C++ apply is
    called directly unless torch.compile traces or a functorch transform (vmap, grad) is active,
    where the layer does its work. (A dead wrapper, a tensor escaped from a finished transform, is
    not unwrapped: it would reach the launchers as it does on their no-grad path.)
    """
    c_apply = super(torch.autograd.Function, function).apply

    def apply(*args):
        if is_compiling() or _functorch_transforms_active():
            return function.apply(*args)
        return c_apply(*args)

    return apply


def custom_op(name: str, fake: Callable, mutates_args: Tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Decorator: register launcher `fn` as the operator `name` ("library::op"), fake `fake`.

    The returned function calls the operator while torch.compile traces and `fn` itself in eager
    mode, then bumps the version counters of the arguments it mutates as the operator would. The
    operator is the wrapper's `.op`. Without torch.library.custom_op, `fn` is returned as is.
    """

    def register(fn: Callable) -> Callable:
        if not HAS_CUSTOM_OP:  # pragma: no cover - torch < 2.4
            return fn
        op = torch.library.custom_op(name, mutates_args=mutates_args)(fn)
        op.register_fake(fake)
        mutated = [list(inspect.signature(fn).parameters).index(arg) for arg in mutates_args]

        @functools.wraps(fn)
        def call(*args):
            if is_compiling():
                return op(*args)
            out = fn(*args)
            for index in mutated:
                torch.autograd.graph.increment_version(args[index])
            return out

        call.op = op
        return call

    return register


def differentiable_op(
    qualified_name: str,
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
) -> Tuple[type, Callable]:
    """(Function, apply) for an op made of a forward and a backward launcher.

    qualified_name: "library::name"; the custom ops are "library::name_fwd" and "library::name_bwd".
    forward(*args) -> tuple of new tensors (never an input); the first n_differentiable_outputs
        receive gradients, the rest (statistics, saved buffers) do not.
    backward(*args): the backward launcher; returns new tensors, or writes into the arguments named
        in backward_mutates and returns None.
    differentiable_args: positions of the forward arguments that may require grad (tensors or None).
    setup_context(ctx, inputs, output): saves what the backward rule needs.
    backward_rule(ctx, grads, backward, eager) -> one gradient (or None) per forward argument; it
        calls `backward` (the launcher in eager mode, the custom op under torch.compile). eager is
        False while AOTAutograd traces the backward: a rule may then use plain torch ops where the
        eager launcher would write into a saved tensor.
    apply(*args) runs the forward without autograd's bookkeeping when nothing requires grad.
    """
    library, name = qualified_name.split("::")

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

    function_apply = eager_function_apply(Function)

    def eager_apply(*args):
        if needs_autograd(*(args[i] for i in differentiable_args)):
            return function_apply(*args)
        return forward(*args)

    if not HAS_CUSTOM_OP:  # pragma: no cover - torch < 2.4: the autograd.Function everywhere
        return Function, eager_apply

    forward_op = torch.library.custom_op(f"{library}::{name}_fwd", forward, mutates_args=())
    forward_op.register_fake(fake_forward)
    backward_op = torch.library.custom_op(f"{library}::{name}_bwd", backward, mutates_args=tuple(backward_mutates))
    backward_op.register_fake(fake_backward)
    forward_op.register_autograd(
        lambda ctx, *grads: backward_rule(ctx, grads, backward_op, False), setup_context=setup_context
    )

    def apply(*args):
        if is_compiling():
            return forward_op(*args)
        return eager_apply(*args)

    return Function, apply
