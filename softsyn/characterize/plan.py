"""`softsyn characterize`: measure a library's delay tables on the real runtime and device.

For every cell kind the provider runs (softsyn.characterize.catalogue), build a small ONNX graph per grid point, time
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
- A CUDA failure at a cell (ORT's "CUDA failure 716: misaligned address") leaves the process's device context
  unusable: the cell is recorded as not characterised with it and the run stops (exit 2), to go on when run again.
- Resumable: cells already in the output file (and cells recorded as not characterised) are skipped;
  the file is rewritten atomically (validated by softsyn.library.model.parse_library first) after each cell.
- The `Run` cell: the fixed cost of one run call vs the number of graph inputs + outputs (`ios`),
  measured the way the signoff measures a model: `run_with_iobinding`, inputs bound once, outputs allocated by
  the runtime (softsyn.runtime.binding.BoundRunner.from_feeds).
"""
from __future__ import annotations

import datetime as _dt
import fnmatch
import functools
import itertools
import math
import os
import re
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import yaml
from onnx import helper

from softsyn.characterize.catalogue import CellKind, cell_kinds, plan_name, run_cell_grid
from softsyn.characterize.cellgraph import FLOAT, Ctx, Graph, make_model
from softsyn.characterize.ceilings import measure_ceilings, time_interleaved
from softsyn.characterize.probe import speed_probe, summarise
from softsyn.characterize.runner import (
    OUTLIER, SETTINGS, Runner, Sample, best_delay, cell_session, measure_point, remeasure_outliers)
from softsyn.characterize.writer import write_library
from softsyn.errors import LibraryFailure, SoftsynError
from softsyn.library import Cell
from softsyn.library.model import GRAPH_MAX_ROWS, GRAPH_SUFFIX
from softsyn.progress import log
from softsyn.runtime.binding import BoundRunner
from softsyn.runtime.session import PROVIDERS, describe_device

PASS_GATE = 1.15  # a pass whose machine-speed probe read slower than this x the cell's fastest pass is dropped


# ------------------------------------------------------------------------------------------ grids

def _grid_points(grids: list[list[float]]) -> list[tuple]:
    return list(itertools.product(*grids))


def _in_computes(kind: CellKind, ctx: Ctx) -> str | None:
    """None if the provider runs the cell natively, else why not."""
    sizes = {a: g[0] for a, g in zip(kind.axes, kind.grids[plan_name(ctx.provider, True)])}
    graph = kind.build(sizes, 1, ctx)
    model = make_model(graph)
    try:
        if ctx.provider == "cpu":
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "opt.onnx")
                cell_session(model, "cpu", optimized_path=path)
                before = sum(n.op_type == "Cast" for n in model.graph.node)
                after = [n.op_type for n in onnx.load(path).graph.node]
            if sum(op == "Cast" for op in after) > before:
                return f"runs only through inserted Casts ({' -> '.join(after[:6])}): no {kind.precision} kernel"
        Runner(graph, ctx.provider)()
    except SoftsynError:
        raise
    except Exception as e:  # noqa: BLE001 - NOT_IMPLEMENTED, fallback refused, ...
        return "does not run: " + failure_text(e, line=0)
    return None


