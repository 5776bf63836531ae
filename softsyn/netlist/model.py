"""The netlist: an onnx-ir model plus what softsyn knows about it.

Cells are ONNX nodes, nets are values. The hierarchy comes from the exporter's module
scopes (kept on each node as the metadata prop ``softsyn.hierarchy`` so it survives a
save/load). Shapes may carry symbolic dims (``batch``, ``seq``, ``past``, and exporter
expressions such as ``past + seq``); :meth:`Netlist.bind` turns them into concrete shapes
for one scenario.
"""
from __future__ import annotations

import ast
import contextlib
import io
import json
import math
import operator
import re
from typing import Any

import onnx_ir as ir

from softsyn.errors import SoftsynError

HIERARCHY_KEY = "softsyn.hierarchy"
NETLIST_META_KEY = "softsyn.netlist"
_SCOPES_KEY = "pkg.torch.onnx.name_scopes"


# --------------------------------------------------------------------------- expressions
class _Unknown(Exception):
    pass


_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _truediv(a, b):
    return a / b


_FUNCS = {
    "Max": max,
    "max": max,
    "Min": min,
    "min": min,
    "floor": math.floor,
    "ceiling": math.ceil,
    "ceil": math.ceil,
    "FloorDiv": operator.floordiv,
    "CeilDiv": lambda a, b: -(-a // b),
    "CeilToInt": math.ceil,
    "FloorToInt": math.floor,
    "IntTrueDiv": _truediv,
    "TruncToInt": int,
    "Mod": operator.mod,
    "PythonMod": operator.mod,
    "Abs": abs,
    "abs": abs,
    "sqrt": math.sqrt,
}

_EXPR_CACHE: dict[str, Any] = {}


def _compile_expr(expr: str):
    code = _EXPR_CACHE.get(expr)
    if code is None:
        try:
            code = ast.parse(expr.strip(), mode="eval").body
        except SyntaxError:
            code = False
        _EXPR_CACHE[expr] = code
    return code


def _eval_node(node, env: dict[str, int]):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        raise _Unknown(node.id)
    if isinstance(node, ast.BinOp):
        a, b = _eval_node(node.left, env), _eval_node(node.right, env)
        if isinstance(node.op, ast.Div):
            return a / b
        fn = _BINOPS.get(type(node.op))
        if fn is None:
            raise _Unknown(ast.dump(node.op))
        return fn(a, b)
    if isinstance(node, ast.UnaryOp):
        v = _eval_node(node.operand, env)
        if isinstance(node.op, ast.USub):
            return -v
        if isinstance(node.op, ast.UAdd):
            return v
        raise _Unknown("unary")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS:
        return _FUNCS[node.func.id](*(_eval_node(a, env) for a in node.args))
    raise _Unknown(ast.dump(node))


def eval_dim_expr(expr: str, env: dict[str, int]) -> int | None:
    """Evaluate a symbolic dim expression ("past + seq", "2*seq", "Max(1, seq)") safely.

    Returns None when the expression cannot be evaluated with ``env``.
    """
    if expr in env:
        return int(env[expr])
    code = _compile_expr(expr)
    if code is False:
        return None
    try:
        value = _eval_node(code, env)
    except (_Unknown, ZeroDivisionError, TypeError, ValueError, OverflowError):
        return None
    if isinstance(value, float):
        if not value.is_integer():
            return None
        value = int(value)
    return int(value)


def expr_names(expr: str) -> set[str]:
    code = _compile_expr(expr)
    if code is False:
        return {expr}
    return {n.id for n in ast.walk(code) if isinstance(n, ast.Name) and n.id not in _FUNCS}


def _numel(shape) -> int:
    return math.prod(int(d) for d in shape)


def _canonical_constant(node_proto):
    """Constant(value_int[s]/value_float[s]=...) -> Constant(value=tensor): ORT's symbolic shape inference reads only `value`."""
    if node_proto.op_type != "Constant" or node_proto.domain not in ("", "ai.onnx"):
        return node_proto
    import onnx

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


_UNARY = {
    "Softmax", "LogSoftmax", "IsNaN", "IsInf", "Sigmoid", "Sqrt", "Neg", "Exp", "Log", "Tanh", "Relu", "Erf",
    "Reciprocal", "Abs", "Cast", "Not", "Identity", "Cos", "Sin", "Gelu", "Silu", "Floor", "Ceil", "Round",
}
_ELEMENTWISE = _UNARY | {
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where", "Equal", "Less", "LessOrEqual", "Greater",
    "GreaterOrEqual", "And", "Or", "Xor", "Mod",
}


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ValueError(f"cannot broadcast {shapes}")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


# --------------------------------------------------------------------------- hierarchy
def scope_from_name_scopes(raw: str, prefix: str = "m") -> str:
    """Deepest module scope of a dynamo-exported node, wrapper prefix stripped.

    "['', 'm', 'm.model', 'm.model.layers.0', 'm.model.layers.0.self_attn', 'linear_1']"
    -> "model.layers.0.self_attn".
    """
    try:
        scopes = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return ""
    if not isinstance(scopes, (list, tuple)):
        return ""
    deepest = ""
    for s in scopes:
        if not isinstance(s, str) or s == "":
            continue
        if deepest == "" or s.startswith(deepest + "."):
            deepest = s
        else:
            break
    if prefix:
        if deepest != prefix and not deepest.startswith(prefix + "."):
            return ""
        if deepest == prefix:
            return ""
        if deepest.startswith(prefix + "."):
            return deepest[len(prefix) + 1 :]
    return deepest


_LEGACY_NAME = re.compile(r"^/(.+)/[^/]+$")


def scope_from_node_name(name: str | None) -> str:
    """Hierarchy from a legacy-exporter node name: "/model/layers.0/self_attn/q_proj/MatMul" -> "model.layers.0.self_attn.q_proj"."""
    if not name:
        return ""
    m = _LEGACY_NAME.match(name)
    if not m:
        return ""
    return ".".join(p for p in m.group(1).split("/") if p)


def annotate_hierarchy(model: ir.Model, prefix: str = "m") -> None:
    """Store each node's hierarchy in its metadata (``softsyn.hierarchy``) from the exporter's scopes."""
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if HIERARCHY_KEY in node.metadata_props:
            continue
        raw = node.metadata_props.get(_SCOPES_KEY)
        if raw is not None:
            h = scope_from_name_scopes(raw, prefix)
        else:
            h = scope_from_node_name(node.name)
        node.metadata_props[HIERARCHY_KEY] = h


# --------------------------------------------------------------------------- netlist
class Netlist:
    """The design's netlist: an onnx-ir model plus provenance, config, hierarchy and shape binding."""

    def __init__(
        self,
        model: ir.Model,
        name: str,
        kind: str = "generic",
        provenance: dict | None = None,
        config: dict | None = None,
        derived_dims: dict[str, str] | None = None,
    ):
        self.model = model
        self.name = name
        self.kind = kind
        self.provenance = dict(provenance or {})
        self.config = dict(config or {})
        self.derived_dims = dict(derived_dims or {})
        self._bind_cache: dict[tuple, dict[str, tuple[int, ...]]] = {}
        self._nodes: list[ir.Node] | None = None
        self._skeleton = None  # weightless ModelProto for shape-inference fallback
        self._bind_stats: dict[tuple, dict] = {}

    # ---- persistence of the softsyn-side description inside the model
    def to_meta(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "provenance": self.provenance,
            "config": self.config,
            "derived_dims": self.derived_dims,
        }

    def store_meta(self) -> None:
        self.model.metadata_props[NETLIST_META_KEY] = json.dumps(self.to_meta(), sort_keys=True, default=str)

    @classmethod
    def from_model(cls, model: ir.Model, **overrides) -> "Netlist":
        """Build a Netlist from a model, reading a stored softsyn description if the model has one."""
        meta = {}
        raw = model.metadata_props.get(NETLIST_META_KEY)
        if raw:
            try:
                meta = json.loads(raw)
            except ValueError:
                meta = {}
        args = {
            "name": meta.get("name") or model.graph.name or "design",
            "kind": meta.get("kind", "generic"),
            "provenance": meta.get("provenance", {}),
            "config": meta.get("config", {}),
            "derived_dims": meta.get("derived_dims", {}),
        }
        args.update({k: v for k, v in overrides.items() if v is not None})
        nl = cls(model, **args)
        annotate_hierarchy(model, prefix=nl.provenance.get("scope_prefix", "m"))
        return nl

    def __repr__(self) -> str:
        return (
            f"Netlist({self.name!r}, kind={self.kind!r}, nodes={len(self.nodes())}, "
            f"inputs={[v.name for v in self.model.graph.inputs]})"
        )

    # ---- structure
    def nodes(self) -> list[ir.Node]:
        """Nodes of the main graph in execution (topological) order."""
        if self._nodes is None or len(self._nodes) != len(self.model.graph):
            self._nodes = list(self.model.graph)
        return self._nodes

    def invalidate(self) -> None:
        """Call after changing the graph: drops cached node lists and bound shapes."""
        self._nodes = None
        self._bind_cache.clear()
        self._bind_stats.clear()
        self._skeleton = None

    def hierarchy(self, node: ir.Node) -> str:
        h = node.metadata_props.get(HIERARCHY_KEY)
        if h is None:
            raw = node.metadata_props.get(_SCOPES_KEY)
            if raw is not None:
                h = scope_from_name_scopes(raw, self.provenance.get("scope_prefix", "m"))
            else:
                h = scope_from_node_name(node.name)
            node.metadata_props[HIERARCHY_KEY] = h
        return h

    def input_modality(self, name: str) -> str:
        n = name.lower()
        if n.startswith("pixel_values") or n.startswith("image") or "pixel" in n:
            return "image"
        if n.startswith("input_features") or n.startswith("audio") or "audio" in n:
            return "audio"
        return "text"

    def symbolic_dims(self) -> set[str]:
        """Free dim names of the graph inputs (derived dims excluded)."""
        names: set[str] = set()
        for v in self.model.graph.inputs:
            if v.shape is None:
                continue
            for d in v.shape:
                if isinstance(d, ir.SymbolicDim) and d.value is not None:
                    if d.value in self.derived_dims:
                        continue
                    code = _compile_expr(d.value)
                    if code is not False and isinstance(code, ast.Name):
                        names.add(d.value)
                    else:
                        names |= {x for x in expr_names(d.value) if x not in self.derived_dims}
        return names

    # ---- binding
    def _env(self, dims: dict[str, int]) -> dict[str, int]:
        env = {k: int(v) for k, v in dims.items()}
        pending = dict(self.derived_dims)
        for _ in range(len(pending) + 1):
            progressed = False
            for k, expr in list(pending.items()):
                if k in env:
                    pending.pop(k)
                    continue
                v = eval_dim_expr(expr, env)
                if v is not None:
                    env[k] = v
                    pending.pop(k)
                    progressed = True
            if not progressed:
                break
        return env

    def _all_values(self):
        g = self.model.graph
        seen = set()
        for v in g.inputs:
            seen.add(id(v))
            yield v
        for v in g.initializers.values():
            if id(v) not in seen:
                seen.add(id(v))
                yield v
        for node in self.nodes():
            for v in node.outputs:
                if v is not None and v.name and id(v) not in seen:
                    seen.add(id(v))
                    yield v

    def bind(self, dims: dict[str, int]) -> dict[str, tuple[int, ...]]:
        """Concrete shape of every value (inputs, initializers, node outputs) for one scenario.

        Exporter expressions are evaluated with ``dims`` (plus ``derived_dims``); values whose
        dims are unknown to the exporter are filled from ONNX shape inference with data
        propagation on a weightless, concrete-input copy of the graph. Results are cached per
        dims. Raises SoftsynError naming the missing dims if a free dim is unbound.
        """
        key = tuple(sorted((str(k), int(v)) for k, v in dims.items()))
        hit = self._bind_cache.get(key)
        if hit is not None:
            return hit
        missing = sorted(self.symbolic_dims() - set(dims))
        if missing:
            raise SoftsynError(
                f"design {self.name}: unbound symbolic dim(s) {', '.join(missing)}; "
                f"bind all of: {', '.join(sorted(self.symbolic_dims()))}"
            )
        env = self._env(dims)
        shapes: dict[str, tuple[int, ...]] = {}
        unresolved = 0
        total = 0
        for v in self._all_values():
            total += 1
            shape = v.shape
            if shape is None:
                unresolved += 1
                continue
            out = []
            ok = True
            for d in shape:
                if isinstance(d, int):
                    out.append(d)
                    continue
                expr = d.value if isinstance(d, ir.SymbolicDim) else None
                val = eval_dim_expr(expr, env) if expr is not None else None
                if val is None:
                    ok = False
                    break
                out.append(val)
            if ok:
                shapes[v.name] = tuple(out)
            else:
                unresolved += 1
        inferred = 0
        if unresolved:
            inferred = self._infer_missing(env, shapes)
            if total - len(shapes):
                inferred += self._propagate_elementwise(shapes)
        self._bind_stats[key] = {
            "values": total,
            "from_exporter": len(shapes) - inferred,
            "from_inference": inferred,
            "unbound": total - len(shapes),
        }
        self._bind_cache[key] = shapes
        return shapes

    def bind_stats(self, dims: dict[str, int]) -> dict:
        """How bind() resolved the shapes for ``dims``: counts by source (exporter / inference / unbound)."""
        self.bind(dims)
        return dict(self._bind_stats[tuple(sorted((str(k), int(v)) for k, v in dims.items()))])

    def _skeleton_proto(self):
        """Weightless copy of the graph as a ModelProto: large initializers become typed inputs."""
        if self._skeleton is not None:
            return self._skeleton
        import onnx

        from onnx_ir import serde

        g = self.model.graph
        nodes = [_canonical_constant(serde.serialize_node(n)) for n in g]
        big_inits = []
        small_inits = []
        for v in g.initializers.values():
            t = v.const_value
            n_el = _numel(v.shape) if v.shape is not None and v.shape.is_static() else None
            small = (
                t is not None
                and n_el is not None
                and n_el <= 64
                and v.dtype in (ir.DataType.INT64, ir.DataType.INT32)
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
            big_inits.append(v)
        inputs = [serde.serialize_value(v) for v in g.inputs]
        input_names = {v.name for v in g.inputs}
        inputs += [serde.serialize_value(v) for v in big_inits if v.name not in input_names]
        outputs = [serde.serialize_value(v) for v in g.outputs]
        graph = onnx.helper.make_graph(nodes, g.name or "g", inputs, outputs, initializer=small_inits)
        opsets = [onnx.helper.make_opsetid(d, v) for d, v in self.model.opset_imports.items()]
        proto = onnx.helper.make_model(graph, opset_imports=opsets, ir_version=min(self.model.ir_version, 10))
        for f in self.model.functions.values():
            proto.functions.append(serde.serialize_function(f))
        self._skeleton = proto
        return proto

    def _infer_missing(self, env: dict[str, int], shapes: dict[str, tuple[int, ...]]) -> int:
        import onnx

        proto = onnx.ModelProto()
        proto.CopyFrom(self._skeleton_proto())
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
            from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

            with contextlib.redirect_stdout(io.StringIO()):
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

    def _propagate_elementwise(self, shapes: dict[str, tuple[int, ...]]) -> int:
        """Last resort for values both the exporter and shape inference left open (e.g. the
        mask chain of an unoptimised export): an elementwise op's output is the broadcast of its
        known inputs (an unknown input of a broadcast op broadcasts into the known ones)."""
        count = 0
        for node in self.nodes():
            if node.op_type not in _ELEMENTWISE or node.domain not in ("", "ai.onnx"):
                continue
            out = node.outputs[0]
            if out is None or out.name in shapes:
                continue
            known = [shapes[v.name] for v in node.inputs if v is not None and v.name in shapes]
            if not known or (node.op_type in _UNARY and len(known) != 1):
                continue
            try:
                shapes[out.name] = _broadcast(known)
                count += 1
            except ValueError:
                continue
        return count

    # ---- convenience
    def parameter_count(self) -> int:
        """Elements in the floating-point initializers (weights), from their shapes; never reads data."""
        total = 0
        for v in self.model.graph.initializers.values():
            if v.dtype is not None and not v.dtype.is_floating_point():
                continue
            if v.shape is not None and v.shape.is_static():
                total += _numel(v.shape)
        return total

    def weight_bytes(self) -> int:
        total = 0
        for v in self.model.graph.initializers.values():
            if v.shape is not None and v.shape.is_static() and v.dtype is not None:
                total += int(_numel(v.shape) * v.dtype.itemsize)
        return total
