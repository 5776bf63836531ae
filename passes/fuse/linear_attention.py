"""Linear-attention layers (Gated DeltaNet, Qwen3-Next): the delta rule into com.microsoft.LinearAttention.

ONNX Runtime 1.31 registers com.microsoft.LinearAttention (CPU and CUDA kernels; `update_rule` "gated_delta":
S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t), o_t = scale q_t^T S_t, inputs packed
[batch, seq, heads * dim], the state [batch, heads, d_k, d_v]). Two forms of the rule reach the netlist:

- the recurrent form, one Scan over the tokens (softsyn.frontends.hybrid_export: state, then q, k, v, the log
  decay g and beta, sequence first, q and k already l2-normalised and q scaled): the anchor. The check runs the Scan
  and its replacement (Transpose/Reshape in, LinearAttention, Reshape/Transpose out) on the same seeded inputs on ORT
  CPU and fuses where they agree: a check by meaning, so an exporter's other input order is a miss, not a wrong graph;
- the chunked form (transformers' prefill: a CumSum of the decay per 64-token chunk, unrolled at the export's
  length; a depthwise causal Conv in the same scope is its anchor): counted and named, not matched.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper as oh
from onnx_ir import serde

from softsyn.netlist import HIERARCHY_KEY
from softsyn.runtime.session import IR_VERSION, SessionSettings, open_session
from passes.fuse.base import Rule
from passes.fuse.graph import MS, add_initializer, attr, const, const_shape, make_node, replace_value

CHECK_TOKENS, CHECK_BATCH, TOLERANCE = 5, 2, 1e-4  # the check's inputs; max |difference| / max |Scan's output|


def _scope(node) -> str:
    return node.metadata_props.get(HIERARCHY_KEY, "")


def _static(value: ir.Value | None, rank: int) -> tuple | None:
    """The value's dims after the first two (sequence, batch), when its rank is `rank` and they are ints."""
    shape = value.shape if value is not None else None
    if shape is None or len(shape) != rank or not all(isinstance(d, int) for d in shape[2:]):
        return None
    return tuple(shape[2:])


def geometry(scan: ir.Node) -> tuple[int, int, int] | str:
    """(heads, d_k, d_v) of a delta-rule Scan: one state [batch, H, d_k, d_v] and five scanned inputs
    q, k [seq, batch, H, d_k], v [seq, batch, H, d_v], g, beta [seq, batch, H]; or why it is not one."""
    if len(scan.inputs) != 6 or len(scan.outputs) != 2 or attr(scan, "num_scan_inputs") != 5:
        return f"a Scan of {len(scan.inputs)} inputs and {len(scan.outputs)} outputs, not the delta rule's 6 and 2"
    state = scan.inputs[0].shape
    if state is None or len(state) != 4 or not all(isinstance(d, int) for d in state[1:]):
        return f"state {scan.inputs[0].name} is not [batch, heads, d_k, d_v] with static heads and dims"
    heads, dk, dv = state[1], state[2], state[3]
    want = ((heads, dk), (heads, dk), (heads, dv), (heads,), (heads,))
    got = tuple(_static(v, len(w) + 2) for v, w in zip(scan.inputs[1:], want))
    if got != want:
        return f"scanned inputs {[v.name for v in scan.inputs[1:]]} are not q, k, v, g, beta of {heads} heads"
    return heads, dk, dv


def _outer_values(scan: ir.Node, graph: ir.Graph) -> list[onnx.TensorProto]:
    """The constants the Scan's body reads from the graph around it (the exporter's optimizer hoists them)."""
    body = scan.attributes["body"].value
    inner = {v.name for v in body.inputs} | {o.name for n in body for o in n.outputs}
    names = {v.name for n in body for v in n.inputs if v is not None and v.name not in inner}
    values = list(graph.initializers.values()) + [o for n in graph if n.op_type == "Constant" for o in n.outputs]
    return [onnx.numpy_helper.from_array(np.asarray(const(v)), v.name) for v in values if v.name in names]


def replacement_ops(heads: int, dv: int, names: list[str], outs: list[str]) -> list[tuple]:
    """The nodes that replace a delta-rule Scan: (op, domain, inputs, outputs, attributes); `names` the Scan's six
    inputs and two shape constants ([0, 0, -1], [0, 0, heads, d_v]), `outs` its final state and per-token output."""
    state, q, k, v, g, beta, pack, unpack = names
    ops = []
    for x in (q, k, v):
        ops += [("Transpose", "", [x], [f"{x}_bt"], {"perm": [1, 0, 2, 3]}),
                ("Reshape", "", [f"{x}_bt", pack], [f"{x}_packed"], {})]
    ops += [("Transpose", "", [x], [f"{x}_bt"], {"perm": [1, 0, 2]}) for x in (g, beta)]
    ops += [("LinearAttention", MS, [f"{q}_packed", f"{k}_packed", f"{v}_packed", state, f"{g}_bt", f"{beta}_bt"],
             [f"{outs[1]}_packed", outs[0]], {"q_num_heads": heads, "kv_num_heads": heads,
                                              "update_rule": "gated_delta", "scale": 1.0}),
            ("Reshape", "", [f"{outs[1]}_packed", unpack], [f"{outs[1]}_bt"], {}),
            ("Transpose", "", [f"{outs[1]}_bt"], [outs[1]], {"perm": [1, 0, 2, 3]})]
    return ops


