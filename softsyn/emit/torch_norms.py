"""A decoder layer's RMS norms and residual adds inside its GEMVs for the torch targets' decode step (issue 28): a
decode step is bound by its number of kernels, and a Llama-style pre-norm layer ran two Inductor kernels of its own
(residual add + RMSNorm, before q/k/v and before gate/up) beside its GEMVs.

fold_norms: before quantisation, each decoder layer's input and post-attention RMS norm weight g folded into the
packed projection it feeds (W <- W * g[None, :], g <- 1): the same function up to fp16 rounding in every path (the
prefill package's too), checked per norm on one random step with a random g (a norm that feeds anything else, or
computes x * (1 + g), gives another function there and is kept). fuse_norms: after fuse_prologues, FusedNorms where a
layer's q/k/v, o, gate/up and down are softsyn's kernel (QuantLinear), its attention FusedAttention and its MLP a
GatedMLP: at decode the weightless norms run in the q/k/v and gate/up GEMVs (NORM) and the residual adds in o_proj's
and down's (RESIDUAL), checked on one random step against the layer as it was; elsewhere (a prompt, no softsyn
cache) the layer runs the original class's forward.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from transformers.cache_utils import Cache

from softsyn.emit.torch_prologue import (CHECK_FORM, CHECK_SEQ, CHECK_SLOTS, FUSED_FORM, CheckInput, FusedAttention,
                                         check_input, close, norm_eps)
from softsyn.emit.torch_attention_forms import attention_implementation
from softsyn.emit.torch_step import (BufferLayer, GatedMLP, PackedLinear, on_same_state, rotary_embedding,
                                     substitute_checked)
from softsyn.emit.triton_weights import QuantLinear

NORMS = (("input_layernorm", "packed_q_k_v"), ("post_attention_layernorm", "packed_gate_up"))  # norm -> what it feeds
FUSED_SETTINGS = ("off", "on")  # TorchTarget.fused_norms


class Fusion(NamedTuple):
    done: int  # norms folded (fold_norms), decoder layers fused (fuse_norms)
    kept: int
    why: dict[str, int]  # {reason: kept for it}


def decoder_layer(module: torch.nn.Module) -> bool:
    """Whether `module` is a Llama-style decoder layer: an input and a post-attention norm, a self_attn with a
    layer_idx, an mlp."""
    names = ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp")
    return all(hasattr(module, n) for n in names) and hasattr(module.self_attn, "layer_idx")


def check_case(model: torch.nn.Module, layer: torch.nn.Module,
               rotary: torch.nn.Module | None) -> CheckInput | None:
    """fuse_prologues' random step (2 rows at positions 3-5 over a small cache of stale values) for `layer`'s
    attention; None without a rotary embedding (`rotary`, the model's) or a packed q/k/v to size it."""
    attn = layer.self_attn
    packed = getattr(attn, "packed_q_k_v", None)
    if rotary is None or not isinstance(packed, PackedLinear) or len(packed.sizes) != 3:
        return None
    dim = int(attn.head_dim)
    return check_input(packed.linear.in_features, packed.sizes[1] // dim, dim, rotary,
                       model.get_input_embeddings().weight)


def run_layer(layer: torch.nn.Module, form: str, case: CheckInput) -> tuple[torch.Tensor, torch.Tensor]:
    """(`layer`'s output, the cache after it) for `case` under attention implementation `form`."""
    keys, values = case.cache.clone()
    cache = Cache(layers=[BufferLayer(keys, values, case.where, CHECK_SLOTS)] * (layer.self_attn.layer_idx + 1))
    with attention_implementation(layer.self_attn, form), torch.no_grad():
        out = layer(case.x, attention_mask=case.mask, position_embeddings=(case.cos, case.sin),
                    position_ids=case.where.expand(2, CHECK_SEQ), cache=cache, use_cache=True)
    out = out[0] if isinstance(out, tuple) else out
    return out.float(), torch.stack([keys, values]).float()


def agree(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor], case: CheckInput) -> bool:
    """run_layer's results agree: the caches within fp16 rounding (close), the outputs' updates (output less the
    input, which the residual stream carries either way and which would hide a wrong update) within 1 % of the
    largest update, plus the rounding of adding them to the input in its dtype."""
    x = case.x.float()
    rounding = 2 * torch.finfo(case.x.dtype).eps * x.abs().max()
    update = want[0] - x
    return (close(got[1], want[1]) and got[0].shape == want[0].shape
            and bool((got[0] - want[0]).abs().max() <= 1e-2 * update.abs().max() + rounding + 1e-6))


