"""Area = VRAM: weights by dtype + KV cache at the workload + activation/workspace peak.

Weights come from the initializers' shapes and dtypes (their data is never
read). The KV cache is the netlist's past-KV inputs at the workload's
batch x concurrency and KV length (kv_cache.max_length, else the context).
The activation peak replays execution order per scenario and tracks the bytes
of live intermediate tensors (freed after their last consumer), the way a
caching allocator holds them.

The KV budget is what area_constraint leaves for the KV cache once the weights
and the workspace (the activation peak) are placed: its bytes per token come
from the past-KV inputs' shapes, never from a config, so any architecture
works. Concurrent sequences share the workspace of one run at the workload's
batch (the timed scenarios); the workspace does grow with the context, so the
largest context re-binds the scenarios that read the cache at a longer one and
measures that growth (a chord of the convex peak: the answer fits).
"""
from __future__ import annotations

import math
import re
from collections import defaultdict

import onnx_ir as ir

from softsyn.constraints import KV_DTYPES, Constraints
from softsyn.netlist import Netlist
from softsyn.netlist.dims import eval_dim_expr
from softsyn.netlist.keys import STATE_PORT
from softsyn.timing.cost import PRECISION_BY_DTYPE, numel, value_bytes
from softsyn.results.analysis import AreaItem, AreaResult, KVBudget, KVOption, WeightOption, WorkspacePoint
from softsyn.timing.realised import weight_storage

_INDEXED = re.compile(r"\.(\d+)(?=\.|$)")


def weight_items(netlist: Netlist, depth: int = 4, share: dict[str, float] | None = None,
                 recast: dict[str, str] | None = None) -> tuple[list[AreaItem], list[AreaItem], int]:
    """Weights by precision and by hierarchy (the scope of each initializer's first consumer); `share`: the
    part of each named tensor one device holds (softsyn.timing.tp), 1 for those it does not name; `recast`:
    tensors counted at another precision's WEIGHT_BYTES (a what-if: "weights int4 (est)").

    Parameters are the float and quantised initializers, labelled and counted as the cells reading them store
    them (softsyn.timing.realised: a MatMulNBits weight is int4/int8 by its `bits`, K x N parameters, its scales
    in its bytes); integer and bool initializers (shape and index constants) are counted apart as constants.
    """
    by_dtype: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    by_scope: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    parameters = 0
    for value in netlist.model.graph.initializers.values():
        if value.dtype is None or value.shape is None:
            continue
        part = share.get(value.name, 1.0) if share else 1.0
        stored = numel(tuple(value.shape.numpy())) * part
        size = stored * value.dtype.itemsize
        storage = weight_storage(value)  # labelled as its cell stores it: a packed int4 weight is int4, K x N
        precision = storage.precision
        count = storage.parameters * part if precision else stored
        kind = f"weights {precision}" if precision else "constants"
        if recast and value.name in recast:
            precision = recast[value.name]
            size, kind = count * WEIGHT_BYTES[precision], f"weights {precision} (est)"
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
    return kinds, scopes, int(parameters)


def _scope_key(item):
    # model.layers.10 after model.layers.9
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", item[0])]


# Extra workspace points measured to tighten the largest context (each a re-bind of the cache-reading scenarios).
REFINE_ROUNDS = 2
# Bytes per element of each kv_cache.dtype; int8/fp8 scales are not counted (one per head or tensor).
KV_ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
# Bytes per parameter of each weight precision; int8/int4 as MatMulNBits stores them (an fp16 scale per 32), fp8 as
# MatMulBlockQuantizedFp8Weight does (e4m3, an fp32 scale per 128: passes.optimize.mapping.FP8_BLOCK).
WEIGHT_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0 + 2 / 32, "fp8": 1.0 + 4 / 128,
                "int4": 0.5 + 2 / 32}


GQA_PAST_INPUTS = (3, 4)  # GroupQueryAttention's past_key / past_value inputs


def kv_seq_axis(value: ir.Value) -> int | None:
    """The sequence axis of a past-KV input: its `past` dim, or axis 2 of a shared buffer (a GroupQueryAttention
    past whose present has its shape: passes.kv_layout's [batch, kv_heads, max_length, head_dim])."""
    if value.shape is None:
        return None
    named = [i for i, d in enumerate(value.shape) if str(d) == "past"]
    if named:
        return named[0]
    for use in value.uses():
        node = use.node
        if node.op_type == "GroupQueryAttention" and use.idx in GQA_PAST_INPUTS and len(value.shape) == 4:
            present = node.outputs[use.idx - 2]
            if present is not None and present.shape is not None and list(present.shape) == list(value.shape):
                return 2
    return None


