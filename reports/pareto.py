"""report_pareto: the latency-error front of the maps the compile loop evaluated, the uniform designs and peers.

Renders a softsyn.results.pareto.ParetoSet: DIR/reports/pareto.rpt (text), DIR/reports/pareto.json (the points,
the front and the same table's rows) and the chart of report.html's front section (`pareto_view`). The set comes
from the optimize pass's report at emit (`pareto_rpt`, `pareto_file_json`), or back from pareto.json
(`read_pareto`) when `softsyn report pareto DIR --peers FILE` adds peers (`with_peers`). Computes nothing the
points do not hold, beyond which of them are on the front (softsyn.results.pareto.front) and what dominates the kept
map when it is off it.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from markupsafe import Markup

from passes.optimize.search import ESTIMATE_RULE
from reports.columns import pareto_columns
from reports.common import BANNER_RULE, Table, printable, write_atomic
from reports.svg import H, PAD_B, PAD_L, PAD_R, PAD_T, W, ticks
from softsyn.errors import SoftsynError
from softsyn.results.pareto import ParetoPoint, ParetoSet, axis_group, dominates, on_axes

RPT_FILE, JSON_FILE = "reports/pareto.rpt", "reports/pareto.json"
HOW = {"estimated": "est", "measured": "meas"}


def pareto_set(report, design: str, target: str) -> ParetoSet:
    """The optimize pass's points (passes.optimize.OptimizeReport.pareto) with what they stand on."""
    problem = report.problem
    groups = list(problem.cost) if problem is not None else []
    return ParetoSet(design=design, target=target, groups=groups,
                     axis=axis_group(groups, problem.weight if problem is not None else None), budget=report.budget,
                     sensitivity=report.sensitivity, points=list(report.pareto), notes=list(report.pareto_notes))


def pareto_table(ps: ParetoSet) -> Table:
    """One row per point, in the order recorded (the loop's, then peers)."""
    flags = ps.on_front()
    rows = []
    for p, flag in zip(ps.points, flags):
        rows.append({"origin": p.origin, "mix": p.mix or None,
                     **{f"pred_{g}": p.predicted.get(g) for g in ps.groups},
                     **{f"meas_{g}": (p.measured or {}).get(g) for g in ps.groups},
                     "error": p.error, "how": HOW.get(p.error_how, p.error_how) if p.error is not None else None,
                     "front": flag, "kept": p.kept, "label": p.label})
    return Table(pareto_columns(ps.groups), tuple(rows))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.3f} ms"


def _why(d: ParetoPoint, k: ParetoPoint, ps: ParetoSet) -> str:
    """Why a point that dominates the kept map on the two axes was not the loop's choice, in a clause."""
    if d.origin == "peer":
        return "a peer (another tool's model): not a map the loop could choose"
    slower = [g for g in ps.groups if g != ps.axis and d.latency(g) is not None and k.latency(g) is not None
              and d.latency(g) > k.latency(g)]
    if slower:
        return ("slower in " + ", ".join(f"{g} ({_ms(d.latency(g))} vs {_ms(k.latency(g))})" for g in slower)
                + ": the loop's cost weighs every group")
    if d.error_how != k.error_how:
        return f"its error {d.error_how}, the kept map's {k.error_how}: not the same measure"
    axis_source = lambda p: "measured" if p.measured and ps.axis in p.measured else "predicted"  # noqa: E731
    if axis_source(d) != axis_source(k):
        return f"its {ps.axis} latency {axis_source(d)}, the kept map's {axis_source(k)}"
    return "the loop's cost order (design rules, weighted negative slack, weighted latency) ranked the kept map first"


def front_lines(ps: ParetoSet) -> list[str]:
    """The front's summary, and where the kept map stands on it: on it, or what dominates it and why."""
    flags = ps.on_front()
    plotted = sum(on_axes(p, ps.axis) for p in ps.points)
    lines = [f"Front over ({ps.axis} latency, error): {sum(flags)} of {plotted} points with both "
             f"({len(ps.points) - plotted} without)"]
    if ps.budget is not None:
        over = [p for p in ps.points if p.error is not None and p.error > ps.budget]
        if over:
            lines.append(f"Over the accuracy budget: {len(over)} point{'s' if len(over) != 1 else ''} (the loop never "
                         "keeps one)")
    kept = next(((p, f) for p, f in zip(ps.points, flags) if p.kept), None)
    if kept is None:
        return lines + ["Kept: no point (the loop kept no map)"]
    k, flag = kept
    name = f"{printable(k.label)} ({k.mix})"
    if flag:
        return lines + [f"Kept: {name}, on the front"]
    if not on_axes(k, ps.axis):
        return lines + [f"Kept: {name}, on no front: it has no {ps.axis} latency or no error"]
    doms = [p for p in ps.points if dominates(p, k, ps.axis)]
    lines.append(f"Kept: {name}, off the front: dominated by {len(doms)} point{'s' if len(doms) != 1 else ''}")
    for d in doms[:5]:
        lines.append(f"  {printable(d.label)}: {ps.axis} {_ms(d.latency(ps.axis))} vs {_ms(k.latency(ps.axis))}, "
                     f"error {d.error:.3e} vs {k.error:.3e}; {_why(d, k, ps)}")
    return lines


