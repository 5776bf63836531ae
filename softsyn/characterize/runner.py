"""Measuring one grid point of a cell: the cell's bound runner, T(1) and T(N copies), and their combination.

`measure_point` times a cell graph with 1 and N copies of its op (softsyn.characterize.plan's docstring gives
the method), `best_delay` combines a point's passes, and `remeasure_outliers` measures again the points that
came out slower than a larger point. SETTINGS hold how each plan measures.
"""
from __future__ import annotations

import gc
import math
import statistics
import time
from dataclasses import dataclass, replace

import numpy as np
import onnxruntime as ort
from onnx import numpy_helper

from softsyn.characterize.catalogue import CellKind, plan_name
from softsyn.characterize.ceilings import session_settings, time_calls, time_interleaved
from softsyn.characterize.cellgraph import Blob, Ctx, Graph, intermediates, make_model
from softsyn.runtime.binding import BoundRunner, device_of, empty, to_device
from softsyn.runtime.session import open_session

LONG = 40.0  # a point whose one-copy run exceeds LONG x run overhead is timed with one copy


@dataclass(frozen=True)
class Settings:
    """How a plan measures its points (the comments below SETTINGS say why)."""

    copies: int  # N: copies of a tiny op in the N-copy graph (fewer for longer ops)
    min_sample: float  # s: one timed sample loops its graph at least this long
    min_samples: int  # timed samples per graph: at least ...
    max_samples: int  # ... and at most, within the point's budget
    point_budget: float  # s per grid point, over all passes
    cell_cap: float  # s per cell
    passes: int  # the whole grid is measured this many times
    combine: str  # how a point's passes combine (best_delay): "median" | "fastest"
    weight_cap: int  # bytes of weights in one cell graph
    timing: str  # "sequential" (T(1) then T(N), one live session) | "interleaved" (sample by sample)
    form: str  # "chain" | "copies" (softsyn.characterize.cellgraph)
    cold_weights: bool
    shared_weights: bool


_CPU = Settings(copies=64, min_sample=2e-3, min_samples=9, max_samples=25, point_budget=0.6, cell_cap=40.0, passes=3,
                combine="median", weight_cap=64 << 20, timing="sequential", form="chain", cold_weights=True,
                shared_weights=False)
_CUDA = Settings(copies=64, min_sample=2e-3, min_samples=7, max_samples=15, point_budget=0.2, cell_cap=15.0, passes=1,
                 combine="fastest", weight_cap=256 << 20, timing="interleaved", form="copies", cold_weights=False,
                 shared_weights=True)
SETTINGS = {  # by plan name (softsyn.characterize.catalogue.plan_name)
    "cpu": _CPU,
    "cpu-quick": replace(_CPU, min_sample=1e-3, min_samples=5, max_samples=9, point_budget=0.10, cell_cap=6.0,
                         passes=2),
    "cuda": _CUDA,
    "cuda-quick": replace(_CUDA, copies=32, min_sample=1e-3, min_samples=5, max_samples=9, point_budget=0.08,
                          cell_cap=5.0),
}

# passes / combine: the whole grid is measured `passes` times and each point combines its passes (best_delay): on a
# shared VM a busy spell of a few seconds inflated whole stretches of a one-pass CPU table 2-3x (MatMul m=8 n=256 k=32:
# 3.52 us in the table, 1.31 us re-measured alone), and the fastest of two passes then caught the VM's fast phases
# (minutes long, memory-bound points 2x faster): the CPU takes the median of three passes spread over the plan, the
# median of two (their mean) in --quick. The H200 is not shared: one pass, outliers re-measured.
# cold_weights: a weight-bearing cell (MatMul/Gemm/MatMulNBits with initializers) always takes as many copies as
# weight_cap holds, so its weights cycle through 64 MiB, twice the CPU's 32 MiB L3, and each copy reads its weight
# from memory, as every layer of a model whose weights exceed the cache does (minilm's 90 MB; a copy count chosen by
# run time alone kept 16 x 2.4 MB mostly in cache: 51 us in the table vs 86 us in the model's profile). Models whose
# weights fit the cache read theirs hot: their small matrices stay under the cache in the cell too.
# shared_weights: random weights (cellgraph.Blob) reach the session as one host array per type and shape, through ORT's
# external initializers, not inlined in the protobuf (the CUDA plan's 256 MiB cell graphs; the CPU plan keeps the
# inlined weights its shipped library was measured with).
# weight_cap: weight bytes inlined in one cell graph; ONNX protobufs cannot exceed 2 GiB ("Failed to
# serialize proto" on the H200 run of 2026-11-30 with 4 GiB), and serialising, parsing and uploading them
# dominates a CUDA cell's time (the full H200 plan must fit 15 minutes).