def kv_cache_inputs(netlist: Netlist) -> list[ir.Value]:
    """Graph inputs that carry cached keys/values: those with a `past` dimension, or shared KV buffers."""
    return [v for v in netlist.model.graph.inputs if kv_seq_axis(v) is not None]


def kv_buffer_length(kv_inputs: list[ir.Value]) -> int | None:
    """The static length of shared KV buffers (one for all of them), else None (a cache that grows)."""
    lengths = {v.shape[kv_seq_axis(v)] for v in kv_inputs}
    length = lengths.pop() if len(lengths) == 1 else None
    return length if isinstance(length, int) else None


def kv_bytes_per_token(netlist: Netlist, kv_inputs: list[ir.Value], share: dict[str, float] | None = None) -> float:
    """Bytes one token of one sequence adds to the KV cache: the past-KV inputs' dims other than
    batch and the sequence axis, times their element size (2 x layers x kv heads x head dim x size for a GQA
    decoder)."""
    env = {"batch": 1, "past": 1, "seq": 1, **{d: 1 for d in netlist.symbolic_dims() - {"batch", "past"}}}
    total = 0.0
    for v in kv_inputs:
        count, axis = 1, kv_seq_axis(v)
        for i, d in enumerate(v.shape):
            if i == axis:
                continue
            if isinstance(d, int):
                count *= d
            elif str(d) != "batch":
                value = eval_dim_expr(str(d), env)
                count *= 1 if value is None else value
        total += count * v.dtype.itemsize * (share.get(v.name, 1.0) if share else 1.0)
    return total


def kv_layout_text(kv_inputs: list[ir.Value]) -> str:
    """The shared shape of the past-KV inputs, e.g. ``[batch, 8, past, 128]``; "mixed" when they differ."""
    shapes = {"[" + ", ".join(str(d) for d in v.shape) + "]" for v in kv_inputs}
    return shapes.pop() if len(shapes) == 1 else "mixed"


def kv_length(constraints: Constraints, buffer: int | None = None) -> tuple[int, str]:
    """KV tokens per sequence and the constraints key that set them; a shared buffer's own length first."""
    w = constraints.workload
    if buffer is not None:
        return buffer, ("kv_cache.max_length" if buffer == constraints.kv_cache.max_length
                        else "the KV buffer's max_length")
    if constraints.kv_cache.max_length:
        return constraints.kv_cache.max_length, "kv_cache.max_length"
    if w.prompt_len > w.context_len:
        return w.prompt_len, "workload.prompt_len"
    return w.context_len, "workload.context_len"


def kv_cache_item(netlist: Netlist, constraints: Constraints, share: dict[str, float] | None = None) -> AreaItem | None:
    kv_inputs = kv_cache_inputs(netlist)
    if not kv_inputs:
        return None
    w = constraints.workload
    length, _ = kv_length(constraints, kv_buffer_length(kv_inputs))
    total = kv_bytes_per_token(netlist, kv_inputs, share) * w.batch * w.concurrency * length
    dtype = kv_inputs[0].dtype.name.lower()
    detail = (f"{len(kv_inputs)} tensors ({dtype}) x batch {w.batch} x concurrency {w.concurrency} "
              f"x {length} tokens")
    return AreaItem("kv_cache", total, len(kv_inputs), detail)


def state_inputs(netlist: Netlist) -> list[ir.Value]:
    """A hybrid decoder's conv and recurrent state inputs (past.N.conv, past.N.recurrent): fixed size per sequence."""
    return [v for v in netlist.model.graph.inputs if (m := STATE_PORT.fullmatch(v.name)) and m[1] == "past"]


def state_bytes(netlist: Netlist) -> float:
    """Bytes of one sequence's states (every dim but the first, the batch); 0 for a decoder without them."""
    return float(sum(numel(tuple(int(d) for d in v.shape[1:])) * v.dtype.itemsize for v in state_inputs(netlist)))


def state_item(netlist: Netlist, constraints: Constraints) -> AreaItem | None:
    """The states a hybrid decoder carries per sequence beside its KV cache, at the workload's batch x concurrency
    (one sequence's: every dim but the batch, which is the first)."""
    states = state_inputs(netlist)
    if not states:
        return None
    w = constraints.workload
    per_sequence = state_bytes(netlist)
    kinds = ", ".join(f"{k} {sum(1 for v in states if v.name.endswith(k))}" for k in ("conv", "recurrent"))
    detail = (f"{len(states)} tensors ({kinds}) x batch {w.batch} x concurrency {w.concurrency}; a fixed size per "
              "sequence, no token dim")
    return AreaItem("kv_cache states", per_sequence * w.batch * w.concurrency, len(states), detail)