def time_unit(ps: ParetoSet) -> str:
    """us where every latency is under a millisecond (a toy model's 3 decimals of ms would be 1-2 digits), else ms."""
    values = [v for p in ps.points for v in [*p.predicted.values(), *(p.measured or {}).values()]]
    return "us" if values and max(values) < 1e-3 else "ms"


def report_pareto(ps: ParetoSet) -> str:
    table, unit = pareto_table(ps), time_unit(ps)
    lines = [BANNER_RULE, "Report : pareto", f"        -axis {printable(ps.axis)}"]
    if ps.target:
        lines.append(f"        -target {printable(ps.target)}")
    lines += [f"Design : {printable(ps.design)}", BANNER_RULE, "",
              "Points: each map the compile loop evaluated (loop), the uniform designs on the same tables (uniform), "
              "peers measured by another tool (peer)",
              f"Latency per group, in {unit}: Pred = the library's tables (est); Meas = measured on the target (a measured "
              "re-timing round, a peer's run)",
              f"Error: relative output error (max|out - ref| / max|ref|); est = the cells' errors combined "
              f"({ESTIMATE_RULE}), meas = an end-to-end check",
              "Accuracy budget: " + ("none" if ps.budget is None else f"{ps.budget:.3e}"),
              f"Sensitivity: {printable(ps.sensitivity)}", "",
              table.header(), table.dashes(), *table.lines(unit), "", *front_lines(ps)]
    if ps.notes:
        lines += ["", "Notes:", *(f"  {printable(n)}" for n in ps.notes)]
    return "\n".join(lines) + "\n"


def pareto_json(ps: ParetoSet) -> str:
    """DIR/reports/pareto.json: the set (its points as recorded), which are on the front, and the table's rows."""
    data = {**ps.to_dict(), "front": ps.on_front(), "table": pareto_table(ps).to_dict()}
    return json.dumps(data, indent=1, allow_nan=False) + "\n"


def pareto_rpt(report, design: str | None = None, target: str | None = None) -> str:
    """emit's renderer (softsyn.emit.report_files): the optimize pass's report as pareto.rpt's text."""
    return report_pareto(pareto_set(report, design or "", target or ""))


def pareto_file_json(report, design: str | None = None, target: str | None = None) -> str:
    """emit's renderer: the optimize pass's report as pareto.json's text."""
    return pareto_json(pareto_set(report, design or "", target or ""))


def write_files(ps: ParetoSet, folder: Path) -> list[Path]:
    return [write_atomic(Path(folder) / RPT_FILE, report_pareto(ps)),
            write_atomic(Path(folder) / JSON_FILE, pareto_json(ps))]


def read_pareto(folder: Path) -> ParetoSet:
    """DIR/reports/pareto.json back as a set; a one-line SoftsynError where there is none or it does not read."""
    path = Path(folder) / JSON_FILE
    if not path.is_file():
        raise SoftsynError(f"{path}: no such file; `softsyn compile --effort medium|high|ultra -o {folder}` writes "
                           "it (the compile loop)")
    try:
        return ParetoSet.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SoftsynError(f"{path}: not a readable softsyn pareto file ({exc}); re-run softsyn compile") from None


def with_peers(ps: ParetoSet, peers: list[ParetoPoint], notes: list[str]) -> ParetoSet:
    """The set with its peers replaced by `peers` (a second --peers file replaces the first, never adds to it)."""
    kept = [p for p in ps.points if p.origin != "peer"]
    old = [n for n in ps.notes if not n.startswith("peers: ")]
    missing = [p.label for p in peers if ps.axis not in (p.measured or {})]
    extra = [f"peers: no {ps.axis} latency for {', '.join(missing)}: on no front"] if missing else []
    return dataclasses.replace(ps, points=kept + peers, notes=old + notes + extra)


# ------------------------------------------------------------------------------------------ the page's chart

