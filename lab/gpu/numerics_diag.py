"""Where the GPU-only tolerance failures come from (fused-swiglu bf16 weight gradients, GELU-tanh
fp32 with large gates, Gemma-2 fp32 logits): error statistics over seeds, and per patch switch.

    python3 lab/gpu/numerics_diag.py

A lab tool: prints tables, changes nothing.
"""

import copy
import functools
import sys

import torch

sys.path.insert(0, "packages/fused-swiglu/tests")
sys.path.insert(0, "packages/tritonformer-model/tests")

from fused_swiglu import swiglu, swiglu_mlp  # noqa: E402
from fused_swiglu.reference import swiglu_mlp_reference, swiglu_reference  # noqa: E402


def errors(ours, exact, torch_low):
    """(max, rms) absolute error of ours and of torch's low-precision result."""
    e1, e2 = (ours.double() - exact).abs(), (torch_low.double() - exact).abs()
    return e1.max().item(), e1.square().mean().sqrt().item(), e2.max().item(), e2.square().mean().sqrt().item()


def grads(fn, inputs, dy):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    return [out.detach()] + list(torch.autograd.grad(out, leaves, dy))


def mlp_weight_grads():
    print("### swiglu_mlp bf16, (2, 19) x 48 -> 72: error ours / torch bf16 (max, rms), 8 seeds\n")
    print("| act | seed | name | ours max | torch max | ours rms | torch rms |")
    print("|---|---|---|---|---|---|---|")
    for act in ("silu", "gelu_tanh"):
        for seed in range(8):
            torch.manual_seed(seed)
            x = torch.randn(2, 19, 48, device="cuda").bfloat16()
            ws = [(torch.randn(*s, device="cuda") / s[0] ** 0.5).bfloat16() for s in ((48, 72), (48, 72), (72, 48))]
            dy = torch.randn(2, 19, 48, device="cuda").bfloat16()
            ours = grads(functools.partial(swiglu_mlp, activation=act), [x, *ws], dy)
            ref = functools.partial(swiglu_mlp_reference, activation=act)
            exact = grads(ref, [t.double() for t in (x, *ws)], dy.double())
            low = grads(ref, [x, *ws], dy)
            for name, o, e, lo in zip(["y", "dx", "dw_gate", "dw_up", "dw_down"], ours, exact, low):
                m1, r1, m2, r2 = errors(o, e, lo)
                flag = " **" if m1 > 2 * m2 + 2e-3 else ""
                print(f"| {act} | {seed} | {name}{flag} | {m1:.3e} | {m2:.3e} | {r1:.3e} | {r2:.3e} |")


def gelu_large_gates():
    print("\n### swiglu gelu_tanh fp32, gate biases 1..1000: y max abs error (and |y| there), 8 seeds\n")
    print("| seed | ours max | at abs(y) | torch max | at abs(y) | ours rms | torch rms |")
    print("|---|---|---|---|---|---|---|")
    for seed in range(8):
        torch.manual_seed(seed)
        x = torch.randn(26, 24, device="cuda")
        wg, wu = (torch.randn(24, 40, device="cuda") / 24**0.5 for _ in range(2))
        bg = torch.logspace(0, 3, 40, device="cuda") * torch.tensor([1.0, -1.0], device="cuda").repeat(20)
        bu = 0.5 * torch.randn(40, device="cuda")
        ours = swiglu(x, wg, wu, bg, bu, activation="gelu_tanh")
        exact = swiglu_reference(*(t.double() for t in (x, wg, wu, bg, bu)), activation="gelu_tanh")
        low = swiglu_reference(x, wg, wu, bg, bu, activation="gelu_tanh")
        row = []
        for t in (ours, low):
            e = (t.double() - exact).abs()
            row += [f"{e.max():.3e}", f"{exact.flatten()[e.argmax()].abs():.4g}"]
        rms = [f"{(t.double() - exact).square().mean().sqrt():.3e}" for t in (ours, low)]
        print(f"| {seed} | " + " | ".join(row + rms) + " |")


def gemma2_switches():
    import test_hf_patch as t  # the tests' tiny configs and batches

    from tritonformer import hf

    print("\n### Gemma-2 fp32 logits, right padding: max error vs float64 per patch switch set\n")
    device = "cuda"
    reference = t.tiny_model("gemma2", device)
    ids, mask, labels = t.padded_batch(device, "right")
    valid = mask.bool()
    with torch.no_grad():
        exact = reference.double()(ids, attention_mask=mask).logits[valid]
        low = copy.deepcopy(reference).float()(ids, attention_mask=mask).logits[valid]
    print(f"unpatched fp32: {(low.double() - exact).abs().max():.3e}")
    print(f"default attn_implementation: {reference.config._attn_implementation}")
    # Per layer: the attention modules' outputs of the unpatched fp32 model and of the one patched
    # for attention alone, on the same inputs (each layer's input taken from the unpatched run).
    captured = {}

    def capture(tag):
        def hook(module, args, kwargs, output):
            captured[(tag, module.layer_idx)] = (output[0].detach(), args, kwargs)

        return hook

    plain, patched = copy.deepcopy(reference).float(), copy.deepcopy(reference).float()
    hf.apply(patched, rms_norm=False, rope=False, swiglu=False, cross_entropy=False, fused_linear_cross_entropy=False)
    for tag, model in (("plain", plain), ("patched", patched)):
        for layer in model.model.layers:
            layer.self_attn.register_forward_hook(capture(tag), with_kwargs=True)
        with torch.no_grad():
            model(ids, attention_mask=mask)
    for index in range(len(patched.model.layers)):
        (out_plain, _, kw_plain), (out_patched, _, kw_patched) = (captured[(t, index)] for t in ("plain", "patched"))
        rows = valid[:, :, None].expand_as(out_plain)
        same_input = torch.equal(kw_plain["hidden_states"], kw_patched["hidden_states"])
        print(
            f"layer {index} ({model.config.layer_types[index]}): attention output max diff on real rows "
            f"{(out_patched - out_plain)[rows].abs().max():.3e} (same input: {same_input})"
        )
    switches = ["rms_norm", "rope", "swiglu", "attention", "cross_entropy", "fused_linear_cross_entropy"]
    for only in [None] + switches:
        model = copy.deepcopy(reference).float()
        hf.apply(model, **{s: (only is None or s == only) for s in switches})
        with torch.no_grad():
            got = model(ids, attention_mask=mask).logits[valid]
        print(f"patched {'all' if only is None else 'only ' + only}: {(got.double() - exact).abs().max():.3e}")


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = False
    print("tf32:", torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    parts = sys.argv[1:] or ["mlp", "gelu", "gemma2"]
    for part, run in (("mlp", mlp_weight_grads), ("gelu", gelu_large_gates), ("gemma2", gemma2_switches)):
        if part in parts:
            run()
