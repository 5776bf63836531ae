"""DIR/reports/*.rpt, analysis.json, fusion.json, precision.rpt, pareto.rpt/.json, compile.log, compile_log.json
and, last, DIR/reports/report.html (the page reads the files before it): the compiled design's reports, rendered by reports."""
from __future__ import annotations

from pathlib import Path

import reports
from reports.compile_log import compile_log_json, report_compile_log
from reports.html import write_html
from reports.pareto import write_pareto
from reports.advice import design_facts
from reports.suggest import precision_moves, precision_suggestions
from softsyn.results.compile_log import CompileLog
from softsyn.timing import Analysis


def write_report_files(design, analysis: Analysis, folder: Path, log: CompileLog) -> None:
    """Every report of the compiled design into `folder`; the loop's suggestions go to the compile log's notes first."""
    netlist = design.netlist
    precision_map = design.pass_reports.get("optimize")
    moves = precision_suggestions(precision_map, analysis.groups) if precision_map is not None else []
    log.notes += [f"suggestion: {m}" for m in moves]
    facts = design_facts(design, analysis, log.effort, precision_moves(precision_map, analysis.groups))
    reports.write_reports(analysis, folder, facts=facts)
    coverage = design.pass_reports.get("fuse")
    if coverage is not None:
        (folder / "reports" / "fusion.rpt").write_text(
            reports.report_fusion(coverage, design=netlist.name, target=design.library.name))
        (folder / "reports" / "fusion.json").write_text(
            reports.fusion_json(coverage, design=netlist.name, target=design.library.name))
    if precision_map is not None:
        (folder / "reports" / "precision.rpt").write_text(
            reports.report_precision(precision_map, design=netlist.name, target=design.library.name))
        write_pareto(precision_map, folder, netlist.name, design.library.name)  # pareto.rpt, pareto.json
    log.add("emit", analysis, len(netlist.nodes()))  # its elapsed: the model written and loaded, the reports
    (folder / "compile.log").write_text(report_compile_log(log))
    (folder / "compile_log.json").write_text(compile_log_json(log))
    write_html(folder)  # last: the page reads the files above
