"""A decoder layer's attention with its prologue in one kernel (softsyn::attention_prologue,
softsyn.emit.triton_prologue) for the torch targets' decode step: the packed QKV projection once, then the q/k norms,
rotary and q's stacked layout in one kernel, the cache write an `index_copy_` (the op returns the step's rows:
softsyn.emit.triton_prologue says why), softsyn::decode_attention over the cache's filled prefix
(as torch_attention_forms.softsyn_attention calls it) and the output projection. Where Inductor ran the prologue as
four kernels a layer (q norm + rotary, k norm + rotary, two cache writes), and a decode step is bound by its number
of kernels (docs/decisions/2026-12-06-triton-int4.md).

FusedAttention replaces an attention module (Llama-style: q/k/v the parts of one PackedLinear, optional q_norm and
k_norm over the head, rotary from the layer's position_embeddings, o_proj) only where it computes what that module
does: fuse_prologues runs both on one random input over a small cache and keeps the original where they differ
(interleaved rotary, another norm) or where the kernels cannot take the layer (partial rotary, sliding-window layers,
soft-capped scores, a head width that is not a power of two), saying why. Outside softsyn's decode attention form
(the prefill package's SDPA) or without softsyn's cache, a FusedAttention runs the original class's forward.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from transformers.cache_utils import Cache

from softsyn.emit.triton_prologue import reference as prologue_in_torch  # the import registers the op
from softsyn.emit.torch_attention_forms import ATTENTIONS, attention_implementation
from softsyn.emit.torch_step import (PACKED, BufferLayer, PackedLinear, PackedPart, on_same_state, rotary_embedding,
                                     substitute_checked)

FUSED_FORM = ATTENTIONS["softsyn"][0]  # the attention implementation whose steps take the fused prologue
CHECK_FORM = ATTENTIONS["matmul"][0]  # the original runs the check in the matmul form (a bool mask, plain torch)
CHECK_SLOTS, CHECK_SEQ = 8, 3  # the check's cache and step: three positions written at slots 3-5 of 8


def norm_eps(norm: torch.nn.Module | None) -> float | None:
    """An RMS norm's epsilon (Qwen3RMSNorm's variance_epsilon, Llama-style `eps`), None for anything else."""
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    return float(eps) if isinstance(eps, (int, float)) else None


class FusedAttention(torch.nn.Module):
    """An attention that fuse_prologues checked, with its prologue in one kernel at decode: a subclass of the
    original's class (fused_form(), same instance state, so module paths, weight names and kernel provenance are
    unchanged) whose forward is the original's wherever the fused form does not apply."""

    prologue_eps: float = 1e-6  # the q/k norms' epsilon (fused_form() sets it from them)
    kernel_prologue: bool = True  # the prologue as softsyn's kernel; False: its torch form, which Inductor compiles
    # into kernels of its own (as the original's), so the layer can still take fused_norms where the kernel lost
    writes_cache: bool = False  # with the kernel: the prologue writes the cache and attends in one op
    # (softsyn::attention_step), no index_copy_ after it
    folds_combine: bool = False  # with writes_cache: the attention's combine folded into its split kernel

    def norm_weight(self, name: str) -> torch.Tensor | None:
        norm = getattr(self, name, None)
        return None if norm is None else norm.weight

    def decode_layer(self, attention_mask, position_embeddings, kwargs: dict) -> BufferLayer | None:
        """The layer's softsyn cache where the fused form applies (softsyn's decode attention form, its cache, a
        mask and rotary), else None."""
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        layers = getattr(cache, "layers", ())
        layer = layers[self.layer_idx] if len(layers) > self.layer_idx else None
        if (self.config._attn_implementation != FUSED_FORM or not isinstance(layer, BufferLayer)
                or attention_mask is None or position_embeddings is None):
            return None
        return layer

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, input_norm_eps=None,
                residual=None, **kwargs):
        """`input_norm_eps`, `residual` (a fused decoder layer's, softsyn.emit.torch_norms): the layer's input RMS
        norm (its weight folded into q/k/v) in the q/k/v GEMV, and the residual added in o_proj's; the fused form
        only (the decoder layer asks decode_layer first)."""
        layer = self.decode_layer(attention_mask, position_embeddings, kwargs)
        if layer is None:
            if input_norm_eps is not None or residual is not None:
                raise ValueError("an input norm or residual for an attention outside its fused form")
            return super().forward(hidden_states, position_embeddings=position_embeddings,
                                   attention_mask=attention_mask, **kwargs)
        cos, sin = position_embeddings
        linear = self.packed_q_k_v.linear
        qkv = linear(hidden_states) if input_norm_eps is None else linear(hidden_states, input_norm_eps)
        scale = self.scaling if self.scaling is not None else self.head_dim ** -0.5
        weights = self.norm_weight("q_norm"), self.norm_weight("k_norm")
        if self.kernel_prologue and self.writes_cache:
            out = torch.ops.softsyn.attention_step(qkv, *weights, cos, sin, keys=layer.keys, values=layer.values,
                                                   where=layer.where, mask=attention_mask[:, 0], eps=self.prologue_eps,
                                                   scale=scale, fold=self.folds_combine)
        else:
            prologue = torch.ops.softsyn.attention_prologue if self.kernel_prologue else prologue_in_torch
            q, k_rows, v_rows = prologue(qkv, *weights, cos, sin, kv_heads=layer.keys.shape[1], eps=self.prologue_eps)
            keys, values = layer.update(k_rows, v_rows)  # index_copy_ into the cache, which Inductor writes in place
            out = torch.ops.softsyn.decode_attention(q, keys, values, attention_mask[:, 0], scale)
        out = out.reshape(*hidden_states.shape[:-1], -1)
        return (self.o_proj(out) if residual is None else self.o_proj(out, residual=residual)), None


