"""report_timing on a torch package's macro cells (softsyn.runtime.torch_macros, softsyn.timing.macro): per path group
the path through its macro cells, measured on the target, in report_timing's layout; then the macro cells as a table
beside the ORT library's estimate of the netlist cells each covers, and what maps to nothing (kernels no call claims,
netlist cells no macro covers, groups not characterised)."""
from __future__ import annotations

from reports.columns import MACRO_COLUMNS, TIMING_COLUMNS
from reports.common import BANNER_RULE, INDENT, Table, ftime, printable, render, table_header
from reports.timing import path_lines
from softsyn.runtime.torch_macros import MACROS_FILE, MacroGroup, MacroLibrary
from softsyn.timing.macro import macro_path

SHOWN_UNCOVERED = 8  # netlist cells named per group before "and N more"


def macro_table(group: MacroGroup) -> Table:
    """A group's macro cells in launch order, then the unattributed kernels; Est: the ORT library's delay of the
    netlist cells the macro covers (None: it covers none)."""
    rows = [{"instance": m.instance, "kernels": m.kernels, "cells": len(m.cells), "seconds": m.seconds, "est": m.est,
             "share": m.seconds / group.step if group.step else None}
            for m in (*group.macros, group.unattributed)]
    return Table(MACRO_COLUMNS, tuple(rows))


def report_macro_timing(analysis, library: MacroLibrary, group: str | None = None, fold: bool = True,
                        digits: int = 3, unit: str = "ms") -> str:
    """report_timing's paths through the macro cells of every group of `analysis` (the compile's) that `library`
    holds, each with its macro table and the two predictions side by side."""
    groups = [analysis.group(group)] if group else list(analysis.groups)
    banner = [BANNER_RULE, "Report : timing (macro cells)", "        -path full -delay max" + (" -fold" if fold else ""),
              f"Design : {printable(analysis.design)}",
              f"Library: torch macro cells, {MACROS_FILE} ({library.target}; measured on {library.device}, "
              f"{library.date}; torch {library.torch})",
              f"Method : {library.method}",
              f"Est    : the {library.library or analysis.library} library's delay of the netlist cells a macro covers "
              "(the compile's prediction, an estimate)", BANNER_RULE]
    sections, tables = [], []
    for g in groups:
        macros = library.group(g.name)
        path = macro_path(g.critical, macros) if macros is not None else None
        sections.append({"group": g, "paths": [path_lines(path, fold, unit, digits)] if path else []})
        tables += _group_lines(g, macros, path, unit, digits)
    text = render("timing.j2", banner=banner, sections=sections, header=table_header(TIMING_COLUMNS, unit),
                  rule="-" * len(table_header(TIMING_COLUMNS, unit)), suggestions=[])
    return text + "\n".join(line.rstrip() for line in tables) + "\n"


def _group_lines(g, macros: MacroGroup | None, path, unit: str, digits: int) -> list[str]:
    t = lambda s: ftime(s, unit, digits)  # noqa: E731
    head = ["", f"{INDENT}Macro cells of '{g.name}': {g.scenario.description}", INDENT + "-" * 60]
    if macros is None:
        return head + [f"{INDENT}not characterised: {MACROS_FILE} holds no group '{g.name}'"]
    if macros.problem:
        return head + [f"{INDENT}not characterised: {macros.problem}"]
    table = macro_table(macros)
    est = g.critical.arrival - g.critical.input_delay
    out = head + [INDENT + table.header(), *(INDENT + line for line in table.lines(unit, digits)),
                  f"{INDENT}(times in {unit} per step; {macros.steps} steps profiled on {macros.package})",
                  f"{INDENT}Predicted from macro cells (measured): {t(path.arrival - path.input_delay)} {unit} = "
                  f"kernels {t(macros.kernel_seconds)} + outside kernels "
                  f"{t(path.arrival - path.input_delay - macros.kernel_seconds)} {unit}; from the ORT library "
                  f"(est): {t(est)} {unit}"]
    if macros.scale < 1:
        out.append(f"{INDENT}Kernel times scaled by {macros.scale:.3f}: the profiled kernels summed to more than the "
                   "timed step (the profiler's own cost inside each record; the step timed unprofiled)")
    if macros.unattributed.kernels:
        out.append(f"{INDENT}Unattributed: {macros.unattributed.kernels:g} kernels per step no kernel call of the map "
                   f"accounts for ({', '.join(macros.unattributed.kernel_names[:4])})")
    empty = [m.instance for m in macros.macros if not m.cells]
    if empty:
        out.append(f"{INDENT}Macro cells mapping to no netlist cell: {', '.join(empty)}")
    if macros.uncovered:
        shown = ", ".join(macros.uncovered[:SHOWN_UNCOVERED])
        more = len(macros.uncovered) - SHOWN_UNCOVERED
        out.append(f"{INDENT}Netlist cells no macro cell covers: {len(macros.uncovered)} ({shown}"
                   + (f", and {more} more" if more > 0 else "") + ")")
    return out
