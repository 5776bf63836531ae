"""DIR/reports/report.html: the design at a glance, one self-contained page (no network, no script).

Rendered from what the text and JSON reports render, read back from DIR: analysis.json (the Analysis),
reports/fusion.json, compile_log.json, netlist.json and runtime/session.json (a compile), signoff/signoff.json
(a sign-off). Every table is a `Table` of SI rows with its columns from reports.columns (or the
columns saved beside the rows) and prints through `format_cell`, as the text does; each number also sits
in a `data-si` attribute, so a reader (and the tests) compare it with the JSON. A section appears when
the data behind it exists: the compile log after a compile, the precision map where cells are known,
predicted vs measured after a sign-off, one VRAM bar per device when the area holds `devices`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from softsyn.errors import SoftsynError
from softsyn.results.signoff import SignoffResult
from reports.advice import analysis_facts
from reports.columns import AREA_KIND_COLUMNS, VERDICT_COLUMNS
from reports.common import (Table, byte_unit_for, fbytes, fpercent, indexed_scope, is_unconstrained, render,
                                    write_atomic)
from reports.html_table import UNIT, saved_table, t, table_html
from reports.json_io import from_json
from reports.pareto import pareto_view
from reports.serving import serving_view
from reports.signoff import cell_table, group_table, module_table
from reports.suggest import area_suggestions, timing_suggestions
from reports.svg import OP_KIND_NAMES, Segment, hbars, line_plot, op_kind, scatter, stacked_bar
from reports.views import before_after, op_time, roofline, slack_histogram, timeline
from reports.waterfall import group_sections, path_status
from softsyn.timing import Analysis

HTML_FILE = "reports/report.html"
FILES = {"analysis": "analysis.json", "fusion": "reports/fusion.json", "compile_log": "compile_log.json",
         "netlist": "netlist.json", "session": "runtime/session.json", "signoff": "signoff/signoff.json",
         "suggestions": "reports/suggestions.json", "pareto": "reports/pareto.json"}
PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "int8", "int4")


@dataclass(frozen=True)
class Page:
    """What one page renders; None where the directory does not hold it (its section is left out)."""

    analysis: Analysis
    fusion: dict | None = None  # reports/fusion.json
    compile_log: dict | None = None  # compile_log.json
    cells: tuple[dict, ...] | None = None  # netlist.json's cells
    session: dict | None = None  # runtime/session.json
    signoff: SignoffResult | None = None
    suggestions: tuple | None = None  # reports/suggestions.json's items: the advice the text reports print
    pareto: dict | None = None  # reports/pareto.json: the compile loop's latency-error points (and peers)


def _read(dirs: tuple[Path, ...], key: str) -> dict | None:
    """The first of `dirs` holding FILES[key], parsed; None when none does."""
    for d in dirs:
        path = d / FILES[key]
        if path.is_file():
            try:
                return json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise SoftsynError(f"{path}: not readable JSON ({exc}); re-run the command that wrote it") from None
    return None


def load_page(*dirs: str | Path) -> Page:
    """The page of an output directory; later `dirs` fill what earlier ones lack (a sign-off's staging
    folder first, then DIR)."""
    paths = tuple(Path(d) for d in dirs)
    saved = next((d / FILES["analysis"] for d in paths if (d / FILES["analysis"]).is_file()), None)
    if saved is None:
        raise SoftsynError(f"{paths[-1]}: no {FILES['analysis']} here; run `softsyn analyze MODEL -o DIR` or "
                           "`softsyn compile MODEL -o DIR` first")
    try:
        analysis = from_json(saved.read_text())
    except (OSError, ValueError) as exc:
        raise SoftsynError(f"{saved}: not a readable softsyn analysis ({exc}); re-run softsyn analyze") from None
    netlist = _read(paths, "netlist")
    signoff = _read(paths, "signoff")
    advice = _read(paths, "suggestions")
    return Page(analysis, fusion=_read(paths, "fusion"), compile_log=_read(paths, "compile_log"),
                cells=tuple(netlist["cells"]) if netlist else None, session=_read(paths, "session"),
                signoff=SignoffResult.from_dict(signoff) if signoff else None,
                suggestions=tuple(advice["items"]) if advice else None, pareto=_read(paths, "pareto"))


# ------------------------------------------------------------------------------------------ header

def verdict_table(analysis: Analysis) -> Table:
    """One row per path group: its critical path's clock, the budget's delays, arrival, slack and verdict."""
    rows = []
    for g in analysis.groups:
        if not g.paths:
            continue
        p = g.critical
        rows.append({"group": g.name, "scenario": g.scenario.description, "clock_period": p.clock_period,
                     "input_delay": p.input_delay, "output_delay": p.output_delay,
                     "clock_uncertainty": p.clock_uncertainty, "arrival": p.arrival,
                     "slack": None if is_unconstrained(p.slack) else p.slack, "status": path_status(p)})
    return Table(VERDICT_COLUMNS, tuple(rows))


def header(page: Page) -> dict:
    a = page.analysis
    target = (page.session or {}).get("target") or a.library
    kind = "signoff" if page.signoff else "compile" if page.compile_log else "analyze"
    return {"design": a.design, "library": a.library, "library_source": a.library_source, "target": target,
            "constraints": a.constraints_file, "date": a.date, "version": a.version, "kind": kind,
            "scenarios": [g.scenario.description for g in a.groups], "warnings": a.warnings,
            "verdicts": verdict_table(a), "area_status": _area_status(a)}


def _area_status(a: Analysis) -> str:
    area = a.area
    unit = byte_unit_for(area.total, area.limit)
    if area.limit is None:
        return f"VRAM {fbytes(area.total, unit)}, no area_constraint"
    state = "MET" if area.slack >= 0 else "VIOLATED"
    return f"VRAM {fbytes(area.total, unit)} of {fbytes(area.limit, unit)}: {state} (slack {fbytes(area.slack, unit)})"


# ------------------------------------------------------------------------------------------ precision map

def _precision_cells(page: Page) -> list[dict]:
    """Weight-bearing cells (the matmul kind) with hierarchy and precision: netlist.json's after a compile,
    else the cells on the analysis's timed paths (an analyze output has no per-cell list)."""
    if page.cells is not None:
        return [c for c in page.cells if op_kind(c["op"]) == "matmul"]
    seen: dict[str, dict] = {}
    for g in page.analysis.groups:
        for path in g.paths:
            for p in path.points:
                if op_kind(p.op_type) == "matmul" and p.name not in seen:
                    seen[p.name] = {"name": p.name, "hierarchy": p.hierarchy, "op": p.op_type,
                                    "precision": p.cell.rsplit(".", 1)[-1]}
    return list(seen.values())


