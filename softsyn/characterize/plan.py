"""`softsyn characterize`: measure a library's delay tables on the real runtime and device.

For every cell kind the provider runs (softsyn.characterize.recipes), build a small ONNX graph per grid point, time
it warm with inputs and outputs bound on the device (IO binding: OrtValues on "cpu" or "cuda"), and
write the cell's delay table with its index axes. Method per point:

- The graph holds `copies` instances of the op. CPU: in CHAIN form where the op allows it (copy i
  consumes copy i-1's output; shape-changing ops alternate two shapes: MatMul/Gemm W[k, n] / W[n, k],
  Reshape [r*c] / [r, c], Unsqueeze / Squeeze; view and Transpose chains run without graph rewrites,
  which would fold them), so each node reads its predecessor's output hot in cache and intermediates
  live in ORT's arena, as in a real model; only the last output is a graph output. Ops whose output
  cannot feed their input (compare ops, Cast, reductions, Concat, Slice, Gather, attention, ...) use
  independent copies (own weights, same inputs): on the CPU as arena INTERMEDIATES (only the last copy's
  outputs are graph outputs; no graph rewrites, which would merge the copies), on CUDA each with its own
  bound outputs.
  The per-node delay is (T(N copies) - T(1 copy)) / (N - 1). CPU: T(1) and T(N) are timed one session
  at a time (the other destroyed: a live session's spinning intra-op workers steal the core the timed
  session's parallel kernels need); CUDA: interleaved sample by sample. Medians; a point whose single
  node is already long (>= LONG x the run overhead) is timed with one copy and the run overhead subtracted.
- Precisions are recorded only where the provider computes in them: on CPU the optimised graph must
  not gain Casts (ORT's InsertCastTransformer runs fp16 in fp32), on CUDA the session is created
  with `session.disable_cpu_ep_fallback` (a node that would run on the CPU fails the cell).
  Cells that do not run are listed in the header's `not_characterised` with the reason.
- Interpolation error is measured, not assumed: every cell also measures hold-out points (the
  geometric midpoints between grid points: along each axis for 1-3-axis tables, plus cell centres)
  and records the table's own log-log interpolation error against them (`holdout`: median and max
  |interpolated - measured| / measured, %); the header's `interpolation_error` pools all cells.
- Noise: on the CPU every grid is measured in three passes, each started with a machine-speed probe
  (softsyn.characterize.probe); passes that started slow (PASS_GATE) are dropped and the rest combined by their median,
  and a cell whose every pass started slow against the run's fastest probe is measured again at the end of
  the plan. On every provider a point measured more than OUTLIER x slower than a point at least as large on
  every axis is re-measured.
- Resumable: cells already in the output file (and cells recorded as not characterised) are skipped;
  the file is rewritten atomically (validated by softsyn.library.model.parse_library first) after each cell.
- The `Run` cell: the fixed cost of one run call vs the number of graph inputs + outputs (`ios`),
  measured the way the signoff measures a model: `run_with_iobinding`, inputs bound once, outputs allocated by
  the runtime (softsyn.runtime.measure.BoundRunner).
"""
from __future__ import annotations

import datetime as _dt
import fnmatch
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from softsyn.characterize import recipes as C
from softsyn.characterize.ceilings import time_calls, time_interleaved
from softsyn.errors import SoftsynError
from softsyn.characterize.probe import speed_probe, summarise

