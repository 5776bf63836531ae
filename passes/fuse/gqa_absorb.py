"""cuda: what GroupQueryAttention absorbs — the rotary of Q and K (do_rotary=1, cos/sin caches) and Qwen3-style
per-head q/k RMSNorms (q_norm_weight/k_norm_weight) — or why it cannot.

GQA derives positions from seqlens_k (past + i), so a rotary is absorbed only when it reads the model's own
position_ids input (the standard arange(past, past + seq)); a rotary on computed positions stays outside.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from passes.fuse.graph import MS, attr, const_shape, dim, op


@dataclass
class Absorbed:
    q: ir.Value            # [B, S, Nq*H] before norm and rotary
    k: ir.Value            # [B, S, Nkv*H]
    cos: ir.Value          # [max_pos, H/2]
    sin: ir.Value
    q_norm: ir.Value | None = None   # [H]
    k_norm: ir.Value | None = None
    eps: float = 1e-6
    norm_miss: str = ""


def _rotary_of(x: ir.Value, heads: int, name: str):
    """(RotaryEmbedding node, its un-rotated [B,S,N*H] input) for GQA input x, None if x is not rotated,
    or a reason why GQA cannot absorb it."""
    rot = x.producer()
    if rot is None or rot.op_type != "RotaryEmbedding" or rot.domain != MS:
        return None
    if attr(rot, "interleaved", 0) != 0:
        return f"{name} rotary is interleaved"
    if attr(rot, "rotary_embedding_dim", 0) not in (0, None) or attr(rot, "is_packed_batching", 0):
        return f"{name} rotary is partial or packed-batching"
    if attr(rot, "scale", 1.0) != 1.0:
        return f"{name} rotary has scale {attr(rot, 'scale')}"
    if attr(rot, "num_heads", heads) != heads:
        return f"{name} rotary has num_heads {attr(rot, 'num_heads')}, attention has {heads}"
    flat = rot.inputs[0]
    if flat.shape is None or len(flat.shape) != 3:
        return f"{name} rotary input is not [B, S, N*H] (shape {flat.shape})"
    return rot, flat


def _position_reason(graph, pos: ir.Value):
    """None if pos is the model's position_ids graph input (possibly Cast to int64), else a reason."""
    src = pos
    c = op(src, "Cast")
    if c is not None:
        src = c.inputs[0]
    if src.producer() is not None or src.const_value is not None or not any(i is src for i in graph.inputs):
        made = src.producer().op_type if src.producer() is not None else "a constant"
        return (f"rotary reads position ids {pos.name} computed by {made}, not the model's position_ids input, so "
                "they may not be the standard arange(past, past + seq): GQA (positions from seqlens_k) cannot absorb it")
    if "position" not in src.name:
        return (f"rotary reads graph input {src.name} as positions, not the model's position_ids: "
                "GQA (positions from seqlens_k) cannot absorb it")
    if src.shape is None or len(src.shape) != 2:
        return f"rotary position ids {src.name} are not [batch, seq] (shape {src.shape}): GQA cannot absorb it"
    return None


def _head_norm(flat: ir.Value, heads: int, h: int, name: str):
    """flat = Reshape(SimplifiedLayerNormalization(Reshape(x3, [B,S,N,H])), [B,S,N*H]) with a per-head [H]
    weight: (x3, weight, eps); (flat, None, None) when there is no norm (x3 if flat is Reshape(Reshape(x3)));
    or a reason."""
    rs = op(flat, "Reshape")
    if rs is None:
        return flat, None, None
    a = rs.inputs[0]
    norm = op(a, "SimplifiedLayerNormalization", "LayerNormalization", "RMSNormalization")
    if norm is None:
        if a.shape is not None and len(a.shape) == 4 and dim(a, 2) == heads and dim(a, 3) == h:
            inner = op(a, "Reshape")
            if inner is not None and inner.inputs[0].shape is not None and len(inner.inputs[0].shape) == 3 \
                    and dim(inner.inputs[0], 2) == heads * h:
                return inner.inputs[0], None, None
        return flat, None, None
    if norm.op_type != "SimplifiedLayerNormalization" or norm.domain not in ("", "ai.onnx"):
        return f"{name} norm is {norm.op_type}, not per-head RMSNorm (SimplifiedLayerNormalization)"
    if a.shape is None or len(a.shape) != 4 or dim(a, 2) != heads or dim(a, 3) != h:
        return f"{name} norm is not per-head RMSNorm: it normalises shape {a.shape}, not [B, S, {heads}, {h}]"
    if attr(norm, "axis", -1) not in (-1, 3):
        return f"{name} norm is not per-head RMSNorm: axis {attr(norm, 'axis')}"
    if len(norm.inputs) < 2 or norm.inputs[1] is None or const_shape(norm.inputs[1]) != (h,):
        return f"{name} norm is not per-head RMSNorm: weight is not a constant [{h}]"
    if attr(norm, "stash_type", 1) != 1:
        return f"{name} norm computes in its input type (stash_type {attr(norm, 'stash_type')}), GQA's in float"
    if len(norm.outputs) > 1 and any(o.uses() for o in list(norm.outputs)[1:]):
        return f"{name} norm's inv_std_var output is used"
    view = op(norm.inputs[0], "Reshape")
    x3 = view.inputs[0] if view is not None else None
    if x3 is None or x3.shape is None or len(x3.shape) != 3 or dim(x3, 2) != heads * h \
            or str(x3.shape[0]) != str(a.shape[0]) or str(x3.shape[1]) != str(a.shape[1]):
        return f"{name} norm input is not a [B, S, {heads}*{h}] projection viewed per head"
    if norm.inputs[1].dtype != x3.dtype:
        return f"{name} norm weight dtype {norm.inputs[1].dtype} differs from the activations' {x3.dtype}"
    return x3, norm.inputs[1], float(attr(norm, "epsilon", 1e-5))


