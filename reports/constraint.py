"""report_constraint [-all_violators]: one section per constraint kind, a row per object."""
from __future__ import annotations

from collections.abc import Sequence

from softsyn.timing import Analysis
from reports.columns import CONSTRAINT_AREA_COLUMNS, CONSTRAINT_DELAY_COLUMNS
from reports.common import (Column, banner_lines, byte_unit_for, fbytes, ftime, is_unconstrained, render,
                                    table_row, table_rule)
from reports.advice import Facts, analysis_facts
from reports.serving import constraint_sections
from reports.suggest import area_suggestions, timing_suggestions


def _header(columns: Sequence[Column], unit: str) -> list[str]:
    """Two header lines: 'Required'/'Actual' over 'Path Delay (ms)', as DC stacks them."""
    top, bottom = {}, {}
    for c in columns:
        words = c.title.split(" ", 1)
        if len(words) == 2 and c.key in ("required", "actual"):
            top[c.key], bottom[c.key] = words[0], words[1]
        else:
            bottom[c.key] = c.title
        if c.kind in ("time", "bytes") and c.key in bottom:
            bottom[c.key] += f" ({unit})"
    return [*table_row(columns, top), *table_row(columns, bottom)]


def report_constraint(analysis: Analysis, all_violators: bool = True, significant_digits: int = 3,
                      time_unit: str = "ms", extra: list[list[str]] = (), facts: Facts | None = None) -> str:
    """`extra`: suggestions computed elsewhere from the same figures, first; `facts`: what the suggestions agree
    with (reports.advice; from the analysis alone when not given)."""
    unit, digits = time_unit, significant_digits
    t = lambda s: ftime(s, unit, digits)  # noqa: E731
    sections = []
    for g in analysis.groups:
        rows = []
        for p in g.paths:
            if is_unconstrained(p.clock_period) or is_unconstrained(p.slack):
                if not all_violators:
                    rows.append({"object": p.endpoint, "required": "", "actual": t(p.arrival),
                                 "slack": "", "status": "(unconstrained)"})
                continue
            if all_violators and p.slack >= 0:
                continue
            rows.append({"object": p.endpoint, "required": t(p.required), "actual": t(p.arrival),
                         "slack": t(p.slack), "status": "(MET)" if p.slack >= 0 else "(VIOLATED)"})
        if rows:
            sections.append({"title": f"max_delay/setup ('{g.name}' group)",
                             "header": _header(CONSTRAINT_DELAY_COLUMNS, unit), "rule": table_rule(CONSTRAINT_DELAY_COLUMNS),
                             "rows": [line for r in rows for line in table_row(CONSTRAINT_DELAY_COLUMNS, r)]})
    area = analysis.area
    if area.limit is not None and (not all_violators or area.slack < 0):
        bunit = byte_unit_for(area.total, area.limit)
        b = lambda x: fbytes(x, bunit)[: -len(bunit) - 1]  # noqa: E731  (unit is in the header)
        row = {"object": analysis.design, "required": b(area.limit), "actual": b(area.total),
               "slack": b(area.slack), "status": "(MET)" if area.slack >= 0 else "(VIOLATED)"}
        sections.append({"title": "max_area (VRAM)", "header": _header(CONSTRAINT_AREA_COLUMNS, bunit),
                         "rule": table_rule(CONSTRAINT_AREA_COLUMNS), "rows": table_row(CONSTRAINT_AREA_COLUMNS, row)})
    sections += constraint_sections(analysis.serving, all_violators, unit, digits)
    if not all_violators:
        sections.append({"title": "accuracy", "header": [], "rule": "", "rows": ["not checked"]})
    options = ["-all_violators"] if all_violators else []
    facts = facts or analysis_facts(analysis)
    suggestions = (list(extra) + timing_suggestions(analysis.groups, unit, digits, facts=facts)
                   + area_suggestions(area, facts))
    return render("constraint.j2", banner=banner_lines("constraint", analysis, options), sections=sections,
                  all_violators=all_violators, suggestions=suggestions)
