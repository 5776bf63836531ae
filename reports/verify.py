"""report_verify: the compiled model's outputs against its fp32 reference, per scenario and output.

Renders a softsyn.results.verify.VerifyResult; recomputes nothing. The table is column data
(verify_table): the text here and a JSON reader print the same rows.
"""
from __future__ import annotations

from reports.columns import VERIFY_COLUMNS
from reports.common import INDENT, Table


def verify_table(result) -> Table:
    """One row per (scenario, output): max abs error, rel error, cosine, top-1 agreement, MET/VIOLATED."""
    return Table(VERIFY_COLUMNS, tuple(
        {"scenario": c.scenario, "output": c.output, "max_abs": c.max_abs, "rel": c.rel, "cosine": c.cosine,
         "top1": c.top1, "status": "VIOLATED" if c.violations else "MET"} for c in result.checks))


def report_verify(result, out_dir) -> str:
    ref = result.reference
    table = verify_table(result)
    lines = [f"softsyn verify: {out_dir} ({result.precision}, {result.provider}) vs reference "
             f"{ref.get('source', '?')} ({ref.get('precision', 'fp32')})",
             f"Budget: max rel error {result.max_rel_error:.3e} ({result.budget_source}); min top-1 "
             + (f"{result.min_top1:.4f}" if result.min_top1 is not None else "not set"),
             "rel error = max|compiled - reference| / max|reference| per output tensor", "",
             INDENT + table.header(), INDENT + table.dashes(), *(INDENT + line for line in table.lines()), ""]
    if result.violations:
        lines += [f"VIOLATED: {v}" for v in result.violations]
    else:
        lines.append(f"verify: all {len(result.checks)} outputs within the accuracy budget")
    return "\n".join(lines) + "\n"
