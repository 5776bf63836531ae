"""flatten: inline functions, constant-fold, remove dead, no-op and duplicate nodes.

The IC analogue is `ungroup -flatten` followed by logic sweep. Each step is an
onnxscript / onnx-ir pass; counts are the nodes each step took out of the main
graph (inlining counts the call sites it expanded). Constant folding keeps the
symbolic dims (batch, seq, past) on the values it leaves, so the netlist still
binds every scenario. Nodes created by a step take the hierarchy of the node
whose output they now drive, so reports keep folding by module.
"""
from __future__ import annotations

import logging

import onnx_ir as ir
import onnx_ir.passes.common as common
from onnxscript.optimizer import fold_constants
from onnxscript.rewriter import RewritePass
from onnxscript.rewriter.rules import common as rules

from softsyn.netlist import HIERARCHY_KEY
from passes import PassResult, register

# Rewrites that only remove work: x+0, x*1, Cast to the same type, Expand/Transpose that change nothing,
# back-to-back Casts/Reshapes/Transposes/Unsqueezes, Slices that take everything, Dropout at inference.
NO_OP_RULES = [
    rules.add_0_rule, rules.sub_0_rule, rules.mul_by_1_rule, rules.div_by_1_rule,
    rules.dropout_inference_rule, rules.dropout_zero_rule, rules.no_op_cast_rule, rules.no_op_expand_rule,
    rules.no_op_transpose_rule, rules.cast_cast_rule, rules.reshape_reshape_rule, rules.transpose_transpose_rule,
    rules.unsqueeze_unsqueeze_rule, rules.collapse_slice_rule, rules.collapse_slice2_rule,
    rules.no_op_dynamic_scatter_nd_rule, rules.no_op_static_scatter_nd_rule,
]
MAX_ROUNDS = 3  # folding can expose no-ops and vice versa; tiny and large exports settle in 1-2 rounds


@register("flatten", "inline functions, constant-fold, remove dead, no-op and duplicate nodes")
def run(design) -> PassResult:
    model = design.netlist.model
    driver_hierarchy = {o.name: h for n in model.graph for o in n.outputs
                        if o is not None and (h := n.metadata_props.get(HIERARCHY_KEY)) is not None}
    counts = {"inlined": _call_sites(model), "folded": 0, "noop": 0, "dead": 0, "duplicate": 0, "constants": 0}
    common.InlinePass()(model)
    common.RemoveUnusedFunctionsPass()(model)
    counts["dead"] += _removed(model, common.RemoveUnusedNodesPass())
    for _ in range(MAX_ROUNDS):
        changed = {
            "folded": _removed(model, _FoldAndSweep()),
            "noop": (_removed(model, RewritePass(NO_OP_RULES)) + _removed(model, _NeutralOperand())
                     + _removed(model, common.IdentityEliminationPass())),
            "duplicate": _removed(model, common.CommonSubexpressionEliminationPass()),
        }
        for kind, n in changed.items():
            counts[kind] += n
        if not any(changed.values()):
            break
    # Constant nodes become initializers: what ORT does at load, done once here so the netlist shows it.
    counts["constants"] = _removed(model, common.LiftConstantsToInitializersPass(lift_all_constants=True,
                                                                                 size_limit=0))
    common.RemoveUnusedOpsetsPass()(model)
    _restore_hierarchy(model, driver_hierarchy)
    design.netlist_changed()
    return PassResult(counts)


class _FoldAndSweep(ir.passes.InPlacePass):
    """onnxscript's constant folding, then the nodes it left without consumers."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        # A plan's weights have no data: the folder warns once per weight it cannot evaluate (784 lines for
        # qwen3-1.7b), which is expected there and says nothing a user can act on; real failures still raise.
        folder = logging.getLogger("onnxscript.optimizer._constant_folding")
        level = folder.level
        folder.setLevel(logging.ERROR)
        try:
            folded = fold_constants(model, onnx_shape_inference=True)
        finally:
            folder.setLevel(level)
        swept = common.RemoveUnusedNodesPass()(model)
        return ir.passes.PassResult(model, folded.modified or swept.modified)


class _NeutralOperand(ir.passes.InPlacePass):
    """x+0, x-0, x*1, x/1 with a one-element constant of any rank up to x's (onnxscript's rules take
    scalars only): the output is x, so its uses read x. Outputs that are graph ports stay."""

    NEUTRAL = {"Add": (0.0, (0, 1)), "Sub": (0.0, (1,)), "Mul": (1.0, (0, 1)), "Div": (1.0, (1,))}

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        outputs = set(model.graph.outputs)
        removed = []
        for node in model.graph:
            rule = self.NEUTRAL.get(node.op_type)
            if rule is None or node.domain not in ("", "ai.onnx") or node.outputs[0] in outputs:
                continue
            value, positions = rule
            for pos in positions:
                const, x = node.inputs[pos], node.inputs[1 - pos]
                if _is_neutral(const, x, value) and x.dtype == node.outputs[0].dtype:
                    node.outputs[0].replace_all_uses_with(x)
                    removed.append(node)
                    break
        model.graph.remove(removed, safe=True)
        return ir.passes.PassResult(model, bool(removed))


def _is_neutral(const: ir.Value | None, x: ir.Value | None, value: float) -> bool:
    """`const` is one element equal to `value` and broadcasting it leaves x's shape unchanged."""
    tensor = ir.convenience.get_const_tensor(const) if const is not None else None
    if tensor is None or x is None or x.shape is None:
        return False
    if tensor.size != 1 or len(tensor.shape) > len(x.shape):
        return False
    try:
        first = float(tensor.numpy().reshape(-1)[0])
    except OSError:  # a weightless plan's weight (Gemma's embed_scale): its data was never written
        return False
    return first == value


def _removed(model: ir.Model, step) -> int:
    before = len(model.graph)
    step(model)
    return before - len(model.graph)


def _call_sites(model: ir.Model) -> int:
    return sum(1 for n in model.graph if n.op_identifier() in model.functions)


def _restore_hierarchy(model: ir.Model, driver_hierarchy: dict[str, str]) -> None:
    """A node without a hierarchy drives a net an old node drove (it replaced that node) or feeds
    nodes that have one; take the old driver's, else the hierarchy its consumers share."""
    for node in model.graph:
        if HIERARCHY_KEY in node.metadata_props:
            continue
        known = [driver_hierarchy[o.name] for o in node.outputs if o is not None and o.name in driver_hierarchy]
        if not known:
            known = [u.metadata_props.get(HIERARCHY_KEY, "") for o in node.outputs if o is not None
                     for u, _ in o.uses()]
        node.metadata_props[HIERARCHY_KEY] = _common_scope(known)


def _common_scope(scopes: list[str]) -> str:
    if not scopes:
        return ""
    parts = scopes[0].split(".")
    for s in scopes[1:]:
        other = s.split(".")
        n = 0
        while n < min(len(parts), len(other)) and parts[n] == other[n]:
            n += 1
        parts = parts[:n]
    return ".".join(parts)
