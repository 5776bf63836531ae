"""The fusion rule contract: what a rule sees (FusionContext), is (Rule) and reports (Coverage, Miss).

Each rule (onnxscript rewriter style) has three parts:

* ``anchors(ctx)`` — a structural anchor that does not depend on the rule succeeding (every
  Softmax fed by a MatMul is an attention candidate, every ReduceMean(x²) an RMSNorm candidate),
  so a site that does not fuse is counted, never silent;
* ``check(ctx, anchor)`` — returns a match object, or a string: the reason it does not fuse; a pattern's hops from
  one value through the nodes it must feed are spelled as a chain (``passes.fuse.chain``: ``follow`` returns the
  matched nodes or the first broken link, naming the value it broke at);
* ``rewrite(ctx, match)`` — replaces the site in place;
* ``replacement(ctx, match)`` — what the rewrite would put in and take out (a ``Replacement``), so the pass can
  ask the target library whether the fused cells are faster than the nodes they replace before rewriting.

``passes.fuse.fuse(netlist, target, kinds)`` runs the rules in order and returns one
``Coverage`` per kind.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from passes import PassReport
from passes.fuse.graph import MS, cone_inputs, evaluate, site
from softsyn.runtime.inputs import scenario_inputs

PROBE = {"batch": 2, "seq": 3, "past": 4}  # dims of the probe inputs checks evaluate cones on (others: 3)


@dataclass
class Miss:
    site: str    # node name + hierarchy, e.g. "model.layers.3.self_attn (node_softmax_3)"
    reason: str


@dataclass
class Coverage:
    kind: str
    candidates: int = 0
    fused: int = 0
    misses: list[Miss] = field(default_factory=list)
    target_op: str = ""   # the runtime op this kind maps to, e.g. "com.microsoft.GroupQueryAttention"
    note: str = ""        # kind-level remark (e.g. why a target does not offer the op)

    @property
    def percent(self) -> float:
        return 100.0 * self.fused / self.candidates if self.candidates else 100.0


class FusionReport(list, PassReport):
    """The fuse pass's report: a Coverage per kind, in rule order (reports.report_fusion renders it)."""


class FusionContext:
    """What a rule sees: the netlist, its graph, the target, and shared per-graph helpers."""

    def __init__(self, netlist, target: str, positions: int | None = None):
        self.netlist = netlist
        self.model = netlist.model
        self.graph = netlist.model.graph
        self.target = target
        self.positions = positions  # the longest sequence the design must hold (its KV buffer), if known
        self.cache: dict = {}

    def site(self, node) -> str:
        return site(self.netlist, node)

    def use_opset(self, domain: str, version: int) -> None:
        if domain not in self.model.opset_imports:
            self.model.opset_imports[domain] = version

    def probe(self) -> "Probe | str":
        """Seeded inputs for every graph input at the PROBE dims (built once per context), or why there are none."""
        if "probe" not in self.cache:
            nl = self.netlist
            dims = {k: v for k, v in PROBE.items() if k in nl.symbolic_dims()}
            dims.update({d: 3 for d in nl.symbolic_dims() - set(dims)})
            try:
                self.cache["probe"] = Probe({**scenario_inputs(nl, dims, seed=7), **port_arrays(nl, dims)}, dims)
            except Exception as exc:
                self.cache["probe"] = f"cannot build probe inputs: {exc}"
        return self.cache["probe"]

    def run_probe(self, outputs: list[ir.Value], extra: dict | None = None,
                  arrays: dict[str, np.ndarray] | None = None) -> list[np.ndarray]:
        """The cone of `outputs` on ORT CPU: `extra` feeds inner values (ir.Value -> array), the graph inputs it reads
        come from `arrays` (default: the probe's). Raises when the probe has no inputs or the cone fails."""
        extra = dict(extra or {})
        if arrays is None:
            probe = self.probe()
            if isinstance(probe, str):
                raise ValueError(probe)
            arrays = probe.arrays
        fed = {id(x) for x in extra}
        # a composite's block inputs another block makes: fed from the arrays, so a cone stops at its block's edge
        ports = [v for n in self.graph for v in n.outputs if v.name in arrays and id(v) not in fed]
        for v in cone_inputs(outputs, fed | {id(v) for v in ports}):
            if v.name not in arrays:
                raise ValueError(f"cone reads {v.name}")
            extra[v] = arrays[v.name]
        extra.update({v: arrays[v.name] for v in ports})
        return evaluate(self.graph, outputs, extra, dict(self.model.opset_imports))


def port_arrays(netlist, dims: dict[str, int], seed: int = 8) -> dict[str, np.ndarray]:
    """Seeded values at `dims` for a composite's block boundaries (what one block outputs and another reads), so a
    probe of a later block starts at its inputs instead of running the blocks before it: qwen3-vl-2b-reduced's
    decoder attention probes reached the vision tower through a Shape of inputs_embeds, 6 s each on 2 cores."""
    produced = {o for b in netlist.blocks() for o in b["outputs"]}
    ports = {i for b in netlist.blocks() for i in b["inputs"] if i in produced}
    if not ports:
        return {}
    shapes, rng = netlist.bind(dims), np.random.default_rng(seed)
    values = {v.name: v for n in netlist.nodes() for v in n.outputs if v.name in ports}
    return {name: rng.standard_normal(shapes[name]).astype(v.dtype.numpy()) for name, v in values.items()
            if shapes.get(name) is not None and v.dtype is not None}


@dataclass(frozen=True)
class Probe:
    arrays: dict[str, np.ndarray]  # graph input name -> seeded array at `dims`
    dims: dict[str, int]


@dataclass(frozen=True)
class Cell:
    """A node a rewrite would add, described before it exists: its inputs are graph values or unattached stand-ins
    (ir.Value with a name, shape and type), its outputs the values whose shape and type its outputs take."""
    op_type: str
    inputs: tuple
    outputs: tuple
    attributes: dict = field(default_factory=dict)
    domain: str = MS


@dataclass(frozen=True)
class Replacement:
    """What a rewrite puts in (cells) and takes out: the values it replaces and every node that then has no use,
    up to the graph values its cells read."""
    cells: tuple[Cell, ...]
    replaces: tuple[ir.Value, ...]
    reads: tuple[ir.Value, ...]


def stand_in(name: str, shape, dtype: ir.DataType | None) -> ir.Value:
    """An unattached value of `shape` (ir.Shape, list or None) and `dtype`, for a Cell's inputs and outputs."""
    return ir.Value(name=name, shape=None if shape is None else ir.Shape(list(shape)),
                    type=None if dtype is None else ir.TensorType(dtype))


class Rule:
    kind: str = ""
    target_op: str = ""

    def anchors(self, ctx: FusionContext) -> list:
        raise NotImplementedError

    def check(self, ctx: FusionContext, anchor):
        raise NotImplementedError

    def rewrite(self, ctx: FusionContext, match) -> None:
        raise NotImplementedError

    def replacement(self, ctx: FusionContext, match) -> Replacement | None:
        """What rewrite(ctx, match) would put in and take out; None: the rule is not cost-checked."""
        return None

    def note(self, ctx: FusionContext) -> str:
        return ""
