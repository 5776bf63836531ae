"""The fusion cost check: a rewrite is applied only where the target library says its fused cells are faster.

Before a matched site is rewritten, its rule's `Replacement` (the cells it would add, the values it replaces)
is timed the way static timing times a node (softsyn.timing.cost.node_work, then Library.node_timing) at every
scenario of the design: the fused cells against the nodes that lose their last use once the values are
replaced. A cell costs its host time or its device time, whichever is longer (on a CPU the host does the work;
on a GPU a small node costs its launch). Nodes the runtime folds at load (inputs all weights) cost nothing.
A site whose fused cells are slower over the design's scenarios, by delays the library measured on both
sides (a roofline estimate is no evidence against a fusion), is kept as it is, with the figures as its reason.
"""
from __future__ import annotations

from collections import ChainMap
from dataclasses import dataclass

import onnx_ir as ir

from softsyn.netlist import eval_dim_expr
from passes.fuse.base import Cell, Replacement
from passes.fuse.graph import consumers
from softsyn.timing import node_work, precision_of
from softsyn.timing.sta import NONDETERMINISTIC
from softsyn.units import fmt_time

KEPT = "kept:"  # how a kept site's reason starts: the fusion matched, the library times it slower
TABLED = {"table", "table-extrap"}  # delay sources the library measured: only they can keep a site unfused


@dataclass(frozen=True)
class BoundScenario:
    group: str
    dims: dict[str, int]
    shapes: dict[str, tuple[int, ...]]  # the netlist bound at dims before the pass (values added later: by dims)


class CostCheck:
    """Times Replacements against the library at the design's scenarios; `precision` is what the cells will
    run at after the precision pass ("fp16" on GPU targets: float cells are looked up at fp16)."""

    def __init__(self, library, scenarios: list[BoundScenario], derived_dims: dict[str, str], precision: str):
        self.library = library
        self.scenarios = scenarios
        self.derived = dict(derived_dims)
        self.precision = precision

    def verdict(self, graph: ir.Graph, rep: Replacement) -> str | None:
        """None if the fused cells are no slower than what they replace, else the reason the site is kept."""
        folded: dict[int, bool] = {}
        removed = [n for n in replaced_nodes(graph, rep) if not _is_folded(n, folded)]
        protos = [_proto(cell) for cell in rep.cells]
        fused = unfused = 0.0
        fused_sources, unfused_sources = set(), set()
        for sc in self.scenarios:
            for node in protos:
                delay, source = self._delay(node, sc)
                fused += delay
                fused_sources.add(source)
            for node in removed:
                delay, source = self._delay(node, sc)
                unfused += delay
                unfused_sources.add(source)
        if fused <= unfused or not (fused_sources | unfused_sources) <= TABLED:
            return None
        ops = " + ".join(c.op_type for c in rep.cells)
        unit, digits = ("ms", 3) if fused >= 1e-3 else ("us", 2)
        where = " + ".join(sc.group for sc in self.scenarios)
        return (f"{KEPT} {ops} tabled {fmt_time(fused, unit, digits)} > {fmt_time(unfused, unit, digits)} unfused "
                f"({len(removed)} nodes, {where}, {self.library.name})")

    def _delay(self, node: ir.Node, sc: BoundScenario) -> tuple[float, str]:
        shapes = ChainMap(self._extra_shapes(node, sc), sc.shapes)
        work = node_work(node, shapes)
        precision = precision_of(node)
        if precision == "fp32" and self.precision != "fp32" and _has_float(node):
            precision = self.precision
        delay, source, host, device = self.library.node_timing(node.op_type, precision, work.flops, work.bytes,
                                                               work.sizes)
        return max(host, device), source

    def _extra_shapes(self, node: ir.Node, sc: BoundScenario) -> dict[str, tuple[int, ...]]:
        """Shapes of the node's values the pass-start binding does not have (added by earlier rewrites, or a
        Cell's stand-ins), from their symbolic shapes at the scenario's dims."""
        env = dict(sc.dims)
        for role, expr in self.derived.items():
            value = eval_dim_expr(expr, env)
            if value is not None:
                env.setdefault(role, value)
        out = {}
        for v in list(node.inputs) + list(node.outputs):
            if v is None or v.name in sc.shapes or v.shape is None:
                continue
            dims = [d if isinstance(d, int) else eval_dim_expr(str(d.value), env) if getattr(d, "value", None) else None
                    for d in v.shape]
            if all(isinstance(d, int) for d in dims):
                out[v.name] = tuple(dims)
        return out


def _is_folded(node: ir.Node, memo: dict[int, bool]) -> bool:
    """The runtime computes it once at load: every input a weight, a constant or another such node's output."""
    key = id(node)
    if key not in memo:
        memo[key] = node.op_type not in NONDETERMINISTIC and all(
            v is None or (v.producer() is None and v.const_value is not None)
            or (v.producer() is not None and _is_folded(v.producer(), memo)) for v in node.inputs)
    return memo[key]


def replaced_nodes(graph: ir.Graph, rep: Replacement) -> list[ir.Node]:
    """The nodes that have no use left once `rep.replaces` are replaced: the backward cone of those values up to
    `rep.reads`, less every node one of whose outputs is still read outside that dead set (or is a graph output)."""
    stop = {id(v) for v in rep.reads}
    replaced = {id(v) for v in rep.replaces}
    outputs = {id(o) for o in graph.outputs}
    cone, seen = [], set()
    stack = [v.producer() for v in rep.replaces if v.producer() is not None]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        cone.append(n)
        stack.extend(v.producer() for v in n.inputs
                     if v is not None and id(v) not in stop and v.producer() is not None)
    dead = {id(n) for n in cone}
    changed = True
    while changed:
        changed = False
        for n in cone:
            if id(n) in dead and any(id(o) not in replaced and (id(o) in outputs or any(id(u) not in dead
                                                                                       for u in consumers(o)))
                                     for o in n.outputs):
                dead.discard(id(n))
                changed = True
    return [n for n in cone if id(n) in dead]


def _proto(cell: Cell) -> ir.Node:
    """A detached node shaped like the cell: fresh copies of its values, so no graph value gains a use."""
    def copy(v):
        return None if v is None else ir.Value(name=v.name, shape=v.shape, type=v.type)

    node = ir.Node(cell.domain, cell.op_type, [copy(v) for v in cell.inputs],
                   ir.convenience.convert_attributes(cell.attributes), num_outputs=len(cell.outputs))
    for o, like in zip(node.outputs, cell.outputs):
        if like is not None:
            o.name, o.shape, o.type = like.name, like.shape, like.type
    return node


def _has_float(node: ir.Node) -> bool:
    return any(v is not None and v.dtype == ir.DataType.FLOAT for v in list(node.inputs) + list(node.outputs))