def precision_map(page: Page) -> dict | None:
    """Layer x projection grid of the cells' precisions; `requested` where a cell (or the uniform request
    in session.json) asked for another one."""
    cells = _precision_cells(page)
    if not cells:
        return None
    uniform = ((page.session or {}).get("precision_request") or {}).get("requested")
    layers: dict[int, dict[str, list[dict]]] = {}
    columns: list[str] = []
    outside: list[dict] = []
    for c in cells:
        requested = c.get("requested") or uniform
        entry = {"precision": c["precision"], "requested": requested if requested and requested != c["precision"]
                 else None, "name": c["name"], "op": c["op"]}
        scope = indexed_scope(c["hierarchy"])
        if scope is None:
            outside.append({**entry, "scope": c["hierarchy"] or "(top)"})
            continue
        column = scope[2].lstrip(".") or c["name"]
        if column not in columns:
            columns.append(column)
        layers.setdefault(scope[1], {}).setdefault(column, []).append(entry)
    rows = [{"layer": i, "cells": [layers[i].get(col, []) for col in columns]} for i in sorted(layers)]
    used = sorted({c["precision"] for c in cells}, key=lambda p: (PRECISIONS.index(p) if p in PRECISIONS else 99, p))
    source = "netlist.json (every cell)" if page.cells is not None else "the cells on the timed paths (analysis.json)"
    short = [c.rsplit(".", 1)[-1] for c in columns]  # q_proj for self_attn.q_proj, where that stays unambiguous
    labels = short if len(set(short)) == len(short) else columns
    return {"columns": columns, "labels": labels, "rows": rows, "outside": outside, "used": used, "source": source,
            "requested": uniform, "prefix": next((indexed_scope(c["hierarchy"])[0] for c in cells
                                                  if indexed_scope(c["hierarchy"])), "")}


