"""precision (effort low): one uniform precision for the whole netlist.

The default is the library's native activation precision: fp16 on GPU targets, fp32 on CPU
(where ORT runs fp16 MatMuls as Cast -> fp32 -> Cast, so fp16 buys nothing). The constraints'
`precision.default` overrides it. fp32 is the export's precision: the pass changes nothing.
fp16 converts weights, activations and the float ports (past KV in, logits and present KV out),
keeping fp32 islands where fp16 loses more than rounding (passes.precision.fp16).
Named rules hold cells above the map: `moe_router` (passes.precision.router) keeps MoE routing at
fp16/bf16 or wider, and the log and session.json's precision report say how many cells it held.
"""
from __future__ import annotations

from softsyn.errors import SoftsynError
from passes import PassResult, register
from passes.precision.fp16 import to_fp16
from passes.precision.router import RULE, router_cells, summary

UNIFORM = ("fp32", "fp16")
# A requested precision the uniform map does not realise, and the one it realises instead when the constraints allow
# it: bf16 and fp16 carry the same bytes, and ORT's CPU provider has no bf16 MatMul to verify a bf16 artifact on.
# Per-cell bf16 comes with the compile loop's precision moves; the substitution is logged and reported, never silent.
SUBSTITUTE = {"bf16": "fp16"}


def default_precision(design) -> tuple[str, str]:
    """(requested, realised) uniform precision."""
    cons = design.constraints
    chosen = cons.precision.default or ("fp16" if design.library.is_gpu else "fp32")
    if chosen in UNIFORM:
        return chosen, chosen
    instead = SUBSTITUTE.get(chosen)
    if instead is not None and instead in cons.precision.allowed:
        return chosen, instead
    raise SoftsynError(f"{cons.source}: precision.default: {chosen} is not a uniform precision the low-effort "
                       f"compile maps; valid: {', '.join(UNIFORM)}"
                       + (f" (or {chosen} with {instead} in precision.allowed)" if instead else ""))


@register("precision", "uniform default precision: fp16 on GPU targets (fp32 islands for norms, rotary), fp32 on CPU")
def run(design) -> PassResult:
    requested, realised = default_precision(design)
    report = {"requested": requested, "realised": realised}
    if requested != realised:
        design.log(f"precision: requested {requested}, realised {realised} (the low-effort map is uniform "
                   f"{'/'.join(UNIFORM)}; {realised} is in precision.allowed)")
    cells = router_cells(design.netlist.model.graph)
    rule = {}
    if cells["matmul"] or cells["scores"]:
        report["rules"] = {RULE: summary(cells, realised)}
        rule = {f"rule_{RULE}": len(cells["matmul"]) + len(cells["scores"])}
        design.log(f"precision rule {RULE}: {report['rules'][RULE]['held']}")
    if realised == "fp32":
        return PassResult(rule, report)
    counts = to_fp16(design.netlist.model, design.constraints.dont_touch).counts()
    design.netlist_changed()
    return PassResult({**counts, **rule}, report)