def fused_form(original: torch.nn.Module, kernel: bool = True, writes_cache: bool = False,
               folded: bool = False) -> FusedAttention:
    """A FusedAttention sharing `original`'s state (torch_step.on_same_state), its prologue the kernel or (`kernel`
    False) its torch form; with the kernel, `writes_cache`: the prologue writes the cache and attends in one op, and
    with it `folded`: that op's combine folded into its split kernel."""
    out = on_same_state(original, FusedAttention, "Fused")
    norms = [getattr(original, name, None) for name in ("q_norm", "k_norm")]
    out.prologue_eps = next((norm_eps(n) for n in norms if n is not None), FusedAttention.prologue_eps)
    out.kernel_prologue = kernel
    out.writes_cache = kernel and writes_cache
    out.folds_combine = out.writes_cache and folded
    return out


def packed_qkv(module: torch.nn.Module) -> PackedLinear | None:
    """The PackedLinear whose three parts are `module`'s q/k/v projections, where it has an o_proj, a layer_idx and a
    head_dim (a Llama-style attention pack_projections packed); else None."""
    packed = getattr(module, "packed_q_k_v", None)
    parts = [getattr(module, name, None) for name in PACKED[0]]
    if not isinstance(packed, PackedLinear) or len(packed.sizes) != 3:
        return None
    if not all(isinstance(p, PackedPart) and p.packed is packed for p in parts):
        return None
    has = all(hasattr(module, name) for name in ("o_proj", "layer_idx", "head_dim", "scaling", "config"))
    return packed if has else None