def fold_one(layer: torch.nn.Module, norm: torch.nn.Module, linear: torch.nn.Linear, case: CheckInput) -> bool:
    """Fold `norm`'s weight into `linear` where that is `layer`'s function, checked with a random weight r * g in the
    norm (so a g of ones still tells a norm that feeds something else, or scales by 1 + g): the layer with it, and
    with it folded into `linear` and the norm's weight 1, agree (output and cache). Left as it was where they do not."""
    g, w = norm.weight.detach().clone(), linear.weight.detach().clone()
    generator = torch.Generator(device=g.device).manual_seed(1)
    probe = (g.float() * (0.5 + torch.rand(g.shape, generator=generator, device=g.device))).to(g.dtype)
    with torch.no_grad():
        norm.weight.copy_(probe)
        want = run_layer(layer, CHECK_FORM, case)
        linear.weight.copy_((w.float() * probe.float()[None, :]).to(w.dtype))
        norm.weight.fill_(1.0)
        got = run_layer(layer, CHECK_FORM, case)
        same = agree(got, want, case)
        linear.weight.copy_((w.float() * g.float()[None, :]).to(w.dtype) if same else w)
        norm.weight.copy_(torch.ones_like(g) if same else g)
    return same


def fold_norms(model: torch.nn.Module) -> Fusion:
    """Fold each decoder layer's input and post-attention RMS norm weight into the packed q/k/v and gate/up Linear it
    feeds (W * g[None, :], g <- 1), before quantisation, where fold_one's check says that is the layer's function;
    the others kept, with why. Never the final norm into a (tied) lm_head."""
    done, why, rotary = 0, {}, rotary_embedding(model)
    for layer in [m for m in model.modules() if decoder_layer(m)]:
        case = check_case(model, layer, rotary)
        for norm_name, packed_name in NORMS:
            norm = getattr(layer, norm_name)
            owner = layer.self_attn if packed_name == "packed_q_k_v" else layer.mlp
            packed = getattr(owner, packed_name, None)
            weight = getattr(norm, "weight", None)
            if not isinstance(packed, PackedLinear) or type(packed.linear) is not torch.nn.Linear:
                reason = f"{norm_name} feeds no packed Linear"
            elif norm_eps(norm) is None or weight is None or tuple(weight.shape) != (packed.linear.in_features,):
                reason = f"{norm_name} is not an RMS norm with a weight over its input"
            elif case is None:
                reason = "no rotary embedding or packed q/k/v to check it on"
            elif fold_one(layer, norm, packed.linear, case):
                done += 1
                continue
            else:
                reason = f"{norm_name} folded computes something else (it feeds more, or is no x * g norm)"
            why[reason] = why.get(reason, 0) + 1
    return Fusion(done, sum(why.values()), why)


class FusedNorms(torch.nn.Module):
    """A decoder layer that fuse_norms checked, with its norms and residual adds in its GEMVs at decode: a subclass of
    the original's class (fused_form(), same instance state, so module paths, weight names and kernel provenance are
    unchanged) whose forward is the original's wherever the fused form does not apply."""

    input_eps: float = 1e-6  # the input and post-attention norms' epsilons (fused_form() sets them)
    post_eps: float = 1e-6

    def forward(self, hidden_states, *args, **kwargs):
        attn, mlp = self.self_attn, self.mlp
        prompt = any(m.prompt_form for m in (attn.packed_q_k_v.linear, attn.o_proj, mlp.gate_up, mlp.down_proj))
        if args or prompt or attn.decode_layer(kwargs.get("attention_mask"), kwargs.get("position_embeddings"),
                                               kwargs) is None:
            return super().forward(hidden_states, *args, **kwargs)
        # the input norm in q/k/v's GEMV, the residual in o_proj's; the post-attention norm in gate/up's, down adds
        h, _ = attn(hidden_states=hidden_states, input_norm_eps=self.input_eps, residual=hidden_states, **kwargs)
        return mlp(h, norm_eps=self.post_eps, residual=h)


def fused_form(original: torch.nn.Module) -> FusedNorms:
    """A FusedNorms sharing `original`'s state (torch_step.on_same_state)."""
    out = on_same_state(original, FusedNorms, "FusedNorms")
    out.input_eps, out.post_eps = norm_eps(original.input_layernorm), norm_eps(original.post_attention_layernorm)
    return out