def _nest(flat: list[float], shape: list[int]):
    if len(shape) == 1:
        return list(flat)
    step = len(flat) // shape[0]
    return [_nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


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

# Graph tables (--graph, CUDA): the cells whose copies-measured delay is host-bound at decode sizes, re-measured as
# CUDA graph replays at a decode step's rows (m / q_tokens up to GRAPH_MAX_ROWS: batch 1 and batched decode), where the
# host share disappears. Their tables are
# cells of implementation `<impl>GRAPH_SUFFIX`, which only a captured group's timing reads (Library.graph_delay).
GRAPH_ROWS = {"MatMul": "m", "MatMulNBits": "m", "MatMulBlockQuantizedFp8Weight": "m", "GroupQueryAttention": "q_tokens",
              "MultiHeadAttention": "q_tokens",
              # the small nodes of a captured decode step, over `elements` up to GRAPH_ELEMENTS: inside a graph they
              # cost 1.7-4 us on the H200 (CUPTI, qwen3-1.7b), not the 1.1 us of an empty node the STA gave them
              "SimplifiedLayerNormalization": None, "SkipSimplifiedLayerNormalization": None, "Split": None,
              "Mul": None, "QuickGelu": None, "Slice": None, "ReduceSum": None, "Gather": None,
              # bf16 cells' boundary Casts: ~3.3 us each in an H100's captured decode against the 1.07 us of an empty
              # node (bench/results/bf16-fp8-h100-2026-12-06-signoff.rpt)
              "Cast": None}
GRAPH_ELEMENTS = 1 << 18  # the largest elements point a small node's graph table holds (a decode step's sizes)


def graph_kind(kind: CellKind | None) -> bool:
    """Whether a kind has a graph table: its rows axis (GRAPH_ROWS), or an elements-only kind GRAPH_ROWS names."""
    return kind is not None and kind.op in GRAPH_ROWS and (
        GRAPH_ROWS[kind.op] in kind.axes if GRAPH_ROWS[kind.op] else tuple(kind.axes) == ("elements",))


def graph_grids(kind: CellKind, grids: list[list[float]]) -> list[list[float]]:
    """A kind's grids for its graph table: the rows axis at its points up to GRAPH_MAX_ROWS (a decode step's rows, one
    sequence or a batch of them), the rest as they are; an elements-only kind's points up to GRAPH_ELEMENTS."""
    rows = GRAPH_ROWS.get(kind.op)
    if rows is None:
        return [[v for v in g if v <= GRAPH_ELEMENTS] or [g[0]] for g in grids]
    return [[v for v in g if v <= GRAPH_MAX_ROWS] or [g[0]] if a == rows else list(g) for a, g in zip(kind.axes, grids)]


def characterize(provider: str, output: str | os.PathLike, *, cells: str | None = None, quick: bool = False,
                 progress: bool = True, command: str | None = None, note: str | None = None,
                 holdout_limit: int | None = None, cuda_graph: bool = False, again: bool = False) -> dict:
    """Characterise `provider` into `output` (resuming it if it exists); returns the library dict. `cuda_graph`:
    the graph tables instead (GRAPH_ROWS' kinds at one row, timed as CUDA graph replays; CUDA only). `again`: the
    `cells` selected are measured again though the file has them (a recipe changed), each entry replaced when its
    new measurement is written (an interrupted run keeps the old ones it had not reached).

    Three stages: the library's header (read or measured ceilings, the method), the plan (plan_cells: which cells,
    in which order), then each cell measured (_Measurement) and written as soon as it is."""
    if provider not in PROVIDERS:
        raise SoftsynError(f"unknown provider {provider!r}; valid: {', '.join(PROVIDERS)}")
    if cuda_graph and provider != "cuda":
        raise SoftsynError(f"--graph times cells as CUDA graph replays: it needs --provider cuda, not {provider}")
    say = functools.partial(log, enabled=progress, tag="characterize")
    path = Path(output)
    started = time.perf_counter()
    lib = _open_library(provider, path, quick=quick, progress=progress, command=command, say=say)
    _stamp_header(lib, provider, plan_name(provider, quick), command=command, note=note, cuda_graph=cuda_graph)
    plan = plan_cells(provider, lib, cells=cells, quick=quick, cuda_graph=cuda_graph, again=again,
                      holdout_limit=holdout_limit)
    _Measurement(plan, lib, path, say, started).sweep()
    e = lib.get("interpolation_error", {})
    say(f"done in {time.perf_counter() - started:.0f} s: {len(lib['cells'])} cells, "
        f"interpolation error median {e.get('median_pct')}% max {e.get('max_pct')}% over {e.get('points')} "
        f"held-out points -> {path}")
    return lib


# ------------------------------------------------------------------------------------------ the header

def device_model(described: str) -> str:
    """The device's model in describe_device's line (its first field: the GPU's or CPU's name, without memory,
    driver or cores)."""
    return described.split(",")[0].strip()


def _open_library(provider: str, path: Path, *, quick: bool, progress: bool, command: str | None, say) -> dict:
    """The library at `path` to resume (it must be one, for `provider`), or a new one from measured ceilings."""
    if path.exists():
        lib = yaml.safe_load(path.read_text())
        if not isinstance(lib, dict) or "ceilings" not in lib:
            raise SoftsynError(f"{path}: exists and is not a library; choose another -o FILE")
        if str(lib.get("provider")) != PROVIDERS[provider]:
            raise SoftsynError(f"{path}: is a library for {lib.get('provider')}, not --provider {provider}")
        here, there = device_model(describe_device(provider)), device_model(str(lib.get("device", "")))
        if here != there:  # one library, one device: its header names the device every cell was measured on
            raise SoftsynError(f"{path}: was measured on {there or 'an unnamed device'}, this machine is {here}: "
                               "a library's cells come from one device; characterize into a new -o FILE")
        lib.setdefault("notes", {})
        lib["cells"] = lib.get("cells") or []
        say(f"resuming {path}: {len(lib['cells'])} cells already measured")
        return lib
    say(f"measuring ceilings ({provider}{', quick' if quick else ''}) ...")
    lib = measure_ceilings(provider, quick=quick, progress=progress,
                           name="cpu-ort" if provider == "cpu" else "h200-ort-cuda", command=command)
    lib["cells"] = []
    return lib


def _stamp_header(lib: dict, provider: str, plan: str, *, command: str | None, note: str | None,
                  cuda_graph: bool) -> None:
    """The header's `characterization` (plan, date, runtime, method; a resumed run's command listed after the
    library's own), the graph tables' note, and an empty `not_characterised` where there is none."""
    st = SETTINGS[plan]
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
                    + (f"; each point the {st.combine} of {st.passes} passes "
                       f"over the grid, less passes whose machine-speed probe read > {PASS_GATE:g}x the cell's fastest"
                       if st.passes > 1 else "")
                    + f"; points > {OUTLIER:g}x slower than a larger point re-measured")
    if cuda_graph:
        lib.setdefault("notes", {})["graph_tables"] = (
            f"cells of implementation *{GRAPH_SUFFIX}: {', '.join(sorted(GRAPH_ROWS))} at one row (decode), the same "
            "T(N copies) - T(1) difference with both graphs captured (enable_cuda_graph=1) and replayed: the kernel "
            "time plus what one more node costs inside a graph, with no host share; read only by captured groups")
    lib.setdefault("not_characterised", {})


