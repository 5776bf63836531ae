"""Delay tables: lookup by multilinear interpolation in log space, and the extrapolation rules outside the grid.

A table has one strictly increasing grid per axis (``points``) and its delays flattened row-major (``flat``).

- Inside the grid: multilinear interpolation in log space (log size -> log delay), i.e. piecewise
  power laws between grid points; source "table". Sizes below 1 (e.g. past = 0) count as 1.
- Outside the grid on any axis: source "table-extrap". Above the last grid point the edge
  segment's log-log slope continues (slope floored at 0, so a delay never falls as a size grows);
  below the first grid point, and on an axis with a single grid point, the edge value is held.
  An axis in LINEAR_AXES (batch: independent work) grows linearly above its grid instead.
  Callers and reports should treat "table-extrap" as less trustworthy than "table".

Scale rule (optional `scale: {size: reference}` on a cell): sizes folded out of the table (e.g.
attention's batch and head_dim) scale the work-proportional part of the delay linearly (see
`scaled`); a scaled delay is reported as "table-extrap".
"""
from __future__ import annotations

import bisect
import math
from typing import Any

LINEAR_AXES = ("batch",)  # axes that multiply independent work: linear extrapolation above the grid (lookup)


def flatten(delays: Any, rank: int) -> list[float]:
    """A nested (row-major) table of ``rank`` levels as one flat list."""
    if rank == 0:
        return [delays]
    return [v for sub in delays for v in flatten(sub, rank - 1)]


def lookup(axes: list[str], points: list[list[float]], flat: list[float],
           sizes: dict[str, float]) -> tuple[float, bool]:
    """(delay s, extrapolated?) of the table at `sizes` (must hold every axis)."""
    extrap = False
    # Per axis: the two bracketing grid indices and the weight of the upper one, in log space.
    brackets: list[tuple[int, int, float]] = []
    for axis, grid in zip(axes, points):
        x = math.log(max(float(sizes[axis]), 1.0))
        lg = [math.log(g) for g in grid]
        if len(lg) == 1:
            if abs(x - lg[0]) > 1e-12:
                extrap = True
            brackets.append((0, 0, 0.0))
            continue
        if x < lg[0] - 1e-12:
            extrap = True
            brackets.append((0, 1, 0.0))  # hold the edge value below the grid
            continue
        if x > lg[-1] + 1e-12:
            extrap = True
            i = len(lg) - 2
        else:
            i = min(max(bisect.bisect_right(lg, x) - 1, 0), len(lg) - 2)
        t = (x - lg[i]) / (lg[i + 1] - lg[i])
        brackets.append((i, i + 1, t))
    # Axes that multiply independent work (LINEAR_AXES: batch) above the grid: the table's work above
    # its floor (smallest entry, the fixed per-node cost) grows in proportion to the size,
    #     delay = floor + (edge - floor) * size / edge_size,
    # with `edge` the table at the grid's last point on that axis (ORT CPU loops GEMMs over the batch).
    factor = 1.0
    for a, (axis, grid) in enumerate(zip(axes, points)):
        lo, hi, t = brackets[a]
        if axis in LINEAR_AXES and t > 1.0:
            factor *= max(float(sizes[axis]), 1.0) / grid[-1]
            brackets[a] = (lo, hi, 1.0)
    # Other axes above the grid: the edge segment's slope continues, floored at 0 per axis (a delay
    # never falls as a size grows past the grid).
    for a, (lo, hi, t) in enumerate(brackets):
        if t > 1.0:
            edge = brackets[:a] + [(lo, hi, 1.0)] + brackets[a + 1:]
            if _interp(points, flat, edge) > _interp(points, flat, brackets):
                brackets = edge
    value = _interp(points, flat, brackets)
    if factor != 1.0:
        floor = min(flat)
        value = floor + max(value - floor, 0.0) * factor
    return value, extrap


def outside(axes: list[str], points: list[list[float]], sizes: dict) -> float:
    """How far `sizes` lie outside the grid: the sum over axes of |log(size / nearest grid end)|
    (0: every axis within its grid's range; a single-point axis must match its point)."""
    d = 0.0
    for axis, grid in zip(axes, points):
        x = max(float(sizes[axis]), 1.0)
        if x < grid[0]:
            d += math.log(grid[0] / x)
        elif x > grid[-1]:
            d += math.log(x / grid[-1])
    return d


def scaled(scale: dict[str, float] | None, floor: float, value: float, sizes: dict) -> tuple[float, bool]:
    """Apply a cell's scale rule: (delay, scaled?).

    For each size in `scale` present in `sizes` the work-proportional part of the delay (above the
    table's smallest entry `floor`, its fixed per-node cost) scales linearly with size / reference:
        delay = floor + (table - floor) * prod(sizes[s] / scale[s])
    e.g. attention tables measured at batch 1 and one head_dim serve other batches / head_dims.
    """
    if not scale:
        return value, False
    factor = 1.0
    for k, ref in scale.items():
        if k in sizes and sizes[k] is not None and ref:
            factor *= max(float(sizes[k]), 1.0) / float(ref)
    if abs(factor - 1.0) < 1e-12:
        return value, False
    return floor + max(value - floor, 0.0) * factor, True


def _interp(points: list[list[float]], flat: list[float], brackets: list[tuple[int, int, float]]) -> float:
    """Multilinear interpolation of log(delay) over the 2^d corners of the bracketing cell."""
    strides = []
    s = 1
    for grid in reversed(points):
        strides.append(s)
        s *= len(grid)
    strides.reverse()
    logd = 0.0
    for corner in range(1 << len(brackets)):
        w = 1.0
        idx = 0
        for a, (lo, hi, t) in enumerate(brackets):
            if corner >> a & 1:
                w *= t
                idx += hi * strides[a]
            else:
                w *= 1.0 - t
                idx += lo * strides[a]
        if w != 0.0:
            logd += w * math.log(flat[idx])
    return math.exp(logd)