def activation_peak(netlist: Netlist, shapes: dict, share: dict[str, float] | None = None) -> float:
    """Peak bytes of live intermediate tensors in execution order (weights and inputs excluded); `share` as
    in weight_items."""
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
            size = value_bytes(out, shapes) * (share.get(out.name, 1.0) if share else 1.0)
            live += size
            if out.name not in graph_outputs:
                frees[last_use.get(out.name, i)] += size
        peak = max(peak, live)
        live -= frees.pop(i, 0.0)
    return peak


# ------------------------------------------------------------------------------------------ KV budget

def largest_concurrency(available: float, per_sequence: float, batch: int) -> int:
    """Concurrent sequences (of `batch` each) whose KV fits in `available` bytes."""
    if per_sequence <= 0:
        return 0
    return max(0, math.floor(available / (per_sequence * batch) + 1e-9))


def workspace_at(points: list[WorkspacePoint], length: float) -> float:
    """The workspace at a KV length, linear between measured points and held at the nearest one outside them."""
    pts = sorted(points, key=lambda p: p.length)
    if length <= pts[0].length:
        return pts[0].bytes
    for a, b in zip(pts, pts[1:]):
        if length <= b.length:
            return a.bytes + (b.bytes - a.bytes) * (length - a.length) / (b.length - a.length)
    return pts[-1].bytes


def largest_context(room: float, per_token: float, sequences: int, points: list[WorkspacePoint],
                    cap: int | None = None) -> int:
    """Largest KV length whose KV (`sequences` x `per_token` per token) plus workspace fits in `room` bytes
    (the limit less the weights), at most `cap`. The workspace is a convex function of the length (a peak
    over steps whose tensors grow linearly), so chords between measured points lie above it: the answer
    fits. Outside the points it is held at the nearest one (conservative below, the caller measures above)."""
    kv = per_token * sequences
    if kv <= 0:
        return 0
    pts = sorted(points, key=lambda p: p.length)
    best = math.floor((room - pts[0].bytes) / kv + 1e-9)
    if best > pts[0].length:
        best = math.floor((room - pts[-1].bytes) / kv + 1e-9)  # beyond the last point, unless a segment crosses
        for a, b in zip(pts, pts[1:]):
            if kv * b.length + b.bytes > room:
                slope = (b.bytes - a.bytes) / (b.length - a.length)
                best = math.floor(a.length + (room - kv * a.length - a.bytes) / (kv + slope) + 1e-9)
                break
    best = max(0, best)
    return best if cap is None else min(best, cap)


def workspace_floor(points: list[WorkspacePoint], length: int) -> float:
    """A least workspace at a KV length: at least that of any measured point below it (it does not shrink as
    the context grows) and, being convex, above the line through two adjacent points outside their span."""
    pts = sorted(points, key=lambda p: p.length)
    floor = max((p.bytes for p in pts if p.length <= length), default=0.0)
    for a, b in zip(pts, pts[1:]):
        if length <= a.length or length >= b.length:
            floor = max(floor, a.bytes + (b.bytes - a.bytes) * (length - a.length) / (b.length - a.length))
    return floor


def context_upper_bound(room: float, per_token: float, sequences: int, points: list[WorkspacePoint],
                        answer: int) -> int:
    """A KV length no answer can exceed, searched between `answer` and the next measured point with the
    workspace at its floor (workspace_floor): KV plus floor grows with the length, so bisection finds it."""
    kv = per_token * sequences
    if kv <= 0:
        return answer
    above = [p.length for p in points if p.length > answer]
    hi = min(above) - 1 if above else math.floor((room - workspace_floor(points, answer)) / kv + 1e-9)
    lo = answer
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if kv * mid + workspace_floor(points, mid) <= room:
            lo = mid
        else:
            hi = mid - 1
    return lo