# ------------------------------------------------------------------------------------------ the plan

def _cell_name(provider: str, kind: CellKind | None, cuda_graph: bool) -> tuple[str, str, str]:
    """(op, precision, implementation) of `kind` as the library names its entry (None: the Run cell)."""
    impl = kind.implementation(provider) if kind else f"ort-{provider}"
    impl += GRAPH_SUFFIX if cuda_graph else ""
    op, prec = (kind.op, kind.precision) if kind else ("Run", "fp32")
    return op, prec, impl


def _entry_name(cell: dict) -> tuple[str, str, str]:
    return cell["op"], str(cell["precision"]), str(cell.get("implementation", ""))


@dataclass(frozen=True)
class CellPlan:
    """What one characterize run measures: the kinds selected, in catalogue order, each with its 1-based index (None:
    the Run cell); the entries the library already has (skipped); the library's cell order; how points are taken."""

    provider: str
    name: str  # the plan (softsyn.characterize.catalogue.plan_name): its grids and SETTINGS
    kinds: tuple  # ((index, CellKind | None), ...)
    done: frozenset  # (op, precision, implementation) of the entries the library has
    order: dict  # (op, precision, implementation) -> position in the catalogue: the library's cell order
    holdout_limit: int
    quick: bool
    cuda_graph: bool
    again: bool

    def cell(self, kind: CellKind | None) -> tuple[str, str, str]:
        return _cell_name(self.provider, kind, self.cuda_graph)


