"""The compile loop's KV moves (optimize, effort medium and up, after the weight map): the KV buffer's length, and the
KV dtype.

- opt.kv.length: when the area (VRAM) budget is violated, the shared KV buffer (passes.kv_layout) is cut from
  its length (kv_cache.max_length, else the workload's) to the longest timed scenario's past + seq, never below
  (kv_layout.max_length_for's rule: every timed scenario must fit). Kept when it lowers the area without raising
  a more important cost; still violated at that length, the note says what would close it.
- opt.kv.dtype: an fp16 cache to GroupQueryAttention's int8 cache (kv_layout.quantise_cache, scales calibrated the
  same way) when int8 is in precision.allowed, kv_cache.dtype does not pin a float cache, and the library has a
  GroupQueryAttention.int8 cell; judged on the library's tables (the STA re-timed: decode/prefill delay per group,
  the area) and its error measured end to end (ORT CPU, which runs the same int8 cache: the design's logits with the
  int8 cache against the design as it stands, both reading the same cached values), kept only if it lowers one
  cost without raising a more important one: design rules (accuracy, area) -> weighted negative slack -> the
  serving checks' violation (with a serving block, simulated before and after: an int8 cache admits twice the
  tokens under the same KV budget) -> latency.
  fp8 is not tried (ORT CPU has no float8e4m3fn GroupQueryAttention kernel to measure its error on).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from passes import kv_layout, refile, report_of
from softsyn.runtime.decoder import GQA_PAST, GQA_PRESENT
from softsyn.runtime.design_runner import DesignRunner
from softsyn.runtime.kv_quant import dequantise, quantise


@dataclass(frozen=True)
class KvMove:
    phase: str  # the compile log's row: opt.kv.length / opt.kv.dtype
    requested: str  # what the move tried, e.g. "max_length 320" / "int8"
    realised: str  # what the design has after it
    kept: bool
    why: str
    error: float | None = None  # the dtype move's measured end-to-end error


@dataclass(frozen=True, order=True)
class LoopCost:
    rules: float  # area over its limit (MB) + error over the budget (x 100)
    violation: float  # sum of weight x max(0, -slack), s
    serving: float  # the serving checks' violation: sum of max(0, -slack) / required (0 without a serving block)
    latency: float  # sum of weight x the critical arrival, s


def loop_cost(analysis, error_over: float = 0.0) -> LoopCost:
    slack = analysis.area.slack
    rules = (max(0.0, -slack) / 1e6 if slack is not None else 0.0) + max(0.0, error_over) * 100
    served = analysis.serving.checks if analysis.serving is not None else []
    return LoopCost(rules, sum(g.weight * max(0.0, -g.critical.slack) for g in analysis.groups),
                    sum(max(0.0, -c.slack) / c.required for c in served if c.required),
                    sum(g.weight * g.critical.arrival for g in analysis.groups))


def serving_text(analysis) -> str:
    """The serving checks violated in an analysis, for a move's detail ("" without a serving block)."""
    if analysis.serving is None:
        return ""
    violated = [c.group for c in analysis.serving.checks if not c.met]
    return ", ".join(violated) if violated else "none"


def better(after: LoopCost, before: LoopCost) -> bool:
    """Lower in the cost order (rules, then path-group violation, then the serving checks' violation, then latency),
    ties within rounding not counted."""
    for a, b in ((after.rules, before.rules), (after.violation, before.violation), (after.serving, before.serving),
                 (after.latency, before.latency)):
        if not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12):
            return a < b
    return False


def needed_length(design) -> int:
    """The longest timed scenario's past + seq: the shortest buffer every group fits in."""
    return max(g.scenario.dims.get("past", 0) + g.scenario.dims.get("seq", 1) for g in design.groups)


