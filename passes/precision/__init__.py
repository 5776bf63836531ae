"""precision (effort low): one uniform precision for the whole netlist.

The default is the library's native activation precision: fp16 on GPU targets, fp32 on CPU
(where ORT runs fp16 MatMuls as Cast -> fp32 -> Cast, so fp16 buys nothing). The constraints'
`precision.default` overrides it. fp32 on an fp32 export changes nothing; on an fp16/bf16 source (a real-size
export) it converts everything up to fp32 (passes.precision.fp16.to_fp32), dont_touch cells kept as they are.
fp16 converts weights, activations and the float ports (past KV in, logits and present KV out),
keeping fp32 islands where fp16 loses more than rounding (passes.precision.fp16).
A quantised default (int4, int8, fp8) is a uniform weight map: the float design first, then every weight cell the
compile loop could move (passes.optimize.mapping.candidates: outside dont_touch, with a library cell for it) becomes
that precision's cell through the loop's own apply_mapping (ORT's quantiser); activations stay float. The loop
(effort medium and up) then has no float weight cell left to move: the map is the one asked for.
The report's `realised` is read from the model after the conversion (softsyn.timing.realised), never the request.
Named rules hold cells above the map: `moe_router` (passes.rules.router) keeps MoE routing at
fp16/bf16 or wider, and the log and session.json's precision report say how many cells it held.
"""
from __future__ import annotations

from softsyn.timing.realised import realised_precision
from passes import PassReport, PassResult, register, report_of
from passes.precision.fp16 import holds_half, to_fp16, to_fp32
from passes.optimize.mapping import apply_mapping, candidates  # the loop's own: one quantiser, one cell choice
from passes.rules.router import RULE, router_cells, summary
from passes.rules.uniform import UNIFORM, WEIGHTS_ONLY, bf16_start, default_precision

class PrecisionReport(dict, PassReport):
    """The uniform map as session.json's `precision_request` holds it: requested, realised (read from the model),
    target, kv and the named rules that held cells (a dict, so it lands in the JSON as it is)."""

    def artifact_notes(self) -> list[str]:
        return [f"precision rule {name}: {rule['held']}" for name, rule in (self.get("rules") or {}).items()]

    def session_entries(self) -> dict[str, object]:
        return {"precision_request": dict(self)}


@register("precision", "uniform default precision: fp16 on GPU targets (fp32 islands for norms, rotary), fp32 on CPU")
def run(design) -> PassResult:
    requested, realised = default_precision(design)
    report = PrecisionReport(requested=requested, realised=realised)
    if requested != realised and bf16_start(design):
        design.log(f"precision: requested {requested}, realised {realised} for the float design (attention, norms, "
                   f"rotary, the KV cache and ports: a bf16 region is not built); the compile loop (effort medium and "
                   f"up) starts every MatMul cell as a bf16 cell on {design.library.name}; effort low keeps them "
                   f"{realised}")
    elif requested != realised and requested not in WEIGHTS_ONLY:
        design.log(f"precision: requested {requested}, realised {realised} (the low-effort map is uniform "
                   f"{'/'.join(UNIFORM)}; {realised} is in precision.allowed)")
    cells = router_cells(design.netlist.model.graph)
    rule = {}
    if cells["matmul"] or cells["scores"]:
        report["rules"] = {RULE: summary(cells, realised)}
        rule = {f"rule_{RULE}": len(cells["matmul"]) + len(cells["scores"])}
        design.log(f"precision rule {RULE}: {report['rules'][RULE]['held']}")
    model, pinned = design.netlist.model, design.constraints.dont_touch
    if realised == "fp32" and not holds_half(model):
        counts = {}
    else:
        counts = (to_fp32 if realised == "fp32" else to_fp16)(model, pinned).counts()
        design.netlist_changed()
    if requested in WEIGHTS_ONLY:
        counts.update(uniform_weights(design, requested, report))
    held = realised_precision(design.netlist)  # what the model holds now, per weight and KV buffer
    report.update({"target": realised, "realised": held.float_precision or realised, "kv": held.kv_precision})
    return PassResult({**counts, **rule}, report)


def uniform_weights(design, precision: str, report: PrecisionReport) -> dict[str, int]:
    """Every weight cell offered `precision` (passes.optimize.mapping.candidates) mapped to it; the counts, and the
    report's `weights` entry: how many cells were mapped and why the others were not."""

    cands, skipped = candidates(design)
    mapping = {c.name: precision for c in cands if precision in c.options}
    kept = len(cands) - len(mapping)
    if precision in skipped:
        why = skipped[precision]
    else:
        why = f"{kept} cell{'s' if kept != 1 else ''} without a {precision} option" if kept else ""
    counts = apply_mapping(design.netlist, mapping, mapping, design.library) if mapping else {}
    if mapping:
        design.netlist_changed()
    pinned = sum(1 for why_not in skipped.values() if why_not == "dont_touch")
    report["weights"] = {"precision": precision, "cells": counts.get(precision, 0), "dont_touch": pinned,
                         **({"not_mapped": why} if why else {})}
    design.log(f"precision: uniform {precision} weights: {counts.get(precision, 0)} cells"
               + (f"; {pinned} dont_touch" if pinned else "") + (f"; not mapped: {why}" if why else ""))
    return {f"weights_{precision}": counts.get(precision, 0)}


def _float_params(weights: dict[str, int]) -> int:
    """Parameters held in a float precision (quantised fp8/int8/int4 weights left out: "mostly" is of these)."""
    return sum(n for p, n in weights.items() if p in ("fp32", "fp16", "bf16"))


def record_realised(design, after: str) -> str | None:
    """Re-read what the model holds after pass `after` into the uniform precision report: its `realised` and `kv`
    are the model's (softsyn.timing.realised), whatever a pass asked for. Returns a line for the compile log where
    the model's float weights are not in the uniform target's precision (a dont_touch pin holding most of them);
    the line names no pass first, so the log keeps one per state, not one per pass."""
    report = report_of(design, PrecisionReport)
    if report is None or "target" not in report:
        return None
    held = realised_precision(design.netlist)
    report["realised"], report["kv"] = held.float_precision or report["target"], held.kv_precision
    if report["realised"] == report["target"]:
        return None
    return (f"precision: the model's float weights are mostly {report['realised']} "
            f"({held.weights.get(report['realised'], 0)} of the {_float_params(held.weights)} float parameters; "
            f"{sum(held.weights.values())} in all), not the uniform "
            f"{report['target']} (read after {after}, "
            + ("the compile loop's bf16 cells: precision.default bf16" if report["realised"] == "bf16"
               and report.get("requested") == "bf16" else "dont_touch cells keep the source's")
            + "); session.json says "
            f"{report['realised']}")
