"""Norm rules: RMSNorm -> SimplifiedLayerNormalization, residual + RMSNorm -> SkipSimplifiedLayerNormalization,
decomposed LayerNorm -> LayerNormalization, residual + LayerNorm -> com.microsoft.SkipLayerNormalization."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from softsyn.netlist import eval_dim_expr
from passes.fuse.base import Cell, Replacement, Rule, stand_in
from passes.fuse.chain import Link, follow
from passes.fuse.graph import (MS, add_initializer, attr, const, const_shape, consumers, first_in_order, insert_before,
                                  make_node, op, other_input, rank, replace_value, scalar)


def _axes(ctx, node: ir.Node):
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        c = const(node.inputs[1])
        return None if c is None else [int(a) for a in np.ravel(c)]
    a = attr(node, "axes")
    return None if a is None else list(a)


def _last_axis_only(axes, x: ir.Value) -> bool:
    if axes is None or len(axes) != 1:
        return False
    r = rank(x)
    return axes[0] == -1 or (r is not None and axes[0] == r - 1)


def _squared_input(node: ir.Node | None) -> ir.Value | None:
    """x if node is Pow(x, 2) or Mul(x, x)."""
    if node is None:
        return None
    if node.op_type == "Pow" and scalar(node.inputs[1]) == 2.0:
        return node.inputs[0]
    if node.op_type == "Mul" and node.inputs[0] is node.inputs[1]:
        return node.inputs[0]
    return None


def _weight_mul(y: ir.Value, h) -> tuple[ir.Value | None, ir.Value]:
    """(gamma, output) if y feeds exactly one Mul by a constant vector, else (None, y)."""
    users = consumers(y)
    if len(users) == 1 and users[0].op_type == "Mul":
        w = other_input(users[0], y)
        c = const_shape(w)  # readable or weightless (meta) weight: the fused op takes the same initializer
        if c is not None and len(c) == 1 and (h is None or c[0] == h):
            return w, users[0].outputs[0]
    return None, y


# --------------------------------------------------------------------------- RMSNorm
@dataclass
class _RMS:
    anchor: ir.Node
    x: ir.Value
    eps: float
    gamma: ir.Value | None
    out: ir.Value


def _eps(add: ir.Node, mean: ir.Value) -> str | None:
    return None if scalar(other_input(add, mean)) is not None else "epsilon is not a constant scalar"


def _rsqrt(n: ir.Node) -> bool:
    """Reciprocal(s) or Div(1, s)."""
    return n.op_type == "Reciprocal" or (n.op_type == "Div" and scalar(n.inputs[0]) == 1.0)


def _rms_tail(x: ir.Value) -> tuple[Link, ...]:
    """mean(x**2) -> Add(eps) -> Sqrt -> Reciprocal | Div(1, .) | Div(x, .)."""
    def over_sqrt(n: ir.Node, s: ir.Value) -> str | None:
        if _rsqrt(n):
            return None
        if n.op_type != "Div" or n.inputs[1] is not s:
            return "it does not divide by sqrt(...)"
        return None if n.inputs[0] is x else "x / sqrt(...) divides a different tensor than the one squared"

    return (Link("Add(eps)", ("Add",), gives="mean(x**2)+eps", test=_eps),
            Link("Sqrt (no rsqrt form recognised)", ("Sqrt",), gives="sqrt(mean(x**2)+eps)"),
            Link("Reciprocal/Div", ("Reciprocal", "Div"), test=over_sqrt))


def _times_x(x: ir.Value) -> Link:
    return Link("Mul(x, rsqrt) of the same x", ("Mul",),
                test=lambda n, r: None if other_input(n, r) is x else "it multiplies another tensor than x")


def match_rms(ctx, rm: ir.Node) -> _RMS | str:
    x = _squared_input(op(rm.inputs[0], "Pow", "Mul"))
    if x is None:
        return "ReduceMean input is not x**2"
    if not _last_axis_only(_axes(ctx, rm), x):
        return f"mean is over axes {_axes(ctx, rm)}, not the last axis only"
    if attr(rm, "keepdims", 1) != 1:
        return "ReduceMean keepdims=0"
    tail = follow(rm.outputs[0], "mean(x**2)", *_rms_tail(x))
    if isinstance(tail, str):
        return tail
    add, _, last = tail
    eps = scalar(other_input(add, rm.outputs[0]))
    if _rsqrt(last):
        mul = follow(last.outputs[0], "rsqrt", _times_x(x))
        if isinstance(mul, str):
            return mul
        last = mul[0]
    y = last.outputs[0]
    if x.dtype is not None and x.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        return f"x has dtype {x.dtype}"
    x, y = _strip_upcast(x, y)
    h = x.shape[-1] if x.shape is not None and isinstance(x.shape[-1], int) else None
    gamma, out = _weight_mul(y, h)
    return _RMS(rm, x, eps, gamma, out)


_HALF = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


def _strip_upcast(x: ir.Value, y: ir.Value) -> tuple[ir.Value, ir.Value]:
    """HF half-precision norms compute in fp32: x = Cast(x16, to=float) ... y32 -> Cast(to=x16's dtype).
    If both Casts are there, return (x16, the cast-back output): the fused op takes the half-precision
    tensor and normalises in fp32 itself (stash_type=1). Otherwise (x, y) unchanged."""
    up = op(x, "Cast")
    if up is None or attr(up, "to") != ir.DataType.FLOAT or up.inputs[0] is None:
        return x, y
    x16 = up.inputs[0]
    if x16.dtype not in _HALF:
        return x, y
    users = consumers(y)
    if len(users) != 1 or users[0].op_type != "Cast" or attr(users[0], "to") != x16.dtype:
        return x, y
    return x16, users[0].outputs[0]


def _replace_norm(ctx, anchor: ir.Node, out: ir.Value, op_type: str, inputs: list, eps: float) -> None:
    """One `op_type` node (last axis, fp32 stash) computing `out`, placed before out's producer, in its place."""
    node = make_node(anchor, "", op_type, inputs, {"axis": -1, "epsilon": float(eps), "stash_type": 1})
    node.outputs[0].shape, node.outputs[0].type = out.shape, out.type
    insert_before(ctx.graph, out.producer(), [node])
    replace_value(ctx.graph, out, node.outputs[0])


def _norm_replacement(out: ir.Value, op_type: str, inputs: list) -> Replacement:
    return Replacement((Cell(op_type, tuple(inputs), (out,), domain=""),), (out,), tuple(inputs))


class RMSNormRule(Rule):
    kind = "rms_norm"
    target_op = "SimplifiedLayerNormalization"

    def anchors(self, ctx):
        out = []
        for n in ctx.graph:
            if n.op_type != "ReduceMean":
                continue
            x = _squared_input(op(n.inputs[0], "Pow", "Mul"))
            sub = op(x, "Sub")
            if x is None or (sub is not None and op(sub.inputs[1], "ReduceMean") is not None):
                continue  # not squared, or centred: a LayerNorm candidate
            out.append(n)
        return out

    def check(self, ctx, anchor):
        m = match_rms(ctx, anchor)
        if isinstance(m, str):
            return m
        # a centred norm (LayerNorm: x is itself x0 - mean(x0)) is not an RMSNorm
        sub = op(m.x, "Sub")
        if sub is not None and op(sub.inputs[1], "ReduceMean") is not None:
            return "x is centred (x - mean(x)): a LayerNorm, not an RMSNorm"
        return m

    def rewrite(self, ctx, m: _RMS):
        gamma = m.gamma
        if gamma is None:
            h = m.x.shape[-1] if m.x.shape is not None else None
            if not isinstance(h, int):
                raise ValueError("no gamma and the hidden size is symbolic")
            gamma = add_initializer(ctx.graph, "rms_gamma_ones", np.ones(h, dtype=m.x.dtype.numpy()))
        _replace_norm(ctx, m.anchor, m.out, "SimplifiedLayerNormalization", [m.x, gamma], m.eps)

    def replacement(self, ctx, m: _RMS) -> Replacement:
        gamma = m.gamma or stand_in("rms_gamma_ones", [m.x.shape[-1]] if m.x.shape is not None else None, m.x.dtype)
        return _norm_replacement(m.out, "SimplifiedLayerNormalization", [m.x, gamma])


# --------------------------------------------------------------------------- residual + norm
def _residual_add(ctx, x: ir.Value) -> ir.Node | None:
    add = op(x, "Add")
    if add is None or const(add.inputs[0]) is not None or const(add.inputs[1]) is not None:
        return None
    return add


def _same_dim(a, b) -> bool:
    """Dims a and b are equal: the same int or expression, or expressions that agree at two probe bindings (as
    Min(128, seq) and seq do wherever the model's 128 positions can be fed)."""
    if isinstance(a, int) or isinstance(b, int) or str(a) == str(b):
        return str(a) == str(b)
    values = [tuple(eval_dim_expr(str(d), env) for d in (a, b)) for env in _DIM_PROBES]
    return all(x is not None and x == y for x, y in values)


_DIM_PROBES = ({"batch": 2, "seq": 3, "past": 4, "total": 7}, {"batch": 3, "seq": 17, "past": 5, "total": 22})


def _residual(add: ir.Node):
    """(input, skip) of the residual Add as the fused op takes them — skip the same shape as input, or broadcast
    over the batch ([1, S, H] or [S, H]: what ORT's skip norms accept) — or why it cannot be."""
    a, b = add.inputs
    if a.shape is None or b.shape is None:
        return "residual operands have unknown shapes"
    if len(a.shape) == len(b.shape) and all(str(x) == str(y) for x, y in zip(a.shape, b.shape)):
        return a, b
    for full, skip in ((a, b), (b, a)):
        if len(full.shape) == 3 and (len(skip.shape) == 2 or (len(skip.shape) == 3 and skip.shape[0] == 1)) \
                and all(_same_dim(x, y) for x, y in zip(full.shape[1:], skip.shape[-2:])):
            return full, skip
    return (f"residual Add broadcasts over more than the batch (shapes {a.shape} and {b.shape}): the skip norms "
            "take a skip of [B|1, S, H] or [S, H]")


def _skip_check(norm: ir.Node, add: ir.Node, op_type: str):
    """(input, skip) of the residual Add + norm as com.microsoft `op_type` takes them, or why it cannot."""
    res = _residual(add)
    if isinstance(res, str):
        return res
    full = res[0]
    if rank(full) not in (2, 3):
        return f"input has rank {rank(full)}; {op_type} takes 2-D or 3-D"
    if attr(norm, "axis", -1) not in (-1, rank(full) - 1):
        return "normalises over an axis other than the last"
    return res


def _emit_skip(ctx, norm: ir.Node, add: ir.Node, op_type: str, inputs: list) -> None:
    """com.microsoft `op_type` in place of norm (output 0) and of the residual Add (output 3, the sum)."""
    ctx.use_opset(MS, 1)
    node = make_node(norm, MS, op_type, inputs, {"epsilon": float(attr(norm, "epsilon", 1e-5))}, num_outputs=4)
    out, summed = node.outputs[0], node.outputs[3]
    out.shape, out.type = norm.outputs[0].shape, norm.outputs[0].type
    summed.shape, summed.type = add.outputs[0].shape, add.outputs[0].type
    # before the norm and before every reader of the sum (a DeepStack merger reads a vision block's residual
    # stream between the Add and the norm): each of them reads an output of the new node
    insert_before(ctx.graph, first_in_order(ctx.graph, [norm, *consumers(add.outputs[0])]), [node])
    replace_value(ctx.graph, norm.outputs[0], out)
    replace_value(ctx.graph, add.outputs[0], summed)


class SkipRMSNormRule(Rule):
    kind = "skip_rms_norm"
    target_op = "com.microsoft.SkipSimplifiedLayerNormalization"

    def anchors(self, ctx):
        return [n for n in ctx.graph if n.op_type == "SimplifiedLayerNormalization" and _residual_add(ctx, n.inputs[0])]

    def check(self, ctx, norm):
        add = _residual_add(ctx, norm.inputs[0])
        res = _skip_check(norm, add, "SkipSimplifiedLayerNormalization")
        return res if isinstance(res, str) else (norm, add) + res

    def rewrite(self, ctx, match):
        norm, add, full, skip = match
        _emit_skip(ctx, norm, add, "SkipSimplifiedLayerNormalization", [full, skip, norm.inputs[1]])

    def replacement(self, ctx, match) -> Replacement:
        norm, add, full, skip = match
        return _skip_replacement(norm, add, "SkipSimplifiedLayerNormalization", [full, skip, norm.inputs[1]])


def _skip_replacement(norm: ir.Node, add: ir.Node, op_type: str, inputs: list) -> Replacement:
    cell = Cell(op_type, tuple(inputs), (norm.outputs[0], None, None, add.outputs[0]))
    return Replacement((cell,), (norm.outputs[0], add.outputs[0]), tuple(v for v in inputs if v is not None))


# --------------------------------------------------------------------------- LayerNorm
@dataclass
class _LN:
    anchor: ir.Node
    x: ir.Value
    eps: float
    gamma: ir.Value | None
    beta: ir.Value | None
    out: ir.Value


class LayerNormRule(Rule):
    """Decomposed LayerNorm: d = x - mean(x); d / sqrt(mean(d**2) + eps) * gamma + beta."""
    kind = "layer_norm"
    target_op = "LayerNormalization"

    def anchors(self, ctx):
        out = []
        for n in ctx.graph:
            if n.op_type != "ReduceMean":
                continue
            if any(u.op_type == "Sub" and u.inputs[1] is n.outputs[0] and u.inputs[0] is n.inputs[0]
                   for u in consumers(n.outputs[0])):
                out.append(n)
        return out

    def check(self, ctx, rm):
        x = rm.inputs[0]
        if not _last_axis_only(_axes(ctx, rm), x):
            return f"mean is over axes {_axes(ctx, rm)}, not the last axis only"
        sub = next(u for u in consumers(rm.outputs[0]) if u.op_type == "Sub")
        d = sub.outputs[0]
        sq_means = [u for u in consumers(d) if u.op_type in ("Pow", "Mul") and _squared_input(u) is d]
        if len(sq_means) != 1:
            return "no (x - mean)**2 found"
        rm2 = follow(sq_means[0].outputs[0], "(x - mean)**2", Link("ReduceMean (the variance)", ("ReduceMean",)))
        if isinstance(rm2, str):
            return rm2
        m = match_rms(ctx, rm2[0])   # same tail as RMSNorm, applied to d
        if isinstance(m, str):
            return "variance tail: " + m
        beta, out = None, m.out
        if m.gamma is not None:
            users = consumers(m.out)
            if len(users) == 1 and users[0].op_type == "Add":
                b = other_input(users[0], m.out)
                if const(b) is not None and const(b).ndim == 1:
                    beta, out = b, users[0].outputs[0]
        return _LN(rm, x, m.eps, m.gamma, beta, out)

    def rewrite(self, ctx, m: _LN):
        h = m.x.shape[-1] if m.x.shape is not None else None
        dt = m.x.dtype.numpy()
        gamma = m.gamma or add_initializer(ctx.graph, "ln_gamma_ones", np.ones(h, dtype=dt))
        beta = m.beta or add_initializer(ctx.graph, "ln_beta_zeros", np.zeros(h, dtype=dt))
        _replace_norm(ctx, m.anchor, m.out, "LayerNormalization", [m.x, gamma, beta], m.eps)

    def replacement(self, ctx, m: _LN) -> Replacement:
        h = [m.x.shape[-1]] if m.x.shape is not None else None
        gamma = m.gamma or stand_in("ln_gamma_ones", h, m.x.dtype)
        beta = m.beta or stand_in("ln_beta_zeros", h, m.x.dtype)
        return _norm_replacement(m.out, "LayerNormalization", [m.x, gamma, beta])


class SkipLayerNormRule(Rule):
    kind = "skip_layer_norm"
    target_op = "com.microsoft.SkipLayerNormalization"

    def anchors(self, ctx):
        return [n for n in ctx.graph if n.op_type == "LayerNormalization" and n.domain in ("", "ai.onnx")
                and _residual_add(ctx, n.inputs[0])]

    def check(self, ctx, norm):
        add = _residual_add(ctx, norm.inputs[0])
        res = _skip_check(norm, add, "SkipLayerNormalization")
        if isinstance(res, str):
            return res
        if len(norm.inputs) < 2 or const(norm.inputs[1]) is None:
            return "gamma is not a constant"
        a, b = res
        bias = None
        if a.shape is not None and b.shape is not None and len(a.shape) == len(b.shape) \
                and all(str(x) == str(y) for x, y in zip(a.shape, b.shape)):
            # fold a bias Add (Add(MatMul, const bias)) on either operand into the op's bias input (operands of one
            # shape only: the folded operand may become the op's input, which must be the full-shape one)
            for first, second in ((a, b), (b, a)):
                badd = op(first, "Add")
                if badd is not None and len(consumers(first)) == 1:
                    for i in (0, 1):
                        c = const(badd.inputs[1 - i])
                        if c is not None and c.ndim == 1 and op(badd.inputs[i], "MatMul") is not None:
                            a, b, bias = badd.inputs[i], second, badd.inputs[1 - i]
                            break
                if bias is not None:
                    break
        return (norm, add, a, b, bias)

    def _inputs(self, ctx, match, create: bool) -> list:
        norm, add, a, b, bias = match
        beta = norm.inputs[2] if len(norm.inputs) > 2 and norm.inputs[2] is not None else None
        if beta is None:
            h = a.shape[-1]
            beta = (add_initializer(ctx.graph, "ln_beta_zeros", np.zeros(h, dtype=a.dtype.numpy())) if create
                    else stand_in("ln_beta_zeros", [h], a.dtype))
        return [a, b, norm.inputs[1], beta] + ([bias] if bias is not None else [])

    def rewrite(self, ctx, match):
        norm, add = match[:2]
        _emit_skip(ctx, norm, add, "SkipLayerNormalization", self._inputs(ctx, match, create=True))

    def replacement(self, ctx, match) -> Replacement:
        norm, add = match[:2]
        return _skip_replacement(norm, add, "SkipLayerNormalization", self._inputs(ctx, match, create=False))