def length_move(design, analysis, row) -> tuple[KvMove | None, object]:
    """opt.kv.length on a design whose area is over budget (None when there is nothing to try); the analysis after."""
    report = report_of(design, kv_layout.KvLayoutReport)
    slack = analysis.area.slack
    if slack is None or slack >= 0 or report is None or not report.applied:
        return None, analysis
    nodes = kv_layout.kv_attention(design.netlist.model.graph)
    current, need = report.max_length, needed_length(design)
    if not nodes or need >= current:
        return KvMove("opt.kv.length", f"max_length {need}", f"max_length {current}", False,
                      f"the buffer is already the longest scenario's past + seq ({need}): area still over by "
                      f"{-slack / 1e6:.1f} MB"), analysis
    before = loop_cost(analysis)
    kv_layout.rewrite_kv(nodes, need)
    design.netlist_changed()
    after_analysis = design.analyze(tp_plan=False)
    after = loop_cost(after_analysis)
    row("opt.kv.length", after_analysis)
    if not better(after, before):
        kv_layout.rewrite_kv(nodes, current)
        design.netlist_changed()
        return KvMove("opt.kv.length", f"max_length {need}", f"max_length {current}", False,
                      "no lower cost in the order rules -> slack -> latency"), design.analyze(tp_plan=False)
    refile(design, dataclasses.replace(
        report, max_length=need, length_key=f"the compile loop's opt.kv.length: {report.length_key} asked {current}, "
                                            f"cut to the longest scenario's past + seq for the area budget"))
    left = after_analysis.area.slack
    why = f"area {analysis.area.total / 1e6:.1f} -> {after_analysis.area.total / 1e6:.1f} MB"
    if left is not None and left < 0:
        why += (f"; still over by {-left / 1e6:.1f} MB at the shortest buffer every scenario fits in: shorten the "
                f"longest scenario (past + seq {need}), lower workload.batch x concurrency, "
                + ("set kv_cache.dtype int8 (1 B per cached element), " if report.kv_dtype == "fp16" else "")
                + "or raise area_constraint")
    return KvMove("opt.kv.length", f"max_length {need}", f"max_length {need}", True, why), after_analysis


def dtype_blocker(design) -> str:
    """Why opt.kv.dtype is not tried on this design ("" when it is)."""
    report = report_of(design, kv_layout.KvLayoutReport)
    cons = design.constraints
    if report is None or not report.applied:
        return "no shared KV buffer (kv_layout did not apply)"
    if report.kv_dtype != "fp16":
        return f"the KV cache is {report.kv_dtype}, not fp16"
    if cons.kv_cache.dtype in ("fp32", "fp16", "bf16"):
        return f"kv_cache.dtype {cons.kv_cache.dtype} pins a float cache"
    if "int8" not in cons.precision.allowed:
        return "int8 is not in precision.allowed"
    problem = kv_layout.quantised_cache_problem(design, "int8")
    if problem:
        return problem
    if kv_layout.weightless(design):
        return "a weightless plan: no weights to measure the int8 cache's error on"
    if not any(c.op == "GroupQueryAttention" and c.precision == "int8" for c in design.library.cells):
        return (f"library {design.library.name} has no GroupQueryAttention.int8 cell (softsyn characterize --cells "
                f"GroupQueryAttention.int8 measures it)")
    return ""


def kv_error(design, nodes, scales) -> float:
    """verify's relative error of the non-KV outputs (logits) with the int8 cache against the fp16 cache, on every
    group's seeded inputs (ORT CPU), both reading the cached values an int8 cache holds (the seeded past is no K/V
    of the model: quantised, it saturates; held, the new tokens' and the attention's error is measured)."""
    ports = {}
    for node in nodes:
        k_scale, v_scale = scales[node.name]
        ports[node.inputs[GQA_PAST["key"]].name] = k_scale
        ports[node.inputs[GQA_PAST["value"]].name] = v_scale
    outputs = [v.name for v in design.netlist.model.graph.outputs]
    kept = [i for i, n in enumerate(outputs) if not any(n == node.outputs[GQA_PRESENT[k]].name
                                                         for node in nodes for k in GQA_PRESENT)]
    fp16 = DesignRunner(design, provider="cpu")
    for feeds in fp16.feeds.values():
        for name, scale in ports.items():
            feeds[name] = dequantise(quantise(feeds[name], scale), scale).astype(feeds[name].dtype)
    reference = fp16.run({})
    held = {g: dict(feeds) for g, feeds in fp16.feeds.items()}
    del fp16
    graph = design.netlist.model.graph
    kv_layout.quantise_cache(graph, nodes, scales)
    design.netlist_changed()
    int8 = DesignRunner(design, provider="cpu")
    for g, feeds in held.items():
        int8.feeds[g] = {n: (quantise(v, ports[n]) if n in ports else v) for n, v in feeds.items()}
    got = int8.run({})
    worst = 0.0
    for g, outs in got.items():
        for i in kept:
            want = reference[g][i].astype(np.float64)
            scale = float(np.abs(want).max()) if want.size else 0.0
            diff = float(np.abs(got[g][i].astype(np.float64) - want).max()) if want.size else 0.0
            worst = max(worst, diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf))
    return worst


