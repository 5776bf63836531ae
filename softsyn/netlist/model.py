"""The netlist: an onnx-ir model plus what softsyn knows about it.

Cells are ONNX nodes, nets are values. The hierarchy comes from the exporter's module
scopes (softsyn.netlist.hierarchy). Shapes may carry symbolic dims (``batch``, ``seq``,
``past``, and exporter expressions such as ``past + seq``, evaluated by softsyn.netlist.dims);
:meth:`Netlist.bind` turns them into concrete shapes for one scenario.
"""
from __future__ import annotations

import json

import onnx_ir as ir

from softsyn.errors import SoftsynError
from softsyn.netlist.dims import eval_dim_expr, expr_names, is_dim_name
from softsyn.netlist.hierarchy import HIERARCHY_KEY, annotate_hierarchy, node_scope
from softsyn.netlist.shapes import infer_missing, numel, propagate_elementwise, skeleton_proto

NETLIST_META_KEY = "softsyn.netlist"  # metadata prop holding Netlist.to_meta() in a saved model


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
            h = node_scope(node, self.provenance.get("scope_prefix", "m"))
            node.metadata_props[HIERARCHY_KEY] = h
        return h

    def blocks(self) -> list[dict]:
        """A composite's blocks (name, file, inputs, outputs) in execution order; [] for a one-graph design."""
        return list(self.provenance.get("blocks") or [])

    def block_of(self, node: ir.Node) -> str:
        """The block a cell belongs to: its hierarchy's top level in a composite ("" in a one-graph design)."""
        if not self.provenance.get("blocks"):
            return ""
        return self.hierarchy(node).split(".", 1)[0]

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
                    if is_dim_name(d.value):
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
            inferred = infer_missing(self._skeleton_proto(), env, shapes)
            if total - len(shapes):
                inferred += propagate_elementwise(self.nodes(), shapes)
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
        """Weightless copy of the graph for shape inference, built once per graph (see invalidate)."""
        if self._skeleton is None:
            self._skeleton = skeleton_proto(self.model)
        return self._skeleton

    # ---- convenience
    def parameter_count(self) -> int:
        """Elements in the floating-point initializers (weights), from their shapes; never reads data."""
        total = 0
        for v in self.model.graph.initializers.values():
            if v.dtype is not None and not v.dtype.is_floating_point():
                continue
            if v.shape is not None and v.shape.is_static():
                total += numel(v.shape)
        return total

    def weight_bytes(self) -> int:
        total = 0
        for v in self.model.graph.initializers.values():
            if v.shape is not None and v.shape.is_static() and v.dtype is not None:
                total += int(numel(v.shape) * v.dtype.itemsize)
        return total
