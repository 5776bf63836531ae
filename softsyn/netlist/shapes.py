"""Shape binding helpers for :meth:`softsyn.netlist.Netlist.bind`.

What the exporter leaves symbolic and the dim expressions cannot resolve is filled in two steps: shape
inference on a weightless copy of the graph with concrete inputs (ORT's symbolic shape inference, else
ONNX's with data propagation), then, as a last resort, broadcasting through elementwise ops.
"""
from __future__ import annotations

import contextlib
import io
import math
import os
import tempfile

import onnx
import onnx_ir as ir
from onnx_ir import serde

from softsyn.netlist.dims import eval_dim_expr

Shapes = dict[str, tuple[int, ...]]

_UNARY = {
    "Softmax", "LogSoftmax", "IsNaN", "IsInf", "Sigmoid", "Sqrt", "Neg", "Exp", "Log", "Tanh", "Relu", "Erf",
    "Reciprocal", "Abs", "Cast", "Not", "Identity", "Cos", "Sin", "Gelu", "Silu", "Floor", "Ceil", "Round",
    "QuickGelu",
}
_ELEMENTWISE = _UNARY | {
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where", "Equal", "Less", "LessOrEqual", "Greater",
    "GreaterOrEqual", "And", "Or", "Xor", "Mod",
}


def numel(shape) -> int:
    return math.prod(int(d) for d in shape)


def broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """Numpy broadcast of ``shapes``; ValueError if two dims other than 1 disagree."""
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ValueError(f"cannot broadcast {shapes}")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _canonical_constant(node_proto):
    """Constant(value_int[s]/value_float[s]=...) -> Constant(value=tensor): ORT's symbolic shape inference reads only `value`."""
    if node_proto.op_type != "Constant" or node_proto.domain not in ("", "ai.onnx"):
        return node_proto

    for a in node_proto.attribute:
        if a.name in ("value_int", "value_ints", "value_float", "value_floats"):
            if a.name == "value_int":
                t = onnx.helper.make_tensor("value", onnx.TensorProto.INT64, [], [a.i])
            elif a.name == "value_ints":
                t = onnx.helper.make_tensor("value", onnx.TensorProto.INT64, [len(a.ints)], list(a.ints))
            elif a.name == "value_float":
                t = onnx.helper.make_tensor("value", onnx.TensorProto.FLOAT, [], [a.f])
            else:
                t = onnx.helper.make_tensor("value", onnx.TensorProto.FLOAT, [len(a.floats)], list(a.floats))
            del node_proto.attribute[:]
            node_proto.attribute.append(onnx.helper.make_attribute("value", t))
            break
    return node_proto


def skeleton_proto(model: ir.Model, any_dtype: bool = False, vectors: int = 0):
    """Weightless copy of the graph as a ModelProto: large initializers become typed inputs.

    Kept as data: int64/int32 initializers of at most 64 elements (shape arithmetic), and with `any_dtype`
    small float ones too (the scalars ONNX Runtime's fusions check, e.g. GELU's 0.044715). `vectors`: other
    initializers of rank <= 1 up to that many elements stay initializers, as zeros (norm scales and biases,
    which fusions want constant but never read)."""
    g = model.graph
    nodes = [_canonical_constant(serde.serialize_node(n)) for n in g]
    big_inits = []
    small_inits = []
    for v in g.initializers.values():
        t = v.const_value
        n_el = numel(v.shape) if v.shape is not None and v.shape.is_static() else None
        small = (
            t is not None
            and n_el is not None
            and n_el <= 64
            and (any_dtype or v.dtype in (ir.DataType.INT64, ir.DataType.INT32))
            and not isinstance(t, ir.ExternalTensor)
        )
        if small:
            try:
                tp = serde.serialize_tensor(t)
            except Exception:  # data not available (meta): treat as a typed input
                tp = None
            if tp is not None:
                tp.name = v.name
                small_inits.append(tp)
                continue
        if vectors and n_el is not None and n_el <= vectors and v.shape is not None and len(v.shape) <= 1:
            zeros = onnx.helper.make_tensor(v.name, int(v.dtype), list(v.shape.numpy()), b"\0" * math.ceil(n_el * v.dtype.itemsize),
                                            raw=True)
            small_inits.append(zeros)
            continue
        big_inits.append(v)
    inputs = [serde.serialize_value(v) for v in g.inputs]
    input_names = {v.name for v in g.inputs}
    inputs += [serde.serialize_value(v) for v in big_inits if v.name not in input_names]
    outputs = [serde.serialize_value(v) for v in g.outputs]
    graph = onnx.helper.make_graph(nodes, g.name or "g", inputs, outputs, initializer=small_inits)
    opsets = [onnx.helper.make_opsetid(d, v) for d, v in model.opset_imports.items()]
    proto = onnx.helper.make_model(graph, opset_imports=opsets, ir_version=min(model.ir_version, 10))
    for f in model.functions.values():
        proto.functions.append(serde.serialize_function(f))
    return proto