def cell_session(model, provider: str, optimized_path: str | None = None, optimize: bool = True,
                 external: dict | None = None, cuda_graph: bool = False):
    """A characterisation session on a cell model; `optimize=False` (a graph ORT would fold: a Reshape chain, the
    identical copies of an intermediates graph) turns the graph rewrites off on the CPU."""
    return open_session(model, session_settings(provider, optimize=optimize or provider != "cpu",
                                                 optimized_model_filepath=optimized_path, cuda_graph=cuda_graph),
                        external)


class Runner(BoundRunner):
    """A session on one cell graph with every input and output bound on the device (outputs preallocated).

    `uploaded`: OrtValues of inputs already on the device, by data identity, shared by the runners of one point
    (its one-copy and N-copy graphs read the same input arrays: softsyn.characterize.cellgraph.data hands
    them out again)."""

    def __init__(self, graph: Graph, provider: str, uploaded: dict | None = None, cuda_graph: bool = False):
        external = {} if SETTINGS[provider].shared_weights else None
        self.model = make_model(graph, external)
        super().__init__(cell_session(self.model, provider, optimize=graph.optimize, external=external),
                         ort.RunOptions())
        device = device_of(provider)
        uploaded = {} if uploaded is None else uploaded
        values = {}
        for name, (elem, arr) in graph.inputs.items():
            dev = "cpu" if name in graph.cpu_inputs else device
            # a device-only allocation (a shape) is the same input only under the same name; an input an output
            # aliases is written by the runs: never shared with another runner
            key = (name, arr, dev) if isinstance(arr, tuple) else (id(arr), dev)
            if name in graph.aliases.values():
                key = (key, id(self))
            if key not in uploaded:  # the array is kept: its id stays unique
                uploaded[key] = (arr, empty(arr, elem, dev) if isinstance(arr, tuple) else to_device(arr, dev))
            values[name] = uploaded[key][1]
            self.bind_input(name, values[name])
        # output shapes: on the CPU from one plain run (numpy feeds, not timed); on CUDA, or where an input has no
        # numpy form (bf16, device-only weights), from one run with ORT-allocated outputs (no host copies of the
        # inputs or outputs); then preallocated and bound
        if provider != "cuda" and all(not isinstance(a, tuple) for _, a in graph.inputs.values()):
            outs = self.session.run([n for n, _ in graph.outputs], {n: a for n, (_, a) in graph.inputs.items()})
            shapes = {name: np.shape(v) for (name, _), v in zip(graph.outputs, outs)}
        else:
            for name, _ in graph.outputs:
                self.binding.bind_output(name, device)
            self.session.run_with_iobinding(self.binding)
            shapes = {name: tuple(v.shape()) for (name, _), v in zip(graph.outputs, self.binding.get_outputs())}
            self.binding.clear_binding_outputs()
        for name, elem in graph.outputs:
            self.bind_output(name, values[graph.aliases[name]] if name in graph.aliases else
                             empty(shapes[name], elem, device))
        if cuda_graph:
            # a graph replays the addresses of its capture: a session of its own whose first call (the first timed
            # warm-up) captures on the buffers bound above, which every later call replays
            bound = dict(zip([*graph.inputs, *(n for n, _ in graph.outputs)], self.keep))  # bound in that order
            self.session = cell_session(self.model, provider, optimize=graph.optimize, external=external,
                                        cuda_graph=True)
            self.binding, self.keep = self.session.io_binding(), []
            for name in graph.inputs:
                self.bind_input(name, bound[name])
            for name, _ in graph.outputs:
                self.bind_output(name, bound[name])


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _init_bytes(g: Graph) -> int:
    return sum(t.nbytes if isinstance(t, Blob) else len(t.raw_data) if t.raw_data else numpy_helper.to_array(t).nbytes
               for t in g.inits)