def kernel_path(module: torch.nn.Module) -> bool:
    return isinstance(module, QuantLinear) and not module.prompt_form and module.dense is None


def unfusable(layer: torch.nn.Module) -> str | None:
    """Why fuse_norms cannot take decoder layer `layer`, None when it can (what it computes is checked after)."""
    attn, mlp = layer.self_attn, layer.mlp
    if not isinstance(attn, FusedAttention):
        return "its attention is not in the fused form (FusedAttention)"
    if not isinstance(mlp, GatedMLP):
        return "its MLP is not a gated MLP on softsyn's kernel"
    if not all(kernel_path(m) for m in (attn.packed_q_k_v.linear, attn.o_proj, mlp.gate_up, mlp.down_proj)):
        return "a GEMV is not softsyn's kernel (QuantLinear) in its decode form"
    for name in ("input_layernorm", "post_attention_layernorm"):
        norm = getattr(layer, name)
        weight = getattr(norm, "weight", None)
        if norm_eps(norm) is None or weight is None or not bool((weight == 1).all()):
            return f"{name} is not a weightless RMS norm (not folded: fold_norms)"
    return None


def fuse_norms(model: torch.nn.Module) -> Fusion:
    """Put a FusedNorms where each decoder layer of `model` computes what the fused form does, checked on one random
    step over a small cache in softsyn's decode form (output and cache, within fp16 rounding); the others kept, with
    why."""
    rotary = rotary_embedding(model)

    def attempt(child: torch.nn.Module) -> torch.nn.Module | str | None:
        if not decoder_layer(child) or isinstance(child, FusedNorms):
            return None
        reason = unfusable(child)
        if reason is not None:
            return reason
        case = check_case(model, child, rotary)
        if case is None:
            return "no rotary embedding found"
        candidate = fused_form(child)
        want = run_layer(child, FUSED_FORM, case)
        if agree(run_layer(candidate, FUSED_FORM, case), want, case):
            return candidate
        return "it computes something else"

    fused, why = substitute_checked(model, attempt)
    return Fusion(fused, sum(why.values()), why)


def covered_cells(model: torch.nn.Module) -> dict[str, tuple[str, ...]]:
    """{module path of a fused layer's GEMV op (as the kernel map names it): the instances it computes besides}: the
    q/k/v GEMV its layer's input norm, the gated gate/up GEMV (GatedMLP's op) the post-attention norm, o_proj's and
    down's the layer's own residual adds. The decode package's map gives those netlist cells to the GEMVs' macro
    cells (softsyn.runtime.torch_provenance.kernel_calls): at decode they have no kernel of their own."""
    out = {}
    for path, layer in model.named_modules():
        if isinstance(layer, FusedNorms):
            out.update({f"{path}.self_attn.packed_q_k_v.linear": (f"{path}.input_layernorm",),
                        f"{path}.mlp": (f"{path}.post_attention_layernorm",),
                        f"{path}.self_attn.o_proj": (path,), f"{path}.mlp.down_proj": (path,)})
    return out


def norms_for(target, model: torch.nn.Module, folded: Fusion | None) -> list[str]:
    """Fuse `model`'s decoder layers' norms where torch target `target` asks (fused_norms "on"; `folded`: what
    fold_norms did before quantisation); the compile log's lines."""
    if target.fused_norms == "off" or folded is None:
        return []
    lines = [f"{folded.done} RMS norm weight{'s' if folded.done != 1 else ''} folded into the q/k/v and gate/up "
             "projections they feed before quantisation (fused_norms)"]
    if folded.kept:
        lines.append(f"{folded.kept} norm{'s' if folded.kept != 1 else ''} not folded ("
                     + "; ".join(f"{n}: {reason}" for reason, n in folded.why.items()) + ")")
    fusion = fuse_norms(model)
    if fusion.done:
        lines.append(f"{fusion.done} decoder layer{'s' if fusion.done != 1 else ''}: input and post-attention RMS "
                     "norms in the q/k/v and gate/up GEMVs, residual adds in the o_proj and down GEMVs (softsyn's "
                     "kernel, NORM and RESIDUAL; fused_norms on): no norm kernels at decode")
    if fusion.kept:
        lines.append(f"{fusion.kept} decoder layer{'s' if fusion.kept != 1 else ''} kept their norm kernels ("
                     + "; ".join(f"{n}: {reason}" for reason, n in fusion.why.items()) + ")")
    return lines