def unfusable(module: torch.nn.Module, packed: PackedLinear) -> str | None:
    """Why the kernels cannot take `module`'s attention, None when they can (what it computes is checked after)."""
    dim = int(module.head_dim)
    q_size, k_size, v_size = packed.sizes
    if dim & (dim - 1):
        return f"head dim {dim} is not a power of two (the kernels' tiles)"
    if k_size != v_size or k_size % dim or q_size % k_size:
        return "q/k/v widths are not whole heads with as many query heads for every KV head"
    if getattr(module, "sliding_window", None):
        return "sliding-window layers (the step's per-type mask)"
    if getattr(module, "attn_logit_softcapping", None) or getattr(module.config, "attn_logit_softcapping", None):
        return "soft-capped scores"
    norms = [getattr(module, name, None) for name in ("q_norm", "k_norm")]
    if any(n is not None and (norm_eps(n) is None or getattr(n, "weight", None) is None
                              or tuple(n.weight.shape) != (dim,)) for n in norms):
        return "a q/k norm that is not an RMS norm over the head"
    if len({norm_eps(n) for n in norms if n is not None}) > 1:
        return "q and k norms of different epsilons"
    return None


class CheckInput(NamedTuple):
    x: torch.Tensor  # [B, CHECK_SEQ, hidden]
    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor  # [B, 1, CHECK_SEQ, CHECK_SLOTS] bool
    where: torch.Tensor  # the slots written
    cache: torch.Tensor  # [2, B, Hkv, CHECK_SLOTS, D]: keys and values before the step


def check_input(width: int, kv_heads: int, dim: int, rotary: torch.nn.Module, like: torch.Tensor) -> CheckInput:
    """One random step of 2 batch rows at positions 3-5 over a cache of random stale values (`like`: the
    activations' dtype and device)."""
    g = torch.Generator(device=like.device).manual_seed(0)
    x = torch.randn(2, CHECK_SEQ, width, generator=g, device=like.device).to(like.dtype)
    where = torch.arange(3, 3 + CHECK_SEQ, device=like.device)
    positions = where.expand(2, CHECK_SEQ)
    cos, sin = rotary(x, positions)
    mask = (torch.arange(CHECK_SLOTS, device=like.device)[None, None, :] <= positions[:, :, None])[:, None]
    cache = torch.randn(2, 2, kv_heads, CHECK_SLOTS, dim, generator=g, device=like.device).to(like.dtype)
    return CheckInput(x, cos, sin, mask, where, cache)


def run_once(module: torch.nn.Module, form: str, case: CheckInput) -> tuple[torch.Tensor, torch.Tensor]:
    """(module's output, the cache after it) for `case` under attention implementation `form`."""
    keys, values = case.cache.clone()
    layer = BufferLayer(keys, values, case.where, CHECK_SLOTS)
    cache = Cache(layers=[layer] * (module.layer_idx + 1))
    with attention_implementation(module, form), torch.no_grad():
        out = module(hidden_states=case.x, position_embeddings=(case.cos, case.sin), attention_mask=case.mask,
                     position_ids=case.where.expand(2, CHECK_SEQ), cache=cache, use_cache=True)[0]
    return out.float(), torch.stack([keys, values]).float()


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Within fp16's rounding of the prologue (the original rounds between norm, weight and rotary; the kernel once)."""
    return got.shape == want.shape and bool((got - want).abs().max() <= 1e-2 * want.abs().max() + 1e-6)


class Fusion(NamedTuple):
    fused: int
    kept: int  # packed-QKV attentions left as they were
    why: dict[str, int]  # {reason: attentions kept for it}