def graph_bytes(g: Graph) -> int:
    total = _init_bytes(g)
    for elem, arr in g.inputs.values():
        total += (math.prod(arr) * 2) if isinstance(arr, tuple) else arr.nbytes
    return total


@dataclass
class Sample:
    """One measurement of a grid point: medians of T(1) and T(N copies), or a direct (long-node) figure."""

    one: float
    many: float = math.nan
    copies: int = 1
    direct: bool = False

    def delay(self, run_overhead: float) -> float:
        if self.direct:
            return max(self.one - run_overhead, 1e-9)
        d = (self.many - self.one) / (self.copies - 1)
        return d if d > 0 else max(self.one - run_overhead, 1e-9)  # noise swamped a tiny op


def best_delay(samples: list[Sample], run_overhead: float, combine: str = "fastest") -> float:
    """The delay of a point measured in several passes.

    "fastest": noise only adds time to each timed graph, so the fastest T(1) and the fastest T(N) stand, and the
    delay is their difference (the fastest *difference* would be biased low: a slow T(1) shrinks it; a
    one-pass-min table read Transpose [64, 64] at 1.1 us, 4.4 us alone). "median": the median of the passes'
    delays, for a machine with fast phases as well as busy spells (the CPU VM: its memory-bound points move 2x
    between phases of minutes, and the fastest of two passes took the fast phase: GatherND of 64 MB read 1.0 ms
    in the table, 1.9-2.2 ms in the model and alone minutes later)."""
    copied = [s for s in samples if not s.direct]
    if not copied:
        delays = [s.delay(run_overhead) for s in samples]
        return min(delays) if combine == "fastest" else statistics.median(delays)
    # a pass that fell back on one direct copy (a hiccup made the node look long) timed its weights hot from the
    # previous run: the copies' marginal cost stands (minilm [16, 384] x [384, 1536]: 66 us direct, 81-86 us over
    # 16 copies, 86 us in the model's profile)
    n = statistics.mode(s.copies for s in copied)
    same = [s for s in copied if s.copies == n]
    if combine == "median":
        return statistics.median(s.delay(run_overhead) for s in same)
    return Sample(min(s.one for s in same), min(s.many for s in same), n).delay(run_overhead)


def cell_graph(kind: CellKind, sizes: dict, copies: int, ctx: Ctx) -> Graph:
    """The cell graph as measured: on the CPU ("chain" form), ops that cannot chain run as arena intermediates."""
    g = kind.build(sizes, copies, ctx)
    return intermediates(g) if ctx.form == "chain" and g.form == "copies" else g


