"""Attention matching shared by the attention op rules: Softmax(Q K^T * scale + mask) V, found and checked.

Robustness comes from checking meaning, not spelling: the walk from the Softmax back to Q and K and
forward to V is structural (scalar Mul/Div, layout ops), and what the layout chains and the mask
compute is then *evaluated* on small probe inputs and compared with what the fused op assumes
(K and V = the cache repeated per query-head group, mask = causal over past + new tokens). So an
exporter that spells repeat_kv or the causal mask differently still fuses, and a model whose mask is
not causal (sliding window, prefix-LM, bidirectional) gets a Miss that says which entry differs.

`AttentionRule` is the one `attention` kind: it finds every site (`match`), then hands it to the first of its
op rules (`AttentionOp`: GroupQueryAttention in gqa.py, MultiHeadAttention in mha.py) that claims it, which
checks what its op needs and rewrites the site.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from passes.fuse.attention_sites import attention_softmaxes, position_terms
from passes.fuse.base import Replacement, Rule, stand_in
from passes.fuse.chain import Link, follow, reached, trace
from passes.fuse.graph import (attr, cone_inputs, const, consumers, dim, input_dependent, int64, make_node, op, rank,
                               scalar)
from passes.fuse.window import inner_bias_reason, local_window, softcap_step

LAYOUT = {"Reshape", "Transpose", "Expand", "Unsqueeze", "Squeeze", "Identity"}
SCORE_OPS = ("MatMul", "Mul", "Div", "Add", "Tanh")  # what lies between Q.K^T and the mask's Add (a soft cap: Tanh)


def _scalar_strip(v: ir.Value) -> tuple[ir.Value, float]:
    """Strip Mul/Div by constant scalars; return (inner value, accumulated factor)."""
    s = 1.0
    while True:
        n = op(v, "Mul", "Div")
        if n is None:
            return v, s
        c0, c1 = scalar(n.inputs[0]), scalar(n.inputs[1])
        if n.op_type == "Mul" and c1 is not None:
            v, s = n.inputs[0], s * c1
        elif n.op_type == "Mul" and c0 is not None:
            v, s = n.inputs[1], s * c0
        elif n.op_type == "Div" and c1 is not None:
            v, s = n.inputs[0], s / c1
        else:
            return v, s


def _reaches_matmul(v: ir.Value, depth: int = 4, through=("MatMul", "Mul", "Div", "Add")) -> bool:
    n = op(v, *through)
    if n is None or depth == 0:
        return False
    if n.op_type == "MatMul":
        return const(n.inputs[1]) is None and const(n.inputs[0]) is None
    return any(_reaches_matmul(i, depth - 1, through) for i in n.inputs)


def _walk_scores(v: ir.Value):
    """(qk MatMul, bias value or None, scale, softcap) or a reason: the scores are softcap * tanh(scale / softcap *
    Q.K^T) + bias with a soft cap (passes.fuse.window), scale * Q.K^T + bias without (softcap 0)."""
    bias, scale, softcap = None, 1.0, 0.0
    for _ in range(10):
        n = v.producer()
        if n is None:
            return "softmax input does not come from a MatMul"
        if n.op_type == "MatMul":
            if const(n.inputs[1]) is not None:
                return "the scores MatMul multiplies by a constant weight (not Q.K^T)"
            return n, bias, scale * softcap if softcap else scale, softcap
        if n.op_type in ("Mul", "Div"):
            inner, s = _scalar_strip(v)
            if inner is v:
                return f"scores are scaled by a non-constant ({n.op_type} {n.name})"
            v, scale = inner, scale * s
            continue
        if n.op_type == "Add":
            if softcap:
                return inner_bias_reason(n)
            a, b = n.inputs
            ra, rb = _reaches_matmul(a, 6, SCORE_OPS), _reaches_matmul(b, 6, SCORE_OPS)
            if ra and not rb:
                v, extra = a, b
            elif rb and not ra:
                v, extra = b, a
            else:
                return f"cannot tell scores from mask in {n.name}"
            if bias is not None:
                return "two additive masks/biases on the scores"
            bias = extra
            continue
        if n.op_type == "Tanh":
            step = softcap_step(n, scale, softcap)
            if isinstance(step, str):
                return step
            (v, softcap), scale = step, 1.0
            continue
        return f"unsupported {n.op_type} ({n.name}) between the scores MatMul and Softmax"
    return "scores chain too long"


def _tol(dtype) -> float:
    """Relative tolerance for a probe comparison in `dtype` (fp16/bf16 round at ~1e-3/~8e-3)."""
    return 1e-5 if np.dtype(dtype).itemsize >= 4 else 2e-2


def _max_rel(got, exp) -> float:
    got, exp = np.asarray(got, dtype=np.float64), np.asarray(exp, dtype=np.float64)
    if not (np.all(np.isfinite(got)) and np.all(np.isfinite(exp))):
        return float("inf")
    return float(np.abs(got - exp).max() / (np.abs(exp).max() + 1e-12)) if exp.size else 0.0


LAYOUT_BACK = Link("a layout op", tuple(sorted(LAYOUT)), times=(0, None))  # back to where a K/V operand's view starts


def _appends_to_past(n: ir.Node, v: ir.Value) -> str | None:
    """Why Concat `n` is not the KV cache append Concat(past, new, axis=-2) with past a graph input, else None."""
    if len(n.inputs) != 2 or attr(n, "axis") not in (2, -2):
        return f"{len(n.inputs)} inputs on axis {attr(n, 'axis')}, not (past, new) on axis -2"
    past = n.inputs[0]
    if past.producer() is not None or past.const_value is not None:
        return f"its past ({past.name}) is not a graph input"
    return None


CACHE_APPEND = Link("the KV-cache Concat(past, new, axis=-2)", ("Concat",), test=_appends_to_past)


def _kv_source(operand: ir.Value, name: str) -> tuple[ir.Value, ir.Node | str]:
    """(where the layout chain back from K/V `operand` starts, the KV-cache Concat that makes it or why none does)."""
    src = reached(operand, trace(operand, f"{name} operand", LAYOUT_BACK), forward=False)
    cat = trace(src, f"{name} source", CACHE_APPEND)
    return src, cat if isinstance(cat, str) else cat[0]


def _nan_guard(n: ir.Node, v: ir.Value) -> str | None:
    """Why Where `n` is not the NaN guard Where(IsNaN(v), fill, v) an exporter puts after the Softmax, else None."""
    cond = op(n.inputs[0], "IsNaN")
    if cond is not None and cond.inputs[0] is v and n.inputs[2] is v:
        return None
    return "not Where(IsNaN(probs), fill, probs)"


# forward from the Softmax: an optional NaN guard, then probs @ V
PROBS_TO_V = (Link("a NaN guard Where(IsNaN(probs), fill, probs)", ("Where",), gives="guarded probs", test=_nan_guard,
                   times=(0, 1), beside=("IsNaN",)),
              Link("MatMul(probs, V)", ("MatMul",),
                   test=lambda n, v: None if n.inputs[0] is v else "probs is its second operand, not the first"))


def _output_chain(v: ir.Value):
    """Forward from probs @ V [B, N, S, H] through up to six single-use layout ops to the value the fused op's
    [B, S, N*H] output replaces: the first 3-D value, a 2-D [B*S, N*H] one (a flattened matrix for the output
    projection), or where the chain ends on a value of unknown rank; else a reason naming where it ended. Which
    layout it computes is checked on a probe (_verify_out)."""
    def unfinished(_: ir.Node, x: ir.Value) -> str | None:
        return "the output is reached" if rank(x) == 3 or (x is not v and rank(x) == 2) else None

    chain = follow(v, "probs@V", Link("a layout op", tuple(sorted(LAYOUT)), test=unfinished, times=(0, 6)))
    end = reached(v, chain)
    r = rank(end)
    if r == 3 or (chain and r == 2):
        return end
    if not any(n.op_type == "Transpose" for n in chain):
        return (f"attention output is not transposed back to [B, S, N, H] (probs@V "
                f"{'-> ' + ' -> '.join(n.op_type for n in chain) + ' ' if chain else ''}feeds "
                f"{[u.op_type for u in consumers(end)]} at {end.name})")
    if r is None:
        return end
    return (f"attention output is not reshaped to [B, S, N*H] (after {' -> '.join(n.op_type for n in chain)}: "
            f"{end.name} has rank {r})")


def bsd_view(v: ir.Value) -> ir.Value | None:
    """z if v [B,N,S,H] is Transpose(0,2,1,3) of Reshape(z) with z [B,S,N*H] (the projection it was viewed from)."""
    tr = op(v, "Transpose")
    rs = op(tr.inputs[0], "Reshape") if tr is not None and list(attr(tr, "perm", [])) == [0, 2, 1, 3] else None
    if rs is None:
        return None
    y, z = tr.inputs[0], rs.inputs[0]
    if z.shape is not None and y.shape is not None and len(z.shape) == 3 and len(y.shape) == 4 \
            and str(z.shape[0]) == str(y.shape[0]) and str(z.shape[1]) == str(y.shape[1]) \
            and isinstance(z.shape[2], int) and isinstance(y.shape[2], int) and isinstance(y.shape[3], int) \
            and z.shape[2] == y.shape[2] * y.shape[3]:
        return z
    return None


def _bsd_shape(ctx, v: ir.Value) -> ir.Value:
    """Reshape's target for [B,S,N,H] -> [B,S,N*H]: [0, 0, N*H] where N and H are static, since a -1 cannot be
    inferred for a zero-size batch (a composite's vision block at images 0, a text-only group), else [0, 0, -1]."""
    n, h = dim(v, 1), dim(v, 3)
    if isinstance(n, int) and isinstance(h, int):
        return int64(ctx.graph, f"shape_bs_{n * h}", [0, 0, n * h])
    return int64(ctx.graph, "shape_bs_flat", [0, 0, -1])


def to_bsd(ctx, anchor, v: ir.Value, new_nodes: list):
    """A [B,S,N*H] value equal to v [B,N,S,H] viewed as [B,S,N*H]; emits Transpose+Reshape if needed."""
    z = bsd_view(v)
    if z is not None:
        return z
    tr = op(v, "Transpose")
    if tr is not None and list(attr(tr, "perm", [])) == [0, 2, 1, 3]:
        r = make_node(anchor, "", "Reshape", [tr.inputs[0], _bsd_shape(ctx, v)])
        r.outputs[0].type = v.type
        new_nodes.append(r)
        return r.outputs[0]
    t = make_node(anchor, "", "Transpose", [v], {"perm": [0, 2, 1, 3]})
    r = make_node(anchor, "", "Reshape", [t.outputs[0], _bsd_shape(ctx, v)])
    t.outputs[0].type = r.outputs[0].type = v.type
    new_nodes += [t, r]
    return r.outputs[0]


@dataclass
class Site:
    """An attention site that passed the shared checks: what an op rule needs to claim, check and rewrite it."""
    softmax: ir.Node
    q: ir.Value            # [B, Nq, S, H]
    k_new: ir.Value        # cached: [B, Nkv, S, H] appended to the cache; else the K source, [B, T, Nkv*H] or kv_bnsh
    v_new: ir.Value
    past_k: ir.Value | None
    past_v: ir.Value | None
    present_k: ir.Value | None
    present_v: ir.Value | None
    out: ir.Value          # the [B, S, Nq*H] (or flattened [B*S, Nq*H]) value to replace
    num_heads: int
    kv_heads: int
    scale: float
    mask_input: ir.Value | None
    causal: bool
    head_size: int
    bias: ir.Value | None = None  # the additive mask the scores get (its value in the graph), if any
    softcap: float = 0.0   # GroupQueryAttention's softcap: scores capped as softcap * tanh(scores / softcap)
    window: int = -1       # GroupQueryAttention's local_window_size: the last `window` keys (-1: all)
    kv_bnsh: bool = False  # no cache, K/V sources per head [B, Nkv, T, H] (a ViT's rotary is applied per head)


def exact_scale(scale: float, head_size) -> float:
    """1/sqrt(head_size) when `scale` is that value rounded to fp16/bf16 constants by a half-precision export.

    The fused op's `scale` attribute is float32: keeping the exporter's rounding (0.0884249 for head size 128
    instead of 0.0883883) would move every score by ~4e-4 relative for nothing.
    """
    if not isinstance(head_size, int) or head_size <= 0:
        return scale
    exact = head_size ** -0.5
    return exact if abs(scale - exact) <= 4e-3 * exact else scale


def _probe_len(v: ir.Value, axis: int, default: int) -> int:
    """The probe's size of v's `axis`: the dim itself where the export fixed it (a ViT's 17 tokens), else default."""
    d = dim(v, axis)
    return d if isinstance(d, int) else default


def _probe_batch(probe, v: ir.Value) -> int:
    """The probe's size of v's batch axis: fixed by the export, the probe's size of its named dim (a vision block's
    `images`, which the block's reshapes read back from the probe's pixels), else the probe's batch."""
    d, batch = dim(v, 0), probe.dims.get("batch", 2)
    if isinstance(d, int):
        return d
    return batch if d is None else probe.dims.get(str(d), batch)


def _verify_kv(ctx, probe, ksrc, kt, vsrc, vv, nq, nkv, h, cached, bnsh=False):
    """The K and V operands are repeat_kv of their sources (K transposed): a KV-cache Concat [B, Nkv, T, H], or
    without a cache the [B, T, Nkv*H] projections (viewed per head, then repeated) or, `bnsh`, per-head values
    [B, Nkv, T, H] (rotary applied after the heads were split: a ViT's)."""
    b = _probe_batch(probe, ksrc)
    seq = probe.dims.get("seq", 3)
    per_head = cached or bnsh  # the source is [B, Nkv, T, H]
    past = probe.dims.get("past", 0) if cached else 0
    t = _probe_len(ksrc, 2, past + seq) if per_head else _probe_len(ksrc, 1, seq)
    rng = np.random.default_rng(3)
    # probes in the graph's dtype, and the expectation built from those very values: the layout
    # chains only move data, so they must reproduce them exactly (no fp32-vs-fp16 rounding gap)
    dt = (ksrc.dtype or ir.DataType.FLOAT).numpy()
    if per_head:
        kin = rng.standard_normal((b, nkv, t, h)).astype(dt)
        vin = rng.standard_normal((b, nkv, t, h)).astype(dt)
        heads_k, heads_v = kin, vin
    else:
        kin = rng.standard_normal((b, t, nkv * h)).astype(dt)
        vin = rng.standard_normal((b, t, nkv * h)).astype(dt)
        heads_k = kin.reshape(b, t, nkv, h).transpose(0, 2, 1, 3)
        heads_v = vin.reshape(b, t, nkv, h).transpose(0, 2, 1, 3)
    exp_k = np.repeat(heads_k, nq // nkv, axis=1).transpose(0, 1, 3, 2)
    exp_v = np.repeat(heads_v, nq // nkv, axis=1)
    try:
        got_k, got_v = ctx.run_probe([kt, vv], {ksrc: kin, vsrc: vin})
    except Exception as exc:
        return f"could not evaluate the K/V layout chains: {exc}"
    source = "cache" if cached else "per-head source" if bnsh else "projection"
    for name, got, exp, what in (("K", got_k, exp_k, f"(repeat_kv({source}))^T"), ("V", got_v, exp_v, f"repeat_kv({source})")):
        got = np.asarray(got)
        if got.shape != exp.shape:
            return (f"{name} operand is not {what}: got shape {tuple(got.shape)}, expected {tuple(exp.shape)} "
                    f"({nkv} KV heads -> {nq} heads)")
        err = _max_rel(got, exp)
        if not err <= _tol(exp.dtype):
            return (f"{name} operand is not {what}: values differ (max rel {err:.2e} > {_tol(exp.dtype):g}, "
                    f"shape {tuple(exp.shape)}, {nkv} KV heads -> {nq} heads)")
    return None


def _verify_out(ctx, probe, q, ctx_v, out, nq, h):
    """The layout chain from probs @ V [B, N, S, H] to `out` computes transpose(0, 2, 1, 3) + reshape to
    [B, S, N*H] (what the fused op outputs), or on to [B*S, N*H], however the exporter spells it (e.g. a no-op
    view first)."""
    b, s = _probe_batch(probe, q), _probe_len(q, 2, probe.dims.get("seq", 3))
    x = np.random.default_rng(4).standard_normal((b, nq, s, h)).astype((ctx_v.dtype or ir.DataType.FLOAT).numpy())
    try:
        (got,) = ctx.run_probe([out], {ctx_v: x})
    except Exception as exc:
        return f"could not evaluate the attention output chain to {out.name}: {exc}"
    exp = x.transpose(0, 2, 1, 3).reshape(b, s, nq * h)
    got = np.asarray(got)
    if got.shape == (b * s, nq * h):
        exp = exp.reshape(b * s, nq * h)
    if got.shape != exp.shape or not np.array_equal(got, exp):
        return (f"attention output {out.name} is not probs@V transposed back to [B, S, N, H] and reshaped to "
                f"[B, S, N*H] (probe: shape {tuple(got.shape)}, expected {tuple(exp.shape)})")
    return None


def _verify_mask(ctx, probe, bias, s, p):
    """(mask input or None, causal) for the additive mask `bias` over s queries and p past + s keys, or a reason:
    it must be causal (+ key padding), all open, or a key-padding mask of a graph input."""
    try:
        (m,) = ctx.run_probe([bias])
    except Exception as exc:
        return f"could not evaluate the attention mask: {exc}"
    m = np.asarray(m, dtype=np.float64)
    if m.ndim != 4 or m.shape[-2:] != (s, s + p):
        return f"attention mask has shape {m.shape}, not [B, 1|N, {s}, {s + p}]"
    allowed = np.arange(s + p)[None, :] <= (p + np.arange(s))[:, None]
    blocked = m <= -1e4
    open_ = np.abs(m) < 1e-6
    mask_inputs = [v for v in cone_inputs([bias]) if "mask" in v.name]
    mask_input = mask_inputs[0] if len(mask_inputs) == 1 else None
    if np.all(open_):
        if mask_input is None:
            return None, False
        # key padding? block the last key of batch row 0 and look again
        arrays = dict(probe.arrays)
        pm = np.array(arrays[mask_input.name])
        pm[0, -1] = 0
        arrays[mask_input.name] = pm
        try:
            (m2,) = ctx.run_probe([bias], arrays=arrays)
        except Exception as exc:
            return f"could not evaluate the attention mask: {exc}"
        m2 = np.broadcast_to(np.asarray(m2, dtype=np.float64), (m.shape[0], 1 if m.shape[1] == 1 else m.shape[1], s, s + p))
        want = np.zeros(m2.shape, dtype=bool)
        want[0, ..., -1] = True
        if np.all((m2 <= -1e4) == want) and np.all(np.abs(m2[~want]) < 1e-6):
            return mask_input, False
        return f"attention mask from {mask_input.name} is not a key-padding mask (zeroing key {s + p - 1} of row 0 did not block exactly that key)"
    if np.all(open_[..., allowed]) and np.all(blocked[..., ~allowed]):
        return mask_input, True
    bad = np.argwhere(~((open_ & allowed) | (blocked & ~allowed)))[0]
    i, j = int(bad[-2]), int(bad[-1])
    return (f"attention mask is not causal+padding: entry [q {i}, k {j}] (past {p}) is {m[tuple(bad)]:.3g}, "
            f"causal expects {'0' if allowed[i, j] else '-inf'}")


def _kv_heads(src: ir.Value, nq: int, h: int, name: str):
    """Without a cache: (KV head count, per-head layout) of a K/V source, [B, T, Nkv*H] (False) or [B, Nkv, T, H]
    (True: the heads split before the rotary, as a ViT applies it), or why it is neither."""
    width, heads = dim(src, 2), dim(src, 1)
    r = rank(src)
    if r == 3 and isinstance(width, int) and width % h == 0 and width and nq % (width // h) == 0:
        return width // h, False
    if r == 4 and dim(src, 3) == h and isinstance(heads, int) and heads and nq % heads == 0:
        return heads, True
    return (f"{name} source {src.name} is not [B, T, Nkv*{h}] or [B, Nkv, T, {h}] with Nkv dividing {nq} (shape "
            f"{src.shape}; walk stopped at {src.producer().op_type if src.producer() else 'an input'})")


def match(ctx, sm: ir.Node) -> Site | str:
    """The attention site of Softmax `sm`, its layouts, output chain and mask checked on probes, or a reason."""
    r = len(sm.inputs[0].shape) if sm.inputs[0].shape is not None else 4
    if attr(sm, "axis", -1) not in (-1, r - 1):
        return f"softmax over axis {attr(sm, 'axis')}, not the keys axis"
    walked = _walk_scores(sm.inputs[0])
    if isinstance(walked, str):
        return walked
    qk, bias, scale, softcap = walked
    to_v = follow(sm.outputs[0], "softmax output", *PROBS_TO_V)
    if isinstance(to_v, str):
        return to_v
    pv = to_v[-1]
    out = _output_chain(pv.outputs[0])
    if isinstance(out, str):
        return out
    q, sq = _scalar_strip(qk.inputs[0])
    kt, sk = _scalar_strip(qk.inputs[1])
    vv = pv.inputs[1]
    if q.shape is None or len(q.shape) != 4:
        return f"Q is not 4-D [B, N, S, H] (shape {q.shape})"
    h = dim(q, 3)
    nq = dim(q, 1)
    if not isinstance(h, int) or not isinstance(nq, int):
        return f"Q heads/head size are not static (shape {q.shape})"
    (ksrc, kcat), (vsrc, vcat) = _kv_source(kt, "K"), _kv_source(vv, "V")
    if isinstance(kcat, str) != isinstance(vcat, str):
        return f"only one of K and V comes from a KV-cache Concat ({kcat if isinstance(kcat, str) else vcat})"
    kcat, vcat = (None, None) if isinstance(kcat, str) else (kcat, vcat)
    probe = ctx.probe()
    if isinstance(probe, str):
        return probe
    # K and V: verify the layout chains compute repeat_kv (and K^T) of the cache or the projections
    bnsh = False
    if kcat is not None:
        ksrc, vsrc = kcat.outputs[0], vcat.outputs[0]
        nkv = dim(ksrc, 1)
        if not isinstance(nkv, int) or nq % nkv:
            return f"K has {nkv} heads, not a divisor of Q's {nq}"
        if dim(vsrc, 1) != nkv:
            return f"K has {nkv} heads but V has {dim(vsrc, 1)}"
    else:
        kv = _kv_heads(ksrc, nq, h, "K")
        if isinstance(kv, str):
            return kv
        nkv, bnsh = kv
        if _kv_heads(vsrc, nq, h, "V") != kv:
            return (f"V source {vsrc.name} (shape {vsrc.shape}) does not have K's {nkv} heads of {h} in K's layout "
                    f"({'[B, Nkv, T, H]' if bnsh else '[B, T, Nkv*H]'}; K source {ksrc.name} {ksrc.shape})")
    heads = dict(nq=nq, h=h)
    bad = _verify_kv(ctx, probe, ksrc, kt, vsrc, vv, nkv=nkv, cached=kcat is not None, bnsh=bnsh, **heads) \
        or _verify_out(ctx, probe, q, pv.outputs[0], out, **heads)
    if bad:
        return bad
    mask_input, causal = None, False
    if bias is not None:
        s = _probe_len(q, 2, probe.dims.get("seq", 3))
        p = probe.dims.get("past", 0) if kcat is not None else 0
        res = _verify_mask(ctx, probe, bias, s, p)
        if isinstance(res, str):
            return res
        mask_input, causal = res
    window = local_window(ctx, bias, s, kcat is not None) if causal else -1
    if isinstance(window, str):
        return window
    scale = exact_scale(scale * sq * sk, h)
    shared = dict(softmax=sm, q=q, out=out, num_heads=nq, kv_heads=nkv, scale=scale, mask_input=mask_input,
                  causal=causal, head_size=h, bias=bias, softcap=softcap, window=window)
    if kcat is not None:
        return Site(k_new=kcat.inputs[1], v_new=vcat.inputs[1], past_k=kcat.inputs[0], past_v=vcat.inputs[0],
                    present_k=kcat.outputs[0], present_v=vcat.outputs[0], **shared)
    return Site(k_new=ksrc, v_new=vsrc, past_k=None, past_v=None, present_k=None, present_v=None, kv_bnsh=bnsh,
                **shared)


def fused_output(ctx, m: Site, node: ir.Node, new_nodes: list) -> ir.Value:
    """The fused node's [B, S, N*H] output 0 typed, shaped and, where the site's output was flattened to
    [B*S, N*H], reshaped to it: the value that replaces m.out."""
    y = node.outputs[0]
    y.type = m.out.type
    if m.out.shape is not None and len(m.out.shape) == 3:
        y.shape = m.out.shape
        return y
    y.shape = ir.Shape([m.q.shape[0], m.q.shape[2], m.num_heads * m.head_size])
    if m.out.shape is None:  # the probe showed the chain ends 3-D, its shape unrecorded
        return y
    flat = make_node(node, "", "Reshape", [y, int64(ctx.graph, "shape_rows", [-1, m.num_heads * m.head_size])])
    flat.outputs[0].shape, flat.outputs[0].type = m.out.shape, m.out.type
    new_nodes.append(flat)
    return flat.outputs[0]


def bsd_source(v: ir.Value) -> ir.Value:
    """Where a rewrite's to_bsd(v) reads from: the [B, S, N*H] value v was viewed from, else v itself (the graph
    value a cost Replacement stops at)."""
    return bsd_view(v) or v


def bsd_stand_in(v: ir.Value) -> ir.Value:
    """A stand-in for to_bsd(v) (v [B, N, S, H]) in a cost Cell: the existing [B, S, N*H] view, else its shape."""
    z = bsd_view(v)
    if z is not None:
        return z
    shape = None if v.shape is None else [v.shape[0], v.shape[2], dim(v, 1) * dim(v, 3)]
    return stand_in(f"{v.name}_bsd", shape, v.dtype)


class AttentionOp:
    """One fused attention op: which sites it claims, what else it needs of them, its rewrite and its cost Cells."""
    target_op: str = ""

    def claims(self, ctx, site: Site) -> bool:
        raise NotImplementedError

    def check(self, ctx, site: Site) -> Site | str:
        raise NotImplementedError

    def rewrite(self, ctx, site: Site) -> None:
        raise NotImplementedError

    def replacement(self, ctx, site: Site) -> Replacement:
        raise NotImplementedError

    def note(self, ctx) -> str:
        return ""


class AttentionRule(Rule):
    """Every Softmax attention site, matched once, fused by the first of `ops` that claims it."""
    kind = "attention"

    def __init__(self, *ops: AttentionOp):
        self.ops = ops
        self.target_op = " | ".join(o.target_op for o in ops)

    def anchors(self, ctx):
        # anchor: every Softmax over a Q.K^T (attention_sites), whatever lies between them
        ctx.cache["input-dependent"] = input_dependent(ctx.graph)
        return attention_softmaxes(ctx.graph, ctx.cache["input-dependent"])

    def check(self, ctx, sm):
        unfusable = position_terms(sm, ctx.cache["input-dependent"])
        if unfusable:
            return unfusable
        site = match(ctx, sm)
        if isinstance(site, str):
            return site
        owner = next((o for o in self.ops if o.claims(ctx, site)), None)
        if owner is None:
            return f"no attention op claims this site ({', '.join(o.target_op for o in self.ops)})"
        checked = owner.check(ctx, site)
        return checked if isinstance(checked, str) else (owner, checked)

    def rewrite(self, ctx, m):
        owner, site = m
        owner.rewrite(ctx, site)

    def replacement(self, ctx, m):
        owner, site = m
        return owner.replacement(ctx, site)

    def note(self, ctx):
        return "; ".join(n for n in (o.note(ctx) for o in self.ops) if n)
