"""The serving checks (a constraints file's `serving:` block, softsyn.timing.serving) as tables: report_qor's
Serving section, the HTML page's, and the same rows in analysis.json (the ServingResult they are built from).
Every figure is simulated over step times estimated from the library: each status says so."""
from __future__ import annotations

from dataclasses import asdict

from softsyn.results.serving import ServingResult
from reports.columns import (SERVING_DISTRIBUTION_COLUMNS, SERVING_RATE_COLUMNS, SERVING_STEP_COLUMNS,
                             SERVING_SUGGESTION_COLUMNS, SERVING_TIME_COLUMNS)
from reports.common import Table
from reports.html_table import table_html
from reports.svg import histogram

LABEL = "(simulated, est)"


def _status(met: bool) -> str:
    return f"{'MET' if met else 'VIOLATED'} {LABEL}"


def serving_tables(result: ServingResult) -> dict[str, Table]:
    """checks (latency), throughput, distributions, suggestions, steps: each a Table of SI rows."""
    rows = {kind: tuple({**asdict(c), "status": _status(c.met)} for c in result.checks if c.kind == kind)
            for kind in ("time", "rate")}
    return {
        "checks": Table(SERVING_TIME_COLUMNS, rows["time"]),
        "throughput": Table(SERVING_RATE_COLUMNS, rows["rate"]),
        "distributions": Table(SERVING_DISTRIBUTION_COLUMNS, tuple(asdict(d) for d in result.distributions)),
        "suggestions": Table(SERVING_SUGGESTION_COLUMNS, tuple(asdict(s) for s in result.suggestions)),
        "steps": Table(SERVING_STEP_COLUMNS, tuple(asdict(s) for s in result.steps)),
    }


def _block(table: Table, unit: str, digits: int) -> list[str]:
    return [table.header(), table.dashes(), *table.lines(unit, digits)] if table.rows else []


def _steps_line(result: ServingResult) -> str:
    """What the step table covers (its rows: analysis.json and report.html)."""
    parts = []
    for kind, what in (("decode", "past"), ("prefill", "prompt")):
        points = [p for p in result.steps if p.kind == kind]
        if points:
            batches, tokens = [p.batch for p in points], [p.tokens for p in points]
            parts.append(f"{len(points)} {kind} (batch {min(batches)}..{max(batches)}, {what} "
                         f"{min(tokens)}..{max(tokens)})")
    return f"Step times (est, the STA from the library): {', '.join(parts)} points; rows in analysis.json, report.html"


def _host_line(result: ServingResult) -> list[str]:
    """The engine's host work per iteration the simulation added: measured figures, or why none."""
    if result.host is None:
        return []
    return [f"Host:  {result.host.status}: {result.host.line}"]


def serving_lines(result: ServingResult | None, unit: str = "ms", digits: int = 3) -> list[str]:
    """report_qor's Serving section (empty without a serving block)."""
    if result is None:
        return []
    tables = serving_tables(result)
    lines = [f"Serving {LABEL}", f"Load:  {result.load}", f"Model: {result.model}", *_host_line(result),
             f"Completed {result.completed} of {result.requests} requests; throughput {result.throughput:,.1f} "
             f"tok/s (offered {result.offered:,.1f} tok/s)", "", f"Checks (times in {unit})",
             *_block(tables["checks"], unit, digits)]
    if tables["throughput"].rows:
        lines += ["", *_block(tables["throughput"], unit, digits)]
    lines += ["", f"Distributions over the requests ({unit})", *_block(tables["distributions"], unit, digits)]
    lines += ["", _steps_line(result)] if result.steps else []
    lines += [""] + [f"Note: {n}" for n in result.notes] if result.notes else []
    if result.suggestions:
        lines += ["", "Suggestions (each re-runs the simulation with one knob changed)",
                  *_block(tables["suggestions"], unit, digits)]
    return lines


def serving_view(result: ServingResult | None) -> dict | None:
    """The HTML page's Serving section: the same tables, as HTML (None without a serving block)."""
    if result is None:
        return None
    tables = serving_tables(result)
    captions = {"checks": f"latency checks {LABEL}", "throughput": f"throughput check, tokens/s {LABEL}",
                "distributions": "simulated distributions over the requests",
                "suggestions": "suggestions: the simulation re-run with one knob changed"}
    charts = []
    for metric in dict.fromkeys(b.metric for b in result.histogram):
        bins = [(b.low, b.high, b.count) for b in result.histogram if b.metric == metric]
        charts.append({"metric": metric, "chart": histogram(bins, f"{metric}: requests per bin {LABEL}",
                                                            fmt=lambda v: f"{v * 1e3:.3g}", x_label=f"{metric} (ms)",
                                                            noun="request")})
    return {"load": result.load, "model": result.model, "host": "".join(_host_line(result)), "notes": result.notes,
            "charts": charts,
            "verdict": "VIOLATED" if result.violated else "MET",
            "tables": [table_html(tables[k], caption, "stack" if k == "suggestions" else "")
                       for k, caption in captions.items() if tables[k].rows],
            "steps": table_html(tables["steps"], "step times the simulation ran on: the STA at these dims (est)")
            if tables["steps"].rows else None}


def constraint_sections(result: ServingResult | None, all_violators: bool, unit: str = "ms",
                        digits: int = 3) -> list[dict]:
    """report_constraint's serving sections (latency, throughput): every check, or with `all_violators` the
    violated ones only."""
    if result is None:
        return []
    keep = [c.group for c in result.checks if not (all_violators and c.met)]
    sections = []
    for key, title in (("checks", f"serving latency {LABEL}"), ("throughput", f"serving throughput {LABEL}")):
        table = serving_tables(result)[key]
        table = Table(table.columns, tuple(r for r in table.rows if r["group"] in keep))
        if table.rows:
            sections.append({"title": title + (f" ({unit})" if key == "checks" else " (tok/s)"),
                             "header": [table.header()], "rule": table.dashes(), "rows": table.lines(unit, digits)})
    return sections
