"""Linear-attention layers (Gated DeltaNet, Qwen3-Next): counted and named, never fused — ORT 1.31 has no kernel.

Anchor, by structure: a depthwise causal Conv (group = input channels, one spatial axis: the short convolution over
the sequence that Gated DeltaNet and Mamba-style mixers run on q/k/v) in a scope that also holds the delta rule: a
CumSum (the decay's running sum over a chunk, the chunked form) or a Scan (the recurrent form, token by token, as
softsyn exports a hybrid decoder with its cache). Every anchor is a miss whose reason names the layer and how many cells of its scope
stay as exported ops, each timed from its own library cell: the layer is costed from its measured ops, and the
report says so instead of leaving it silent.
"""
from __future__ import annotations

from collections import Counter

from softsyn.netlist import HIERARCHY_KEY
from passes.fuse.base import Rule
from passes.fuse.graph import attr, const_shape


DELTA_RULE_OPS = ("CumSum", "Scan")  # the chunked form's decay sum, the recurrent form's loop over tokens


def _scope(node) -> str:
    return node.metadata_props.get(HIERARCHY_KEY, "")


class LinearAttentionRule(Rule):
    kind = "linear_attention"
    target_op = "(no ORT 1.31 kernel: Gated DeltaNet)"

    def anchors(self, ctx):
        with_rule = {_scope(n) for n in ctx.graph if n.op_type in DELTA_RULE_OPS}
        out = []
        for n in ctx.graph:
            if n.op_type != "Conv" or _scope(n) not in with_rule or len(n.inputs) < 2:
                continue
            w = const_shape(n.inputs[1])  # [C, 1, kernel] for a depthwise conv over one axis
            if w is not None and len(w) == 3 and w[1] == 1 and attr(n, "group", 1) == w[0] > 1:
                out.append(n)
        return out

    def check(self, ctx, conv):
        scope = _scope(conv)
        ops = Counter(n.op_type for n in ctx.graph if _scope(n).startswith(scope))
        top = ", ".join(f"{op} {k}" for op, k in ops.most_common(4))
        return (f"linear attention (Gated DeltaNet: causal conv + delta rule) has no ONNX Runtime 1.31 kernel; its "
                f"{sum(ops.values())} exported cells stay, each timed from its library cell ({top}, ...)")

    def rewrite(self, ctx, match):  # check never matches: nothing to rewrite
        raise AssertionError("linear_attention never rewrites")