def dtype_move(design, analysis, row, budget: float, map_error: float) -> tuple[KvMove | None, object]:
    """opt.kv.dtype (see the module docstring); `budget`: the error the end-to-end check allows; `map_error`: the
    weight map's error, combined with the cache's in root sum of squares (two measured errors of independent
    roundings)."""
    report = report_of(design, kv_layout.KvLayoutReport)
    if report is None or not report.applied or report.kv_dtype != "fp16":
        return None, analysis  # no shared fp16 KV cache (a CPU target's is fp32): nothing to move
    why = dtype_blocker(design)
    if why:
        return KvMove("opt.kv.dtype", "int8", "fp16", False, f"not tried: {why}"), analysis
    graph = design.netlist.model.graph
    nodes = kv_layout.kv_attention(graph)
    scales, tokens = kv_layout.calibrate(design, nodes)
    # with a serving block the move is also judged on the simulated load (an int8 cache admits twice the tokens)
    serving = design.constraints.serving is not None
    if serving and analysis.serving is None:
        analysis = design.analyze(tp_plan=False, serving=True)
    before = loop_cost(analysis)
    error = kv_error(design, nodes, scales)  # leaves the int8 cache applied
    total = math.sqrt(map_error ** 2 + error ** 2)
    after_analysis = design.analyze(tp_plan=False, serving=serving)
    after = loop_cost(after_analysis, total - budget)
    row("opt.kv.dtype", after_analysis)
    detail = (f"error {error:.3e} measured end to end (ORT CPU, {tokens} calibration tokens), with the map's "
              f"{map_error:.3e}: {total:.3e} against the budget {budget:.3e}; area {analysis.area.total / 1e6:.1f} -> "
              f"{after_analysis.area.total / 1e6:.1f} MB, weighted latency {before.latency * 1e3:.3f} -> "
              f"{after.latency * 1e3:.3f} ms (est: the library's tables)")
    if serving:
        detail += (f"; serving checks violated: {serving_text(analysis)} -> {serving_text(after_analysis)} "
                   "(simulated, est)")
    if total > budget or not better(after, before):
        unquantise_cache(graph, nodes)
        design.netlist_changed()
        reason = ("over the accuracy budget" if total > budget else
                  "no lower cost in the order rules -> slack -> serving -> latency")
        return KvMove("opt.kv.dtype", "int8", "fp16", False, f"rejected ({reason}): {detail}", error), \
            design.analyze(tp_plan=False)
    refile(design, dataclasses.replace(
        report, kv_dtype="int8", kv_note=f"KV cache int8 (GroupQueryAttention's quantised cache): the compile loop's "
                                         f"opt.kv.dtype, {error:.3e} measured end to end"))
    return KvMove("opt.kv.dtype", "int8", "int8", True, f"kept: {detail}", error), after_analysis


def unquantise_cache(graph, nodes) -> None:
    """Undo kv_layout.quantise_cache: the fp16 ports back, the quant attributes and scale initializers removed."""
    for node in nodes:
        for idx in (kv_layout.GQA_K_SCALE, kv_layout.GQA_V_SCALE):
            scale = node.inputs[idx]
            node.replace_input_with(idx, None)
            if scale is not None and not scale.uses():
                graph.initializers.pop(scale.name, None)
        while len(node.inputs) > kv_layout.GQA_K_SCALE and node.inputs[-1] is None:
            node.resize_inputs(len(node.inputs) - 1)
        for attr in ("k_quant_type", "v_quant_type", "kv_cache_bit_width"):
            node.attributes.pop(attr, None)
        for kind, i in GQA_PAST.items():
            for port in (node.inputs[i], node.outputs[GQA_PRESENT[kind]]):
                port.type = ir.TensorType(ir.DataType.FLOAT16)
