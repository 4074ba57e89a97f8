"""The Tritonformer kernels in Hugging Face `transformers` models, in one call.

    import tritonformer.hf
    report = tritonformer.hf.apply(model)       # an instantiated LlamaForCausalLM, MistralForCausalLM, ...
    print(report)                               # what was patched, what was left alone and why

    tritonformer.hf.apply_to_llama()            # or: patch the classes before instantiation
    model = LlamaForCausalLM.from_pretrained(...)

Model types: llama, mistral, qwen2, qwen3, gemma, gemma2 and gemma3_text (Gemma3ForCausalLM; RMSNorm with
the `1 + w` offset, Gemma-2's attention and final-logit softcapping in the kernels), gpt2.
Switches (all on by default; one a model type lacks is ignored):
- rms_norm: the RMSNorm modules through fused_norm_xent.rms_norm.
- layer_norm: GPT-2's torch.nn.LayerNorm modules through fused_norm_xent.layer_norm.
- rope: `apply_rotary_pos_emb` through fused_rope.apply_rotary_qk (apply: in this model's attention
  modules only; apply_to_<type>: the modeling module's function, for every model of the type).
- swiglu: the gate/up/down MLP through fused_swiglu.swiglu_mlp (SiLU, or Gemma's tanh-approximate
  GELU as activation="gelu_tanh").
- attention: attn_implementation "tritonformer", registered in transformers' attention-function and
  attention-mask registries: fused_attention's flash kernel, or its varlen kernel over the unpadded
  tokens when the padding mask has padding; transformers' sdpa for what the kernels cannot do.
- cross_entropy: the causal-LM loss (loss_function) through fused_norm_xent.cross_entropy.
- fused_linear_cross_entropy: in training, `model(..., labels=...)` computes the loss from the final
  hidden states with fused_norm_xent.linear_cross_entropy and returns logits=None (no (tokens, vocab)
  logits tensor) and no KV cache unless use_cache=True is passed; without labels, or in eval mode, the
  forward is unchanged.

Every patched function checks its inputs on each call and runs the original code where a kernel
cannot (a CPU tensor without TRITON_INTERPRET=1, float64, an unsupported head dim, ...); the code
itself is in hf_kernels. `revert(model)` / `revert()` undo the patches.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import types
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch

from .hf_kernels import (
    ATTENTION_NAME,
    CLASS_ORIGINALS,
    FEEDS_MATMULS,
    MISSING,
    causal_lm_loss,
    layer_norm_forward,
    make_causal_lm_forward,
    make_rope,
    offset_rms_norm_forward,
    original_method,
    rebind_rope,
    register_attention,
    rms_norm_forward,
    swiglu_mlp_forward,
    swiglu_mlp_ready,
)


@dataclasses.dataclass(frozen=True)
class _ModelSpec:
    """Where a model type keeps the pieces that the switches replace."""

    model_type: str
    module: str
    causal_lm: str
    pretrained: str
    attention: str
    output: str
    rms_norm: Optional[str] = None
    rms_offset: float = 0.0
    mlp: Optional[str] = None
    rope: bool = True
    layer_norm: bool = False  # GPT-2: torch.nn.LayerNorm modules
    # The attribute names of each decoder layer's norms that feed only linear layers (hf_kernels.FEEDS_MATMULS).
    matmul_norms: Tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")


def _llama_like(model_type: str, prefix: str, **options: Any) -> _ModelSpec:
    values = dict(
        model_type=model_type,
        module=f"transformers.models.{model_type}.modeling_{model_type}",
        causal_lm=f"{prefix}ForCausalLM",
        pretrained=f"{prefix}PreTrainedModel",
        attention=f"{prefix}Attention",
        output="CausalLMOutputWithPast",
        rms_norm=f"{prefix}RMSNorm",
        mlp=f"{prefix}MLP",
    )
    values.update(options)
    return _ModelSpec(**values)


_GEMMA2_MATMUL_NORMS = ("input_layernorm", "pre_feedforward_layernorm")

SPECS: Dict[str, _ModelSpec] = {
    "llama": _llama_like("llama", "Llama"),
    "mistral": _llama_like("mistral", "Mistral"),
    "qwen2": _llama_like("qwen2", "Qwen2"),
    "qwen3": _llama_like("qwen3", "Qwen3"),  # its q/k norms are Qwen3RMSNorm modules too
    "gemma": _llama_like("gemma", "Gemma", rms_offset=1.0),
    # Gemma 2 and 3 normalize the attention's and the MLP's outputs too (post_*): those feed the residual.
    "gemma2": _llama_like("gemma2", "Gemma2", rms_offset=1.0, matmul_norms=_GEMMA2_MATMUL_NORMS),
    # Gemma 3's text model (model type gemma3_text): its q/k norms are Gemma3RMSNorm modules too.
    "gemma3_text": _llama_like(
        "gemma3_text",
        "Gemma3",
        rms_offset=1.0,
        module="transformers.models.gemma3.modeling_gemma3",
        matmul_norms=_GEMMA2_MATMUL_NORMS,
    ),  # fmt: skip
    "gpt2": _ModelSpec(
        model_type="gpt2",
        module="transformers.models.gpt2.modeling_gpt2",
        causal_lm="GPT2LMHeadModel",
        pretrained="GPT2PreTrainedModel",
        attention="GPT2Attention",
        output="CausalLMOutputWithCrossAttentions",
        rope=False,
        layer_norm=True,
        matmul_norms=("ln_1", "ln_2"),
    ),
}


@dataclasses.dataclass
class PatchReport:
    """What apply / apply_to_<model> did: switch -> what was patched, switch -> why it was left alone."""

    model_type: str
    patched: Dict[str, str] = dataclasses.field(default_factory=dict)
    skipped: Dict[str, str] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"tritonformer patches for {self.model_type}:"]
        lines += [f"  {name}: {what}" for name, what in self.patched.items()]
        lines += [f"  {name}: not patched ({why})" for name, why in self.skipped.items()]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Patching an instantiated model: every switch's preconditions are checked before anything changes.

Step = Callable[[], Callable[[], None]]  # runs a change, returns its undo
Plan = Tuple[str, List[Step]]  # what is patched, the steps (or a str: why the switch is left alone)


def _set_attribute(obj: Any, name: str, value: Any) -> Step:
    def run() -> Callable[[], None]:
        previous = vars(obj).get(name, MISSING)
        setattr(obj, name, value)

        def undo() -> None:
            if previous is MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, previous)

        return undo

    return run


def _bind_forwards(modules: List[torch.nn.Module], function: Callable) -> List[Step]:
    return [_set_attribute(module, "forward", types.MethodType(function, module)) for module in modules]


def _instance_forward_state(modules: List[torch.nn.Module], function: Callable) -> Optional[str]:
    """'patched' when every module already runs `function`, a reason when any has another instance
    forward (set by something else), None when none is overridden."""
    overridden = [vars(m)["forward"] for m in modules if "forward" in vars(m)]
    if not overridden:
        return None
    if len(overridden) == len(modules) and all(getattr(f, "__func__", None) is function for f in overridden):
        return "patched"
    return f"{type(modules[0]).__name__} modules already have a forward set on the instance (another patch)"


def _modules_of(model: torch.nn.Module, cls: Optional[type]) -> List[torch.nn.Module]:
    return [m for m in model.modules() if cls is not None and type(m) is cls]


def _forward_swap(modules: List[torch.nn.Module], function: Callable, description: str, what: str) -> Union[str, Plan]:
    """The plan that binds `function` as the forward of every module, or why not."""
    if not modules:
        return f"the model has no {what} modules"
    state = _instance_forward_state(modules, function)
    if state == "patched":
        return description + " (already patched)", []
    if state is not None:
        return state
    if (type(modules[0]), "forward") in CLASS_ORIGINALS:
        return description + " (patched at class level)", []
    return description, _bind_forwards(modules, function)


def _matmul_norms(model: torch.nn.Module, spec: _ModelSpec, norm_type: Optional[type]) -> List[torch.nn.Module]:
    """The norms of type norm_type that feed only linear layers (spec.matmul_norms, in decoder layers)."""
    return [
        module for name, module in model.named_modules()
        if norm_type is not None and type(module) is norm_type and name.rpartition(".")[2] in spec.matmul_norms
    ]  # fmt: skip


def _mark_matmul_norms(model: torch.nn.Module, spec: _ModelSpec, norm_type: Optional[type]) -> None:
    """Marks a new model's norms that feed only linear layers (the class-level patches' post_init)."""
    for module in _matmul_norms(model, spec, norm_type):
        setattr(module, FEEDS_MATMULS, True)


def _with_matmul_marks(plan: Union[str, Plan], modules: List[torch.nn.Module]) -> Union[str, Plan]:
    """plan, whose steps also mark `modules` as feeding linear layers (hf_kernels.FEEDS_MATMULS)."""
    if isinstance(plan, str) or not plan[1]:
        return plan
    return plan[0], plan[1] + [_set_attribute(module, FEEDS_MATMULS, True) for module in modules]


def _plan_rms_norm(model, spec: _ModelSpec, modeling) -> Union[str, Plan]:
    cls = getattr(modeling, spec.rms_norm, None)
    modules = _modules_of(model, cls)
    eps = "eps" if spec.rms_offset else "variance_epsilon"
    for module in modules:
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.nn.Parameter) or weight.dim() != 1 or not hasattr(module, eps):
            return f"{spec.rms_norm} has no 1-D weight and {eps} (a different transformers version)"
    forward = offset_rms_norm_forward if spec.rms_offset else rms_norm_forward
    offset = " (offset 1: normalized x * (1 + w))" if spec.rms_offset else ""
    plan = _forward_swap(
        modules, forward, f"{len(modules)} {spec.rms_norm} -> fused_norm_xent.rms_norm{offset}", spec.rms_norm or ""
    )
    return _with_matmul_marks(plan, _matmul_norms(model, spec, cls))


def _plan_layer_norm(model, spec: _ModelSpec, modeling) -> Union[str, Plan]:
    modules = _modules_of(model, torch.nn.LayerNorm)
    plan = _forward_swap(
        modules, layer_norm_forward, f"{len(modules)} torch.nn.LayerNorm -> fused_norm_xent.layer_norm", "LayerNorm"
    )
    return _with_matmul_marks(plan, _matmul_norms(model, spec, torch.nn.LayerNorm))


def _plan_swiglu(model, spec: _ModelSpec, modeling) -> Union[str, Plan]:
    modules = _modules_of(model, getattr(modeling, spec.mlp, None))
    for module in modules:
        reason = swiglu_mlp_ready(module)
        if reason:
            return f"{spec.mlp}: {reason}"
    return _forward_swap(modules, swiglu_mlp_forward, f"{len(modules)} {spec.mlp} -> fused_swiglu.swiglu_mlp", spec.mlp)


def _plan_rope(model, spec: _ModelSpec, modeling) -> Union[str, Plan]:
    current = getattr(modeling, "apply_rotary_pos_emb", None)
    if not callable(current):
        return f"{spec.module} has no apply_rotary_pos_emb"
    description = f"apply_rotary_pos_emb -> fused_rope.apply_rotary_qk in every {spec.attention}"
    if hasattr(current, "__tritonformer_original__"):
        return description + " (patched at class level)", []
    modules = _modules_of(model, getattr(modeling, spec.attention, None))
    if not modules:
        return f"the model has no {spec.attention} modules"
    overridden = [vars(m)["forward"] for m in modules if "forward" in vars(m)]
    if overridden:
        if all(getattr(getattr(f, "__func__", None), "__tritonformer_rope__", False) for f in overridden):
            return description + " (already patched)", []
        return f"{spec.attention} modules already have a forward set on the instance (another patch)"
    raw = inspect.unwrap(original_method(modules[0]))
    if "apply_rotary_pos_emb" not in getattr(getattr(raw, "__code__", None), "co_names", ()):
        return f"{spec.attention}.forward does not call apply_rotary_pos_emb (a different transformers version)"
    forward = rebind_rope(modules[0], make_rope(current))
    forward.__tritonformer_rope__ = True
    return description, _bind_forwards(modules, forward)


def _plan_attention(model, spec: _ModelSpec, modeling) -> Union[str, Plan]:
    try:
        from transformers.masking_utils import AttentionMaskInterface  # noqa: F401
        from transformers.modeling_utils import AttentionInterface  # noqa: F401
    except ImportError as error:
        return f"this transformers has no attention-function registry ({error})"
    if not hasattr(model, "set_attn_implementation"):
        return "this transformers cannot change the attention implementation of an instantiated model"
    can_set = getattr(type(model), "_can_set_attn_implementation", None)
    if can_set is not None and not can_set():
        return f"{type(model).__name__} does not dispatch its attention through ALL_ATTENTION_FUNCTIONS"
    previous = model.config._attn_implementation
    description = (
        f"config._attn_implementation {previous!r} -> {ATTENTION_NAME!r} (fused_attention; sdpa where it cannot)"
    )
    if previous == ATTENTION_NAME:
        return f"config._attn_implementation is {ATTENTION_NAME!r} (already patched)", []

    def run() -> Callable[[], None]:
        register_attention()
        model.set_attn_implementation(ATTENTION_NAME)
        if model.config._attn_implementation != ATTENTION_NAME:
            raise RuntimeError(
                f"set_attn_implementation({ATTENTION_NAME!r}) left {model.config._attn_implementation!r}"
            )
        return lambda: model.set_attn_implementation(previous)

    return description, [run]


def _causal_lm_blocker(model, spec: _ModelSpec, modeling) -> Optional[str]:
    cls = getattr(modeling, spec.causal_lm, None)
    if cls is None or not isinstance(model, cls):
        return f"{type(model).__name__} is not a {spec.causal_lm} (no language-model loss)"
    return None


def _plan_cross_entropy(model, spec: _ModelSpec, modeling) -> Union[str, Plan]:
    blocker = _causal_lm_blocker(model, spec, modeling)
    if blocker:
        return blocker
    description = "loss_function -> fused_norm_xent.cross_entropy (ForCausalLMLoss)"
    prop = inspect.getattr_static(type(model), "loss_function", None)
    if not isinstance(prop, property) or prop.fset is None:
        return "this transformers has no settable loss_function"
    if getattr(model, "loss_type", None) not in (None, "ForCausalLM"):
        return f"loss_type {model.loss_type!r} is not ForCausalLM"
    own = vars(model).get("_loss_function", MISSING)
    if own is causal_lm_loss or inspect.getattr_static(type(model), "_loss_function", None) is not None:
        return description + (" (already patched)" if own is causal_lm_loss else " (patched at class level)"), []
    if own is not MISSING:
        return "the model already has its own loss_function"

    def run() -> Callable[[], None]:
        model.loss_function = causal_lm_loss

        def undo() -> None:
            del model._loss_function

        return undo

    return description, [run]


def _plan_fused_linear_cross_entropy(model, spec: _ModelSpec, modeling) -> Union[str, Plan]:
    blocker = _causal_lm_blocker(model, spec, modeling)
    if blocker:
        return blocker
    description = "forward(labels=...) in training -> fused_norm_xent.linear_cross_entropy, logits=None"
    own = vars(model).get("forward", MISSING)
    if own is not MISSING:
        if hasattr(getattr(own, "__func__", None), "__tritonformer_original__"):
            return description + " (already patched)", []
        return "the model already has a forward set on the instance (another patch)"
    class_forward = type(model).forward
    if hasattr(class_forward, "__tritonformer_original__"):
        return description + " (patched at class level)", []
    reason = _fused_forward_blocker(model, class_forward, spec, modeling)
    if reason:
        return reason
    forward = make_causal_lm_forward(class_forward, getattr(modeling, spec.output))
    return description, [_set_attribute(model, "forward", types.MethodType(forward, model))]


def _fused_forward_blocker(model, forward: Callable, spec: _ModelSpec, modeling) -> Optional[str]:
    parameters = inspect.signature(forward).parameters
    if "labels" not in parameters or "logits_to_keep" not in parameters:
        return f"{spec.causal_lm}.forward takes no labels / logits_to_keep (a different transformers version)"
    if not dataclasses.is_dataclass(getattr(modeling, spec.output, None)):
        return f"{spec.module} has no {spec.output}"
    if model is not None:
        if type(model.get_output_embeddings()) is not torch.nn.Linear:
            return "the output embedding (lm_head) is not a torch.nn.Linear"
        if not isinstance(getattr(model, model.base_model_prefix, None), torch.nn.Module):
            return f"the model has no base model at {model.base_model_prefix!r}"
    return None


_INSTANCE_PLANNERS = {
    "rms_norm": _plan_rms_norm,
    "layer_norm": _plan_layer_norm,
    "rope": _plan_rope,
    "swiglu": _plan_swiglu,
    "attention": _plan_attention,
    "cross_entropy": _plan_cross_entropy,
    "fused_linear_cross_entropy": _plan_fused_linear_cross_entropy,
}


def _applicable(spec: _ModelSpec, switch: str) -> bool:
    """Whether the model type has the part a switch replaces (GPT-2: no RMSNorm, rotary embedding, SwiGLU)."""
    parts = {"rms_norm": spec.rms_norm, "layer_norm": spec.layer_norm, "rope": spec.rope, "swiglu": spec.mlp}
    return bool(parts.get(switch, True))


def _spec_of(model: Any) -> _ModelSpec:
    config = getattr(model, "config", None)
    if not isinstance(model, torch.nn.Module) or config is None:
        raise TypeError(f"model must be an instantiated transformers PreTrainedModel, got {type(model).__name__}")
    model_type = getattr(config, "model_type", None)
    if model_type not in SPECS:
        raise ValueError(
            f"model type {model_type!r} ({type(model).__name__}) is not supported by tritonformer.hf; "
            f"supported: {', '.join(sorted(SPECS))}"
        )
    return SPECS[model_type]


def _modeling(spec: _ModelSpec):
    try:
        return importlib.import_module(spec.module)
    except ImportError as error:
        raise ValueError(f"transformers cannot import {spec.module} here: {error}") from error


def _run(report: PatchReport, plans: Dict[str, Union[str, Plan]]) -> List[Callable[[], None]]:
    """Records every plan in the report, then runs the steps of those that go ahead (all of them, or
    none: a step that raises undoes the ones before it)."""
    steps: List[Step] = []
    for name, plan in plans.items():
        if isinstance(plan, str):
            report.skipped[name] = plan
        else:
            report.patched[name], more = plan
            steps += more
    undo: List[Callable[[], None]] = []
    try:
        for step in steps:
            undo.append(step())
    except BaseException:
        for step in reversed(undo):
            step()
        raise
    return undo


def apply(
    model: Any,
    *,
    rms_norm: bool = True,
    rope: bool = True,
    swiglu: bool = True,
    attention: bool = True,
    cross_entropy: bool = True,
    fused_linear_cross_entropy: bool = True,
    layer_norm: bool = True,
) -> PatchReport:
    """Patches an instantiated transformers model in place with the Tritonformer kernels.

    model: a Llama / Mistral / Qwen2 / Gemma / GPT-2 model of transformers (the CausalLM or the bare
        model); any other model type raises ValueError naming it.
    Switches (see the module docstring): rms_norm, rope, swiglu, attention, cross_entropy,
    fused_linear_cross_entropy, and layer_norm (GPT-2's LayerNorms).

    Each switch's preconditions are checked on the model before anything changes; a switch the
    model or the installed transformers cannot take is left alone and reported with the reason.
    Only this model changes (rope rebinds its attention modules' forward, not the modeling module).
    Returns a PatchReport; `revert(model)` undoes the patches.
    """
    spec = _spec_of(model)
    modeling = _modeling(spec)
    wanted = dict(
        rms_norm=rms_norm, layer_norm=layer_norm, rope=rope, swiglu=swiglu, attention=attention,
        cross_entropy=cross_entropy, fused_linear_cross_entropy=fused_linear_cross_entropy,
    )  # fmt: skip
    for name, value in wanted.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    plans = {
        name: _INSTANCE_PLANNERS[name](model, spec, modeling)
        for name, on in wanted.items()
        if on and _applicable(spec, name)
    }
    report = PatchReport(spec.model_type)
    undo = _run(report, plans)
    vars(model).setdefault("_tritonformer_undo", []).extend(undo)
    return report


# ---------------------------------------------------------------------------------------------
# Patching the classes before instantiation.

# (owner, attribute) in the order they were patched, for revert().
_CLASS_PATCH_ORDER: List[Tuple[Any, str]] = []


def _set_class_attribute(owner: Any, name: str, value: Any) -> Step:
    def run() -> Callable[[], None]:
        CLASS_ORIGINALS[(owner, name)] = vars(owner).get(name, MISSING)
        _CLASS_PATCH_ORDER.append((owner, name))
        setattr(owner, name, value)
        return lambda: _restore_class_attribute(owner, name)

    return run


def _restore_class_attribute(owner: Any, name: str) -> None:
    _CLASS_PATCH_ORDER.remove((owner, name))
    original = CLASS_ORIGINALS.pop((owner, name))
    if original is MISSING:
        delattr(owner, name)
    else:
        setattr(owner, name, original)


def _class_patched(owner: Any, name: str) -> bool:
    return (owner, name) in CLASS_ORIGINALS


def _class_swap(owner: Optional[type], name: str, value: Any, description: str, what: str) -> Union[str, Plan]:
    if owner is None or not callable(getattr(owner, name, None)):
        return f"{what} has no {name} in this transformers"
    if _class_patched(owner, name):
        return description + " (already patched)", []
    return description, [_set_class_attribute(owner, name, value)]


def _class_plan_rms_norm(spec: _ModelSpec, modeling) -> Union[str, Plan]:
    forward = offset_rms_norm_forward if spec.rms_offset else rms_norm_forward
    owner, eps = getattr(modeling, spec.rms_norm, None), "eps" if spec.rms_offset else "variance_epsilon"
    if owner is not None and eps not in getattr(getattr(owner.__init__, "__code__", None), "co_names", ()):
        return f"{spec.rms_norm} sets no {eps} (a different transformers version)"
    description = f"{spec.rms_norm}.forward -> fused_norm_xent.rms_norm"
    plan = _class_swap(owner, "forward", forward, description, spec.rms_norm)
    pretrained = getattr(modeling, spec.pretrained, None)
    if isinstance(plan, str) or not plan[1] or not callable(getattr(pretrained, "post_init", None)):
        return plan
    original = pretrained.post_init

    @functools.wraps(original)
    def post_init(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        _mark_matmul_norms(self, spec, owner)
        return result

    return plan[0], plan[1] + [_set_class_attribute(pretrained, "post_init", post_init)]


def _class_plan_layer_norm(spec: _ModelSpec, modeling) -> Union[str, Plan]:
    owner = getattr(modeling, spec.pretrained, None)
    if owner is None or not callable(getattr(owner, "post_init", None)):
        return f"{spec.pretrained} has no post_init in this transformers"
    original = owner.post_init

    @functools.wraps(original)
    def post_init(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        # GPT-2's norms are torch.nn.LayerNorm, shared with all of torch: patched per instance.
        for module in self.modules():
            if type(module) is torch.nn.LayerNorm and "forward" not in vars(module):
                module.forward = types.MethodType(layer_norm_forward, module)
        _mark_matmul_norms(self, spec, torch.nn.LayerNorm)
        return result

    return _class_swap(
        owner, "post_init", post_init, f"the torch.nn.LayerNorm of every new {spec.model_type} model -> "
        "fused_norm_xent.layer_norm", spec.pretrained,
    )  # fmt: skip


def _class_plan_swiglu(spec: _ModelSpec, modeling) -> Union[str, Plan]:
    return _class_swap(
        getattr(modeling, spec.mlp, None), "forward", swiglu_mlp_forward,
        f"{spec.mlp}.forward -> fused_swiglu.swiglu_mlp (when the activation is SiLU)", spec.mlp,
    )  # fmt: skip


def _class_plan_rope(spec: _ModelSpec, modeling) -> Union[str, Plan]:
    current = getattr(modeling, "apply_rotary_pos_emb", None)
    if not callable(current):
        return f"{spec.module} has no apply_rotary_pos_emb in this transformers"
    description = f"{spec.module}.apply_rotary_pos_emb -> fused_rope.apply_rotary_qk"
    return _class_swap(modeling, "apply_rotary_pos_emb", make_rope(current), description, spec.module)


def _class_plan_attention(spec: _ModelSpec, modeling) -> Union[str, Plan]:
    owner = getattr(modeling, spec.pretrained, None)
    try:
        from transformers.masking_utils import AttentionMaskInterface  # noqa: F401
        from transformers.modeling_utils import AttentionInterface  # noqa: F401
    except ImportError as error:
        return f"this transformers has no attention-function registry ({error})"
    if owner is None or not callable(getattr(owner, "get_correct_attn_implementation", None)):
        return f"{spec.pretrained} has no get_correct_attn_implementation in this transformers"
    can_set = getattr(owner, "_can_set_attn_implementation", None)
    if can_set is not None and not can_set():
        return f"{spec.pretrained} does not dispatch its attention through ALL_ATTENTION_FUNCTIONS"
    original = owner.get_correct_attn_implementation

    @functools.wraps(original)
    def get_correct_attn_implementation(self, requested_attention, *args, **kwargs):
        # Only the default changes: an explicit attn_implementation (sdpa, eager, ...) is kept.
        requested = ATTENTION_NAME if requested_attention is None else requested_attention
        return original(self, requested, *args, **kwargs)

    description = f"new {spec.model_type} models default to attn_implementation={ATTENTION_NAME!r}"
    plan = _class_swap(owner, "get_correct_attn_implementation", get_correct_attn_implementation, description, "")
    if isinstance(plan, tuple) and plan[1]:
        plan[1].insert(0, _register_step)
    return plan


def _register_step() -> Callable[[], None]:
    """A step: the registry entries stay when the patches are undone (an unused name is harmless)."""
    register_attention()
    return lambda: None


def _class_plan_cross_entropy(spec: _ModelSpec, modeling) -> Union[str, Plan]:
    owner = getattr(modeling, spec.causal_lm, None)
    prop = inspect.getattr_static(owner, "loss_function", None) if owner is not None else None
    if not isinstance(prop, property):
        return "this transformers has no loss_function property"
    description = f"{spec.causal_lm}.loss_function -> fused_norm_xent.cross_entropy (ForCausalLMLoss)"
    if _class_patched(owner, "_loss_function"):
        return description + " (already patched)", []
    # PreTrainedModel.loss_function returns self._loss_function where there is one.
    return description, [_set_class_attribute(owner, "_loss_function", staticmethod(causal_lm_loss))]


def _class_plan_fused_linear_cross_entropy(spec: _ModelSpec, modeling) -> Union[str, Plan]:
    owner = getattr(modeling, spec.causal_lm, None)
    if owner is None:
        return f"{spec.module} has no {spec.causal_lm}"
    description = (
        f"{spec.causal_lm}.forward(labels=...) in training -> fused_norm_xent.linear_cross_entropy, logits=None"
    )
    if _class_patched(owner, "forward"):
        return description + " (already patched)", []
    reason = _fused_forward_blocker(None, owner.forward, spec, modeling)
    if reason:
        return reason
    forward = make_causal_lm_forward(owner.forward, getattr(modeling, spec.output))
    return description, [_set_class_attribute(owner, "forward", forward)]


_CLASS_PLANNERS = {
    "rms_norm": _class_plan_rms_norm,
    "layer_norm": _class_plan_layer_norm,
    "rope": _class_plan_rope,
    "swiglu": _class_plan_swiglu,
    "attention": _class_plan_attention,
    "cross_entropy": _class_plan_cross_entropy,
    "fused_linear_cross_entropy": _class_plan_fused_linear_cross_entropy,
}


def _apply_to_classes(model_type: str, switches: Dict[str, bool]) -> PatchReport:
    spec = SPECS[model_type]
    modeling = _modeling(spec)
    for name, value in switches.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    plans = {name: _CLASS_PLANNERS[name](spec, modeling) for name, on in switches.items() if on}
    report = PatchReport(model_type)
    _run(report, plans)
    return report


def _class_patcher(model_type: str) -> Callable[..., PatchReport]:
    def apply_to_model(
        *,
        rms_norm: bool = True,
        rope: bool = True,
        swiglu: bool = True,
        attention: bool = True,
        cross_entropy: bool = True,
        fused_linear_cross_entropy: bool = True,
        layer_norm: bool = True,
    ) -> PatchReport:
        switches = dict(
            rms_norm=rms_norm, layer_norm=layer_norm, rope=rope, swiglu=swiglu, attention=attention,
            cross_entropy=cross_entropy, fused_linear_cross_entropy=fused_linear_cross_entropy,
        )  # fmt: skip
        spec = SPECS[model_type]
        return _apply_to_classes(model_type, {name: on for name, on in switches.items() if _applicable(spec, name)})

    apply_to_model.__name__ = apply_to_model.__qualname__ = f"apply_to_{model_type}"
    apply_to_model.__doc__ = (
        f"Patches transformers' {model_type} classes with the Tritonformer kernels: models instantiated "
        "afterwards use them (an explicit attn_implementation is kept). Switches as apply(); returns a "
        "PatchReport. rope replaces the modeling module's apply_rotary_pos_emb, for every model of the type. "
        "revert() undoes the class patches."
    )
    return apply_to_model


apply_to_llama = _class_patcher("llama")
apply_to_mistral = _class_patcher("mistral")
apply_to_qwen2 = _class_patcher("qwen2")
apply_to_qwen3 = _class_patcher("qwen3")
apply_to_gemma = _class_patcher("gemma")
apply_to_gemma2 = _class_patcher("gemma2")
apply_to_gemma3 = _class_patcher("gemma3_text")
apply_to_gpt2 = _class_patcher("gpt2")


def revert(model: Optional[Any] = None) -> None:
    """Undoes apply(model)'s patches of `model`; without a model, every apply_to_<type> class patch."""
    if model is not None:
        undo = vars(model).pop("_tritonformer_undo", [])
        for step in reversed(undo):
            step()
        return
    while _CLASS_PATCH_ORDER:
        _restore_class_attribute(*_CLASS_PATCH_ORDER[-1])