def plan_cells(provider: str, lib: dict, *, cells: str | None, quick: bool, cuda_graph: bool, again: bool,
               holdout_limit: int | None) -> CellPlan:
    """The cells `characterize` measures into `lib`: the provider's kinds and the Run cell, the graph tables' only
    with `cuda_graph`, those `cells` (comma-separated fnmatch patterns on key or op) selects. `again`: the
    selected cells count as not measured, and their not_characterised entries are dropped from `lib`."""
    catalogue = [k for k in cell_kinds() if provider in k.providers] + [None]  # None: the Run cell
    kinds = [k for k in catalogue if graph_kind(k)] if cuda_graph else list(catalogue)
    if cells:
        pats = [p.strip() for p in cells.split(",") if p.strip()]
        kinds = [k for k in kinds if any(_selects(k, p) for p in pats)]
    elif again:
        raise SoftsynError("characterize --again measures the --cells given again: name them with --cells")
    done = {_entry_name(c) for c in lib["cells"]}
    if again:
        for k in kinds:
            op, prec, impl = _cell_name(provider, k, cuda_graph)
            done.discard((op, prec, impl))
            lib["not_characterised"].pop(f"{op}.{prec}.{impl}", None)
    order = {(k.op, k.precision, k.implementation(provider)) if k else ("Run", "fp32", f"ort-{provider}"): i
             for i, k in enumerate(catalogue)}
    return CellPlan(provider=provider, name=plan_name(provider, quick), kinds=tuple(enumerate(kinds, 1)),
                    done=frozenset(done), order=order, holdout_limit=holdout_limit or (6 if quick else 24),
                    quick=quick, cuda_graph=cuda_graph, again=again)


# ------------------------------------------------------------------------------------------ measure and write

# an error ORT's CUDA provider reports ("CUDA failure 716: misaligned address"): most leave the process's CUDA context
# unusable (every later call fails), as a misaligned MoE hold-out did on an H100 (2026-12-07)
CUDA_FAILURE = re.compile(r"\b(?:CUDA|CUDNN|CUBLAS) failure \d+: [^;\n]*")


def failure_text(error: BaseException, line: int = -1) -> str:
    """Why a cell or point failed, in one line: the CUDA failure the error names where it names one (ORT's message
    ends in a source path and a C++ signature), else the error's `line` (the last by default), cut at 200."""
    text = str(error)
    cuda = CUDA_FAILURE.search(text)
    return cuda.group(0).strip() if cuda else (text.strip().splitlines() or ["?"])[line][:200]


