"""report_fusion: fusion coverage per kind — candidate sites, fused, and the reason for every miss.

Silent non-fusion is the top complaint about runtime optimisers; this report lists every site a
rule's structural anchor found and did not fuse, with the reason its check gave.
"""
from __future__ import annotations

from softsyn.reports.common import BANNER_RULE

RULE = "-" * 78


def report_fusion(coverage, design: str | None = None, target: str | None = None, max_misses: int = 50) -> str:
    """Text report of a list of softsyn.passes.fuse.rules.Coverage (the `fuse` pass's result)."""
    lines = [BANNER_RULE, "Report : fusion"]
    if target:
        lines.append(f"        -target {target}")
    if design:
        lines.append(f"Design : {design}")
    lines += [BANNER_RULE, ""]
    lines.append(f"{'Fusion kind':<16}{'Candidates':>11}{'Fused':>7}{'Missed':>8}{'Coverage':>10}  Runtime op")
    lines.append(RULE)
    total_c = total_f = 0
    for c in coverage:
        missed = c.candidates - c.fused
        pct = f"{c.percent:.0f}%" if c.candidates else "-"
        op = getattr(c, "target_op", "") or ""
        lines.append(f"{c.kind:<16}{c.candidates:>11}{c.fused:>7}{missed:>8}{pct:>10}  {op}")
        total_c += c.candidates
        total_f += c.fused
    lines.append(RULE)
    pct = f"{100.0 * total_f / total_c:.0f}%" if total_c else "-"
    lines.append(f"{'Total':<16}{total_c:>11}{total_f:>7}{total_c - total_f:>8}{pct:>10}")
    notes = [c for c in coverage if getattr(c, "note", "")]
    if notes:
        lines += ["", "Notes:"]
        lines += [f"  {c.kind}: {c.note}" for c in notes]
    misses = [(c.kind, m) for c in coverage for m in c.misses]
    lines.append("")
    if not misses:
        lines.append("Misses: none (every candidate site fused)")
    else:
        lines.append(f"Misses ({len(misses)}):")
        for kind, m in misses[:max_misses]:
            lines.append(f"  [{kind}] {m.site}")
            lines.append(f"      reason: {m.reason}")
        if len(misses) > max_misses:
            lines.append(f"  ... {len(misses) - max_misses} more")
    lines.append("")
    return "\n".join(lines)
