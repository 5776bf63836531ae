"""The tensor-parallel plan of a Design: per degree N, one device's VRAM and each group's critical arrival.

Every degree that divides the query heads, up to parallel.devices, is partitioned (softsyn.timing.tp) and
timed like the design itself, its cells at their per-device shapes from the target library plus the
collectives on the path from the collective library; its VRAM is weights + KV cache + workspace of one
device, checked against area_constraint (a per-device limit). The smallest degree that fits is reported;
`--tp auto` analyses the design at it.
"""
from __future__ import annotations

from softsyn.library.collectives import COLLECTIVE_OPS
from softsyn.timing.area import activation_peak, kv_cache_item, weight_items
from softsyn.results.analysis import TPPlan, TPRow
from softsyn.timing.sta import TimingRequest, time_group
from softsyn.timing.tp import TPError, check_degree, partition, valid_degrees


def _fail(design, message: str) -> Exception:
    """A bad degree names where it was given: --tp on the command line, else parallel.tensor in the file."""
    if design.tp_from_cli:
        return TPError(f"--tp {design.tp_request}: {message}")
    return design.constraints.error("parallel.tensor", message)


def partition_at(design, n: int):
    shapes = design.netlist.bind(design.groups[0].scenario.dims)
    try:
        return partition(design.netlist, n, shapes, design.constraints.parallel.devices,
                         design.constraints.parallel.weights)
    except TPError as exc:
        raise _fail(design, str(exc)) from None


def row(design, n: int) -> TPRow:
    """Degree `n`: one device's VRAM and every group timed at its partition."""
    part = partition_at(design, n)
    netlist, share = design.netlist, part.share
    kinds, _, _ = weight_items(netlist, share=share, recast=part.recast)
    kv = kv_cache_item(netlist, design.constraints, share)
    workspace = max((activation_peak(netlist, netlist.bind(g.scenario.dims), share) for g in design.groups),
                    default=0.0)
    weights, kv_bytes = sum(k.bytes for k in kinds), kv.bytes if kv else 0.0
    total = weights + kv_bytes + workspace
    limit = design.constraints.area_constraint
    absorbed = design.runtime_view.absorbed if design.runtime_view is not None else frozenset()
    arrival, moved = {}, {}
    for group in design.groups:
        request = TimingRequest(absorbed=absorbed, partition=part, collectives=design.collectives)
        timing = time_group(netlist, design.graph, design.library, design.constraints, group, request)
        arrival[group.name] = timing.critical.arrival
        moved[group.name] = sum(p.incr for p in timing.critical.points if p.op_type in COLLECTIVE_OPS)
    return TPRow(n=n, weights=weights, kv_cache=kv_bytes, workspace=workspace, total=total,
                 fits=None if limit is None else total <= limit, arrival=arrival, collective_time=moved,
                 collectives=sum(len(m) for m in part.collectives.values()), kv_heads_per_device=part.kv_per_device)


def plan(design) -> TPPlan:
    request, devices = design.tp_request, design.constraints.parallel.devices
    try:
        heads, kv_heads, experts = check_degree(design.netlist, request if isinstance(request, int) else 1,
                                                max(devices, request if isinstance(request, int) else 1))
    except TPError as exc:
        raise _fail(design, str(exc)) from None
    degrees = valid_degrees(heads, max(devices, request if isinstance(request, int) else 1))
    rows = [row(design, n) for n in degrees]
    fitting = [r.n for r in rows if r.fits]
    smallest = min(fitting) if fitting else None
    n = request if isinstance(request, int) else (smallest or degrees[-1])
    return TPPlan(n=n, heads=heads, kv_heads=kv_heads, experts=experts, devices=devices,
                  limit=design.constraints.area_constraint, smallest_fit=smallest,
                  collectives=design.collectives.describe(), layout=partition_at(design, n).describe(),
                  weights=design.constraints.parallel.weights, rows=rows)