def absorb(ctx, q: ir.Value, k: ir.Value, nq: int, nkv: int):
    """What GQA (cuda) can take over: None (no rotary here), a reason (rotary not absorbable), or Absorbed."""
    rq, rk = _rotary_of(q, nq, "Q"), _rotary_of(k, nkv, "K")
    if rq is None and rk is None:
        return None
    if rq is None or rk is None:
        return f"only {'K' if rq is None else 'Q'} is rotated by a RotaryEmbedding"
    for r in (rq, rk):
        if isinstance(r, str):
            return r
    (qrot, qflat), (krot, kflat) = rq, rk
    if qrot.inputs[2] is not krot.inputs[2] or qrot.inputs[3] is not krot.inputs[3]:
        return "Q and K rotaries use different cos/sin caches"
    if qrot.inputs[1] is not krot.inputs[1]:
        return "Q and K rotaries read different position ids"
    bad = _position_reason(ctx.graph, qrot.inputs[1])
    if bad:
        return bad
    cos, sin = qrot.inputs[2], qrot.inputs[3]
    h = dim(qflat, 2) // nq if isinstance(dim(qflat, 2), int) else None
    cc = const_shape(cos)  # shapes only: a weightless netlist's caches have no data
    if h is None or cc is None or len(cc) != 2 or cc[1] * 2 != h or const_shape(sin) != cc:
        return f"cos/sin caches are not constant [max_pos, {h}/2]"
    if cos.dtype != q.dtype or sin.dtype != q.dtype:
        return f"cos/sin cache dtype {cos.dtype} differs from Q's {q.dtype}"
    nqv = _head_norm(qflat, nq, h, "q")
    nkv_ = _head_norm(kflat, nkv, h, "k")
    ab = Absorbed(qflat, kflat, cos, sin)
    if isinstance(nqv, str) or isinstance(nkv_, str):
        ab.norm_miss = nqv if isinstance(nqv, str) else nkv_
        return ab
    (xq, wq, eq), (xk, wk, ek) = nqv, nkv_
    if (wq is None) != (wk is None):
        ab.norm_miss = f"only {'q' if wk is None else 'k'} has a per-head norm (GQA takes both or neither)"
        return ab
    if wq is None:
        ab.q, ab.k = xq, xk
        return ab
    if not np.isclose(eq, ek, rtol=1e-6, atol=0):
        ab.norm_miss = f"q and k norms use different epsilons ({eq:g}, {ek:g}); GQA has one qk_norm_epsilon"
        return ab
    ab.q, ab.k, ab.q_norm, ab.k_norm, ab.eps = xq, xk, wq, wk, eq
    return ab


def absorb_into(ctx, site_name: str, inputs: list, attrs: dict, nq: int, nkv: int) -> None:
    """Let the GQA node being built (inputs [q, k, v, past_k, past_v, seqlens, total], attrs) take over the rotary
    and q/k norms of q = inputs[0] and k = inputs[1] where it can; what it could not take is logged for note()."""
    ab = absorb(ctx, inputs[0], inputs[1], nq, nkv)
    if ab is None:  # no rotary here: nothing to absorb, nothing to note
        return
    log = ctx.cache.setdefault("gqa-absorb", {"rotary": 0, "qk_norm": 0, "misses": []})
    if isinstance(ab, str):
        log["misses"].append(f"{site_name}: {ab}; rotary stays outside GQA (do_rotary=0)")
        return
    inputs[0], inputs[1] = ab.q, ab.k
    inputs += [ab.cos, ab.sin]
    attrs.setdefault("local_window_size", -1)  # a window or soft cap the site has (passes.fuse.window) stays
    attrs.setdefault("softcap", 0.0)
    attrs.update({"do_rotary": 1, "rotary_interleaved": 0})
    log["rotary"] += 1
    if ab.q_norm is not None:
        inputs += [None, None, None, None, None, ab.q_norm, ab.k_norm]
        attrs["qk_norm_epsilon"] = float(ab.eps)
        log["qk_norm"] += 1
    elif ab.norm_miss:
        log["misses"].append(f"{site_name}: {ab.norm_miss}; q/k norms stay outside GQA")


def absorb_note(ctx) -> str:
    """What the cuda GQA nodes absorbed, of how many, and why the rest did not."""
    log = ctx.cache.get("gqa-absorb")
    if ctx.target != "cuda" or log is None:
        return ""
    n = sum(1 for x in ctx.graph if x.op_type == "GroupQueryAttention")
    text = (f"cuda: rotary absorbed into GroupQueryAttention (do_rotary=1) {log['rotary']}/{n}, "
            f"q/k RMSNorm absorbed (q_norm_weight/k_norm_weight) {log['qk_norm']}/{n}; the fused GQA derives "
            "positions from seqlens_k (past + i), i.e. it ignores position_ids (kept as an input)")
    if log["misses"]:
        text += "; not absorbed: " + "; ".join(log["misses"])
    return text
