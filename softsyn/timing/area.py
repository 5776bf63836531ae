"""Area = VRAM: weights by dtype + KV cache at the workload + activation/workspace peak.

Weights come from the initializers' shapes and dtypes (their data is never
read). The KV cache is the netlist's past-KV inputs bound at the workload's
batch x concurrency and context length. The activation peak replays execution
order per scenario and tracks the bytes of live intermediate tensors (freed
after their last consumer), the way a caching allocator holds them.
"""
from __future__ import annotations

import re
from collections import defaultdict

import onnx_ir as ir

from softsyn.constraints import Constraints
from softsyn.netlist import Netlist
from softsyn.timing.cost import PRECISION_BY_DTYPE, numel, value_bytes
from softsyn.timing.results import AreaItem, AreaResult

_INDEXED = re.compile(r"\.(\d+)(?=\.|$)")


def weight_items(netlist: Netlist, depth: int = 4) -> tuple[list[AreaItem], list[AreaItem], int]:
    """Weights by precision and by hierarchy (the scope of each initializer's first consumer).

    Parameters are the float and quantised initializers; integer and bool
    initializers (shape and index constants) are counted apart as constants.
    """
    by_dtype: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    by_scope: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    parameters = 0
    for value in netlist.model.graph.initializers.values():
        if value.dtype is None or value.shape is None:
            continue
        count = numel(tuple(value.shape.numpy()))
        size = count * value.dtype.itemsize
        precision = PRECISION_BY_DTYPE.get(value.dtype)
        kind = f"weights {precision}" if precision else "constants"
        by_dtype[kind][0] += size
        by_dtype[kind][1] += count
        if not precision:
            continue
        parameters += count
        consumers = value.uses()
        scope = netlist.hierarchy(consumers[0].node) if consumers else "(unused)"
        scope = ".".join(scope.split(".")[:depth]) or "(top)"
        by_scope[scope][0] += size
        by_scope[scope][1] += count
    kinds = [AreaItem(kind, b, int(n), "elements" if kind == "constants" else "parameters")
             for kind, (b, n) in sorted(by_dtype.items(), key=lambda kv: kv[0] == "constants")]
    scopes = [AreaItem(scope, b, int(n), "parameters") for scope, (b, n) in sorted(by_scope.items(), key=_scope_key)]
    return kinds, scopes, parameters


def _scope_key(item):
    # model.layers.10 after model.layers.9
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", item[0])]


def kv_cache_inputs(netlist: Netlist) -> list[ir.Value]:
    """Graph inputs that carry cached keys/values: those with a `past` dimension."""
    return [v for v in netlist.model.graph.inputs
            if v.shape is not None and any(str(d) == "past" for d in v.shape)]


def kv_cache_item(netlist: Netlist, constraints: Constraints) -> AreaItem | None:
    kv_inputs = kv_cache_inputs(netlist)
    if not kv_inputs:
        return None
    w = constraints.workload
    length = constraints.kv_cache.max_length or max(w.context_len, w.prompt_len)
    batch = w.batch * w.concurrency
    dims = {"batch": batch, "past": length, "seq": 1, **{d: 1 for d in netlist.symbolic_dims() - {"batch", "past", "seq"}}}
    shapes = netlist.bind(dims)
    total = sum(value_bytes(v, shapes) for v in kv_inputs)
    dtype = kv_inputs[0].dtype.name.lower()
    detail = (f"{len(kv_inputs)} tensors ({dtype}) x batch {w.batch} x concurrency {w.concurrency} "
              f"x {length} tokens")
    return AreaItem("kv_cache", total, len(kv_inputs), detail)


def activation_peak(netlist: Netlist, shapes: dict) -> float:
    """Peak bytes of live intermediate tensors in execution order (weights and inputs excluded)."""
    nodes = netlist.nodes()
    last_use: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for v in node.inputs:
            if v is not None:
                last_use[v.name] = i
    graph_outputs = {v.name for v in netlist.model.graph.outputs}
    live = peak = 0.0
    frees: dict[int, float] = defaultdict(float)
    for i, node in enumerate(nodes):
        for out in node.outputs:
            size = value_bytes(out, shapes)
            live += size
            if out.name not in graph_outputs:
                frees[last_use.get(out.name, i)] += size
        peak = max(peak, live)
        live -= frees.pop(i, 0.0)
    return peak


def area(netlist: Netlist, constraints: Constraints, scenario_shapes: dict[str, dict]) -> AreaResult:
    """`scenario_shapes`: group name -> bound shapes, for the activation peak."""
    kinds, scopes, parameters = weight_items(netlist)
    kv = kv_cache_item(netlist, constraints)
    if kv is not None:
        kinds.append(kv)
    worst_group, worst_peak = "", 0.0
    for name, shapes in scenario_shapes.items():
        peak = activation_peak(netlist, shapes)
        if peak >= worst_peak:
            worst_group, worst_peak = name, peak
    kinds.append(AreaItem("activations (peak)", worst_peak, 0, f"live intermediates, {worst_group} scenario"))
    return AreaResult(
        by_kind=kinds, by_hierarchy=scopes, total=sum(k.bytes for k in kinds), limit=constraints.area_constraint,
        parameters=parameters, kv_detail=kv.detail if kv else "no KV cache", activation_scenario=worst_group)
