"""report_precision: the compile loop's per-cell precision map, requested vs realised, never a silent override.

One row per candidate cell of the `optimize` pass (softsyn.passes.optimize.OptimizeReport): the precision the
search asked for, the one the netlist holds after the map was applied, the output error it adds (measured, or
the labelled prior of a plan) and its change in cost per path group (library tables; negative is faster).
"""
from __future__ import annotations

from softsyn.passes.precision.search import ESTIMATE_RULE
from softsyn.reports.columns import precision_columns
from softsyn.reports.common import BANNER_RULE, Table


def precision_table(report) -> Table:
    groups = list(report.problem.cost) if report.problem is not None else []
    return Table(precision_columns(groups), tuple(
        {"cell": c.hierarchy or c.name, "requested": c.requested, "realised": c.realised, "error": c.error,
         **{f"delta_{g}": c.cost[g] - c.baseline_cost[g] for g in groups}} for c in report.cells))


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
    if report.notes:
        lines += ["", "Notes:", *(f"  {n}" for n in report.notes)]
    lines.append("")
    return "\n".join(lines)