PLANS = ("cpu", "cuda")
LONG = 40.0  # a point whose one-copy run exceeds LONG x run overhead is timed with one copy
# per-provider measurement settings: (quick, full)
SETTINGS = {
    "cpu": {"copies": (64, 64), "min_sample": (1e-3, 2e-3), "samples": ((5, 9), (9, 25)),
            "point_budget": (0.10, 0.6), "cell_cap": (6.0, 40.0), "weight_cap": 64 << 20, "timing": "sequential",
            "form": "chain", "passes": (2, 3), "combine": "median", "cold_weights": True, "shared_weights": False},
    "cuda": {"copies": (32, 64), "min_sample": (1e-3, 2e-3), "samples": ((5, 9), (7, 15)),
             "point_budget": (0.08, 0.2), "cell_cap": (5.0, 15.0), "weight_cap": 256 << 20, "timing": "interleaved",
             "form": "copies", "passes": (1, 1), "combine": "fastest", "cold_weights": False, "shared_weights": True},
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
# shared_weights: random weights (cells.Blob) reach the session as one host array per type and shape, through ORT's
# external initializers, not inlined in the protobuf (the CUDA plan's 256 MiB cell graphs; the CPU plan keeps the
# inlined weights its shipped library was measured with).
# weight_cap: weight bytes inlined in one cell graph; ONNX protobufs cannot exceed 2 GiB ("Failed to
# serialize proto" on the H200 run of 2026-11-30 with 4 GiB), and serialising, parsing and uploading them
# dominates a CUDA cell's time (the full H200 plan must fit 15 minutes).


def _log(progress: bool, msg: str, end: str = "\n") -> None:
    if not progress:
        return
    if msg.startswith("\r") or end == "":  # a progress-bar update: only on a terminal
        if sys.stderr.isatty():
            print(msg, file=sys.stderr, end=end, flush=True)
        return
    if sys.stderr.isatty():
        msg = "\r\033[K" + msg
    print(msg, file=sys.stderr, end=end, flush=True)


# ------------------------------------------------------------------------------------------ sessions

def _session(model, provider: str, optimized_path: str | None = None, optimize: bool = True,
             external: dict | None = None):
    from softsyn.characterize.ceilings import _session as ceil_session
    if optimize or provider != "cpu":
        return ceil_session(model, provider, optimized_path=optimized_path, external=external)
    import onnxruntime as ort
    so = ort.SessionOptions()  # defaults, but no graph rewrites: ORT would fuse a Reshape chain away
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if optimized_path:
        so.optimized_model_filepath = optimized_path
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _ortvalue(arr, elem: int, device: str):
    import onnxruntime as ort
    if isinstance(arr, tuple):  # any contents: allocated on the device
        return ort.OrtValue.ortvalue_from_shape_and_type(list(arr), elem, device, 0)
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr), device, 0)


class Runner:
    """A session on one cell graph with every input and output bound on the device.

    `uploaded`: OrtValues of inputs already on the device, by data identity, shared by the runners of one point
    (its one-copy and N-copy graphs read the same input arrays: softsyn.characterize.recipes._data hands them out again)."""

    def __init__(self, graph: "C.Graph", provider: str, uploaded: dict | None = None):
        import onnxruntime as ort
        external = {} if SETTINGS[provider]["shared_weights"] else None
        self.model = C.make_model(graph, external)
        self.sess = _session(self.model, provider, optimize=graph.optimize, external=external)
        device = "cuda" if provider == "cuda" else "cpu"
        self.io = self.sess.io_binding()
        self._keep = []
        uploaded = {} if uploaded is None else uploaded
        for name, (elem, arr) in graph.inputs.items():
            dev = "cpu" if name in graph.cpu_inputs else device
            # a device-only allocation (a shape) is the same input only under the same name
            key = (name, arr, dev) if isinstance(arr, tuple) else (id(arr), dev)
            if key not in uploaded:
                uploaded[key] = (arr, _ortvalue(arr, elem, dev))  # the array is kept: its id stays unique
            v = uploaded[key][1]
            self._keep.append(v)
            self.io.bind_ortvalue_input(name, v)
        # output shapes: on the CPU from one plain run (numpy feeds, not timed); on CUDA, or where an input has no
        # numpy form (bf16, device-only weights), from one run with ORT-allocated outputs (no host copies of the
        # inputs or outputs); then preallocated and bound
        if provider != "cuda" and all(not isinstance(a, tuple) for _, a in graph.inputs.values()):
            outs = self.sess.run([n for n, _ in graph.outputs], {n: a for n, (_, a) in graph.inputs.items()})
            shapes = {name: np.shape(v) for (name, _), v in zip(graph.outputs, outs)}
        else:
            for name, _ in graph.outputs:
                self.io.bind_output(name, device)
            self.sess.run_with_iobinding(self.io)
            shapes = {name: tuple(v.shape()) for (name, _), v in zip(graph.outputs, self.io.get_outputs())}
            self.io.clear_binding_outputs()
        for name, elem in graph.outputs:
            v = C_ort_empty(shapes[name], elem, device)
            self._keep.append(v)
            self.io.bind_ortvalue_output(name, v)
        self.ro = ort.RunOptions()

    def __call__(self):
        self.sess.run_with_iobinding(self.io, self.ro)


