"""report_signoff: predicted (analysis) vs measured (runtime) per path group, op type and cell.

Renders a softsyn.results.signoff.SignoffResult; recomputes nothing. PrimeTime's sign-off summary in shape:
banner, what was measured, one line per group (predicted, measured, error, both slacks), then per
group the measured breakdown, the op types and the cells with the largest error, and for each
violated group the cells responsible. The three tables (group_table, op_table, cell_table) are
column data: the text here and a JSON reader print the same rows.
"""
from __future__ import annotations

import math

from reports.columns import (SIGNOFF_CELL_COLUMNS, SIGNOFF_GROUP_COLUMNS, SIGNOFF_KERNEL_COLUMNS, SIGNOFF_MODULE_COLUMNS,
                             SIGNOFF_OP_COLUMNS)
from reports.common import BANNER_RULE, INDENT, Table, fpercent, ftime, is_unconstrained


def _defined(x: float) -> float | None:
    """An error of a zero measurement is NaN; the tables print it as n/a and JSON as null."""
    return None if math.isnan(x) else x


def _status(g) -> str:
    if is_unconstrained(g.budget):
        return "unconstrained"
    return ("VIOLATED" if g.violated else "MET") + (" (predicted MET)" if g.violated and g.predicted_slack >= 0 else "")


def group_table(result) -> Table:
    """One row per path group of a softsyn.results.signoff.SignoffResult: budget, predicted, measured, errors, slacks."""
    return Table(SIGNOFF_GROUP_COLUMNS, tuple(
        {"group": g.name, "scenario": ", ".join(f"{k} {v}" for k, v in g.dims.items()), "budget": g.budget,
         "predicted": g.predicted, "measured": g.measured_median, "p90": g.measured_p90, "quiet": g.measured_quiet,
         "error": _defined(g.error), "error_quiet": _defined(g.error_quiet), "predicted_slack": g.predicted_slack,
         "measured_slack": g.measured_slack, "status": _status(g)} for g in result.groups))


def op_table(group, top: int = 10) -> Table:
    """A group's `top` op types, largest |measured - predicted| first (the order GroupResult.by_op keeps)."""
    return Table(SIGNOFF_OP_COLUMNS, tuple(
        {"op_type": o.op_type, "cells": o.cells, "predicted": o.predicted, "measured": o.measured,
         "delta": o.measured - o.predicted, "error": (o.predicted - o.measured) / o.measured if o.measured else None}
        for o in group.by_op[:top]))


def cell_table(group, top: int = 10) -> Table:
    """A group's `top` cells by |error|; Match says how the profile matched the cell, and the delay's source."""
    def match(r) -> str:
        runtime_op = f" ({r.runtime_op})" if r.runtime_op and r.runtime_op != r.op_type else ""
        return f"{r.match}{runtime_op} [{r.source}]"

    return Table(SIGNOFF_CELL_COLUMNS, tuple(
        {"instance": r.instance, "op_type": r.op_type, "predicted": r.predicted, "measured": r.measured,
         "delta": r.delta, "match": match(r)} for r in group.cells[:top]))


def _indented(table: Table, unit: str, digits: int, rule: bool = False) -> list[str]:
    """A table's header (and a rule as wide), then its rows, each line indented."""
    head = table.header()
    return [INDENT + head, *([INDENT + "-" * len(head)] if rule else []),
            *(INDENT + line for line in table.lines(unit, digits))]


def _machine_line(result) -> list[str]:
    m = result.machine
    if not m:
        return []
    probe = f"probe {m['probe_before_s'] * 1e6:.1f} / {m['probe_after_s'] * 1e6:.1f} us before / after measuring"
    if m.get("factor") and result.provider.startswith("CPU"):
        return [f"{INDENT}Machine  : {probe}; the library's fastest {m['reference_s'] * 1e6:.1f} us: this machine ran "
                f"{m['factor']:.2f}x the speed the tables describe (> 1: slower; softsyn.characterize.probe)."]
    if m.get("factor"):  # the probe's host work does not scale a GPU run (H200 2026-11-30: 1.7-1.87x, errors -1..-13 %)
        return [f"{INDENT}Machine  : {probe}; the library's fastest {m['reference_s'] * 1e6:.1f} us ({m['factor']:.2f}x): "
                "the host's state, not a factor for this GPU run (bench/launch_drift.py samples the launch overhead)."]
    return [f"{INDENT}Machine  : {probe}; the library records no probe to compare with."]


BUSY_SHARE = 0.5  # other processes on half the cores: a 2-thread decode read 4-5x (qwen3-wide, 2 cores)


