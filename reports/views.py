"""The report page's engineering views (reports.html), each a chart and the table of its numbers (columns from
reports.columns, SI rows): time per op type, a roofline, the kernel timeline of a signed-off step, a slack
histogram per group, and the compile's first and last step side by side.

Every figure is one the result objects hold or a ratio of two of them (a cell's FLOPs over its delay); the
predicted rates are estimates and say so; what was not measured is said, never drawn.
"""
from __future__ import annotations

from collections import defaultdict

from softsyn.errors import SoftsynError
from softsyn.library import load_library
from reports.columns import OP_TIME_COLUMNS, ROOFLINE_COLUMNS, CEILING_COLUMNS, SLACK_BIN_COLUMNS, TIMELINE_COLUMNS
from reports.common import Table, fpercent, is_unconstrained
from reports.html_table import t, table_html
from reports.svg import Segment, hbars, histogram, lane, op_kind, roofline_chart

MEASURED = ("exact", "fused-anchor")  # profile matches that carry a kernel time of their own


def _spread(values) -> bool:
    """Whether positive values differ by more than two orders of magnitude (then a log axis)."""
    shown = [v for v in values if v > 0]
    return len(shown) > 1 and max(shown) / min(shown) > 100


# ------------------------------------------------------------------------------------------ time per op type

def op_time(analysis) -> list[dict]:
    """Per group: its critical path's cell time summed by op type, largest first."""
    out = []
    for g in analysis.groups:
        if not g.paths:
            continue
        acc: dict[str, list] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
        for p in g.critical.points:
            row = acc[p.op_type or p.cell.split(".")[0]]
            row[0] += 1
            row[1] += p.incr
            row[2] += p.flops
            row[3] += p.bytes
        total = sum(r[1] for r in acc.values()) or 1.0
        rows = tuple({"op": op, "cells": r[0], "time": r[1], "share": r[1] / total, "flops": r[2] or None,
                      "bytes": r[3] or None} for op, r in sorted(acc.items(), key=lambda kv: (-kv[1][1], kv[0])))
        log = _spread(r["time"] for r in rows)
        chart = hbars([(r["op"], r["time"], f"op-{op_kind(r['op'])}", t(r["time"])) for r in rows],
                      f"{g.name}: time per op type on the critical path", log=log)
        out.append({"name": g.name, "chart": chart, "log": log,
                    "table": table_html(Table(OP_TIME_COLUMNS, rows), f"{g.name}: time per op type (predicted)")})
    return out


# ------------------------------------------------------------------------------------------ roofline

def ceilings(analysis):
    """(the library's Ceilings, None) or (None, why not)."""
    try:
        return load_library(analysis.library).ceilings, None
    except (SoftsynError, OSError, ValueError) as exc:
        return None, f"the library {analysis.library} is not readable here ({exc}): no ceilings to draw"


def _precision(cell: str) -> str:
    parts = cell.split(".")
    return parts[1] if len(parts) > 1 else "fp32"


def _profiled(result, group: str) -> dict:
    """instance -> profiled kernel time (s) of a signed-off group's cells; {} without a sign-off."""
    sg = next((x for x in result.groups if x.name == group), None) if result is not None else None
    return {c.instance: c.measured for c in sg.cells if c.match in MEASURED and c.measured > 0} if sg else {}


def roofline(analysis, result=None) -> dict:
    """Each cell of each group's critical path with FLOPs and bytes: achieved FLOP/s and bytes/s from its predicted
    delay (an estimate), and after a sign-off from its profiled kernel time too, against the library's memory
    bandwidth and peak FLOP/s per precision."""
    ceil, why = ceilings(analysis)
    if ceil is None:
        return {"why": why, "groups": []}
    peaks = {p: v for p, v in ceil.peak_flops.items() if v}
    groups = []
    for g in analysis.groups:
        if not g.paths:
            continue
        profiled = _profiled(result, g.name)
        rows, points = [], []
        for p in g.critical.points:
            if p.incr <= 0 or not (p.flops or p.bytes):
                continue
            intensity = p.flops / p.bytes if p.bytes else None
            peak = peaks.get(_precision(p.cell)) or peaks.get("fp32")
            roof = min(x for x in (peak, intensity * ceil.memory_bandwidth if intensity is not None else None) if x) \
                if (peak or intensity is not None) else None
            rate = p.flops / p.incr
            kernel = profiled.get(p.name)
            measured_rate = p.flops / kernel if kernel and p.flops else None
            rows.append({"name": p.name, "op": p.op_type, "time": p.incr, "source": p.source,
                         "intensity": intensity, "flops_rate": rate or None, "bytes_rate": p.bytes / p.incr or None,
                         "roof": rate / roof if roof and rate else None, "measured": kernel,
                         "measured_rate": measured_rate})
            if intensity and rate:
                points.append((intensity, rate, f"est op-{op_kind(p.op_type)}",
                               f"{p.name} ({p.source}, predicted): {rate:.3g} FLOP/s at {intensity:.3g} FLOP/byte"))
            if intensity and measured_rate:
                points.append((intensity, measured_rate, f"meas op-{op_kind(p.op_type)}",
                               f"{p.name} (profiled): {measured_rate:.3g} FLOP/s at {intensity:.3g} FLOP/byte"))
        rows.sort(key=lambda r: -r["time"])
        groups.append({"name": g.name, "count": len(rows), "plotted": sum(1 for r in rows if r["intensity"]
                                                                            and r["flops_rate"]),
                       "measured": bool(profiled),
                       "chart": roofline_chart(points, ceil.memory_bandwidth, peaks,
                                               f"{g.name}: roofline of the critical path's cells (estimates)"),
                       "table": table_html(Table(ROOFLINE_COLUMNS, tuple(rows)), f"{g.name}: achieved rates per cell, "
                                           "from the predicted delays (estimates), slowest first")})
    ceiling_rows = [{"ceiling": "memory bandwidth", "value": ceil.memory_bandwidth, "unit": "B/s"}]
    ceiling_rows += [{"ceiling": f"peak {p}", "value": v, "unit": "FLOP/s"} for p, v in peaks.items()]
    return {"why": None, "groups": groups,
            "ceilings": table_html(Table(CEILING_COLUMNS, tuple(ceiling_rows)), f"ceilings of {analysis.library}")}


