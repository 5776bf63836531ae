"""report_timing: the DC / PrimeTime path report, with optional folding by hierarchy."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from softsyn.timing import Analysis, PathPoint, TimingPath
from reports.columns import TIMING_COLUMNS
from reports.common import banner_lines, ftime, indexed_scope, is_unconstrained, render, table_header, table_row
from reports.advice import Facts, analysis_facts
from reports.suggest import timing_suggestions


@dataclass
class Row:
    """One row of the path table: a cell, a folded block of repeated scopes, or a clock/port line."""

    point: str
    cell: str = ""
    incr: float | None = None  # s
    path: float | None = None  # s
    folded: int = 0  # number of repeated blocks collapsed into this row (0: not folded)
    cells: int = 1  # path points behind this row

    def to_dict(self) -> dict:
        return asdict(self)


def point_row(p: PathPoint) -> Row:
    cell = f"{p.cell} ({p.source})" if p.source else p.cell
    return Row(point=p.name, cell=cell, incr=p.incr, path=p.arrival)


def fold_points(points: list[PathPoint]) -> list[Row]:
    """Collapse consecutive points under a repeated indexed scope into one row per run.

    A point's scope is repeated-indexed when its hierarchy has a ``<prefix>.<int>``
    component (``model.layers.7.mlp`` -> prefix ``model.layers``). Consecutive points
    with the same prefix form a run; a run spanning two or more indices becomes
    ``model.layers.* (x28, folded)`` with the summed Incr and the Path of its last
    point. Other runs of three or more consecutive points in one scope (the
    embedding prelude, the final norm) become ``model.rotary_emb/* (7 cells)``;
    shorter runs stay as they are.
    """
    rows: list[Row] = []
    i = 0
    while i < len(points):
        scope = indexed_scope(points[i].hierarchy)
        if scope is None:
            j = i
            while j < len(points) and points[j].hierarchy == points[i].hierarchy and \
                    indexed_scope(points[j].hierarchy) is None:
                j += 1
            rows.extend(_fold_scope(points[i:j]))
            i = j
            continue
        prefix = scope[0]
        j = i
        indices: list[int] = []
        while j < len(points):
            s = indexed_scope(points[j].hierarchy)
            if s is None or s[0] != prefix:
                break
            if s[1] not in indices:
                indices.append(s[1])
            j += 1
        run = points[i:j]
        if len(indices) >= 2:
            rows.append(Row(point=f"{prefix}.* (x{len(indices)}, folded)", cell=f"{len(run)} cells",
                            incr=sum(p.incr for p in run), path=run[-1].arrival,
                            folded=len(indices), cells=len(run)))
        else:
            rows.extend(point_row(p) for p in run)
        i = j
    return rows


def _fold_scope(run: list[PathPoint]) -> list[Row]:
    if len(run) < 3:
        return [point_row(p) for p in run]
    name = f"{run[0].hierarchy or '(top)'}/* ({len(run)} cells, folded)"
    return [Row(point=name, cell=f"{len(run)} cells", incr=sum(p.incr for p in run), path=run[-1].arrival,
                cells=len(run))]


def path_rows(path: TimingPath, fold: bool = False) -> dict[str, list[Row]]:
    """The launch (arrival) and capture (required) halves of a path as rows, in SI units."""
    launch = [
        Row(f"clock {path.group} (rise edge)", incr=0.0, path=0.0),
        Row("clock network delay (ideal)", incr=0.0, path=0.0),
        Row("input external delay", incr=path.input_delay, path=path.input_delay),
        Row(f"{path.startpoint} (in)", incr=0.0, path=path.input_delay),
    ]
    launch += fold_points(path.points) if fold else [point_row(p) for p in path.points]
    launch.append(Row(f"{path.endpoint} (out)", incr=0.0, path=path.arrival))
    launch.append(Row("data arrival time", path=path.arrival))
    if is_unconstrained(path.clock_period):
        return {"launch": launch, "capture": []}
    period = path.clock_period
    capture = [
        Row(f"clock {path.group} (rise edge)", incr=period, path=period),
        Row("clock network delay (ideal)", incr=0.0, path=period),
        Row("clock uncertainty", incr=-path.clock_uncertainty, path=period - path.clock_uncertainty),
        Row("output external delay", incr=-path.output_delay, path=path.required),
        Row("data required time", path=path.required),
    ]
    return {"launch": launch, "capture": capture}


def text_row(row: Row, unit: str, digits: int) -> list[str]:
    values = {"point": row.point, "cell": row.cell,
              "incr": None if row.incr is None else ftime(row.incr, unit, digits),
              "path": None if row.path is None else ftime(row.path, unit, digits)}
    return table_row(TIMING_COLUMNS, values)


def path_lines(path: TimingPath, fold: bool, unit: str, digits: int) -> dict:
    """One path as timing.j2 prints it: its launch and capture rows, the footer and the slack line, as text."""
    halves = path_rows(path, fold)
    unconstrained = is_unconstrained(path.clock_period) or is_unconstrained(path.slack)
    return {
        "path": path,
        "launch": [line for r in halves["launch"] for line in text_row(r, unit, digits)],
        "capture": [line for r in halves["capture"] for line in text_row(r, unit, digits)],
        "footer": [] if unconstrained else [
            *text_row(Row("data required time", path=path.required), unit, digits),
            *text_row(Row("data arrival time", path=-path.arrival), unit, digits),
        ],
        "slack": None if unconstrained else text_row(
            Row(f"slack ({'MET' if path.met else 'VIOLATED'})", path=path.slack), unit, digits),
    }


def select_paths(paths: list[TimingPath], max_paths: int, nworst: int) -> list[TimingPath]:
    """Up to max_paths paths, worst first, at most nworst per endpoint."""
    out: list[TimingPath] = []
    per_endpoint: dict[str, int] = {}
    for p in paths:
        if len(out) >= max_paths:
            break
        if per_endpoint.get(p.endpoint, 0) >= nworst:
            continue
        per_endpoint[p.endpoint] = per_endpoint.get(p.endpoint, 0) + 1
        out.append(p)
    return out


def report_timing(analysis: Analysis, group: str | None = None, max_paths: int = 1, fold: bool = False,
                  significant_digits: int = 3, nworst: int = 1, time_unit: str = "ms", facts: Facts | None = None) -> str:
    """PrimeTime-style `report_timing -path full -delay max` of each group's worst paths; `facts`: what the
    suggestions agree with (reports.advice; from the analysis alone when not given)."""
    groups = [analysis.group(group)] if group else list(analysis.groups)
    unit, digits = time_unit, significant_digits
    options = ["-path full", "-delay max", f"-max_paths {max_paths}"]
    if nworst != 1:
        options.append(f"-nworst {nworst}")
    if group:
        options.append(f"-group {group}")
    if fold:
        options.append("-fold")
    if digits != 3:
        options.append(f"-significant_digits {digits}")
    scenarios = [g.scenario.description for g in groups]
    header = table_header(TIMING_COLUMNS, unit)
    rule = "-" * len(header)
    sections = []
    for g in groups:
        sections.append({"group": g, "paths": [path_lines(p, fold, unit, digits)
                                               for p in select_paths(g.paths, max_paths, nworst)]})
    return render("timing.j2", banner=banner_lines("timing", analysis, options, scenarios),
                  sections=sections, header=header, rule=rule,
                  suggestions=timing_suggestions(groups, unit, digits, facts=facts or analysis_facts(analysis)))
