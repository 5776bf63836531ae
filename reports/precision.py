"""report_precision: the compile loop's per-cell precision map, requested vs realised, never a silent override.

One row per candidate cell of the `optimize` pass (passes.optimize.OptimizeReport): the precision the
search asked for, the one the netlist holds after the map was applied, the output error it adds (measured, or
the labelled prior of a plan) and its change in cost per path group (library tables; negative is faster).
At ultra, when the target device was present, the measured re-timing's rounds follow (`retime_table`): per group the
predicted latency (the STA's, plus the tables' change for the map) next to the measured medians, baseline and map.
"""
from __future__ import annotations

from passes.optimize.search import ESTIMATE_RULE
from reports.columns import RETIME_COLUMNS, precision_columns
from reports.common import BANNER_RULE, Table


def precision_table(report) -> Table:
    groups = list(report.problem.cost) if report.problem is not None else []
    return Table(precision_columns(groups), tuple(
        {"cell": c.hierarchy or c.name, "requested": c.requested, "realised": c.realised, "error": c.error,
         **{f"delta_{g}": c.cost[g] - c.baseline_cost[g] for g in groups}} for c in report.cells))


def retime_table(report) -> Table:
    """One row per measured round and group (an empty table when the map was not measured)."""
    result = getattr(report, "retime", None)
    return Table(RETIME_COLUMNS, tuple(result.rows() if result is not None else ()))


def report_precision(report, design: str | None = None, target: str | None = None) -> str:
    table = precision_table(report)
    lines = [BANNER_RULE, "Report : precision", f"        -search {report.search}"]
    if target:
        lines.append(f"        -target {target}")
    if design:
        lines.append(f"Design : {design}")
    lines += [BANNER_RULE, ""]
    counts: dict[tuple[str, str], int] = {}
    for c in report.cells:
        counts[(c.requested, c.realised)] = counts.get((c.requested, c.realised), 0) + 1
    lines.append("Requested vs realised: " + (", ".join(
        f"{n} x {req}" + ("" if req == real else f" realised {real} (OVERRIDDEN)") for (req, real), n in
        sorted(counts.items())) or "no candidate cells"))
    lines.append(f"Accuracy budget {report.budget:.3e}; estimated error of the map {report.estimate_error:.3e} "
                 f"({ESTIMATE_RULE})" + (f"; end-to-end check {report.checked_error:.3e}" if report.checked_error
                                         is not None else ""))
    lines.append(f"Sensitivity: {report.sensitivity}")
    if report.cells:
        lines += ["", table.header(), "-" * len(table.header()), *table.lines()]
    measured = retime_table(report)
    if measured.rows:
        result = report.retime
        lines += ["", f"Measured re-timing on {result.provider} (baseline = the design before the map; medians of "
                      "interleaved rounds; paired = map / baseline per round):", measured.header(),
                  "-" * len(measured.header()), *measured.lines(), f"Outcome: {result.why}"]
    if report.notes:
        lines += ["", "Notes:", *(f"  {n}" for n in report.notes)]
    lines.append("")
    return "\n".join(lines)
