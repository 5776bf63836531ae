"""reports: text reports (DC / PrimeTime shapes) and JSON of softsyn.results.analysis objects.

Every builder takes a result (an `Analysis`, fusion coverage, a signoff or verify result) and returns
text; none recomputes timing or area. Tables are column data (reports.columns).
"""
from __future__ import annotations

from pathlib import Path

from softsyn.timing import Analysis
from reports.advice import Facts, analysis_facts
from reports.area import report_area
from reports.columns import TIMING_COLUMNS
from reports.common import Column, Table, write_atomic
from reports.constraint import report_constraint
from reports.fusion import fusion_json, fusion_table, report_fusion
from reports.json_io import from_json, to_json
from reports.precision import precision_table, report_precision, retime_table
from reports.qor import report_qor
from reports.signoff import report_signoff, report_torch_signoff
from reports.suggest import SUGGESTIONS_FILE, suggestions_json
from reports.timing import Row, fold_points, path_rows, report_timing
from reports.verify import report_verify, verify_table

REPORTS = {
    "timing": report_timing,
    "qor": report_qor,
    "area": report_area,
    "constraint": report_constraint,
}


def write_reports(analysis: Analysis, out_dir: str | Path, extra_suggestions: list[list[str]] = (),
                  facts: Facts | None = None) -> list[Path]:
    """Write out_dir/reports/{timing,timing_full,qor,area,constraint}.rpt, reports/suggestions.json (the advice,
    for the HTML page) and out_dir/analysis.json (each atomically); return the paths written. timing.rpt is folded
    by hierarchy; `extra_suggestions` go first in constraint.rpt; `facts`: what the advice agrees with
    (reports.advice.design_facts; from the analysis alone when not given)."""
    out_dir = Path(out_dir)
    rdir = out_dir / "reports"
    facts = facts or analysis_facts(analysis)
    files = {
        rdir / "timing.rpt": report_timing(analysis, fold=True, facts=facts),
        rdir / "timing_full.rpt": report_timing(analysis, fold=False, facts=facts),
        rdir / "qor.rpt": report_qor(analysis, facts=facts),
        rdir / "area.rpt": report_area(analysis, facts=facts),
        rdir / "constraint.rpt": report_constraint(analysis, all_violators=True, extra=extra_suggestions, facts=facts),
        rdir / SUGGESTIONS_FILE: suggestions_json(analysis, facts, extra_suggestions),
        out_dir / "analysis.json": to_json(analysis),
    }
    return [write_atomic(path, text) for path, text in files.items()]


__all__ = [
    "REPORTS", "write_reports", "report_timing", "report_qor", "report_area", "report_constraint", "report_signoff", "report_torch_signoff",
    "report_fusion", "report_verify", "report_precision", "fusion_table", "fusion_json", "verify_table",
    "precision_table", "retime_table", "to_json", "from_json", "fold_points",
    "path_rows", "Row", "Facts", "suggestions_json", "Column", "Table", "TIMING_COLUMNS",
]
