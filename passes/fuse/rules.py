"""Fusion: rewrite subgraphs of the netlist into the runtime's fused kernels, and explain every miss.

Each rule (onnxscript rewriter style) has three parts:

* ``anchors(ctx)`` — a structural anchor that does not depend on the rule succeeding (every
  Softmax fed by a MatMul is an attention candidate, every ReduceMean(x²) an RMSNorm candidate),
  so a site that does not fuse is counted, never silent;
* ``check(ctx, anchor)`` — returns a match object, or a string: the reason it does not fuse;
* ``rewrite(ctx, match)`` — replaces the site in place.

``fuse(netlist, target, kinds)`` runs the rules in order and returns one ``Coverage`` per kind.
"""
from __future__ import annotations

from dataclasses import dataclass, field


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
        from softsyn.passes.fuse.graph import site

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


def _rules():
    from softsyn.passes.fuse import attention, misc, moe, norms, rotary

    return [
        norms.RMSNormRule(), norms.SkipRMSNormRule(), norms.LayerNormRule(), norms.SkipLayerNormRule(),
        rotary.RotaryRule(), attention.AttentionRule(),
        misc.ProjectionMergeRule("packed_qkv"), misc.ProjectionMergeRule("gate_up"),
        misc.BiasGeluRule(), moe.MoERule(),
    ]


def fusion_kinds() -> list[str]:
    return [r.kind for r in _rules()]


def fuse(netlist, target: str = "cpu", kinds: list[str] | None = None) -> list[Coverage]:
    """Fuse in place; `target` "cpu" | "cuda" picks provider-legal ops. One Coverage per kind run."""
    from softsyn.passes.fuse.graph import remove_dead

    if target not in ("cpu", "cuda"):
        raise ValueError(f"fuse: target must be 'cpu' or 'cuda', not {target!r}")
    rules = _rules()
    if kinds is not None:
        unknown = sorted(set(kinds) - {r.kind for r in rules})
        if unknown:
            raise ValueError(f"fuse: unknown kind(s) {', '.join(unknown)}; valid: {', '.join(r.kind for r in rules)}")
        rules = [r for r in rules if r.kind in kinds]
    ctx = FusionContext(netlist, target)
    result = []
    for rule in rules:
        cov = Coverage(rule.kind, target_op=rule.target_op)
        anchors = rule.anchors(ctx)
        cov.candidates = len(anchors)
        for anchor in anchors:
            if getattr(anchor, "graph", ctx.graph) is None:  # consumed by an earlier rewrite
                cov.misses.append(Miss(ctx.site(anchor), "site was removed by an earlier rewrite"))
                continue
            try:
                match = rule.check(ctx, anchor)
            except Exception as exc:  # a check that crashes is a miss with its reason, never silence
                match = f"check failed: {type(exc).__name__}: {exc}"
            if isinstance(match, str):
                cov.misses.append(Miss(ctx.site(anchor), match))
                continue
            try:
                rule.rewrite(ctx, match)
            except Exception as exc:
                cov.misses.append(Miss(ctx.site(anchor), f"rewrite failed: {type(exc).__name__}: {exc}"))
                continue
            cov.fused += 1
        cov.note = rule.note(ctx) if cov.candidates else ""
        remove_dead(ctx.graph)
        netlist.invalidate()
        result.append(cov)
    return result


__all__ = ["Miss", "Coverage", "fuse", "fusion_kinds", "FusionContext", "Rule"]