def kv_dtype_classes(netlist_dtype: str) -> list[tuple[str, int]]:
    """The netlist's KV dtype, then each smaller element size kv_cache.dtype accepts, names joined:
    [("fp16", 2), ("fp8/int8", 1)]."""
    current = KV_ITEMSIZE.get(netlist_dtype)
    out = [(netlist_dtype, current or 0)]
    if current is None:
        return out
    sizes: dict[int, list[str]] = defaultdict(list)
    for name in KV_DTYPES:
        if KV_ITEMSIZE[name] < current:
            sizes[KV_ITEMSIZE[name]].append(name)
    return out + [("/".join(names), size) for size, names in sorted(sizes.items(), reverse=True)]


def weight_options(area_kinds: list[AreaItem], allowed: list[str]) -> list[tuple[str, float]]:
    """(precision, weights and constants bytes): as built (named by the precision holding most bytes),
    then every lower precision `allowed` names, each weight stored at it unless already smaller
    (an estimate: WEIGHT_BYTES per parameter, constants kept)."""
    weights = [k for k in area_kinds if k.name.startswith("weights ") and k.count]
    constants = sum(k.bytes for k in area_kinds if k.name == "constants")
    if not weights:
        return [("-", constants)]
    dominant = max(weights, key=lambda k: k.bytes)
    out = [(dominant.name.split(" ", 1)[1], sum(k.bytes for k in weights) + constants)]
    built = dominant.bytes / dominant.count
    for name in ("fp16", "bf16", "int8", "fp8", "int4"):
        size = WEIGHT_BYTES[name]
        if name in allowed and size < built and not (name == "bf16" and "fp16" in allowed):
            label = "fp16/bf16" if name == "fp16" and "bf16" in allowed else name
            out.append((label, sum(min(k.bytes, k.count * size) for k in weights) + constants))
    return out


def context_cap(kv: KVBudget) -> int | None:
    """The model's max_position_embeddings, where it holds the workload's KV length: no longer context is served."""
    return kv.max_positions if kv.max_positions and kv.max_positions >= kv.length else None


def kv_budget(kv: KVBudget) -> KVBudget:
    """Fill `kv`'s derived figures from its layout, workload, limit, weights, workspace and growth:
    the bytes available for KV, the largest concurrency and context, one row per KV dtype and the
    totals of its weight rows (whose `weight_bytes` the caller set)."""
    base = KV_ITEMSIZE.get(kv.dtype)
    sequences = kv.batch * kv.concurrency
    available = None if kv.limit is None else kv.limit - kv.weights - kv.workspace
    rows: list[KVOption] = []
    states = kv.state_bytes * sequences  # a hybrid decoder's: their own dtype, whatever kv_cache.dtype says
    for name, size in kv_dtype_classes(kv.dtype):
        per_token = kv.bytes_per_token * (size / base if base and size else 1.0)
        kv_bytes = per_token * sequences * kv.length + states
        total = kv.weights + kv_bytes + kv.workspace
        source = "estimate" if rows else "netlist"
        row = dict(dtype=name, source=source, bytes_per_token=per_token, kv_bytes=kv_bytes, total=total)
        if available is None:
            rows.append(KVOption(**row, max_concurrency=None, max_context=None, fits=None))
        else:
            rows.append(KVOption(**row, max_concurrency=largest_concurrency(
                                     available, per_token * kv.length + kv.state_bytes, kv.batch),
                                 max_context=largest_context(kv.limit - kv.weights - states, per_token, sequences,
                                                             kv.workspace_points, context_cap(kv)),
                                 fits=total <= kv.limit))
    kv.kv_dtypes = rows
    kv.available = available
    kv.max_concurrency, kv.max_context = rows[0].max_concurrency, rows[0].max_context
    for w in kv.weight_precisions:
        w.total = w.weight_bytes + kv.kv_bytes + kv.workspace
        if kv.limit is not None:
            w.fits = w.total <= kv.limit
            w.max_concurrency = largest_concurrency(kv.limit - w.weight_bytes - kv.workspace,
                                                    kv.bytes_per_token * kv.length + kv.state_bytes, kv.batch)
    return kv


def workspace_with_length(netlist: Netlist, scenarios: dict[str, dict], length: int, target: int,
                          share: dict[str, float] | None = None) -> float:
    """The workspace with every scenario that reads the cache (past > 0) holding `target - length` more
    cached tokens (fewer when negative); the others as timed."""
    shifted = [{**dims, "past": dims["past"] + target - length} if dims.get("past", 0) > 0 else dims
               for dims in scenarios.values()]
    return max((activation_peak(netlist, netlist.bind(dims), share) for dims in shifted), default=0.0)