def pareto_chart(ps: ParetoSet) -> Markup:
    """Error (y, linear from 0) against the axis group's latency (x, ms, linear over the points' span): one mark per
    point with both, by origin (loop: circle, uniform: square, peer: diamond), the front joined in latency order, the
    kept map ringed."""
    flags = ps.on_front()
    shown = [(p.latency(ps.axis), p.error, p, f) for p, f in zip(ps.points, flags) if on_axes(p, ps.axis)]
    title = f"error against {ps.axis} latency (ms): the front joined"
    parts = [Markup('<svg class="chart pareto" viewBox="0 0 {} {}" role="img" aria-label="{}"><title>{}</title>').format(
        W, H, title, title)]
    if not shown:
        return parts[0] + Markup('<text x="{}" y="{}" class="axis" text-anchor="middle">no point with a latency and an '
                                 'error</text></svg>').format(W / 2, H / 2)
    lo, hi = min(v[0] for v in shown), max(v[0] for v in shown)
    pad = 0.08 * ((hi - lo) or hi or 1.0)  # maps a few percent apart stay apart: the x axis spans the points only
    x_lo, x_hi = max(0.0, lo - pad), hi + pad
    y_hi = max(v[1] for v in shown) * 1.08 or 1.0
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B
    x = lambda v: PAD_L + pw * (v - x_lo) / (x_hi - x_lo)  # noqa: E731
    y = lambda v: PAD_T + ph * (1 - v / y_hi)  # noqa: E731
    for t in ticks(x_lo, x_hi):
        parts.append(Markup('<line x1="{x:.1f}" x2="{x:.1f}" y1="{t}" y2="{b}" class="grid"/><text x="{x:.1f}" y="{ty}" '
                            'class="axis" text-anchor="middle">{v:.3g}</text>').format(x=x(t), t=PAD_T, b=PAD_T + ph,
                                                                                      ty=PAD_T + ph + 14, v=t * 1e3))
    for t in ticks(0.0, y_hi):
        parts.append(Markup('<line x1="{l}" x2="{r}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/><text x="{lx}" y="{ty:.1f}" '
                            'class="axis" text-anchor="end">{v:.2g}</text>').format(l=PAD_L, r=PAD_L + pw, y=y(t),
                                                                                   lx=PAD_L - 4, ty=y(t) + 4, v=t))
    if ps.budget is not None and ps.budget <= y_hi:
        parts.append(Markup('<line x1="{l}" x2="{r}" y1="{y:.1f}" y2="{y:.1f}" class="band"><title>accuracy budget {b:.3e}'
                            '</title></line>').format(l=PAD_L, r=PAD_L + pw, y=y(ps.budget), b=ps.budget))
    line = sorted((v[0], v[1]) for v in shown if v[3])
    parts.append(Markup('<polyline points="{}" class="series s0 front"/>').format(
        " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in line)))
    for lat, err, p, flag in shown:
        parts.append(_mark(x(lat), y(err), p, f"{p.label} ({p.origin}{', on the front' if flag else ''}"
                                               f"{', kept' if p.kept else ''}): {ps.axis} {lat * 1e3:.3g} ms, error "
                                               f"{err:.3e} ({p.error_how})"))
    parts.append(Markup('<text x="{}" y="{}" class="axis" text-anchor="middle">{} latency (ms)</text><text x="12" y="{}" '
                        'class="axis" transform="rotate(-90 12 {})" text-anchor="middle">error</text></svg>').format(
        PAD_L + pw / 2, H - 4, ps.axis, PAD_T + ph / 2, PAD_T + ph / 2))
    return Markup("").join(parts)


def _mark(cx: float, cy: float, p: ParetoPoint, text: str) -> Markup:
    """A point's mark: its shape says its origin, a ring the kept map."""
    css = f"pt {p.origin}" + (" meas" if p.measured else " est")
    if p.origin == "uniform":
        shape = Markup('<rect x="{:.1f}" y="{:.1f}" width="7" height="7" class="{}">').format(cx - 3.5, cy - 3.5, css)
        end = Markup("</rect>")
    elif p.origin == "peer":
        corners = " ".join(f"{cx + dx:.1f},{cy + dy:.1f}" for dx, dy in ((0, -5), (5, 0), (0, 5), (-5, 0)))
        shape = Markup('<polygon points="{}" class="{}">').format(corners, css)
        end = Markup("</polygon>")
    else:
        shape, end = Markup('<circle cx="{:.1f}" cy="{:.1f}" r="3.5" class="{}">').format(cx, cy, css), Markup("</circle>")
    ring = Markup('<circle cx="{:.1f}" cy="{:.1f}" r="7" class="kept-ring"/>').format(cx, cy) if p.kept else Markup("")
    return ring + shape + Markup("<title>{}</title>").format(text) + end


def pareto_view(data: dict | None) -> dict | None:
    """report.html's front section from pareto.json's content (None: no section)."""
    if not data:
        return None
    try:
        ps = ParetoSet.from_dict(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise SoftsynError(f"{JSON_FILE}: not a readable softsyn pareto file ({exc}); re-run softsyn compile") from None
    return {"axis": ps.axis, "chart": pareto_chart(ps), "table": pareto_table(ps), "summary": front_lines(ps),
            "notes": ps.notes, "count": len(ps.points), "peers": sum(p.origin == "peer" for p in ps.points)}


__all__ = ["pareto_set", "pareto_table", "report_pareto", "pareto_json", "pareto_rpt", "pareto_file_json", "write_files",
           "read_pareto", "with_peers", "pareto_chart", "pareto_view", "front_lines"]
