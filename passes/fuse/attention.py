"""Attention rule: Softmax(Q K^T * scale + mask) V -> com.microsoft.GroupQueryAttention (decoders with a
KV cache) or com.microsoft.MultiHeadAttention (encoders, no cache).

Robustness comes from checking meaning, not spelling: the walk from the Softmax back to Q and K and
forward to V is structural (scalar Mul/Div, layout ops), and what the layout chains and the mask
compute is then *evaluated* on small probe inputs and compared with what the fused op assumes
(K and V = the cache repeated per query-head group, mask = causal over past + new tokens). So an
exporter that spells repeat_kv or the causal mask differently still fuses, and a model whose mask is
not causal (sliding window, prefix-LM, bidirectional) gets a Miss that says which entry differs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from softsyn.passes.fuse.base import Rule
from softsyn.passes.fuse.graph import (MS, attr, cone_inputs, const, const_shape, consumers, dim, evaluate,
                                       insert_before, int64, is_graph_output, make_node, op, replace_value, scalar)

LAYOUT = {"Reshape", "Transpose", "Expand", "Unsqueeze", "Squeeze", "Identity"}
PROBE = {"batch": 2, "seq": 3, "past": 4}


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
    """(qk MatMul, bias value or None, scale) or a reason."""
    bias, scale = None, 1.0
    for _ in range(8):
        n = v.producer()
        if n is None:
            return "softmax input does not come from a MatMul"
        if n.op_type == "MatMul":
            if const(n.inputs[1]) is not None:
                return "the scores MatMul multiplies by a constant weight (not Q.K^T)"
            return n, bias, scale
        if n.op_type in ("Mul", "Div"):
            inner, s = _scalar_strip(v)
            if inner is v:
                return f"scores are scaled by a non-constant ({n.op_type} {n.name})"
            v, scale = inner, scale * s
            continue
        if n.op_type == "Add":
            a, b = n.inputs
            if _reaches_matmul(a) and not _reaches_matmul(b):
                v, extra = a, b
            elif _reaches_matmul(b) and not _reaches_matmul(a):
                v, extra = b, a
            else:
                return f"cannot tell scores from mask in {n.name}"
            if bias is not None:
                return "two additive masks/biases on the scores"
            bias = extra
            continue
        if n.op_type == "Tanh":
            return "scores are soft-capped (Tanh): softcap attention is not fused"
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


def _layout_source(v: ir.Value):
    """Walk back through layout ops; return (source value, the layout nodes)."""
    chain = []
    while True:
        n = v.producer()
        if n is None or n.op_type not in LAYOUT:
            return v, chain
        chain.append(n)
        v = n.inputs[0]


def _output_chain(graph, v: ir.Value):
    """Forward from probs @ V [B, N, S, H] through single-use layout ops to the first 3-D value (the [B, S, N*H]
    the fused op replaces), or a reason. Which layout it computes is checked on a probe (_verify_out)."""
    chain = []
    while v.shape is None or len(v.shape) != 3:
        users = consumers(v)
        if len(users) != 1 or users[0].op_type not in LAYOUT or len(chain) == 6 or is_graph_output(graph, v):
            if not any(n.op_type == "Transpose" for n in chain):
                return (f"attention output is not transposed back to [B, S, N, H] (probs@V "
                        f"{'-> ' + ' -> '.join(n.op_type for n in chain) + ' ' if chain else ''}feeds "
                        f"{[u.op_type for u in users]})")
            return f"attention output is not reshaped to [B, S, N*H] (after {' -> '.join(n.op_type for n in chain)})"
        chain.append(users[0])
        v = users[0].outputs[0]
    return v


def _cache_concat(v: ir.Value):
    """Concat(past, new, axis=-2) with past a graph input: the KV cache append."""
    n = op(v, "Concat")
    if n is None or len(n.inputs) != 2 or attr(n, "axis") not in (2, -2):
        return None
    past = n.inputs[0]
    if past.producer() is not None or past.const_value is not None:
        return None
    return n


def _to_bsd(ctx, anchor, v: ir.Value, new_nodes: list):
    """A [B,S,N*H] value equal to v [B,N,S,H] viewed as [B,S,N*H]; emits Transpose+Reshape if needed."""
    tr = op(v, "Transpose")
    if tr is not None and list(attr(tr, "perm", [])) == [0, 2, 1, 3]:
        y = tr.inputs[0]
        rs = op(y, "Reshape")
        if rs is not None:
            z = rs.inputs[0]
            if z.shape is not None and y.shape is not None and len(z.shape) == 3 and len(y.shape) == 4 \
                    and str(z.shape[0]) == str(y.shape[0]) and str(z.shape[1]) == str(y.shape[1]) \
                    and isinstance(z.shape[2], int) and isinstance(y.shape[2], int) and isinstance(y.shape[3], int) \
                    and z.shape[2] == y.shape[2] * y.shape[3]:
                return z
        r = make_node(anchor, "", "Reshape", [y, int64(ctx.graph, "shape_bs_flat", [0, 0, -1])])
        r.outputs[0].type = v.type
        new_nodes.append(r)
        return r.outputs[0]
    t = make_node(anchor, "", "Transpose", [v], {"perm": [0, 2, 1, 3]})
    r = make_node(anchor, "", "Reshape", [t.outputs[0], int64(ctx.graph, "shape_bs_flat", [0, 0, -1])])
    t.outputs[0].type = r.outputs[0].type = v.type
    new_nodes += [t, r]
    return r.outputs[0]


@dataclass
class _Att:
    softmax: ir.Node
    q: ir.Value            # [B, Nq, S, H]
    k_new: ir.Value        # [B, Nkv, S, H]
    v_new: ir.Value
    past_k: ir.Value | None
    past_v: ir.Value | None
    present_k: ir.Value | None
    present_v: ir.Value | None
    out: ir.Value          # [B, S, Nq*H] value to replace
    num_heads: int
    kv_heads: int
    scale: float
    mask_input: ir.Value | None
    causal: bool


def _exact_scale(scale: float, head_size) -> float:
    """1/sqrt(head_size) when `scale` is that value rounded to fp16/bf16 constants by a half-precision export.

    The fused op's `scale` attribute is float32: keeping the exporter's rounding (0.0884249 for head size 128
    instead of 0.0883883) would move every score by ~4e-4 relative for nothing.
    """
    if not isinstance(head_size, int) or head_size <= 0:
        return scale
    exact = head_size ** -0.5
    return exact if abs(scale - exact) <= 4e-3 * exact else scale


class AttentionRule(Rule):
    kind = "attention"
    target_op = "com.microsoft.GroupQueryAttention | com.microsoft.MultiHeadAttention"

    def anchors(self, ctx):
        # anchor: every Softmax with a non-constant MatMul within a few elementwise ops upstream
        wide = ("MatMul", "Mul", "Div", "Add", "Sub", "Tanh", "Where", "Cast")
        return [n for n in ctx.graph if n.op_type == "Softmax" and _reaches_matmul(n.inputs[0], 5, wide)]

    # ---------------------------------------------------------------- check
    def check(self, ctx, sm):
        r = len(sm.inputs[0].shape) if sm.inputs[0].shape is not None else 4
        if attr(sm, "axis", -1) not in (-1, r - 1):
            return f"softmax over axis {attr(sm, 'axis')}, not the keys axis"
        walked = _walk_scores(sm.inputs[0])
        if isinstance(walked, str):
            return walked
        qk, bias, scale = walked
        # forward: optional NaN guard / Cast, then probs @ V
        probs = sm.outputs[0]
        users = consumers(probs)
        if len(users) == 2 and {u.op_type for u in users} == {"IsNaN", "Where"}:
            probs = next(u for u in users if u.op_type == "Where").outputs[0]
            users = consumers(probs)
        if len(users) != 1 or users[0].op_type != "MatMul" or users[0].inputs[0] is not probs:
            return f"softmax output feeds {[u.op_type for u in users]}, not MatMul(probs, V)"
        pv = users[0]
        out = _output_chain(ctx.graph, pv.outputs[0])
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
        ksrc, _ = _layout_source(kt)
        vsrc, _ = _layout_source(vv)
        kcat, vcat = _cache_concat(ksrc), _cache_concat(vsrc)
        if (kcat is None) != (vcat is None):
            return "only one of K and V comes from a KV-cache Concat"
        feeds = self._probe_feeds(ctx)
        if isinstance(feeds, str):
            return feeds
        # K and V: verify the layout chains compute repeat_kv (and K^T) of the cache
        if kcat is not None:
            ksrc, vsrc = kcat.outputs[0], vcat.outputs[0]
        nkv = dim(ksrc, 1) if kcat is not None else nq
        if not isinstance(nkv, int) or nq % nkv:
            return f"K has {nkv} heads, not a divisor of Q's {nq}"
        if kcat is not None and dim(vsrc, 1) != nkv:
            return f"K has {nkv} heads but V has {dim(vsrc, 1)}"
        bad = self._verify_kv(ctx, feeds, ksrc, kt, vsrc, vv, nq, nkv, h, cached=kcat is not None) \
            or self._verify_out(ctx, feeds, pv.outputs[0], out, nq, h)
        if bad:
            return bad
        mask_input, causal = None, False
        if bias is not None:
            res = self._verify_mask(ctx, feeds, bias, nq)
            if isinstance(res, str):
                return res
            mask_input, causal = res
        if kcat is not None:
            if not causal:
                return "decoder attention without a causal mask (GroupQueryAttention is always causal)"
            if dim(kcat.inputs[0], 3) != h:
                return f"past key head size {dim(kcat.inputs[0], 3)} differs from Q's {h}"
            return _Att(sm, q, kcat.inputs[1], vcat.inputs[1], kcat.inputs[0], vcat.inputs[0], kcat.outputs[0],
                        vcat.outputs[0], out, nq, nkv, _exact_scale(scale * sq * sk, h), mask_input, True)
        if causal:
            return "causal attention without a KV cache: not fused (MultiHeadAttention here is bidirectional)"
        if ctx.netlist.kind == "decoder":
            return "attention without a KV cache in a decoder: not fused"
        return _Att(sm, q, ksrc, vsrc, None, None, None, None, out, nq, nkv, _exact_scale(scale * sq * sk, h),
                    mask_input, False)

    def _probe_feeds(self, ctx):
        if "probe" not in ctx.cache:
            from softsyn.runtime.inputs import scenario_inputs

            nl = ctx.netlist
            dims = {k: v for k, v in PROBE.items() if k in nl.symbolic_dims()}
            missing = nl.symbolic_dims() - set(dims)
            dims.update({d: 3 for d in missing})
            try:
                arrays = scenario_inputs(nl, dims, seed=7)
                ctx.cache["probe"] = ({v.name: v for v in ctx.graph.inputs}, arrays, dims)
            except Exception as exc:
                ctx.cache["probe"] = f"cannot build probe inputs: {exc}"
        return ctx.cache["probe"]

    def _eval(self, ctx, feeds, outputs, extra):
        by_name, arrays, _ = feeds
        stop = {id(v) for v in extra}
        need = cone_inputs(outputs, stop)
        f = dict(extra)
        for v in need:
            if v.name not in arrays:
                raise ValueError(f"cone reads {v.name}")
            f[v] = arrays[v.name]
        return evaluate(ctx.graph, outputs, f, dict(ctx.model.opset_imports))

    def _verify_kv(self, ctx, feeds, ksrc, kt, vsrc, vv, nq, nkv, h, cached):
        _, _, dims = feeds
        b = dims.get("batch", 2)
        t = dims.get("past", 0) + dims.get("seq", 3) if cached else dims.get("seq", 3)
        rng = np.random.default_rng(3)
        # probes in the graph's dtype, and the expectation built from those very values: the layout
        # chains only move data, so they must reproduce them exactly (no fp32-vs-fp16 rounding gap)
        dt = (ksrc.dtype or ir.DataType.FLOAT).numpy()
        if cached:
            kin = rng.standard_normal((b, nkv, t, h)).astype(dt)
            vin = rng.standard_normal((b, nkv, t, h)).astype(dt)
            exp_k = np.repeat(kin, nq // nkv, axis=1).transpose(0, 1, 3, 2)
            exp_v = np.repeat(vin, nq // nkv, axis=1)
        else:  # no cache: the layout walk must reach K and V as [B, T, N*H] projections
            for name, src in (("K", ksrc), ("V", vsrc)):
                if src.shape is None or len(src.shape) != 3 or dim(src, 2) != nq * h:
                    return (f"{name} source {src.name} is not [B, T, {nq * h}] (shape {src.shape}; walk stopped at "
                            f"{src.producer().op_type if src.producer() else 'an input'})")
            kin = rng.standard_normal((b, t, nq * h)).astype(dt)
            vin = rng.standard_normal((b, t, nq * h)).astype(dt)
            exp_k = kin.reshape(b, t, nq, h).transpose(0, 2, 3, 1)
            exp_v = vin.reshape(b, t, nq, h).transpose(0, 2, 1, 3)
        try:
            got_k, got_v = self._eval(ctx, feeds, [kt, vv], {ksrc: kin, vsrc: vin})
        except Exception as exc:
            return f"could not evaluate the K/V layout chains: {exc}"
        for name, got, exp, what in (("K", got_k, exp_k, "(repeat_kv(cache))^T"), ("V", got_v, exp_v, "repeat_kv(cache)")):
            got = np.asarray(got)
            if got.shape != exp.shape:
                return (f"{name} operand is not {what}: got shape {tuple(got.shape)}, expected {tuple(exp.shape)} "
                        f"({nkv} KV heads -> {nq} heads)")
            err = _max_rel(got, exp)
            if not err <= _tol(exp.dtype):
                return (f"{name} operand is not {what}: values differ (max rel {err:.2e} > {_tol(exp.dtype):g}, "
                        f"shape {tuple(exp.shape)}, {nkv} KV heads -> {nq} heads)")
        return None

    def _verify_out(self, ctx, feeds, ctx_v, out, nq, h):
        """The layout chain from probs @ V [B, N, S, H] to `out` computes transpose(0, 2, 1, 3) + reshape to
        [B, S, N*H] (what the fused op outputs), however the exporter spells it (e.g. a no-op view first)."""
        _, _, dims = feeds
        b, s = dims.get("batch", 2), dims.get("seq", 3)
        x = np.random.default_rng(4).standard_normal((b, nq, s, h)).astype((ctx_v.dtype or ir.DataType.FLOAT).numpy())
        try:
            (got,) = self._eval(ctx, feeds, [out], {ctx_v: x})
        except Exception as exc:
            return f"could not evaluate the attention output chain to {out.name}: {exc}"
        exp = x.transpose(0, 2, 1, 3).reshape(b, s, nq * h)
        got = np.asarray(got)
        if got.shape != exp.shape or not np.array_equal(got, exp):
            return (f"attention output {out.name} is not probs@V transposed back to [B, S, N, H] and reshaped to "
                    f"[B, S, N*H] (probe: shape {tuple(got.shape)}, expected {tuple(exp.shape)})")
        return None

    def _verify_mask(self, ctx, feeds, bias, nq):
        by_name, arrays, dims = feeds
        s, p = dims.get("seq", 3), dims.get("past", 0)
        try:
            (m,) = self._eval(ctx, feeds, [bias], {})
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
            probe = dict(arrays)
            pm = np.array(probe[mask_input.name])
            pm[0, -1] = 0
            probe[mask_input.name] = pm
            try:
                (m2,) = self._eval(ctx, (by_name, probe, dims), [bias], {})
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

    # ---------------------------------------------------------------- rewrite
    def rewrite(self, ctx, m: _Att):
        g = ctx.graph
        ctx.use_opset(MS, 1)
        new: list[ir.Node] = []
        anchor = m.softmax
        q = _to_bsd(ctx, anchor, m.q, new)
        if m.past_k is not None:
            k = _to_bsd(ctx, anchor, m.k_new, new)
            v = _to_bsd(ctx, anchor, m.v_new, new)
        else:  # already [B, T, N*H]
            k, v = m.k_new, m.v_new
        if m.past_k is not None:
            seqlens, total = self._lengths(ctx, anchor, m, q, new)
            inputs = [q, k, v, m.past_k, m.past_v, seqlens, total]
            attrs = {"num_heads": m.num_heads, "kv_num_heads": m.kv_heads, "scale": float(m.scale)}
            if ctx.target == "cuda":
                ab = _absorb(ctx, q, k, m.num_heads, m.kv_heads)
                log = ctx.cache.setdefault("gqa-absorb", {"rotary": 0, "qk_norm": 0, "misses": []})
                site = ctx.site(anchor)
                if isinstance(ab, str):
                    log["misses"].append(f"{site}: {ab}; rotary stays outside GQA (do_rotary=0)")
                elif ab is not None:
                    inputs[0], inputs[1] = ab.q, ab.k
                    inputs += [ab.cos, ab.sin]
                    attrs.update({"local_window_size": -1, "softcap": 0.0, "do_rotary": 1, "rotary_interleaved": 0})
                    log["rotary"] += 1
                    if ab.q_norm is not None:
                        inputs += [None, None, None, None, None, ab.q_norm, ab.k_norm]
                        attrs["qk_norm_epsilon"] = float(ab.eps)
                        log["qk_norm"] += 1
                    elif ab.norm_miss:
                        log["misses"].append(f"{site}: {ab.norm_miss}; q/k norms stay outside GQA")
            node = make_node(anchor, MS, "GroupQueryAttention", inputs, attrs, num_outputs=3)
            node.outputs[1].shape, node.outputs[1].type = m.present_k.shape, m.present_k.type
            node.outputs[2].shape, node.outputs[2].type = m.present_v.shape, m.present_v.type
        else:
            inputs = [q, k, v]
            if m.mask_input is not None:
                cast = make_node(anchor, "", "Cast", [m.mask_input], {"to": ir.DataType.INT32})
                new.append(cast)
                inputs += [None, cast.outputs[0]]   # bias, key_padding_mask [B, T]
            node = make_node(anchor, MS, "MultiHeadAttention", inputs,
                             {"num_heads": m.num_heads, "scale": float(m.scale)})
        node.outputs[0].shape, node.outputs[0].type = m.out.shape, m.out.type
        new.append(node)
        insert_before(g, m.out.producer(), new)
        replace_value(g, m.out, node.outputs[0])
        if m.past_k is not None:
            replace_value(g, m.present_k, node.outputs[1])
            replace_value(g, m.present_v, node.outputs[2])

    def note(self, ctx):
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

    def _lengths(self, ctx, anchor, m: _Att, q, new):
        """seqlens_k = sum(mask, 1) - 1 (int32 [B]); total_sequence_length = mask.shape[1] (int32 scalar).
        Without a mask input: both from past length + new tokens. Shared by every layer."""
        key = ("gqa-lengths", id(m.mask_input) if m.mask_input is not None else id(m.past_k))
        if key in ctx.cache:
            return ctx.cache[key]
        g = ctx.graph
        if m.mask_input is not None:
            mask = m.mask_input
            red = make_node(anchor, "", "ReduceSum", [mask, int64(g, "axis1", [1])], {"keepdims": 0})
            one = int64(g, "one", 1)
            if mask.dtype != ir.DataType.INT64:
                c = make_node(anchor, "", "Cast", [mask], {"to": ir.DataType.INT64})
                red.replace_input_with(0, c.outputs[0])
                new.append(c)
            sub = make_node(anchor, "", "Sub", [red.outputs[0], one])
            seq32 = make_node(anchor, "", "Cast", [sub.outputs[0]], {"to": ir.DataType.INT32})
            shp = make_node(anchor, "", "Shape", [mask], {"start": 1, "end": 2})
            new += [red, sub, seq32, shp]
            total_src = shp.outputs[0]
            batch_src = None
        else:
            sp = make_node(anchor, "", "Shape", [m.past_k], {"start": 2, "end": 3})
            sq = make_node(anchor, "", "Shape", [q], {"start": 1, "end": 2})
            add = make_node(anchor, "", "Add", [sp.outputs[0], sq.outputs[0]])
            bq = make_node(anchor, "", "Shape", [q], {"start": 0, "end": 1})
            new += [sp, sq, add, bq]
            total_src, batch_src = add.outputs[0], bq.outputs[0]
        sqz = make_node(anchor, "", "Squeeze", [total_src, int64(g, "axis0", [0])])
        tot32 = make_node(anchor, "", "Cast", [sqz.outputs[0]], {"to": ir.DataType.INT32})
        new += [sqz, tot32]
        if batch_src is not None:
            minus = make_node(anchor, "", "Sub", [total_src, int64(g, "one", [1])])
            exp = make_node(anchor, "", "Expand", [minus.outputs[0], batch_src])
            seq32 = make_node(anchor, "", "Cast", [exp.outputs[0]], {"to": ir.DataType.INT32})
            new += [minus, exp, seq32]
        for n in new:
            if n.op_type == "Cast" and n.outputs[0].type is None:
                n.outputs[0].type = ir.TensorType(ir.DataType(attr(n, "to")))
        ctx.cache[key] = (seq32.outputs[0], tot32.outputs[0])
        return ctx.cache[key]


# ---------------------------------------------------------------- cuda: absorb rotary and q/k norm into GQA
@dataclass
class _Absorb:
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


def _absorb(ctx, q: ir.Value, k: ir.Value, nq: int, nkv: int):
    """What GQA (cuda) can take over: None (no rotary here), a reason (rotary not absorbable), or _Absorb."""
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
    ab = _Absorb(qflat, kflat, cos, sin)
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
