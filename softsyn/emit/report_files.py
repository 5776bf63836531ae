"""DIR/reports/*.rpt, analysis.json, fusion.json, precision.rpt, compile.log, compile_log.json and, last,
DIR/reports/report.html (the page reads the files before it): the compiled design's reports, rendered by reports."""
from __future__ import annotations

from pathlib import Path

import reports
from passes import report_of
from passes.fuse.base import FusionReport
from passes.optimize import OptimizeReport
from reports.compile_log import compile_log_json, report_compile_log
from reports.html import write_html
from reports.advice import design_facts
from reports.suggest import precision_moves, precision_suggestions
from softsyn.results.compile_log import CompileLog
from softsyn.timing import Analysis

# The files a pass report renders to, by its type: (file under reports/, renderer(report, design=, target=)).
PASS_REPORT_FILES = (
    (FusionReport, (("fusion.rpt", reports.report_fusion), ("fusion.json", reports.fusion_json))),
    (OptimizeReport, (("precision.rpt", reports.report_precision),)),
)


def write_report_files(design, analysis: Analysis, folder: Path, log: CompileLog) -> None:
    """Every report of the compiled design into `folder`; the loop's suggestions go to the compile log's notes first."""
    netlist = design.netlist
    precision_map = report_of(design, OptimizeReport)
    moves = precision_suggestions(precision_map, analysis.groups) if precision_map is not None else []
    log.notes += [f"suggestion: {m}" for m in moves]
    facts = design_facts(design, analysis, log.effort, precision_moves(precision_map, analysis.groups))
    reports.write_reports(analysis, folder, facts=facts)
    for cls, files in PASS_REPORT_FILES:
        report = report_of(design, cls)
        for name, render in files if report is not None else ():
            (folder / "reports" / name).write_text(render(report, design=netlist.name, target=design.library.name))
    log.add("emit", analysis, len(netlist.nodes()))  # its elapsed: the model written and loaded, the reports
    (folder / "compile.log").write_text(report_compile_log(log))
    (folder / "compile_log.json").write_text(compile_log_json(log))
    write_html(folder)  # last: the page reads the files above