def precision_class(precision: str) -> str:
    return f"prec-{precision}" if precision in PRECISIONS else "prec-other"


# ------------------------------------------------------------------------------------------ VRAM

def _vram_class(name: str) -> str:
    name = name.lower()
    if name.startswith("weight"):
        parts = name.split()
        return f"vram-w {precision_class(parts[1]) if len(parts) > 1 else 'prec-other'}"
    if name.startswith("kv"):
        return "vram-kv"
    if name.startswith(("activation", "workspace")):
        return "vram-act"
    return "vram-other"


def area_table(area) -> Table:
    """report_area's kinds table: name, bytes, count, share of the total, detail."""
    whole = area.total or 1.0
    rows = [{"name": k.name, "bytes": k.bytes, "count": k.count or None, "percent": k.bytes / whole,
             "detail": k.detail} for k in area.by_kind]
    rows.append({"name": "Total VRAM", "bytes": area.total, "count": None, "percent": 1.0 if area.total else None,
                 "detail": ""})
    if area.limit is not None:
        rows.append({"name": "max_area (VRAM limit)", "bytes": area.limit, "count": None, "percent": None,
                     "detail": f"slack {'MET' if area.slack >= 0 else 'VIOLATED'}"})
        rows.append({"name": "slack", "bytes": area.slack, "count": None, "percent": None, "detail": ""})
    return Table(AREA_KIND_COLUMNS, tuple(rows))


def vram(page: Page) -> list[dict]:
    """One bar per device (an area with `devices`: tensor parallel), else one for the design."""
    area = page.analysis.area
    devices = getattr(area, "devices", None) or [area]
    out = []
    for i, dev in enumerate(devices):
        unit = byte_unit_for(dev.total, dev.limit)
        segments, start = [], 0.0
        for k in dev.by_kind:
            segments.append(Segment(start, k.bytes, _vram_class(k.name), f"{k.name}: {fbytes(k.bytes, unit)}"))
            start += k.bytes
        scale = max(dev.total, dev.limit or 0.0)
        label = f"device {i}" if len(devices) > 1 else page.analysis.design
        limit_label = "" if dev.limit is None else f"limit {fbytes(dev.limit, unit)}"
        out.append({"label": label, "unit": unit,
                    "budget": stacked_bar(segments, scale, f"{label}: VRAM {fbytes(dev.total, unit)} against "
                                          + (limit_label or "no limit"), dev.limit, limit_label),
                    "composition": stacked_bar(segments, dev.total, f"{label}: VRAM by kind"),
                    "legend": [(k.name, _vram_class(k.name)) for k in dev.by_kind],
                    "table": table_html(area_table(dev), f"{label}: VRAM by kind", byte_unit=unit),
                    "share": "no limit" if not dev.limit else fpercent(dev.total / dev.limit),
                    "status": "no limit" if dev.limit is None else
                    f"{fpercent(dev.total / dev.limit)} of the limit" if dev.limit else ""})
    return out


# ------------------------------------------------------------------------------------------ compile log

def compile_log(page: Page) -> dict | None:
    """The compile log's rows (compile_log.json, its own columns) and WNS / TNS per step as lines."""
    log = page.compile_log
    if not log or not log.get("rows"):
        return None
    table = Table.from_dict(log)
    steps = [r["phase"] for r in table.rows]
    scale = 1e3  # the plot prints ms, like the tables
    plot = line_plot({"WNS": [r["wns"] * scale for r in table.rows], "TNS": [r["tns"] * scale for r in table.rows]},
                     steps, "WNS and TNS per compile step (ms)", "slack (ms)", fmt=lambda v: f"{v:.3g}")
    moves = saved_table(log.get("moves"))
    unit = byte_unit_for(*(r.get("area") for r in table.rows))
    return {"effort": log.get("effort", ""), "script": log.get("script", []), "plot": plot, "steps": steps,
            "table": table_html(table, "compile log: one row per step", byte_unit=unit),
            "moves": table_html(moves, "accepted moves") if moves else None, "notes": log.get("notes", [])}