def measure_point(kind: CellKind, sizes: dict, ctx: Ctx, run_overhead: float, budget: float,
                  quick: bool, copies: int | None = None) -> Sample:
    """T(1) and T(N) of `kind` at `sizes` (Sample.delay: the per-node delay, s); `copies` fixes N (later passes
    over a point use the first pass's N so the medians combine).

    CPU ("sequential" timing): T(1) and T(N) are timed one session at a time, the other session destroyed.
    Each ORT session owns an intra-op thread pool whose workers spin after a run; with two live sessions
    timed call by call (time_interleaved) one pool's spinning worker takes the core the other's parallel
    kernel needs (2 cores: MatMul 128x256x128 measured 37 us interleaved vs 20 us alone and 18 us in
    qwen3-tiny's profile). CUDA keeps interleaved timing (drift cancellation; kernels run on the GPU)."""
    st = SETTINGS[plan_name(ctx.provider, quick)]
    lo, hi = st.min_samples, st.max_samples
    sequential = st.timing == "sequential"
    gc.collect()  # sessions of earlier points: their thread pools must be gone before timing
    g1 = cell_graph(kind, sizes, 1, ctx)
    uploaded: dict = {}
    one = Runner(g1, ctx.provider, uploaded, ctx.cuda_graph)
    one()
    t1 = statistics.median(_timed(one) for _ in range(3))  # one call can catch a hiccup and flip the choices below
    if copies is None:
        per_copy = graph_bytes(g1)
        if st.cold_weights and _init_bytes(g1) > 0 and 2 * per_copy <= st.weight_cap:
            # as many weights as the cap holds, long nodes too: they cycle past the cache (cold_weights)
            copies = min(st.copies, st.weight_cap // per_copy)
        elif t1 >= LONG * run_overhead:
            copies = 1
        else:  # many copies for tiny nodes (their delay must stand well above the run-to-run noise)
            copies = st.copies
            for bound, n in ((20 * run_overhead, copies), (100 * run_overhead, 16), (math.inf, 4)):
                if t1 < bound:
                    copies = min(copies, n)
                    break
            copies = max(1, min(copies, st.weight_cap // max(per_copy, 1)))
        if ctx.cuda_graph:  # a replay's fixed cost is not the eager run_overhead: always the two-graph difference
            copies = max(copies, 2)
    if copies < 2:
        inner = max(1, int(st.min_sample / max(t1, 1e-7)))
        samples = int(max(lo, min(hi, budget / max(inner * t1, 1e-7))))
        return Sample(time_interleaved({"one": one}, samples, inner)["one"], direct=True)
    if sequential:
        inner1 = max(1, int(st.min_sample / max(t1, 1e-7)))
        m1 = time_calls(one, int(max(lo, min(hi, budget / 3 / max(inner1 * t1, 1e-7)))), inner1)[0]
        del one
        gc.collect()
    many = Runner(cell_graph(kind, sizes, copies, ctx), ctx.provider, uploaded, ctx.cuda_graph)
    many()
    t0 = time.perf_counter()
    many()
    tn = time.perf_counter() - t0
    inner = max(1, int(st.min_sample / max(tn, 1e-7)))
    if sequential:
        mn = time_calls(many, int(max(lo, min(hi, 2 * budget / 3 / max(inner * tn, 1e-7)))), inner)[0]
        del many
        med = {"one": m1, "many": mn}
    else:
        samples = int(max(lo, min(hi, budget / max(inner * (t1 + tn), 1e-7))))
        med = time_interleaved({"one": one, "many": many}, samples, inner)
    return Sample(med["one"], med["many"], copies)


# ------------------------------------------------------------------------------------------ outliers

OUTLIER = 2.0  # a point slower than OUTLIER x a point at least as large on every axis is re-measured
REMEASURE = 2  # extra measurements of a suspect point; the smallest delay stands (noise only adds time)


def suspects(points: list[tuple], values: list[float], discrete: tuple = ()) -> list[int]:
    """Indices of points measured more than OUTLIER x slower than some point that is at least as large on every
    axis (equal on the `discrete` ones): more work is never that much faster, so the sample caught a hiccup
    (a VM stall, a page-fault burst). The Cast table of 2026-11-30 had 34.9 us at 16 elements vs 0.2 us around it."""
    out = []
    for i, (p, v) in enumerate(zip(points, values)):
        for j, (q, w) in enumerate(zip(points, values)):
            if i != j and v > OUTLIER * w and all(
                    (qa == pa) if a in discrete else (qa >= pa) for a, (pa, qa) in enumerate(zip(p, q))):
                out.append(i)
                break
    return out


def remeasure_outliers(kind: CellKind, allpts: list[tuple], values: list[float], hvalues: list[float], ctx: Ctx,
                       run_overhead: float, quick: bool) -> int:
    """Re-measure suspect points (grid and hold-out) in place; returns how many were re-measured."""
    measured = values + hvalues
    points = [p for p, _ in allpts]
    discrete = tuple(kind.axes.index(a) for a in kind.discrete)
    found = suspects(points, measured, discrete)
    budget = SETTINGS[plan_name(ctx.provider, True)].point_budget
    for i in found:
        sizes = dict(zip(kind.axes, points[i]))
        again = [measure_point(kind, sizes, ctx, run_overhead, budget, quick) for _ in range(REMEASURE)]
        measured[i] = min(measured[i], best_delay(again, run_overhead))
        if i < len(values):
            values[i] = measured[i]
        else:
            hvalues[i - len(values)] = measured[i]
    return len(found)