class _Measurement:
    """Measures a plan's cells into `lib`, writing the file after each. A cell whose every pass started in a slow
    phase of the machine (probe > PASS_GATE x the run's fastest, known at the end of the plan) is measured once more
    then; the measurement whose passes ran faster stands."""

    def __init__(self, plan: CellPlan, lib: dict, path: Path, say, started: float):
        self.plan, self.lib, self.path, self.say = plan, lib, path, say
        provider = plan.provider
        self.ctx = Ctx(provider=provider, row=256 if provider == "cpu" else 1024,
                       head_dim=32 if provider == "cpu" else 128, act="fp32" if provider == "cpu" else "fp16",
                       form=SETTINGS[plan.name].form, cuda_graph=plan.cuda_graph)
        self.run_overhead = float(lib["ceilings"]["run_overhead"])
        self.probes: list[float] = []  # the machine's speed before each measured cell and pass
        self.previous_probe = lib.get("probe")
        self.pass_min: dict = {}  # key -> (index, kind, its fastest pass's probe s)
        self.started = started  # when the run began: the progress line's clock

    def sweep(self) -> None:
        queue, retried, swept = list(self.plan.kinds), set(), False
        while queue or not swept:
            if not queue:  # the end of the plan: the run's fastest probe is known
                swept = True
                retried = {k for k, (_, _, pm) in self.pass_min.items() if pm > PASS_GATE * min(self.probes)}
                queue = [(i, k) for key, (i, k, _) in self.pass_min.items() if key in retried]
                for key in sorted(retried):
                    self.say(f"{key}: every pass started in a slow phase (probe {self.pass_min[key][2] * 1e6:.0f} us "
                             f"vs the run's fastest {min(self.probes) * 1e6:.0f} us): measured again")
                continue
            idx, kind = queue.pop(0)
            self._cell(idx, kind, retried)

    def _cell(self, idx: int, kind: CellKind | None, retried: set) -> None:
        plan, lib = self.plan, self.lib
        op, prec, impl = plan.cell(kind)
        key = f"{op}.{prec}.{impl}"
        if ((op, prec, impl) in plan.done and key not in retried) or key in lib["not_characterised"]:
            self.say(f"{idx:>3}/{len(plan.kinds)} {key}: already in {self.path.name}, skipped")
            return
        self.probes.append(speed_probe(plan.provider))
        lib["probe"] = summarise(self.probes, self.previous_probe)
        t_cell = time.perf_counter()
        if kind is None:
            entry = _run_cell(plan.provider, plan.name, lib)
            entry["measured"] = {"seconds": round(time.perf_counter() - t_cell, 1)}
        else:
            entry = self._table(idx, kind, key, t_cell)
        if entry is not None:
            self._write(idx, kind, entry, t_cell)

    def _not_characterised(self, idx: int, key: str, why: str, shown: int) -> None:
        """Record `key` as not characterised, `why`, in the file; where `why` is a CUDA failure, stop the run there:
        every later call in this process would fail too (a speed probe's then ended a run with an internal error,
        H100, 2026-12-07)."""
        self.lib["not_characterised"][key] = why
        self.say(f"{idx:>3}/{len(self.plan.kinds)} {key}: not characterised: {why[:shown]}")
        write_library(self.lib, self.path)
        if CUDA_FAILURE.search(why):
            raise LibraryFailure(
                f"characterize: {key} {why}; a CUDA failure leaves the process's device context unusable, so the run "
                f"stops here with {len(self.lib['cells'])} cells in {self.path}: run the same command again to go on "
                "from the next cell")

    def _table(self, idx: int, kind: CellKind, key: str, t_cell: float) -> dict | None:
        """The cell's entry: its delay table over the grid, hold-out error, how it was measured; None (recorded as
        not characterised) when the provider does not compute in it or a point fails."""
        plan = self.plan
        self.ctx.precision = kind.precision
        why = _in_computes(kind, self.ctx)
        if why:
            self._not_characterised(idx, key, why, 100)
            return None
        grids = graph_grids(kind, kind.grids[plan.name]) if plan.cuda_graph else kind.grids[plan.name]
        pts = _grid_points(grids)
        hold = kind.holdouts(grids, plan.holdout_limit)
        allpts = [(p, False) for p in pts] + [(p, True) for p in hold]
        taken, pass_probes, failed = self._passes(idx, kind, key, allpts, t_cell)
        # passes that started in a slow phase of the machine are dropped (PASS_GATE), the rest combined
        keep = [i for i, pp in enumerate(pass_probes) if pp <= PASS_GATE * min(pass_probes)]
        best = [best_delay([t[i] for i in keep if i < len(t)] or t, self.run_overhead, SETTINGS[plan.name].combine)
                if t else math.inf for t in taken]
        values, hvalues = best[:len(pts)], best[len(pts):]
        if not failed:
            try:
                redone = remeasure_outliers(kind, allpts, values, hvalues, self.ctx, self.run_overhead,
                                            quick=plan.quick)
            except Exception as e:  # noqa: BLE001
                failed = f"failed re-measuring an outlier: {failure_text(e)}"
            if not failed and redone:
                self.say(f"{idx:>3}/{len(plan.kinds)} {key}: re-measured {redone} outlier point(s)")
        if failed:
            self._not_characterised(idx, key, failed, 120)
            return None
        impl = plan.cell(kind)[2]
        entry = _table_entry(kind, impl, grids, values)
        if kind.scale:
            entry["scale"] = {k: (v if v is not None else self.ctx.head_dim) for k, v in kind.scale.items()}
        entry["notes"] = kind.notes or None
        entry["attributes"] = (kind.attributes or {}).get(self.ctx.provider)
        table = Cell(op=entry["op"], precision=entry["precision"], implementation=impl, axes=entry["axes"],
                     points=[[float(v) for v in g] for g in grids], delays=entry["delays"], _flat=list(values))
        entry["holdout"] = _holdout(table, kind.axes, hold, hvalues)
        entry["measured"] = {"seconds": round(time.perf_counter() - t_cell, 1)}
        if SETTINGS[plan.name].passes > 1:
            entry["measured"]["passes_kept"] = len(keep)
            entry["measured"]["pass_probes_us"] = [round(pp * 1e6) for pp in pass_probes]
        return entry

    def _passes(self, idx: int, kind: CellKind, key: str, allpts: list, t_cell: float):
        """(samples per point, the machine-speed probe at the start of each pass, why a point failed or None):
        every point once per pass (best_delay combines them), within the plan's per-point budget and cell cap."""
        plan, st = self.plan, SETTINGS[self.plan.name]
        passes = st.passes
        taken: list[list[Sample]] = [[] for _ in allpts]
        pass_probes = [self.probes[-1]]
        for pas in range(passes):
            if pas:
                self.probes.append(speed_probe(plan.provider))
                pass_probes.append(self.probes[-1])
            for j, (p, _) in enumerate(allpts):
                remaining = st.cell_cap - (time.perf_counter() - t_cell)
                left = (passes - pas) * len(allpts) - j
                b = max(0.02, min(st.point_budget / passes, remaining / max(1, left)))
                sizes = dict(zip(kind.axes, p))
                try:
                    n = taken[j][0].copies if taken[j] and not taken[j][0].direct else None
                    taken[j].append(measure_point(kind, sizes, self.ctx, self.run_overhead, b, plan.quick, copies=n))
                except Exception as e:  # noqa: BLE001 - one bad point must not lose the run: record why
                    return taken, pass_probes, f"failed at {sizes}: {failure_text(e)}"
                self.say(f"{idx:>3}/{len(plan.kinds)} {key}: pass {pas + 1}/{passes} point "
                         f"{j + 1}/{len(allpts)} {time.perf_counter() - self.started:6.0f} s", end="")
        return taken, pass_probes, None

    def _write(self, idx: int, kind: CellKind | None, entry: dict, t_cell: float) -> None:
        """Put `entry` in the library in catalogue order (an earlier entry for the cell whose passes ran at least as
        fast stands, unless --again), pool the interpolation error, and rewrite the file."""
        plan, lib = self.plan, self.lib
        name = plan.cell(kind)
        key = ".".join(name)
        earlier = [c for c in lib["cells"] if _entry_name(c) == name]
        if earlier and not plan.again and min(earlier[0]["measured"].get("pass_probes_us") or [0]) <= min(
                entry["measured"].get("pass_probes_us") or [0]):
            entry = earlier[0]  # the first measurement ran at least as fast: it stands
        lib["cells"] = sorted([c for c in lib["cells"] if c not in earlier] + [entry],
                              key=lambda c: plan.order.get(_entry_name(c), 10_000))
        if kind is not None and "pass_probes_us" in entry["measured"]:
            self.pass_min[key] = (idx, kind, min(entry["measured"]["pass_probes_us"]) * 1e-6)
        lib["interpolation_error"] = _pool_errors(lib)
        ch = lib["characterization"]
        ch["elapsed_s"] = round(float(ch.get("elapsed_s", 0)) + time.perf_counter() - t_cell, 1)
        write_library(lib, self.path)
        h = entry.get("holdout", {})
        self.say(f"{idx:>3}/{len(plan.kinds)} {key}: {time.perf_counter() - t_cell:.1f} s"
                 + (f", hold-out error median {h.get('median_pct')}% max {h.get('max_pct')}%" if h else ""))


