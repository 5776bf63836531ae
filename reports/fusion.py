"""report_fusion: fusion coverage per kind — candidate sites, fused, and the reason for every miss.

Silent non-fusion is the top complaint about runtime optimisers; this report lists every site a
rule's structural anchor found and did not fuse, with the reason its check gave.
"""
from __future__ import annotations

import json

from reports.columns import FUSION_COLUMNS, FUSION_MISS_COLUMNS
from reports.common import BANNER_RULE, Table, printable

SCHEMA = "softsyn.fusion/1"

RULE = "-" * 78


def _percent(fused: int, candidates: int) -> float | None:
    return 100.0 * fused / candidates if candidates else None


def fusion_table(coverage) -> Table:
    """One row per fusion kind of a list of passes.fuse Coverage (the `fuse` pass's result:
    kind, candidates, fused, misses, target_op, note)."""
    return Table(FUSION_COLUMNS, tuple(
        {"kind": c.kind, "candidates": c.candidates, "fused": c.fused, "missed": c.candidates - c.fused,
         "percent": _percent(c.fused, c.candidates), "target_op": c.target_op} for c in coverage))


def fusion_total(coverage) -> Table:
    """The Total row: the kinds summed (no runtime op)."""
    candidates = sum(c.candidates for c in coverage)
    fused = sum(c.fused for c in coverage)
    return Table(FUSION_COLUMNS[:-1], ({"kind": "Total", "candidates": candidates, "fused": fused,
                                        "missed": candidates - fused, "percent": _percent(fused, candidates)},))


def miss_table(coverage) -> Table:
    """Every site a rule's anchor found and did not fuse, with its check's reason."""
    return Table(FUSION_MISS_COLUMNS, tuple({"kind": c.kind, "site": m.site, "reason": m.reason}
                                            for c in coverage for m in c.misses))


def fusion_json(coverage, design: str | None = None, target: str | None = None) -> str:
    """DIR/reports/fusion.json: the kinds, total and misses tables report_fusion prints, and the kinds' notes."""
    data = {"schema": SCHEMA, "design": design, "target": target, "kinds": fusion_table(coverage).to_dict(),
            "total": fusion_total(coverage).to_dict(), "misses": miss_table(coverage).to_dict(),
            "notes": {c.kind: c.note for c in coverage if c.note}}
    return json.dumps(data, indent=1, allow_nan=False) + "\n"


def report_fusion(coverage, design: str | None = None, target: str | None = None, max_misses: int = 50) -> str:
    """Text report of a list of Coverage: the kinds table, its total, kind notes and up to max_misses misses."""
    kinds = fusion_table(coverage)
    lines = [BANNER_RULE, "Report : fusion"]
    if target:
        lines.append(f"        -target {target}")
    if design:
        lines.append(f"Design : {printable(design)}")
    lines += [BANNER_RULE, "", kinds.header(), RULE, *kinds.lines(), RULE, *fusion_total(coverage).lines()]
    notes = [c for c in coverage if c.note]
    if notes:
        lines += ["", "Notes:"]
        lines += [f"  {c.kind}: {printable(c.note)}" for c in notes]
    misses = [(c.kind, m) for c in coverage for m in c.misses]
    lines.append("")
    if not misses:
        lines.append("Misses: none (every candidate site fused)")
    else:
        lines.append(f"Misses ({len(misses)}):")
        for kind, m in misses[:max_misses]:
            lines.append(f"  [{kind}] {printable(m.site)}")
            lines.append(f"      reason: {printable(m.reason)}")
        if len(misses) > max_misses:
            lines.append(f"  ... {len(misses) - max_misses} more")
    lines.append("")
    return "\n".join(lines)