def _device_lines(result) -> list[str]:
    """Where the measurement ran against where the library was characterised, and how busy the machine was:
    a sign-off's error reads as the analysis's only on the library's device with cores to spare."""
    m = result.machine or {}
    out = []
    if m.get("same_device") is False:
        out.append(f"{INDENT}Device   : NOT the library's: the library was characterised on {m['library_device']}; "
                   f"this is {m['device']}. The predictions describe that machine, so the errors here are the "
                   "difference between the machines, not the analysis's (characterise this one: softsyn "
                   f"characterize --runtime ort --provider {'cuda' if 'CUDA' in result.provider else 'cpu'} -o "
                   "LIB.yaml, then analyze/compile --target LIB.yaml).")
    if m.get("load_before") is not None and m.get("cores"):
        share = m.get("neighbours")
        busy = share >= BUSY_SHARE if share is not None else max(m["load_before"], m["load_after"]) >= m["cores"]
        others = f"other processes used {share:.0%} of them while the runs were timed, " if share is not None else ""
        out.append(f"{INDENT}Load     : {others}load average {m['load_before']:.2f} / {m['load_after']:.2f} before / "
                   f"after measuring on {m['cores']} cores" + (
                       ": busy, so ORT's intra-op pool (a thread per core) waits at each parallel kernel for a worker "
                       "the scheduler parked; the measured times carry the neighbours' share (measure again when the "
                       "machine is quiet)." if busy else "."))
    return out


def report_signoff(result, top: int = 10, unit: str = "ms", digits: int = 3) -> str:
    t = lambda s: ftime(s, unit, digits)  # noqa: E731
    out = [BANNER_RULE, "Report : signoff", f"        -provider {result.provider} -runs {result.runs} -warmup {result.warmup}",
           f"Design : {result.design} ({result.kind} output {result.directory})",
           f"Library: {result.library}" + (f" ({result.library_source})" if result.library_source else ""),
           f"Runtime: {result.runtime} {result.provider} on {result.device}",
           f"Model  : {result.model}",
           f"Date   : {result.date}", BANNER_RULE, ""]
    out += [f"{INDENT}Measured : {result.measured_interval}; median of {result.runs} warm runs, each group's turn "
            f"after untimed runs in blocks of {result.warmup} until its run time settled.",
            f"{INDENT}Predicted: {result.predicted_means}.",
            f"{INDENT}Compared : predicted vs measured median; slack = required - input delay - time "
            "(the input delay is charged to both). Quiet: the fastest of the interleaved rounds' medians, the "
            "undisturbed machine a library of fastest-pass cells describes; Err q = error against it.",
            f"{INDENT}Cells    : profiler kernel times (" + (
                "kernel wall time" if result.node_time == "kernel" else
                "host-side launch times: CUDA kernels are asynchronous, so per-cell figures are NOT GPU times") +
            ") in a separate profiled session; the session.run row carries the residual "
            "(measured - sum of kernels: host overhead, gaps, synchronisation, runtime-only nodes).",
            f"{INDENT}Error    : {result.error_means}.", *_machine_line(result), *_device_lines(result), ""]
    out += [*_indented(group_table(result), unit, digits, rule=True), f"{INDENT}(times in {unit})"]
    for g in result.groups:
        c = g.counts
        out += ["", f"{INDENT}Path Group '{g.name}': {g.description}", INDENT + "-" * 60,
                f"{INDENT}Measured {t(g.measured_median)} {unit} (p10 {t(g.measured_p10)}, p90 {t(g.measured_p90)}, "
                f"quiet {t(g.measured_quiet)}, {g.runs} runs) = kernels {t(g.kernel_sum)} + residual {t(g.residual)} {unit}",
                f"{INDENT}Profiled session: model_run {t(g.profiler_run)} {unit}; profiler cost "
                f"{g.profiler_overhead * 1e6:.2f} us per kernel (calibrated) subtracted from each kernel time",
                *([f"{INDENT}Kernel times scaled by {g.kernel_scale:.3f}: the profiled kernels summed to more than the "
                   "timed run (separate sessions on a busy machine); the residual is 0"] if g.kernel_scale < 1 else []),
                f"{INDENT}Predicted {t(g.predicted)} {unit} = session.run {t(g.predicted_overhead)} + cells "
                f"{t(g.predicted - g.predicted_overhead)} {unit}",
                f"{INDENT}Runtime graph: {c['profiled']} kernels profiled; netlist cells matched {c['exact']} by name, "
                f"{c['fused-anchor']} as fusion anchors, {c['absorbed']} absorbed (folded/fused: 0 s), "
                f"{c['constant']} constants; {c['runtime-only']} runtime-only kernels (in the residual)",
                "", f"{INDENT}By op type (largest |measured - predicted| first)",
                *_indented(op_table(g, top), unit, digits),
                "", f"{INDENT}Cells with the largest error (by instance)",
                *_indented(cell_table(g, top), unit, digits)]
        if g.violated:
            over = g.measured_median - g.budget
            out += ["", f"{INDENT}VIOLATED: '{g.name}' measured {t(g.measured_median)} {unit} against a budget of "
                    f"{t(g.budget)} {unit} (slack {t(g.measured_slack)} {unit}); the analysis predicted "
                    f"{t(g.predicted)} {unit} (slack {t(g.predicted_slack)} {unit}).",
                    f"{INDENT}Cells responsible (measured - predicted, largest first; {t(over)} {unit} over budget):"]
            for r in g.responsible():
                out.append(f"{INDENT}  {r.instance}  {r.op_type}  +{t(r.delta)} {unit}"
                           f" ({fpercent(r.delta / g.measured_median)} of the run)")
    if result.notes:
        out += [""] + [f"{INDENT}Note: {n}" for n in result.notes]
    out += ["", f"{INDENT}Back-annotation: {result.annotation_file}",
            f"{INDENT}  re-time with it: softsyn analyze MODEL -c CONSTRAINTS --annotate {result.annotation_file}"]
    violated = [g.name for g in result.groups if g.violated]
    out += ["", f"{INDENT}signoff: " + (f"VIOLATED ({', '.join(violated)})" if violated else "all groups MET")]
    return "\n".join(line.rstrip() for line in out) + "\n"