def _table_entry(kind: CellKind, impl: str, grids: list[list[float]], values: list[float]) -> dict:
    """A measured kind's library entry, up to its hold-out figures."""
    return {"op": kind.op, "precision": kind.precision, "implementation": impl, "axes": list(kind.axes),
            "points": [[int(v) for v in g] for g in grids],
            "delays": _nest(values, [len(g) for g in grids]),
            "bytes_per_weight": kind.bytes_per_weight, "error": None}


def _holdout(table: Cell, axes: list[str], hold: list[tuple], hvalues: list[float]) -> dict:
    """The table's own log-log interpolation at the hold-out points against what they measured."""
    interp = [table.lookup(dict(zip(axes, p)))[0] for p in hold]
    errs = [abs(i - m) / m * 100 for i, m in zip(interp, hvalues)]
    return {"median_pct": round(statistics.median(errs), 1) if errs else None,
            "max_pct": round(max(errs), 1) if errs else None,
            "points": [[int(v) for v in p] for p in hold], "measured": hvalues, "interpolated": interp}


def _selects(kind, pattern: str) -> bool:
    """Whether a --cells glob names `kind` (None: the Run cell) by OP.PRECISION or OP."""
    return fnmatch.fnmatchcase(kind.key if kind else "Run.fp32", pattern) or fnmatchcase_op(kind, pattern)