@contextlib.contextmanager
def _scratch_cwd():
    """A throwaway working directory: ORT's symbolic shape inference saves sym_shape_infer_temp.onnx (+ .data)
    into the cwd when it cannot finish, and the user's cwd is not softsyn's to write."""
    tmp = tempfile.mkdtemp(prefix="softsyn-shapes-")
    try:
        with contextlib.chdir(tmp):
            yield
    finally:
        for name in os.listdir(tmp):  # flat (the model and its data file): unlink, not rmtree, which a kill test fakes
            os.unlink(os.path.join(tmp, name))
        os.rmdir(tmp)


def infer_missing(skeleton, env: dict[str, int], shapes: Shapes) -> int:
    """Add to ``shapes`` what shape inference finds on ``skeleton`` (see skeleton_proto) with its inputs made
    concrete from ``shapes`` and ``env``; returns how many values it added."""
    proto = onnx.ModelProto()
    proto.CopyFrom(skeleton)
    # concrete graph inputs (and typed weightless initializers)
    for vi in list(proto.graph.input):
        known = shapes.get(vi.name)
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue
        for i, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                continue
            val = known[i] if known is not None and i < len(known) else None
            if val is None and d.dim_param:
                val = eval_dim_expr(d.dim_param, env)
            if val is not None:
                d.Clear()
                d.dim_value = int(val)
    for vi in proto.graph.output:
        vi.type.tensor_type.ClearField("shape")
    inferred = None
    try:  # ORT's symbolic shape inference evaluates shape arithmetic that ONNX's data_prop gives up on
        # deferred: ORT's symbolic shape inference imports sympy; only graphs onnx cannot infer need it
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        with _scratch_cwd(), contextlib.redirect_stdout(io.StringIO()):
            inferred = SymbolicShapeInference.infer_shapes(proto, auto_merge=True, guess_output_rank=True)
    except Exception:
        inferred = None
    if inferred is None:
        try:
            inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
        except Exception:
            return 0
    count = 0
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        if vi.name in shapes:
            continue
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue
        dims = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                dims.append(d.dim_value)
            elif d.dim_param:
                val = eval_dim_expr(d.dim_param, env)
                if val is None:
                    break
                dims.append(val)
            else:
                break
        else:
            shapes[vi.name] = tuple(dims)
            count += 1
    return count


def propagate_elementwise(nodes: list[ir.Node], shapes: Shapes) -> int:
    """Last resort for values both the exporter and shape inference left open (e.g. the
    mask chain of an unoptimised export): an elementwise op's output is the broadcast of its
    known inputs (an unknown input of a broadcast op broadcasts into the known ones)."""
    count = 0
    for node in nodes:
        if node.op_type not in _ELEMENTWISE or node.domain not in ("", "ai.onnx"):
            continue
        out = node.outputs[0]
        if out is None or out.name in shapes:
            continue
        known = [shapes[v.name] for v in node.inputs if v is not None and v.name in shapes]
        if not known or (node.op_type in _UNARY and len(known) != 1):
            continue
        try:
            shapes[out.name] = broadcast(known)
            count += 1
        except ValueError:
            continue
    return count
