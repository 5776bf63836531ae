"""The `fuse` pass: norms, rotary, attention (GQA/MHA), projections, GELU, MoE, SiLU -> runtime kernels.

This module is the rule list and the only module that imports the rule files. Rules run in RULES
order: norms and rotary before attention, which on cuda absorbs the fused rotary and q/k norms. The rule
contract is passes.fuse.base; the graph helpers rules share are passes.fuse.graph. Attention
is one kind with one op rule per target op: `attention` matches every site once, then GroupQueryAttention
(`gqa`, with `gqa_absorb` on cuda) or MultiHeadAttention (`mha`) takes it.
"""
from __future__ import annotations

from passes import PassResult, register
from softsyn.errors import SoftsynDefect
from passes.fuse.attention import AttentionRule
from passes.fuse.base import Coverage, FusionContext, FusionReport, Miss, Rule
from passes.fuse.cost import KEPT, BoundScenario, CostCheck
from passes.fuse.gelu import GeluRule
from passes.fuse.gqa import GroupQueryAttentionRule
from passes.fuse.graph import read_before_made, remove_dead
from passes.fuse.linear_attention import LinearAttentionRule
from passes.fuse.mha import MultiHeadAttentionRule
from passes.fuse.moe import MoERule
from passes.fuse.norms import LayerNormRule, RMSNormRule, SkipLayerNormRule, SkipRMSNormRule
from passes.fuse.patchify import PatchEmbedRule
from passes.fuse.projections import ProjectionMergeRule
from passes.fuse.rotary import RotaryRule
from passes.fuse.silu import SiluRule
from passes.rules.uniform import default_precision
from softsyn.constraints import shared_buffer_length

RULES: tuple[Rule, ...] = (
    RMSNormRule(), SkipRMSNormRule(), LayerNormRule(), SkipLayerNormRule(),
    RotaryRule(), AttentionRule(GroupQueryAttentionRule(), MultiHeadAttentionRule()),
    ProjectionMergeRule("packed_qkv"), ProjectionMergeRule("gate_up"),
    GeluRule(), MoERule(), LinearAttentionRule(), SiluRule(),  # SiLU last: MoE and linear attention match theirs whole
    PatchEmbedRule(),
)
TARGETS = ("cpu", "cuda")


@register("fuse", "fuse norms, rotary, attention (GQA/MHA), projections, GELU, MoE, SiLU into runtime kernels; a patch "
                  "embedding's Conv into one GEMM")
def run(design) -> PassResult:
    target = "cuda" if design.library.is_gpu else "cpu"
    before = len(design.netlist.nodes())
    positions = held_positions(design)
    coverages = fuse(design.netlist, target, cost=cost_check(design), positions=positions)
    trained = design.netlist.config.get("max_position_embeddings")
    rotary = any(c.kind == "rotary" and c.candidates for c in coverages)
    if rotary and trained and positions > int(trained):  # the warning is about the rotary cache: none, no warning
        design.log(f"fuse: warning: the design holds {positions} positions (KV buffer / scenarios), past the model's "
                   f"max_position_embeddings {trained}: the rotary cache covers all {positions}, but positions past "
                   f"{trained} are outside the context the model was trained for")
    design.netlist_changed()
    after = len(design.netlist.nodes())
    kept = sum(1 for c in coverages for m in c.misses if m.reason.startswith(KEPT))
    missed = sum(c.candidates - c.fused for c in coverages) - kept
    design.log(f"fuse ({target}): {before} -> {after} cells; "
               + ", ".join(f"{c.kind} {c.fused}/{c.candidates}" for c in coverages if c.candidates)
               + (f"; {kept} kept (the library times the fused cells slower)" if kept else "")
               + (f"; {missed} missed (see the fusion report)" if missed else ""))
    return PassResult({c.kind: c.fused for c in coverages}, report=FusionReport(coverages))


def cost_check(design) -> CostCheck:
    """The design's library at its scenarios (the netlist bound before fusion), cells at the precision the
    precision pass will give them."""
    nl = design.netlist
    scenarios = [BoundScenario(g.name, dict(g.scenario.dims), nl.bind(g.scenario.dims)) for g in design.groups]
    return CostCheck(design.library, scenarios, nl.derived_dims, default_precision(design)[1])  # the realised precision


def fusion_kinds() -> list[str]:
    return [r.kind for r in RULES]


def held_positions(design) -> int:
    """The longest sequence the compiled design must run: its KV buffer's length (kv_cache.max_length, else the
    workload's) or a timed scenario's past + seq, whichever is longer."""
    held, _ = shared_buffer_length(design.constraints)
    return max([held] + [g.scenario.dims.get("past", 0) + g.scenario.dims.get("seq", 1) for g in design.groups])


def fuse(netlist, target: str = "cpu", kinds: list[str] | None = None, cost: CostCheck | None = None,
         positions: int | None = None) -> list[Coverage]:
    """Fuse in place; `target` "cpu" | "cuda" picks provider-legal ops. One Coverage per kind run. With `cost`, a
    matched site is rewritten only where its fused cells are no slower than what they replace (else a Miss whose
    reason starts with KEPT). `positions`: the longest sequence the design must hold (the rotary cache's rows at
    least; the model's max_position_embeddings when longer)."""
    if target not in TARGETS:
        raise ValueError(f"fuse: target must be 'cpu' or 'cuda', not {target!r}")
    rules = list(RULES)
    if kinds is not None:
        unknown = sorted(set(kinds) - {r.kind for r in rules})
        if unknown:
            raise ValueError(f"fuse: unknown kind(s) {', '.join(unknown)}; valid: {', '.join(r.kind for r in rules)}")
        rules = [r for r in rules if r.kind in kinds]
    ctx = FusionContext(netlist, target, positions)
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
            if cost is not None:
                try:
                    rep = rule.replacement(ctx, match)
                    kept = cost.verdict(ctx.graph, rep) if rep is not None else None
                except Exception as exc:
                    kept = f"cost check failed: {type(exc).__name__}: {exc}"
                if kept:
                    cov.misses.append(Miss(ctx.site(anchor), kept))
                    continue
            try:
                rule.rewrite(ctx, match)
            except Exception as exc:
                cov.misses.append(Miss(ctx.site(anchor), f"rewrite failed: {type(exc).__name__}: {exc}"))
                continue
            cov.fused += 1
        cov.note = rule.note(ctx) if cov.candidates else ""
        remove_dead(ctx.graph)
        disorder = read_before_made(ctx.graph)  # a rewrite placed a node after a reader of its output
        if disorder is not None:
            node, value = disorder
            raise SoftsynDefect(f"fuse: rule {rule.kind} left node {node.name} ({node.op_type}) reading {value.name} "
                                "before the node that makes it: the graph is out of topological order")
        netlist.invalidate()
        result.append(cov)
    return result


__all__ = ["KEPT", "Coverage", "CostCheck", "FusionContext", "Miss", "RULES", "Rule", "cost_check", "fuse",
           "fusion_kinds"]
