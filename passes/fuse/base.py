"""The fusion rule contract: what a rule sees (FusionContext), is (Rule) and reports (Coverage, Miss).

Each rule (onnxscript rewriter style) has three parts:

* ``anchors(ctx)`` — a structural anchor that does not depend on the rule succeeding (every
  Softmax fed by a MatMul is an attention candidate, every ReduceMean(x²) an RMSNorm candidate),
  so a site that does not fuse is counted, never silent;
* ``check(ctx, anchor)`` — returns a match object, or a string: the reason it does not fuse;
* ``rewrite(ctx, match)`` — replaces the site in place.

``softsyn.passes.fuse.fuse(netlist, target, kinds)`` runs the rules in order and returns one
``Coverage`` per kind.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from softsyn.passes.fuse.graph import site


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


class FusionContext:
    """What a rule sees: the netlist, its graph, the target, and shared per-graph helpers."""

    def __init__(self, netlist, target: str):
        self.netlist = netlist
        self.model = netlist.model
        self.graph = netlist.model.graph
        self.target = target
        self.cache: dict = {}

    def site(self, node) -> str:
        return site(self.netlist, node)

    def use_opset(self, domain: str, version: int) -> None:
        if domain not in self.model.opset_imports:
            self.model.opset_imports[domain] = version


class Rule:
    kind: str = ""
    target_op: str = ""

    def anchors(self, ctx: FusionContext) -> list:
        raise NotImplementedError

    def check(self, ctx: FusionContext, anchor):
        raise NotImplementedError

    def rewrite(self, ctx: FusionContext, match) -> None:
        raise NotImplementedError

    def note(self, ctx: FusionContext) -> str:
        return ""