# ------------------------------------------------------------------------------------------ kernel timeline

def timeline(analysis, result) -> list[dict]:
    """Per signed-off group: the predicted cells on the path (start = arrival - delay, after the input delay) and
    the profiled kernels of the same cells laid end to end in the path's order (the profile holds per-node
    durations, not start times); "not measured" where the profile holds no kernel time."""
    out = []
    for sg in result.groups:
        g = next((x for x in analysis.groups if x.name == sg.name and x.paths), None)
        measured = {c.instance: c for c in sg.cells if c.match in MEASURED and c.measured > 0}
        if g is None:
            continue
        path = g.critical
        start, rows, predicted, kernels = 0.0, [], [], []
        for p in path.points:
            at = p.arrival - p.incr - path.input_delay
            predicted.append(Segment(at, p.incr, f"op-{op_kind(p.op_type)}", f"{p.name}: {t(p.incr)} (predicted)"))
            cell = measured.get(p.name)
            if cell is not None:
                kernels.append(Segment(start, cell.measured, f"op-{op_kind(p.op_type)}",
                                       f"{p.name}: {t(cell.measured)} (profiled)"))
                rows.append({"instance": p.name, "op": p.op_type, "start": start, "predicted": p.incr,
                             "measured": cell.measured})
                start += cell.measured
        if not rows:
            out.append({"name": sg.name, "measured": False})
            continue
        scale = max(start, path.arrival - path.input_delay)
        out.append({"name": sg.name, "measured": True, "cells": len(rows), "kernel_sum": start,
                    "median": sg.measured_median, "residual": sg.measured_median - start,
                    "predicted": lane(predicted, scale, f"{sg.name}: predicted cells", titled=len(predicted) < 400),
                    "profiled": lane(kernels, scale, f"{sg.name}: profiled kernels", titled=len(kernels) < 400),
                    "table": table_html(Table(TIMELINE_COLUMNS, tuple(rows)), f"{sg.name}: kernels in the path's "
                                        "order, profiled end to end")})
    return out


# ------------------------------------------------------------------------------------------ slack histogram

def slack_bins(slacks: list[float], count: int = 8) -> list[tuple[float, float, int]]:
    lo, hi = min(slacks), max(slacks)
    if hi - lo <= 0:  # one value: a bin 2 % of it wide, so it draws as a column
        half = max(abs(lo) * 0.01, 1e-6)
        return [(lo - half, hi + half, len(slacks))]
    n = min(count, len(slacks))
    width = (hi - lo) / n
    bins = [[lo + i * width, lo + (i + 1) * width, 0] for i in range(n)]
    for s in slacks:
        bins[min(int((s - lo) / width), n - 1)][2] += 1
    return [tuple(b) for b in bins]


def slack_histogram(analysis) -> list[dict]:
    """Per constrained group: its timed paths' slacks (one per endpoint timed), binned."""
    out = []
    for g in analysis.groups:
        slacks = [p.slack for p in g.paths if not is_unconstrained(p.slack)]
        if not slacks:
            continue
        bins = slack_bins(slacks)
        rows = tuple({"low": lo, "high": hi, "paths": n} for lo, hi, n in bins)
        out.append({"name": g.name, "paths": len(slacks), "violating": sum(1 for s in slacks if s < 0),
                    "chart": histogram(bins, f"{g.name}: slack per timed path", fmt=lambda v: f"{v * 1e3:.3g}"),
                    "table": table_html(Table(SLACK_BIN_COLUMNS, rows), f"{g.name}: timed paths per slack bin")})
    return out


# ------------------------------------------------------------------------------------------ before / after

def before_after(log: dict | None) -> dict | None:
    """The compile log's first row (the design as read) and its last (as emitted), side by side: their rows with
    the log's own columns, and per measure a pair of bars on that measure's own axis."""
    if not log or len(log.get("rows") or []) < 2:
        return None
    table = Table.from_dict(log)
    first, last = table.rows[0], table.rows[-1]
    pairs = []
    for key, title, fmt in (("wns", "worst negative slack", t), ("tns", "total negative slack", t),
                            ("area", "area (VRAM)", lambda v: f"{v / 1e6:.2f} MB"), ("cells", "cells", lambda v: f"{v:g}")):
        a, b = first.get(key), last.get(key)
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            continue
        pairs.append({"title": title, "chart": hbars([(first["phase"], abs(a), "before", fmt(a)),
                                                      (last["phase"], abs(b), "after", fmt(b))], f"{title}: before, after"),
                      "change": f"after - before {'+' if b >= a else ''}{fmt(b - a)}"
                      + (f" ({fpercent((b - a) / abs(a))})" if a else "")})
    return {"table": table_html(Table(table.columns, (first, last)), "before (as read) and after (as emitted)"),
            "pairs": pairs, "first": first["phase"], "last": last["phase"]}


__all__ = ["op_time", "roofline", "timeline", "slack_histogram", "before_after", "slack_bins", "ceilings"]
