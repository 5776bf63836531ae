"""The path groups of the report page (reports.html): clock vs arrival as bars, the critical path as a
waterfall by hierarchy as timing.rpt folds it (fold_points), folded layers opening to a row per layer and then to
their cells, each coloured by op kind and marked with its delay's source."""
from __future__ import annotations

from reports.columns import TIMING_COLUMNS
from reports.common import Table, indexed_scope, is_unconstrained
from reports.html_table import t, table_html
from reports.svg import Segment, lane, op_kind
from reports.timing import fold_points

SOURCE_MARK = {"annot": "measured", "table": "(table)", "table-extrap": "(table-extrap)", "est": "(est)"}


def path_status(path) -> str:
    if is_unconstrained(path.clock_period) or is_unconstrained(path.slack):
        return "unconstrained"
    return "MET" if path.met else "VIOLATED"


def _segment(p, offset: float = 0.0) -> Segment:
    """A cell on the waterfall's axis, which starts at the first cell (`offset`: the input delay, drawn apart)."""
    mark = SOURCE_MARK.get(p.source, f"({p.source})")
    return Segment(p.arrival - p.incr - offset, p.incr, f"op-{op_kind(p.op_type)}",
                   f"{p.name} {p.cell} {mark}: {t(p.incr)}")


def waterfall(path) -> list[dict]:
    """The critical path as timing.rpt folds it (fold_points), each folded row with the cells behind it; on the
    cells' own span (the input delay is drawn apart, on its own row: it would take most of a decode step's
    scale; the clock is on the bars above), so short cells stay visible."""
    off = path.input_delay
    scale = path.arrival - off
    rows, i = [], 0
    rows.append({"name": "input external delay", "incr": off, "path": off, "members": [], "apart": True,
                 "lane": lane([Segment(0.0, 1.0, "io apart", f"input delay {t(off)}, drawn apart")], 1.0,
                              "input external delay, drawn apart"), "mark": "drawn apart", "op": "io"})
    for row in fold_points(path.points):
        members = path.points[i:i + row.cells]
        i += row.cells
        cells = [_cell_row(p, scale, off) for p in members]
        single = len(members) == 1
        rows.append({"name": row.point, "incr": row.incr, "path": row.path, "members": [] if single else cells,
                     "layers": _layers(members, scale, off) if row.folded else [],
                     "lane": lane([_segment(p, off) for p in members], scale, f"{row.point}: {t(row.incr)}", titled=single),
                     "mark": cells[0]["mark"] if single else _marks(members), "op": cells[0]["op"] if single else "",
                     "cell": row.cell})
    return rows


def _cell_row(p, scale: float, offset: float) -> dict:
    return {"name": p.name, "cell": p.cell, "op": op_kind(p.op_type), "incr": p.incr, "path": p.arrival,
            "mark": SOURCE_MARK.get(p.source, f"({p.source})"), "lane": lane([_segment(p, offset)], scale, "", titled=False)}


def _layers(points, scale: float, offset: float) -> list[dict]:
    """A folded run of repeated scopes opened one level: a row per index (model.layers.3), its cells inside."""
    out: list[dict] = []
    for p in points:
        scope = indexed_scope(p.hierarchy)
        name = f"{scope[0]}.{scope[1]}"
        if not out or out[-1]["name"] != name:
            out.append({"name": name, "points": []})
        out[-1]["points"].append(p)
    return [{"name": f"{layer['name']} ({len(layer['points'])} cells)", "incr": sum(p.incr for p in layer["points"]),
             "path": layer["points"][-1].arrival, "mark": _marks(layer["points"]),
             "lane": lane([_segment(p, offset) for p in layer["points"]], scale, layer["name"], titled=False),
             "members": [_cell_row(p, scale, offset) for p in layer["points"]]} for layer in out]


def _marks(points) -> str:
    """How many of a folded row's cells are measured tables, estimates, back-annotated."""
    counts: dict[str, int] = {}
    for p in points:
        mark = SOURCE_MARK.get(p.source, f"({p.source})").strip("()")
        counts[mark] = counts.get(mark, 0) + 1
    return ", ".join(f"{n} {mark}" for mark, n in sorted(counts.items()))


def clock_bars(path) -> dict:
    """Clock vs arrival: the required time with what the budget takes off the period, and the arrival
    as input delay + cells."""
    unconstrained = is_unconstrained(path.clock_period)
    scale = path.arrival if unconstrained else max(path.arrival, path.clock_period)
    arrival = lane([Segment(0.0, path.input_delay, "io", f"input delay {t(path.input_delay)}"),
                    Segment(path.input_delay, path.arrival - path.input_delay, "arrival-cells",
                            f"cells {t(path.arrival - path.input_delay)}")], scale, f"arrival {t(path.arrival)}")
    if unconstrained:
        return {"clock": None, "arrival": arrival}
    required = path.required
    clock = lane([Segment(0.0, required, "required", f"required {t(required)}"),
                  Segment(required, path.output_delay, "io", f"output delay {t(path.output_delay)}"),
                  Segment(required + path.output_delay, path.clock_uncertainty, "uncertainty",
                          f"uncertainty {t(path.clock_uncertainty)}")], scale, f"clock {t(path.clock_period)}")
    return {"clock": clock, "arrival": arrival}


def path_table(path) -> Table:
    """The launch half as timing.rpt prints it (folded), as a table: the waterfall's text alternative."""
    rows = [{"point": r.point, "cell": r.cell, "incr": r.incr, "path": r.path} for r in fold_points(path.points)]
    return Table(TIMING_COLUMNS, tuple(rows))


def group_sections(analysis) -> list[dict]:
    """One section per path group: its critical path's bars, waterfall and table."""
    out = []
    for g in analysis.groups:
        if not g.paths:
            out.append({"name": g.name, "scenario": g.scenario.description, "path": None})
            continue
        p = g.critical
        out.append({"name": g.name, "scenario": g.scenario.description, "path": p, "status": path_status(p),
                     "bars": clock_bars(p), "waterfall": waterfall(p),
                     "table": table_html(path_table(p), f"{g.name}: critical path {p.startpoint} to {p.endpoint}"),
                     "slack": None if is_unconstrained(p.slack) else p.slack})
    return out