def budget_for(netlist: Netlist, constraints: Constraints, kinds: list[AreaItem], *, workspace: float,
               workspace_scenario: str, scenarios: dict[str, dict], share: dict[str, float] | None = None
               ) -> KVBudget | None:
    """The KV budget of the netlist's past-KV inputs under area_constraint (None: no KV cache)."""
    kv_inputs = kv_cache_inputs(netlist)
    if not kv_inputs:
        return None
    w = constraints.workload
    length, key = kv_length(constraints, kv_buffer_length(kv_inputs))
    fixed = sum(k.bytes for k in kinds if k.name.startswith("weights ") or k.name == "constants")
    budget = KVBudget(
        tensors=len(kv_inputs), layout=kv_layout_text(kv_inputs),
        dtype=PRECISION_BY_DTYPE.get(kv_inputs[0].dtype, kv_inputs[0].dtype.name.lower()),
        bytes_per_token=kv_bytes_per_token(netlist, kv_inputs, share), batch=w.batch, concurrency=w.concurrency,
        length=length, length_key=key, limit=constraints.area_constraint, weights=fixed, workspace=workspace,
        workspace_scenario=workspace_scenario, workspace_points=[WorkspacePoint(length, workspace)], available=None,
        max_concurrency=None, max_context=None,
        max_positions=(netlist.config or {}).get("max_position_embeddings"),
        requested_dtype=constraints.kv_cache.dtype, state_bytes=state_bytes(netlist),
        weight_precisions=[WeightOption(p, "estimate" if i else "netlist", b, 0.0, None, None)
                           for i, (p, b) in enumerate(weight_options(kinds, constraints.precision.allowed))])
    kv_budget(budget)
    if budget.limit is None:
        return budget
    # With the workspace held at its timed peak, the answers above `length` are upper bounds and those
    # below lower bounds: one point measured past the longest and one at the shortest length the scenarios
    # can shift to put every answer on a chord of the convex workspace, which lies above it.
    contexts = [r.max_context for r in budget.kv_dtypes if r.max_context is not None]
    pasts = [dims["past"] for dims in scenarios.values() if dims.get("past", 0) > 0]
    probes = []
    if pasts and max(contexts, default=0) > length:
        probes.append(max(contexts))
    if pasts and min(contexts, default=length) < length:
        shortest = max(1, length - min(pasts) + 1)  # every shifted scenario still reads one cached token
        if shortest < length:
            probes.append(shortest)
    # Then a point at the bound no answer can pass: where it fits it is the answer, else the chord to it
    # raises the (still safe) answer.
    for _ in range(REFINE_ROUNDS + 1):
        if not probes:
            break
        budget.workspace_points += [WorkspacePoint(c, workspace_with_length(netlist, scenarios, length, c, share))
                                    for c in probes]
        budget.workspace_points.sort(key=lambda p: p.length)
        kv_budget(budget)
        answer = budget.max_context
        bound = context_upper_bound(budget.limit - budget.weights, budget.bytes_per_token,
                                    budget.batch * budget.concurrency, budget.workspace_points, answer)
        if context_cap(budget):
            bound = min(bound, context_cap(budget))
        probes = [bound] if bound > answer else []
    return budget


def area(netlist: Netlist, constraints: Constraints, scenarios: dict[str, dict],
         share: dict[str, float] | None = None, recast: dict[str, str] | None = None) -> AreaResult:
    """`scenarios`: group name -> its dims, for the activation peak (and its growth with the context);
    `share`: one device's part of each named tensor under tensor parallelism (softsyn.timing.tp)."""
    kinds, scopes, parameters = weight_items(netlist, share=share, recast=recast)
    kv = kv_cache_item(netlist, constraints, share)
    if kv is not None:
        kinds.append(kv)
    states = state_item(netlist, constraints)
    if states is not None:
        kinds.append(states)
    worst_group, worst_peak = "", 0.0
    for name, dims in scenarios.items():
        peak = activation_peak(netlist, netlist.bind(dims), share)
        if peak >= worst_peak:
            worst_group, worst_peak = name, peak
    kinds.append(AreaItem("activations (peak)", worst_peak, 0, f"live intermediates, {worst_group} scenario"))
    return AreaResult(
        by_kind=kinds, by_hierarchy=scopes, total=sum(k.bytes for k in kinds), limit=constraints.area_constraint,
        parameters=parameters, kv_detail=kv.detail if kv else "no KV cache", activation_scenario=worst_group,
        kv_budget=budget_for(netlist, constraints, kinds, workspace=worst_peak, workspace_scenario=worst_group,
                             scenarios=scenarios, share=share))