def fuse_prologues(model: torch.nn.Module, kernel: bool = True, writes_cache: bool = False,
                   folded: bool = False) -> Fusion:
    """Put a FusedAttention (its prologue the kernel, or where not `kernel` its torch form; `writes_cache`: the kernel
    writes the cache and attends in one op, `folded` its combine in the split kernel) where each packed-QKV attention
    of `model` computes what the fused form does, checked on one random step over a small cache (output and cache
    both, within fp16 rounding); the others kept, with why."""
    rotary = rotary_embedding(model)
    like = model.get_input_embeddings().weight

    def attempt(child: torch.nn.Module) -> torch.nn.Module | str | None:
        packed = packed_qkv(child)
        if packed is None:
            return None
        dim = int(child.head_dim)
        reason = unfusable(child, packed) or (None if rotary is not None else "no rotary embedding found")
        if reason is not None:
            return reason
        case = check_input(packed.linear.in_features, packed.sizes[1] // dim, dim, rotary, like)
        if case.cos.shape[-1] != dim:
            return f"partial rotary ({case.cos.shape[-1]} of {dim} dims)"
        candidate = fused_form(child, kernel, writes_cache, folded)
        want, want_cache = run_once(child, CHECK_FORM, case)
        got, got_cache = run_once(candidate, FUSED_FORM, case)
        if close(got, want) and close(got_cache, want_cache):
            return candidate
        return "it computes something else (another rotary or norm)"

    fused, why = substitute_checked(model, attempt)
    return Fusion(fused, sum(why.values()), why)


def fusion_notes(fusion: Fusion, measured: bool = False, kernel: bool = True, writes_cache: bool = False,
                 folded: bool = False) -> list[str]:
    """The compile log's lines on what fuse_prologues did (`measured`: the attention choice timed it faster;
    `kernel`: the prologue as the kernel, else its torch form; `writes_cache`: the kernel writes the cache, `folded`:
    the attention's combine in its split kernel)."""
    lines = []
    if fusion.fused and kernel:
        what = ("q/k norm, rotary and the cache write in one kernel, softsyn's decode attention in the same op"
                f"{', its combine folded into the split kernel' if folded else ''} (softsyn::attention_step"
                if writes_cache else
                "q/k norm, rotary and q's layout in one kernel before softsyn's decode attention "
                "(softsyn::attention_prologue")
        lines.append(f"{fusion.fused} attention{'s' if fusion.fused != 1 else ''}: {what}; "
                     f"fused_prologue, {'measured faster' if measured else 'unmeasured'})")
    elif fusion.fused:
        lines.append(f"{fusion.fused} attention{'s' if fusion.fused != 1 else ''} in the fused form with the "
                     "prologue's torch form (Inductor's kernels, as their own prologue; the kernel measured no "
                     "faster), so that fused_norms can take their layers")
    if fusion.kept:
        why = "; ".join(f"{n}: {reason}" for reason, n in fusion.why.items())
        lines.append(f"{fusion.kept} attention{'s' if fusion.kept != 1 else ''} kept their own prologue ({why})")
    return lines


PROLOGUE_SETTINGS = ("off", "on", "measured")  # TorchTarget.fused_prologue


def prologues_for(target, attention: str, model: torch.nn.Module, chosen: bool = False,
                  writes_cache: bool = False, folded: bool = False) -> list[str]:
    """Fuse `model`'s attention prologues where torch target `target` asks (fused_prologue "on", or "measured" and
    the measured choice `chosen` it) and its decode attention form `attention` is softsyn's (the kernel writes q in
    that form's layout); where "measured" did not choose it but the target fuses norms (fused_norms "on", which
    needs the fused attention form), the fused form with the prologue's torch form. `writes_cache`: the chosen
    prologue writes the cache itself (softsyn::attention_step), `folded` with the combine in its split kernel. The
    compile log's lines."""
    setting = target.fused_prologue
    if setting == "off":
        return []
    if attention != "softsyn":
        return [f"fused_prologue unused: the decode attention is {attention}, not softsyn's"]
    if setting == "measured" and not chosen:
        if target.fused_norms != "on":
            return ["fused_prologue measured: not faster than each attention's own prologue, so not fused"]
        return ["fused_prologue measured: not faster than each attention's own prologue",
                *fusion_notes(fuse_prologues(model, kernel=False), kernel=False)]
    return fusion_notes(fuse_prologues(model, writes_cache=writes_cache, folded=folded),
                        measured=setting == "measured", writes_cache=writes_cache, folded=folded)