def _run(nodes, inputs: dict[str, np.ndarray], inits, outs: list[str], opsets: dict[str, int]) -> list[np.ndarray]:
    info = [oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in inputs.items()]
    graph = oh.make_graph(nodes, "check", info, [oh.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None)
                                                  for n in outs], initializer=inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid(d, v) for d, v in opsets.items()],
                          ir_version=IR_VERSION)
    return open_session(model, SessionSettings(optimize=False, intra_op_threads=1)).run(outs, inputs)


def agreement(scan: ir.Node, graph: ir.Graph, opsets: dict[str, int], heads: int, dk: int, dv: int) -> float:
    """max |LinearAttention - Scan| / max |Scan| over both outputs, on seeded inputs (unit-norm keys, decays
    below 1, beta in (0, 1): the delta rule's domain) on ORT CPU."""
    rng = np.random.default_rng(0)
    t, b = CHECK_TOKENS, CHECK_BATCH
    names = ["state", "q", "k", "v", "g", "beta"]
    key = rng.standard_normal((t, b, heads, dk))
    feeds = {"state": rng.standard_normal((b, heads, dk, dv)) * 0.1, "q": rng.standard_normal((t, b, heads, dk)),
             "k": key / np.linalg.norm(key, axis=-1, keepdims=True), "v": rng.standard_normal((t, b, heads, dv)),
             "g": -rng.uniform(0.01, 1.0, (t, b, heads)), "beta": rng.uniform(0.05, 0.95, (t, b, heads))}
    feeds = {n: feeds[n].astype(ir.DataType(v.dtype).numpy()) for n, v in zip(names, scan.inputs)}
    proto = serde.serialize_node(scan)
    del proto.input[:], proto.output[:]
    proto.input.extend(names)
    proto.output.extend(["final", "ys"])
    want = _run([proto], feeds, _outer_values(scan, graph), ["final", "ys"], opsets)
    shapes = [onnx.numpy_helper.from_array(np.array(s, np.int64), n)
              for n, s in (("pack", [0, 0, -1]), ("unpack", [0, 0, heads, dv]))]
    ops = replacement_ops(heads, dv, names + ["pack", "unpack"], ["final", "ys"])
    nodes = [oh.make_node(op, i, o, domain=d or None, **a) for op, d, i, o, a in ops]
    got = _run(nodes, feeds, shapes, ["final", "ys"], {**opsets, MS: 1})
    return max(float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-30)) for g, w in zip(got, want))


class LinearAttentionRule(Rule):
    kind = "linear_attention"
    target_op = "com.microsoft.LinearAttention (gated_delta)"

    def anchors(self, ctx):
        scans = [n for n in ctx.graph if n.op_type == "Scan" and n.domain in ("", "ai.onnx") and "body" in n.attributes]
        chunked = {_scope(n) for n in ctx.graph if n.op_type == "CumSum"} - {_scope(n) for n in scans}
        convs = []
        for n in ctx.graph:
            if n.op_type != "Conv" or _scope(n) not in chunked or len(n.inputs) < 2:
                continue
            w = const_shape(n.inputs[1])  # [C, 1, kernel] for a depthwise conv over one axis
            if w is not None and len(w) == 3 and w[1] == 1 and attr(n, "group", 1) == w[0] > 1:
                convs.append(n)
        return scans + convs

    def check(self, ctx, anchor):
        if anchor.op_type == "Conv":
            scope = _scope(anchor)
            ops = Counter(n.op_type for n in ctx.graph if _scope(n).startswith(scope))
            top = ", ".join(f"{op} {k}" for op, k in ops.most_common(4))
            return (f"the chunked delta rule (a CumSum per chunk, unrolled at the export's length) is not matched: "
                    f"com.microsoft.LinearAttention is matched in the recurrent form (a Scan over the tokens, as "
                    f"softsyn exports a hybrid decoder with its cache); its {sum(ops.values())} exported cells stay, "
                    f"each timed from its library cell ({top}, ...)")
        geo = geometry(anchor)
        if isinstance(geo, str):
            return geo
        error = agreement(anchor, ctx.graph, dict(ctx.model.opset_imports), *geo)
        if not error <= TOLERANCE:
            return (f"the Scan is not the gated delta rule over (state, q, k, v, g, beta): LinearAttention differs "
                    f"by {error:.2e} of its output on seeded inputs (tolerance {TOLERANCE:.0e})")
        return anchor, geo

    def rewrite(self, ctx, match):
        scan, (heads, dk, dv) = match
        ctx.use_opset(MS, 1)
        graph = ctx.graph
        pack = add_initializer(graph, "linear_attention_pack", np.array([0, 0, -1], np.int64))
        unpack = add_initializer(graph, f"linear_attention_unpack_{heads}x{dv}", np.array([0, 0, heads, dv], np.int64))
        values = {v.name: v for v in (*scan.inputs, pack, unpack)}
        names = [v.name for v in (*scan.inputs, pack, unpack)]
        outs = [f"{scan.name}_state", f"{scan.name}_out"]
        nodes = []
        for op, domain, inputs, outputs, attrs in replacement_ops(heads, dv, names, outs):
            node = make_node(scan, domain, op, [values[n] for n in inputs], attrs, num_outputs=len(outputs))
            for value, name in zip(node.outputs, outputs):
                values[name] = value
            nodes.append(node)
        graph.insert_before(scan, nodes)
        for old, new in zip(scan.outputs, (values[outs[0]], values[outs[1]])):
            new.dtype, new.shape = old.dtype, old.shape
            replace_value(graph, old, new)