def C_ort_empty(shape, elem, device):
    import onnxruntime as ort
    return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), elem, device, 0)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _init_bytes(g: "C.Graph") -> int:
    from onnx import numpy_helper
    return sum(t.nbytes if isinstance(t, C.Blob) else len(t.raw_data) if t.raw_data else numpy_helper.to_array(t).nbytes
               for t in g.inits)


def _graph_bytes(g: "C.Graph") -> int:
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


def _build(kind: "C.CellKind", sizes: dict, copies: int, ctx: "C.Ctx") -> "C.Graph":
    """The cell graph as measured: on the CPU ("chain" form), ops that cannot chain run as arena intermediates."""
    g = kind.build(sizes, copies, ctx)
    return C.intermediates(g) if ctx.form == "chain" and g.form == "copies" else g


def measure_point(kind: "C.CellKind", sizes: dict, ctx: "C.Ctx", run_overhead: float, budget: float,
                  quick: bool, copies: int | None = None) -> Sample:
    """T(1) and T(N) of `kind` at `sizes` (Sample.delay: the per-node delay, s); `copies` fixes N (later passes
    over a point use the first pass's N so the medians combine).

    CPU ("sequential" timing): T(1) and T(N) are timed one session at a time, the other session destroyed.
    Each ORT session owns an intra-op thread pool whose workers spin after a run; with two live sessions
    timed call by call (time_interleaved) one pool's spinning worker takes the core the other's parallel
    kernel needs (2 cores: MatMul 128x256x128 measured 37 us interleaved vs 20 us alone and 18 us in
    qwen3-tiny's profile). CUDA keeps interleaved timing (drift cancellation; kernels run on the GPU)."""
    import gc
    st = SETTINGS[ctx.provider]
    q = 0 if quick else 1
    lo, hi = st["samples"][q]
    sequential = st["timing"] == "sequential"
    gc.collect()  # sessions of earlier points: their thread pools must be gone before timing
    g1 = _build(kind, sizes, 1, ctx)
    uploaded: dict = {}
    one = Runner(g1, ctx.provider, uploaded)
    one()
    t1 = statistics.median(_timed(one) for _ in range(3))  # one call can catch a hiccup and flip the choices below
    if copies is None:
        per_copy = _graph_bytes(g1)
        if st["cold_weights"] and _init_bytes(g1) > 0 and 2 * per_copy <= st["weight_cap"]:
            # as many weights as the cap holds, long nodes too: they cycle past the cache (cold_weights)
            copies = min(st["copies"][q], st["weight_cap"] // per_copy)
        elif t1 >= LONG * run_overhead:
            copies = 1
        else:  # many copies for tiny nodes (their delay must stand well above the run-to-run noise)
            copies = st["copies"][q]
            for bound, n in ((20 * run_overhead, copies), (100 * run_overhead, 16), (math.inf, 4)):
                if t1 < bound:
                    copies = min(copies, n)
                    break
            copies = max(1, min(copies, st["weight_cap"] // max(per_copy, 1)))
    if copies < 2:
        inner = max(1, int(st["min_sample"][q] / max(t1, 1e-7)))
        samples = int(max(lo, min(hi, budget / max(inner * t1, 1e-7))))
        return Sample(time_interleaved({"one": one}, samples, inner)["one"], direct=True)
    if sequential:
        inner1 = max(1, int(st["min_sample"][q] / max(t1, 1e-7)))
        m1 = time_calls(one, int(max(lo, min(hi, budget / 3 / max(inner1 * t1, 1e-7)))), inner1)[0]
        del one
        gc.collect()
    many = Runner(_build(kind, sizes, copies, ctx), ctx.provider, uploaded)
    many()
    t0 = time.perf_counter()
    many()
    tn = time.perf_counter() - t0
    inner = max(1, int(st["min_sample"][q] / max(tn, 1e-7)))
    if sequential:
        mn = time_calls(many, int(max(lo, min(hi, 2 * budget / 3 / max(inner * tn, 1e-7)))), inner)[0]
        del many
        med = {"one": m1, "many": mn}
    else:
        samples = int(max(lo, min(hi, budget / max(inner * (t1 + tn), 1e-7))))
        med = time_interleaved({"one": one, "many": many}, samples, inner)
    return Sample(med["one"], med["many"], copies)


# ------------------------------------------------------------------------------------------ outliers

PASS_GATE = 1.15  # a pass whose machine-speed probe read slower than this x the cell's fastest pass is dropped
OUTLIER = 2.0  # a point slower than OUTLIER x a point at least as large on every axis is re-measured
REMEASURE = 2  # extra measurements of a suspect point; the smallest delay stands (noise only adds time)


def _suspects(points: list[tuple], values: list[float], discrete: tuple = ()) -> list[int]:
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


def _remeasure_outliers(kind, allpts: list[tuple], values: list[float], hvalues: list[float], ctx, run_overhead: float,
                        quick: bool) -> int:
    """Re-measure suspect points (grid and hold-out) in place; returns how many were re-measured."""
    measured = values + hvalues
    points = [p for p, _ in allpts]
    discrete = tuple(kind.axes.index(a) for a in kind.discrete)
    suspects = _suspects(points, measured, discrete)
    for i in suspects:
        sizes = dict(zip(kind.axes, points[i]))
        again = [measure_point(kind, sizes, ctx, run_overhead, SETTINGS[ctx.provider]["point_budget"][0], quick)
                 for _ in range(REMEASURE)]
        measured[i] = min(measured[i], best_delay(again, run_overhead))
        if i < len(values):
            values[i] = measured[i]
        else:
            hvalues[i - len(values)] = measured[i]
    return len(suspects)


# ------------------------------------------------------------------------------------------ grids

def _grid_points(grids: list[list[float]]) -> list[tuple]:
    import itertools
    return list(itertools.product(*grids))


def holdout_points(grids: list[list[float]], limit: int, discrete: tuple = ()) -> list[tuple]:
    """Geometric midpoints: along each axis (other axes on grid points) and cell centres, deduplicated.

    `discrete`: indices of axes with only legal values (block size): no midpoints along them."""
    import itertools
    mids = [[] if a in discrete else [C.geometric_mid(x, y) for x, y in zip(g, g[1:])] for a, g in enumerate(grids)]
    pts: list[tuple] = []
    for a, m in enumerate(mids):
        for v in m:
            if v in grids[a]:
                continue
            others = [g for g in grids]
            others[a] = [v]
            pts.extend(itertools.product(*others))
    if any(mids):
        pts.extend(itertools.product(*[m if m else grids[a] for a, m in enumerate(mids)]))
    seen, out = set(), []
    for p in pts:
        if p not in seen:
            seen.add(p)
            out.append(p)
    if len(out) > limit:  # spread the kept ones over the list (deterministic)
        step = len(out) / limit
        out = [out[int(i * step)] for i in range(limit)]
    return out


def _in_computes(kind: "C.CellKind", ctx: "C.Ctx") -> str | None:
    """None if the provider runs the cell natively, else why not."""
    import onnx
    sizes = {a: g[0] for a, g in zip(kind.axes, kind.grids[_plan(ctx.provider, True)])}
    graph = kind.build(sizes, 1, ctx)
    model = C.make_model(graph)
    try:
        if ctx.provider == "cpu":
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "opt.onnx")
                _session(model, "cpu", optimized_path=path)
                before = sum(n.op_type == "Cast" for n in model.graph.node)
                after = [n.op_type for n in onnx.load(path).graph.node]
            if sum(op == "Cast" for op in after) > before:
                return f"runs only through inserted Casts ({' -> '.join(after[:6])}): no {kind.precision} kernel"
        Runner(graph, ctx.provider)()
    except SoftsynError:
        raise
    except Exception as e:  # noqa: BLE001 - NOT_IMPLEMENTED, fallback refused, ...
        return "does not run: " + (str(e).strip().splitlines() or ["?"])[0][:200]
    return None


def _plan(provider: str, quick: bool) -> str:
    return provider + ("-quick" if quick else "")


# ------------------------------------------------------------------------------------------ YAML

def _num(v) -> str:
    from softsyn.characterize.ceilings import _num as n
    return n(v)


def _flow(v) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_flow(x) for x in v) + "]"
    if isinstance(v, float):
        return _num(v) if (v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e6)) else repr(v)
    return yaml.safe_dump(v, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def _nest(flat: list[float], shape: list[int]):
    if len(shape) == 1:
        return list(flat)
    step = len(flat) // shape[0]
    return [_nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def render(lib: dict) -> str:
    from softsyn.characterize.ceilings import render_library_yaml
    head = render_library_yaml({**lib, "cells": []}).rstrip("\n").splitlines()
    head = [h for h in head if not h.startswith("cells:")]
    head[0] = (f"# softsyn target library: {lib['library']}. Ceilings by softsyn.characterize.ceilings, delay tables by "
               "softsyn characterize (see softsyn/characterize/plan.py for the methods).")
    out = head
    for k in ("characterization", "probe", "interpolation_error", "not_characterised"):
        if k in lib:
            if not lib[k]:
                out.append(f"{k}: {{}}")
                continue
            out.append(f"{k}:")
            for kk, vv in lib[k].items():
                out.append(f"  {kk}: {_flow(vv)}")
    out.append("cells:")
    for c in lib["cells"]:
        out.append(f"  - op: {c['op']}")
        for k in ("precision", "implementation", "axes", "points", "delays", "bytes_per_weight", "error", "scale",
                  "notes"):
            if k in c and c[k] is not None or k in ("error",):
                out.append(f"    {k}: {_flow(c.get(k))}")
        if "holdout" in c:
            h = c["holdout"]
            out.append("    holdout:")
            for k in ("median_pct", "max_pct", "points", "measured", "interpolated"):
                out.append(f"      {k}: {_flow(h[k])}")
        if "measured" in c:
            out.append(f"    measured: {_flow(c['measured'])}")
    return "\n".join(out) + "\n"


def _write(lib: dict, path: Path) -> None:
    from softsyn.library import parse_library
    text = render(lib)
    parse_library(text, path)  # what we write must load
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _pool_errors(lib: dict) -> dict:
    errs = []
    for c in lib["cells"]:
        h = c.get("holdout")
        if h and h["points"]:
            errs += [abs(i - m) / m * 100 for i, m in zip(h["interpolated"], h["measured"])]
    if not errs:
        return {"median_pct": None, "max_pct": None, "points": 0}
    return {"median_pct": round(statistics.median(errs), 1), "max_pct": round(max(errs), 1), "points": len(errs),
            "method": "held-out geometric midpoints between grid points, measured like grid points; "
                      "|log-log interpolated - measured| / measured"}


# ------------------------------------------------------------------------------------------ main

def characterize(provider: str, output: str | os.PathLike, cells: str | None = None, quick: bool = False,
                 progress: bool = True, command: str | None = None, note: str | None = None,
                 holdout_limit: int | None = None) -> dict:
    """Characterise `provider` into `output` (resuming it if it exists); returns the library dict."""
    from softsyn.characterize.ceilings import measure_ceilings
    from softsyn.library import Cell

    if provider not in PLANS:
        raise SoftsynError(f"unknown provider {provider!r}; valid: {', '.join(PLANS)}")
    path = Path(output)
    plan = _plan(provider, quick)
    q = 0 if quick else 1
    started = time.perf_counter()
    if path.exists():
        lib = yaml.safe_load(path.read_text())
        if not isinstance(lib, dict) or "ceilings" not in lib:
            raise SoftsynError(f"{path}: exists and is not a library; choose another -o FILE")
        if str(lib.get("provider")) != {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}[provider]:
            raise SoftsynError(f"{path}: is a library for {lib.get('provider')}, not --provider {provider}")
        lib.setdefault("notes", {})
        lib["cells"] = lib.get("cells") or []
        _log(progress, f"[characterize] resuming {path}: {len(lib['cells'])} cells already measured")
    else:
        _log(progress, f"[characterize] measuring ceilings ({provider}{', quick' if quick else ''}) ...")
        lib = measure_ceilings(provider, quick=quick, progress=progress,
                               name="cpu-ort" if provider == "cpu" else "h200-ort-cuda", command=command)
        lib["cells"] = []
    import onnxruntime as ort
    lib.setdefault("characterization", {})
    ch = lib["characterization"]
    if not lib.get("command"):
        lib["command"] = command
    elif command and command != lib["command"] and command not in ch.get("resumed_with", []):
        # the library's command stays the one that started it; a resumed run (other --cells) is listed after it
        ch["resumed_with"] = ch.get("resumed_with", []) + [command]
    ch.update({"plan": plan, "date": _dt.date.today().isoformat(), "onnxruntime": ort.__version__})
    if note:
        ch["status"] = note
    ch["method"] = ("per-node delay = (T(N copies) - T(1)) / (N - 1), IO bound on the device, median; "
                    + ("CPU: chain form (copy i consumes copy i-1's output) where the op allows it, else independent "
                       "copies; T(1) and T(N) timed one session at a time; weight cells: as many copies as 64 MiB of "
                       "weights holds (cold weights, 2x the L3)" if provider == "cpu" else
                       "independent copies, interleaved samples") + "; long nodes: T(1) - run overhead"
                    + (f"; each point the {SETTINGS[provider]['combine']} of {SETTINGS[provider]['passes'][q]} passes "
                       f"over the grid, less passes whose machine-speed probe read > {PASS_GATE:g}x the cell's fastest"
                       if SETTINGS[provider]["passes"][q] > 1 else "")
                    + f"; points > {OUTLIER:g}x slower than a larger point re-measured")
    lib.setdefault("not_characterised", {})
    done = {(c["op"], str(c["precision"]), str(c.get("implementation", ""))) for c in lib["cells"]}

    ctx = C.Ctx(provider=provider, row=256 if provider == "cpu" else 1024, head_dim=32 if provider == "cpu" else 128,
                act="fp32" if provider == "cpu" else "fp16", form=st_form(provider))
    run_overhead = float(lib["ceilings"]["run_overhead"])
    kinds = [k for k in C.cell_kinds() if provider in k.providers]
    kinds.append(None)  # the Run cell
    if cells:
        pats = [p.strip() for p in cells.split(",") if p.strip()]
        kinds = [k for k in kinds if any(fnmatch.fnmatchcase(k.key if k else "Run.fp32", p)
                                         or fnmatchcase_op(k, p) for p in pats)]
    order = {(k.op, k.precision, k.implementation(provider)) if k else ("Run", "fp32", f"ort-{provider}"): i
             for i, k in enumerate([k for k in C.cell_kinds() if provider in k.providers] + [None])}
    total = len(kinds)
    limit = holdout_limit or (6 if quick else 24)
    st = SETTINGS[provider]
    probes: list[float] = []  # the machine's speed before each measured cell (softsyn.characterize.probe)
    previous_probe = lib.get("probe")
    # a cell whose every pass started in a slow phase of the machine (probe > PASS_GATE x the run's fastest, known
    # at the end of the plan) is measured once more then; the measurement whose passes ran faster stands
    queue, retried, pass_min, swept = list(enumerate(kinds, 1)), set(), {}, False
    while queue or not swept:
        if not queue:  # the end of the plan: the run's fastest probe is known
            swept = True
            retried = {k for k, (_, _, pm) in pass_min.items() if pm > PASS_GATE * min(probes)}
            queue = [(i, k) for key, (i, k, _) in pass_min.items() if key in retried]
            for key in sorted(retried):
                _log(progress, f"[characterize] {key}: every pass started in a slow phase (probe "
                     f"{pass_min[key][2] * 1e6:.0f} us vs the run's fastest {min(probes) * 1e6:.0f} us): measured again")
            continue
        idx, kind = queue.pop(0)
        impl = kind.implementation(provider) if kind else f"ort-{provider}"
        op, prec = (kind.op, kind.precision) if kind else ("Run", "fp32")
        key = f"{op}.{prec}.{impl}"
        if ((op, prec, impl) in done and key not in retried) or key in lib["not_characterised"]:
            _log(progress, f"[characterize] {idx:>3}/{total} {key}: already in {path.name}, skipped")
            continue
        probes.append(speed_probe(provider))
        lib["probe"] = summarise(probes, previous_probe)
        t_cell = time.perf_counter()
        if kind is None:
            entry = _run_cell(provider, plan, lib)
        else:
            ctx.precision = kind.precision
            why = _in_computes(kind, ctx)
            if why:
                lib["not_characterised"][key] = why
                _log(progress, f"[characterize] {idx:>3}/{total} {key}: not characterised: {why[:100]}")
                _write(lib, path)
                continue
            grids = kind.grids[plan]
            pts = _grid_points(grids)
            hold = holdout_points(grids, limit, tuple(kind.axes.index(a) for a in kind.discrete))
            budget = st["point_budget"][q]
            cap = st["cell_cap"][q]
            allpts = [(p, False) for p in pts] + [(p, True) for p in hold]
            passes = st["passes"][q]
            taken: list[list[Sample]] = [[] for _ in allpts]
            failed = None
            pass_probes = [probes[-1]]  # the machine's speed at the start of each pass
            for pas in range(passes):  # every point once per pass (best_delay combines them)
                if pas:
                    probes.append(speed_probe(provider))
                    pass_probes.append(probes[-1])
                for j, (p, is_hold) in enumerate(allpts):
                    remaining = cap - (time.perf_counter() - t_cell)
                    left = (passes - pas) * len(allpts) - j
                    b = max(0.02, min(budget / passes, remaining / max(1, left)))
                    sizes = dict(zip(kind.axes, p))
                    try:
                        n = taken[j][0].copies if taken[j] and not taken[j][0].direct else None
                        taken[j].append(measure_point(kind, sizes, ctx, run_overhead, b, quick, copies=n))
                    except Exception as e:  # noqa: BLE001 - one bad point must not lose the run: record why
                        failed = f"failed at {sizes}: " + (str(e).strip().splitlines() or ["?"])[-1][:200]
                        break
                    _log(progress, f"\r[characterize] {idx:>3}/{total} {key}: pass {pas + 1}/{passes} point "
                         f"{j + 1}/{len(allpts)} {time.perf_counter() - started:6.0f} s", end="")
                if failed:
                    break
            # passes that started in a slow phase of the machine are dropped (PASS_GATE), the rest combined
            keep = [i for i, pp in enumerate(pass_probes) if pp <= PASS_GATE * min(pass_probes)]
            best = [best_delay([t[i] for i in keep if i < len(t)] or t, run_overhead, st["combine"]) if t else math.inf
                    for t in taken]
            values, hvalues = best[:len(pts)], best[len(pts):]
            if not failed:
                try:
                    redone = _remeasure_outliers(kind, allpts, values, hvalues, ctx, run_overhead, quick)
                except Exception as e:  # noqa: BLE001
                    failed = "failed re-measuring an outlier: " + (str(e).strip().splitlines() or ["?"])[-1][:200]
                if redone and not failed:
                    _log(progress, f"[characterize] {idx:>3}/{total} {key}: re-measured {redone} outlier point(s)")
            if failed:
                lib["not_characterised"][key] = failed
                _log(progress, f"[characterize] {idx:>3}/{total} {key}: not characterised: {failed[:120]}")
                _write(lib, path)
                continue
            entry = {"op": kind.op, "precision": kind.precision, "implementation": impl, "axes": list(kind.axes),
                     "points": [[int(v) for v in g] for g in grids],
                     "delays": _nest(values, [len(g) for g in grids]),
                     "bytes_per_weight": kind.bytes_per_weight, "error": None}
            if kind.scale:
                entry["scale"] = {k: (v if v is not None else ctx.head_dim) for k, v in kind.scale.items()}
            entry["notes"] = kind.notes or None
            cell = Cell(op=entry["op"], precision=entry["precision"], implementation=impl, axes=entry["axes"],
                        points=[[float(v) for v in g] for g in grids], delays=entry["delays"], _flat=list(values))
            interp = [cell.lookup(dict(zip(kind.axes, p)))[0] for p in hold]
            errs = [abs(i - m) / m * 100 for i, m in zip(interp, hvalues)]
            entry["holdout"] = {"median_pct": round(statistics.median(errs), 1) if errs else None,
                                "max_pct": round(max(errs), 1) if errs else None,
                                "points": [[int(v) for v in p] for p in hold], "measured": hvalues,
                                "interpolated": interp}
        entry["measured"] = {"seconds": round(time.perf_counter() - t_cell, 1)}
        if kind is not None and passes > 1:
            entry["measured"]["passes_kept"] = len(keep)
            entry["measured"]["pass_probes_us"] = [round(pp * 1e6) for pp in pass_probes]
        earlier = [c for c in lib["cells"] if (c["op"], str(c["precision"]), str(c.get("implementation", ""))) ==
                   (op, prec, impl)]
        if earlier and min(earlier[0]["measured"].get("pass_probes_us") or [0]) <= min(
                entry["measured"].get("pass_probes_us") or [0]):
            entry = earlier[0]  # the first measurement ran at least as fast: it stands
        lib["cells"] = sorted([c for c in lib["cells"] if c not in earlier] + [entry], key=lambda c: order.get(
            (c["op"], str(c["precision"]), str(c.get("implementation", ""))), 10_000))
        if kind is not None and "pass_probes_us" in entry["measured"]:
            pass_min[key] = (idx, kind, min(entry["measured"]["pass_probes_us"]) * 1e-6)
        lib["interpolation_error"] = _pool_errors(lib)
        ch["elapsed_s"] = round(float(ch.get("elapsed_s", 0)) + time.perf_counter() - t_cell, 1)
        _write(lib, path)
        h = entry.get("holdout", {})
        _log(progress, f"[characterize] {idx:>3}/{total} {key}: {time.perf_counter() - t_cell:.1f} s"
             + (f", hold-out error median {h.get('median_pct')}% max {h.get('max_pct')}%" if h else ""))
    e = lib.get("interpolation_error", {})
    _log(progress, f"[characterize] done in {time.perf_counter() - started:.0f} s: {len(lib['cells'])} cells, "
         f"interpolation error median {e.get('median_pct')}% max {e.get('max_pct')}% over {e.get('points')} "
         f"held-out points -> {path}")
    return lib


def st_form(provider: str) -> str:
    return SETTINGS[provider]["form"]


def fnmatchcase_op(kind, pattern: str) -> bool:
    name = kind.op if kind else "Run"
    return fnmatch.fnmatchcase(name, pattern)


def _run_cell(provider: str, plan: str, lib: dict) -> dict:
    """Fixed cost of one run call vs ios = graph inputs + outputs ([1, 8] fp32 Identity per pair), timed the way the
    signoff times a model (through session.run with numpy feeds the CPU cell read 3.2-15.8 us over 2-32 ios, as
    the signoff runs them 1.0-1.5 us; the H200's with preallocated outputs 96-130 us, as the signoff 9-18 us)."""
    from onnx import helper

    from softsyn.runtime.measure import BoundRunner
    grid = C.run_cell_grid(plan)[0]
    launch = float(lib["ceilings"]["launch_overhead"])
    delays = []
    for ios in grid:
        pairs = max(1, ios // 2)
        nodes = [helper.make_node("Identity", [f"x{i}"], [f"y{i}"], name=f"id{i}") for i in range(pairs)]
        g = C.Graph(nodes, {f"x{i}": (C.FLOAT, np.ones((1, 8), np.float32)) for i in range(pairs)},
                    [(f"y{i}", C.FLOAT) for i in range(pairs)])
        feeds = {f"x{i}": np.ones((1, 8), np.float32) for i in range(pairs)}
        fn = BoundRunner(_session(C.make_model(g), provider), feeds, provider).run
        t = time_interleaved({"r": fn}, 15, 50)["r"]
        delays.append(max(t - pairs * launch, 1e-9))
    return {"op": "Run", "precision": "fp32", "implementation": f"ort-{provider}", "axes": ["ios"],
            "points": [grid], "delays": delays, "bytes_per_weight": None, "error": None,
            "notes": "one run_with_iobinding call as the signoff times it (softsyn.runtime.measure.BoundRunner: inputs bound "
                     "once, outputs allocated by the runtime) vs graph inputs + outputs, minus the Identity nodes' "
                     "launch overhead"}


def list_cells(provider: str, quick: bool, cells: str | None = None) -> list[tuple[str, int, int]]:
    plan = _plan(provider, quick)
    out = []
    for k in C.cell_kinds():
        if provider not in k.providers:
            continue
        if cells and not any(fnmatch.fnmatchcase(k.key, p) or fnmatch.fnmatchcase(k.op, p) for p in cells.split(",")):
            continue
        g = k.grids[plan]
        out.append((f"{k.op}.{k.precision}.{k.implementation(provider)}", len(_grid_points(g)),
                    len(holdout_points(g, 6 if quick else 24, tuple(k.axes.index(a) for a in k.discrete)))))
    return out