def kernel_table(group, top: int = 12) -> Table:
    """A group's `top` runtime-only kernels by time per step (a torch package's: no netlist cell maps to them)."""
    return Table(SIGNOFF_KERNEL_COLUMNS, tuple(
        {"kernel": name, "count": k["count"], "seconds": k["seconds"],
         "share": k["seconds"] / group.measured_median if group.measured_median else None}
        for name, k in list(group.runtime_only.items())[:top]))


def module_table(group) -> Table:
    """A torch package's measured kernel time per source-module kind (Inductor's provenance) beside the ORT
    library's estimate of that kind's netlist cells."""
    return Table(SIGNOFF_MODULE_COLUMNS, tuple(
        {"kind": kind, "count": m["count"], "seconds": m["seconds"], "predicted": m.get("predicted"),
         "share": m["seconds"] / group.measured_median if group.measured_median else None}
        for kind, m in group.modules.items()))


def _macro_error(g) -> str:
    return fpercent((g.macro_predicted - g.measured_median) / g.measured_median) if g.measured_median else "n/a"


def report_torch_signoff(result, top: int = 12, unit: str = "ms", digits: int = 3) -> str:
    """report_signoff's shape for a torch target's package: the group table, then per group its measured step and
    its largest kernels (runtime-only: no per-cell comparison)."""
    t = lambda s: ftime(s, unit, digits)  # noqa: E731
    out = [BANNER_RULE, "Report : signoff", f"        -provider {result.provider} -runs {result.runs} -warmup {result.warmup}",
           f"Design : {result.design} ({result.kind} output {result.directory})",
           f"Library: {result.library} ({result.library_source})",
           f"Runtime: {result.runtime}, {result.provider} on {result.device}",
           f"Model  : {result.model}", f"Date   : {result.date}", BANNER_RULE, "",
           f"{INDENT}Measured : {result.measured_interval}; median of {result.runs} steps per group, the groups "
           "interleaved round by round.",
           f"{INDENT}Predicted: {result.predicted_means}.",
           f"{INDENT}Compared : predicted vs measured median; slack = required - input delay - time. Quiet: the "
           "fastest round's median.",
           f"{INDENT}Error    : {result.error_means}.", ""]
    out += [*_indented(group_table(result), unit, digits, rule=True), f"{INDENT}(times in {unit})"]
    for g in result.groups:
        out += ["", f"{INDENT}Path Group '{g.name}': {g.description}", INDENT + "-" * 60,
                f"{INDENT}Measured {t(g.measured_median)} {unit} (p10 {t(g.measured_p10)}, p90 {t(g.measured_p90)}, "
                f"quiet {t(g.measured_quiet)}, {g.runs} steps)" + (
                    f" = kernels {t(g.kernel_sum)} + host and gaps {t(g.residual)} {unit} ({g.counts['profiled']} "
                    "kernel names profiled)" if g.runtime_only else ""),
                *([f"{INDENT}Predicted from macro cells (measured at compile, runtime/torch_macros.json): "
                   f"{t(g.macro_predicted)} {unit}, error {_macro_error(g)}; from the ORT library (est): "
                   f"{t(g.predicted)} {unit}, error {fpercent(g.error) if not math.isnan(g.error) else 'n/a'}"]
                  if g.macro_predicted is not None else []),
                *(["", f"{INDENT}Largest kernels per step (torch.profiler)", *_indented(kernel_table(g, top), unit, digits)]
                  if g.runtime_only else []),
                *(["", f"{INDENT}Kernels per source-module kind (Inductor's provenance; Pred: the ORT library's cells "
                   "of that kind on the critical path, an estimate)", *_indented(module_table(g), unit, digits)]
                  if g.modules else [])]
    out += [""] + [f"{INDENT}Note: {n}" for n in result.notes]
    violated = [g.name for g in result.groups if g.violated]
    out += ["", f"{INDENT}signoff: " + (f"VIOLATED ({', '.join(violated)})" if violated else "all groups MET")]
    return "\n".join(line.rstrip() for line in out) + "\n"