# ------------------------------------------------------------------------------------------ signoff

def signoff(page: Page) -> dict | None:
    """Predicted vs measured: per group (one scatter) and per cell of each group, from signoff.json."""
    result = page.signoff
    if result is None:
        return None
    fmt = lambda v: f"{v * 1e3:.3g}"  # noqa: E731  (ms, as the axes say: three figures at any decade)
    per_group = scatter([(g.predicted, g.measured_median, g.name) for g in result.groups],
                        "predicted vs measured per path group (ms)", fmt=fmt)
    cells = []
    for g in result.groups:
        rows = [c for c in g.cells if c.match != "residual"]
        cells.append({"name": g.name, "count": len(rows),
                      "plot": scatter([(c.predicted, c.measured, c.instance) for c in rows],
                                      f"{g.name}: predicted vs measured per cell (ms)", fmt=fmt),
                      "table": table_html(cell_table(g, top=len(g.cells)), f"{g.name}: every cell, largest error "
                                          "first", css="cell-table")})
    modules = [{"name": g.name, "count": len(g.modules),
                "table": table_html(module_table(g), f"{g.name}: kernel time per source-module kind (torch package; "
                                    "predicted: the ORT library's cells of that kind, an estimate)")}
               for g in result.groups if g.modules]
    slacks = []  # each group's predicted and measured slack on its own axis: they can differ by orders of magnitude
    for g in result.groups:
        pair = [(label, v) for label, v in (("predicted", g.predicted_slack), ("measured", g.measured_slack))
                if v is not None and math.isfinite(v)]
        if pair:
            slacks.append({"name": g.name, "chart": hbars([(label, abs(v), "slack-neg" if v < 0 else "slack-pos", t(v))
                                                           for label, v in pair], f"{g.name}: predicted and measured slack")})
    return {"provider": result.provider, "device": result.device, "runs": result.runs, "date": result.date,
            "slacks": slacks,
            "groups": table_html(group_table(result), "sign-off per path group", css="stack"), "plot": per_group,
            "cells": cells, "modules": modules, "error_means": result.error_means}


# ------------------------------------------------------------------------------------------ fusion, suggestions

def fusion(page: Page) -> dict | None:
    data = page.fusion
    if not data:
        return None
    misses = Table.from_dict(data["misses"])
    return {"kinds": table_html(Table.from_dict(data["kinds"]), "fusion coverage by kind"),
            "total": table_html(Table.from_dict(data["total"]), "fusion coverage, all kinds"),
            "misses": table_html(misses, f"every miss and its reason ({len(misses.rows)})", css="stack")
            if misses.rows else None,
            "notes": data.get("notes", {}), "target": data.get("target")}


def suggestions(page: Page) -> list[list[str]]:
    """The advice the text reports print (reports/suggestions.json), else the analysis's own."""
    if page.suggestions is not None:
        return list(page.suggestions)
    a = page.analysis
    return timing_suggestions(a.groups, UNIT, facts=analysis_facts(a)) + area_suggestions(a.area)


# ------------------------------------------------------------------------------------------ page

def render_html(page: Page) -> str:
    """The whole page: every section whose data `page` holds."""
    a = page.analysis
    views = {"op_time": op_time(a), "roofline": roofline(a, page.signoff), "slack": slack_histogram(a),
             "timeline": timeline(a, page.signoff) if page.signoff else None, "compare": before_after(page.compile_log)}
    return render("report_html.j2", head=header(page), groups=group_sections(a), precision=precision_map(page),
                  vram=vram(page), log=compile_log(page), signoff=signoff(page), fusion=fusion(page),
                  suggestions=suggestions(page), pareto=pareto_view(page.pareto), op_kinds=OP_KIND_NAMES,
                  serving=serving_view(a.serving),
                  precisions=PRECISIONS, precision_class=precision_class, t=t, table_html=table_html, views=views)


def write_html(*dirs: str | Path) -> Path:
    """Render the page of dirs (see load_page) into dirs[0]/reports/report.html, atomically."""
    return write_atomic(Path(dirs[0]) / HTML_FILE, render_html(load_page(*dirs)))