def unmatched_cells(provider: str, cells: str, cuda_graph: bool = False) -> list[str]:
    """The --cells globs that name no cell `characterize` measures on `provider`, so a typo is refused before the
    ceilings are measured rather than measuring nothing."""
    kinds = [k for k in cell_kinds() if provider in k.providers and (not cuda_graph or graph_kind(k))]
    kinds += [] if cuda_graph else [None]
    pats = [p.strip() for p in cells.split(",") if p.strip()]
    return [p for p in pats if not any(_selects(k, p) for k in kinds)]


def fnmatchcase_op(kind, pattern: str) -> bool:
    name = kind.op if kind else "Run"
    return fnmatch.fnmatchcase(name, pattern)


def _run_cell(provider: str, plan: str, lib: dict) -> dict:
    """Fixed cost of one run call vs ios = graph inputs + outputs ([1, 8] fp32 Identity per pair), timed the way the
    signoff times a model (through session.run with numpy feeds the CPU cell read 3.2-15.8 us over 2-32 ios, as
    the signoff runs them 1.0-1.5 us; the H200's with preallocated outputs 96-130 us, as the signoff 9-18 us)."""
    grid = run_cell_grid(plan)[0]
    launch = float(lib["ceilings"]["launch_overhead"])
    delays = []
    for ios in grid:
        pairs = max(1, ios // 2)
        nodes = [helper.make_node("Identity", [f"x{i}"], [f"y{i}"], name=f"id{i}") for i in range(pairs)]
        g = Graph(nodes, {f"x{i}": (FLOAT, np.ones((1, 8), np.float32)) for i in range(pairs)},
                  [(f"y{i}", FLOAT) for i in range(pairs)])
        feeds = {f"x{i}": np.ones((1, 8), np.float32) for i in range(pairs)}
        fn = BoundRunner.from_feeds(cell_session(make_model(g), provider), feeds, provider).run
        t = time_interleaved({"r": fn}, 15, 50)["r"]
        delays.append(max(t - pairs * launch, 1e-9))
    return {"op": "Run", "precision": "fp32", "implementation": f"ort-{provider}", "axes": ["ios"],
            "points": [grid], "delays": delays, "bytes_per_weight": None, "error": None,
            "notes": "one run_with_iobinding call as the signoff times it (softsyn.runtime.binding.BoundRunner."
                     "from_feeds: inputs bound once, outputs allocated by the runtime) vs graph inputs + outputs, minus "
                     "the Identity nodes' launch overhead"}


def list_cells(provider: str, quick: bool, cells: str | None = None,
               cuda_graph: bool = False) -> list[tuple[str, int, int]]:
    """(cell, grid points, hold-out points) of what `characterize` would measure; `cuda_graph`: the graph tables'."""
    plan = plan_name(provider, quick)
    out = []
    for k in cell_kinds():
        if provider not in k.providers or (cuda_graph and not graph_kind(k)):
            continue
        if cells and not any(fnmatch.fnmatchcase(k.key, p) or fnmatch.fnmatchcase(k.op, p) for p in cells.split(",")):
            continue
        g = graph_grids(k, k.grids[plan]) if cuda_graph else k.grids[plan]
        suffix = GRAPH_SUFFIX if cuda_graph else ""
        out.append((f"{k.op}.{k.precision}.{k.implementation(provider)}{suffix}", len(_grid_points(g)),
                    len(k.holdouts(g, 6 if quick else 24))))
    return out
