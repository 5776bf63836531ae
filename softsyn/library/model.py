"""Target libraries: what a runtime x device can do, Liberty in spirit.

A library is one YAML file per runtime x device (`softsyn/library/libs/*.yaml` ship with the package; any
other path loads too). It has a header (library, format, runtime, provider, device, date, and the
`command` that measured it or the `source` it was copied from), measured `ceilings` and `cells`:

    ceilings:                        # SI units
      memory_bandwidth: 1.2e10       # B/s (read + write of a large copy)
      peak_flops: {fp32: 4.5e11, int4: 3e11}   # FLOP/s per precision the provider computes in
      launch_overhead: 2.0e-6        # s per node executed by the runtime (eager)
      launch_overhead_graph: null    # s per node inside a CUDA graph (GPU only)
      run_overhead: 2.0e-5           # s per session.run call; null -> launch_overhead (documented fallback)

A cell is a measured delay table (Liberty's lu_table, one axis per problem-size index):

    - op: MatMul
      precision: fp16
      implementation: ort-cuda
      axes: [m, n, k]                # the keys of `sizes` that cost.node_work gives the op
      points: [[1, 16, 256], [4096], [1024, 4096]]   # one increasing grid per axis (index_1, index_2, ...)
      delays: [[[..,..]], ...]       # seconds, nested row-major: shape len(points[0]) x len(points[1]) x ...
      bytes_per_weight: 2
      error: null                    # relative error the cell adds (quantised formats), null if none

Delay lookup rules (`Library.delay`):
- A cell matches when op and precision are equal (and `implementation`, if the caller names one)
  and every axis is present in `sizes`; the first matching cell in file order wins. Otherwise the
  delay is the roofline estimate, source "est":
      max(flops / peak_flops_for(precision), bytes_moved / memory_bandwidth) + launch_overhead
- Inside the grid: multilinear interpolation in log space (log size -> log delay), i.e. piecewise
  power laws between grid points; source "table". Sizes below 1 (e.g. past = 0) count as 1.
- Outside the grid on any axis: source "table-extrap". Above the last grid point the edge
  segment's log-log slope continues (slope floored at 0, so a delay never falls as a size grows);
  below the first grid point, and on an axis with a single grid point, the edge value is held.
  Callers and reports should treat "table-extrap" as less trustworthy than "table".

Scale rule (optional `scale: {size: reference}` on a cell): sizes folded out of the table (e.g.
attention's batch and head_dim) scale the work-proportional part of the delay linearly (see
Cell.scaled); a scaled delay is reported as "table-extrap". The `Run` cell (axis `ios`: graph inputs
+ outputs) gives the fixed cost of one run call (`Library.run_delay`); without it,
ceilings.run_overhead. Characterised cells also carry `holdout` (measured interpolation error).

Host and device (`Library.host_device`): a GPU provider launches kernels asynchronously, so a node costs
the host its launch (ceilings.launch_overhead: what one more node adds to a run) and the device its
kernel time, and the two overlap (softsyn.timing.sta schedules both). A cell measured as N independent
copies reads max(host, device) per node; where its delay stands above HOST_BOUND x the cell's smallest
entry (its fixed per-node floor) the device dominated and the delay is the kernel time, else the copies
were host-bound and the device time is the roofline's (bytes / bandwidth, flops / peak) capped at the
delay, as for a node without a table. A CPU provider is synchronous: host = the delay, device 0.

Precision fallback (`Library.peak_flops_for`): a precision missing (or null) from `peak_flops` is
timed at the figure of the precision the runtime actually computes it in:
- int4 / int8 (weight-only MatMulNBits) and fp8 (DequantizeLinear -> MatMul) dequantise to the
  activation type: fp16 on a GPU library, fp32 on a CPU library;
- fp16 / bf16 / tf32 / fp64 without a kernel: fp32 (ORT CPU wraps an fp16 MatMul in Casts to fp32,
  its InsertCastTransformer; this is a rough stand-in for fp64, which is slower than fp32);
- if that figure is missing too: fp32; if fp32 is missing: SoftsynError.
"""
from __future__ import annotations

import bisect
import datetime as _dt
import importlib.resources
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from softsyn.errors import SoftsynError

FORMAT_VERSION = 1
HEADER_KEYS = ("library", "format", "runtime", "provider", "device", "date", "ceilings")
PRECISIONS = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4")
_ALIASES = {"float32": "fp32", "float": "fp32", "float64": "fp64", "double": "fp64", "float16": "fp16",
            "half": "fp16", "bfloat16": "bf16", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "e4m3": "fp8",
            "e5m2": "fp8", "float8": "fp8", "uint8": "int8", "uint4": "int4"}
_GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider", "ROCMExecutionProvider",
                  "MIGraphXExecutionProvider", "NvTensorRTRTXExecutionProvider")
_WEIGHT_ONLY = ("int4", "int8", "fp8")


def _canonical_precision(precision: str) -> str | None:
    p = str(precision).strip().lower()
    p = _ALIASES.get(p, p)
    return p if p in PRECISIONS else None


@dataclass
class Ceilings:
    """Measured ceilings of a runtime x device, SI units."""

    memory_bandwidth: float  # B/s
    peak_flops: dict[str, float]  # precision -> FLOP/s (only precisions the provider computes in)
    launch_overhead: float  # s per node, eager
    launch_overhead_graph: float | None  # s per node inside a CUDA graph (None: not applicable / not measured)
    run_overhead: float  # s per session.run call


HOST_BOUND = 1.5  # a GPU cell delay within this factor of its table's floor was host (launch) bound
LINEAR_AXES = ("batch",)  # axes that multiply independent work: linear extrapolation above the grid (Cell.lookup)


@dataclass
class Cell:
    """A characterised delay table for one op x precision x implementation."""

    op: str
    precision: str
    implementation: str
    axes: list[str]
    points: list[list[float]]  # one strictly increasing grid per axis
    delays: Any  # nested list (row-major), seconds
    bytes_per_weight: float | None = None
    error: float | None = None
    _flat: list[float] = field(default_factory=list, repr=False)
    scale: dict[str, float] | None = None  # size -> reference value the table was measured at
    holdout: dict | None = None  # measured interpolation error: median_pct, max_pct, points, ...

    @property
    def name(self) -> str:
        return f"{self.op}.{self.precision}.{self.implementation}"

    def lookup(self, sizes: dict[str, float]) -> tuple[float, bool]:
        """(delay s, extrapolated?) at `sizes` (must hold every axis)."""
        extrap = False
        # Per axis: the two bracketing grid indices and the weight of the upper one, in log space.
        brackets: list[tuple[int, int, float]] = []
        for axis, grid in zip(self.axes, self.points):
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
        for a, (axis, grid) in enumerate(zip(self.axes, self.points)):
            lo, hi, t = brackets[a]
            if axis in LINEAR_AXES and t > 1.0:
                factor *= max(float(sizes[axis]), 1.0) / grid[-1]
                brackets[a] = (lo, hi, 1.0)
        # Other axes above the grid: the edge segment's slope continues, floored at 0 per axis (a delay
        # never falls as a size grows past the grid).
        for a, (lo, hi, t) in enumerate(brackets):
            if t > 1.0:
                edge = brackets[:a] + [(lo, hi, 1.0)] + brackets[a + 1:]
                if self._interp(edge) > self._interp(brackets):
                    brackets = edge
        value = self._interp(brackets)
        if factor != 1.0:
            floor = min(self._flat)
            value = floor + max(value - floor, 0.0) * factor
        return value, extrap

    def outside(self, sizes: dict) -> float:
        """How far `sizes` lie outside the grid: the sum over axes of |log(size / nearest grid end)|
        (0: every axis within its grid's range; a single-point axis must match its point)."""
        d = 0.0
        for axis, grid in zip(self.axes, self.points):
            x = max(float(sizes[axis]), 1.0)
            if x < grid[0]:
                d += math.log(grid[0] / x)
            elif x > grid[-1]:
                d += math.log(x / grid[-1])
        return d

    def scaled(self, value: float, sizes: dict) -> tuple[float, bool]:
        """Apply the cell's scale rule: (delay, scaled?).

        For each size in `scale` present in `sizes` the work-proportional part of the delay (above the
        table's smallest entry, its fixed per-node cost) scales linearly with size / reference:
            delay = floor + (table - floor) * prod(sizes[s] / scale[s])
        e.g. attention tables measured at batch 1 and one head_dim serve other batches / head_dims.
        """
        if not self.scale:
            return value, False
        factor = 1.0
        for k, ref in self.scale.items():
            if k in sizes and sizes[k] is not None and ref:
                factor *= max(float(sizes[k]), 1.0) / float(ref)
        if abs(factor - 1.0) < 1e-12:
            return value, False
        floor = min(self._flat)
        return floor + max(value - floor, 0.0) * factor, True

    def _interp(self, brackets: list[tuple[int, int, float]]) -> float:
        """Multilinear interpolation of log(delay) over the 2^d corners of the bracketing cell."""
        strides = []
        s = 1
        for grid in reversed(self.points):
            strides.append(s)
            s *= len(grid)
        strides.reverse()
        logd = 0.0
        for corner in range(1 << len(brackets)):
            w = 1.0
            flat = 0
            for a, (lo, hi, t) in enumerate(brackets):
                if corner >> a & 1:
                    w *= t
                    flat += hi * strides[a]
                else:
                    w *= 1.0 - t
                    flat += lo * strides[a]
            if w != 0.0:
                logd += w * math.log(self._flat[flat])
        return math.exp(logd)


@dataclass
class Library:
    name: str
    header: dict
    ceilings: Ceilings
    cells: list[Cell]
    path: Path

    @property
    def provider(self) -> str:
        return str(self.header.get("provider", ""))

    @property
    def is_gpu(self) -> bool:
        """True when the execution provider runs on a GPU (CUDA / TensorRT)."""
        p = self.provider
        return p in _GPU_PROVIDERS or "cuda" in p.lower() or "tensorrt" in p.lower()

    def peak_flops_for(self, precision: str) -> float:
        """Peak FLOP/s for `precision`, with the documented fallback (see module docstring)."""
        p = _canonical_precision(precision)
        if p is None:
            raise SoftsynError(f"library {self.name}: unknown precision {precision!r}; "
                               f"valid: {', '.join(PRECISIONS)}")
        pf = self.ceilings.peak_flops
        if pf.get(p):
            return pf[p]
        if p in _WEIGHT_ONLY:
            act = "fp16" if self.is_gpu else "fp32"
            if pf.get(act):
                return pf[act]
        if pf.get("fp32"):
            return pf["fp32"]
        raise SoftsynError(f"{self.path}: ceilings.peak_flops: no figure for {p} and no fp32 figure to fall back "
                           f"on; measured: {', '.join(sorted(k for k, v in pf.items() if v)) or 'none'}")

    def cell_for(self, op_type: str, precision: str, sizes: dict | None = None,
                 implementation: str | None = None) -> Cell | None:
        """The first cell matching op, precision (and implementation) whose axes are all in `sizes`; among
        it and later cells with the same axes (e.g. MatMul.fp32 batched-expert and batched), the one whose grid lies nearest the sizes
        (Cell.outside, 0 when the grid covers them), the first in library order on a tie."""
        p = _canonical_precision(precision) or precision
        best, best_d = None, math.inf
        for c in self.cells:
            if c.op != op_type or c.precision != p:
                continue
            if implementation is not None and c.implementation != implementation:
                continue
            if sizes is None or any(a not in sizes or sizes[a] is None for a in c.axes):
                continue
            if best is not None and c.axes != best.axes:
                continue  # only the most specific match's kind of table (batched before plain MatMul)
            d = c.outside(sizes)
            if d < best_d - 1e-12:
                best, best_d = c, d
            if d <= 1e-12:
                break
        return best

    def roofline(self, precision: str, flops: float, bytes_moved: float) -> float:
        """max(flops / peak, bytes / bandwidth) + launch_overhead, seconds."""
        c = self.ceilings
        compute = flops / self.peak_flops_for(precision) if flops else 0.0
        memory = bytes_moved / c.memory_bandwidth if bytes_moved else 0.0
        return max(compute, memory) + c.launch_overhead

    def delay(self, op_type: str, precision: str, flops: float, bytes_moved: float,
              sizes: dict[str, int] | None = None, *, implementation: str | None = None) -> tuple[float, str]:
        """(seconds, source) of one node: "table" / "table-extrap" from a matching cell, else "est"."""
        return self._cell_delay(self.cell_for(op_type, precision, sizes, implementation), precision, flops,
                                bytes_moved, sizes)

    def node_timing(self, op_type: str, precision: str, flops: float, bytes_moved: float,
                    sizes: dict | None) -> tuple[float, str, float, float]:
        """(delay, source, host, device) of one node with one cell lookup: `delay` and `host_device` together."""
        cell = self.cell_for(op_type, precision, sizes)
        delay, source = self._cell_delay(cell, precision, flops, bytes_moved, sizes)
        return (delay, source) + self._split(cell, precision, flops, bytes_moved, delay)

    def host_device(self, op_type: str, precision: str, flops: float, bytes_moved: float, sizes: dict | None,
                    delay: float) -> tuple[float, float]:
        """(host, device) seconds of one node whose library delay is `delay` (see the module docstring).
        View ops (no FLOPs, no bytes: Reshape, Squeeze, ...) alias their input inside a model and launch
        nothing: host only, whatever their copies-form cell read (a copy into a bound output)."""
        cell = self.cell_for(op_type, precision, sizes) if self.is_gpu else None
        return self._split(cell, precision, flops, bytes_moved, delay)

    def _cell_delay(self, cell: Cell | None, precision: str, flops: float, bytes_moved: float,
                    sizes: dict | None) -> tuple[float, str]:
        if cell is not None:
            value, extrap = cell.lookup(sizes)  # type: ignore[arg-type]
            value, scaled = cell.scaled(value, sizes)  # type: ignore[arg-type]
            return value, ("table-extrap" if extrap or scaled else "table")
        return self.roofline(precision, flops, bytes_moved), "est"

    def _split(self, cell: Cell | None, precision: str, flops: float, bytes_moved: float,
               delay: float) -> tuple[float, float]:
        if not self.is_gpu:
            return delay, 0.0
        c = self.ceilings
        if not flops and not bytes_moved:
            return c.launch_overhead, 0.0
        if cell is not None and delay > HOST_BOUND * min(cell._flat):
            return c.launch_overhead, delay  # the copies were device-bound: the table is kernel time
        compute = flops / self.peak_flops_for(precision) if flops else 0.0
        memory = bytes_moved / c.memory_bandwidth if bytes_moved else 0.0
        return c.launch_overhead, min(delay, max(compute, memory))  # host-bound cell, or a roofline estimate

    def run_delay(self, ios: int) -> tuple[float, str]:
        """(seconds, source) of one run call with `ios` graph inputs + outputs: the `Run` cell's table
        (axis `ios`) when characterised, else ceilings.run_overhead ("est")."""
        cell = self.cell_for("Run", "fp32", {"ios": ios})
        if cell is not None:
            value, extrap = cell.lookup({"ios": ios})
            return value, ("table-extrap" if extrap else "table")
        return self.ceilings.run_overhead, "est"

    def describe(self) -> str:
        h = self.header
        return f"{self.name} ({h['runtime']} {h['provider']}, {h['device']}, measured {h['date']})"


# --------------------------------------------------------------------------------------------- loading

def shipped_libraries() -> list[str]:
    """Names of the libraries shipped in softsyn/library/libs (package data)."""
    root = importlib.resources.files("softsyn.library.libs")
    return sorted(e.name[:-5] for e in root.iterdir() if e.name.endswith(".yaml"))


def default_library() -> str:
    return "cpu-ort"


def _shipped_hint() -> str:
    return f"shipped libraries: {', '.join(shipped_libraries())}"


def _key_lines(text: str) -> dict[str, int]:
    """Dotted key path -> 1-based line, for error messages ("ceilings.peak_flops.fp32", "cells.0.axes")."""
    lines: dict[str, int] = {}
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return lines

    def walk(node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                key = f"{prefix}{k.value}"
                lines[key] = k.start_mark.line + 1
                walk(v, key + ".")
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                key = f"{prefix}{i}"
                lines[key] = v.start_mark.line + 1
                walk(v, key + ".")

    walk(root, "")
    return lines


class _Ctx:
    def __init__(self, path: Path, text: str):
        self.path = path
        self.lines = _key_lines(text)

    def error(self, key: str, what: str) -> SoftsynError:
        probe = key
        while probe and probe not in self.lines:
            probe = probe.rpartition(".")[0]
        loc = f"{self.path}:{self.lines[probe]}" if probe else str(self.path)
        return SoftsynError(f"{loc}: {key}: {what}")


def _positive(ctx: _Ctx, key: str, value, allow_null: bool = False) -> float | None:
    if value is None and allow_null:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)  # YAML 1.1 reads "1e10" (no dot) as a string
        except (TypeError, ValueError):
            raise ctx.error(key, f"must be a positive number (SI units), got {value!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ctx.error(key, f"must be a positive number (SI units), got {value!r}")
    return float(value)


def _parse_cell(ctx: _Ctx, i: int, raw) -> Cell:
    key = f"cells.{i}"
    if not isinstance(raw, dict):
        raise ctx.error(key, "a cell must be a mapping with op, precision, implementation, axes, points, delays")
    for k in ("op", "precision", "axes", "points", "delays"):
        if k not in raw:
            raise ctx.error(f"{key}.{k}", "missing")
    precision = _canonical_precision(raw["precision"])
    if precision is None:
        raise ctx.error(f"{key}.precision", f"unknown precision {raw['precision']!r}; valid: {', '.join(PRECISIONS)}")
    axes = raw["axes"]
    if not isinstance(axes, list) or not axes or not all(isinstance(a, str) for a in axes):
        raise ctx.error(f"{key}.axes", "must be a non-empty list of size names, e.g. [m, n, k]")
    points = raw["points"]
    if not isinstance(points, list) or len(points) != len(axes):
        raise ctx.error(f"{key}.points", f"must be a list of {len(axes)} grids, one per axis {axes}")
    grids = []
    for a, grid in enumerate(points):
        if not isinstance(grid, list) or not grid:
            raise ctx.error(f"{key}.points.{a}", "must be a non-empty list of sizes")
        g = [_positive(ctx, f"{key}.points.{a}", v) for v in grid]
        if any(y <= x for x, y in zip(g, g[1:])):
            raise ctx.error(f"{key}.points.{a}", f"grid for axis {axes[a]!r} must be strictly increasing, got {grid}")
        grids.append(g)
    flat: list[float] = []

    def flatten(node, depth: int, where: str) -> None:
        if depth == len(grids):
            flat.append(_positive(ctx, f"{key}.delays", node))
            return
        if not isinstance(node, list) or len(node) != len(grids[depth]):
            raise ctx.error(f"{key}.delays", f"shape must be {' x '.join(str(len(g)) for g in grids)} "
                            f"(nested, row-major); wrong length at {where or 'top level'}")
        for j, sub in enumerate(node):
            flatten(sub, depth + 1, f"{where}[{j}]")

    flatten(raw["delays"], 0, "")
    error = raw.get("error")
    if error is not None and (not isinstance(error, (int, float)) or error < 0):
        raise ctx.error(f"{key}.error", f"must be null or a non-negative relative error, got {error!r}")
    bpw = raw.get("bytes_per_weight")
    if bpw is not None:
        bpw = _positive(ctx, f"{key}.bytes_per_weight", bpw)
    scale = raw.get("scale")
    if scale is not None:
        if not isinstance(scale, dict):
            raise ctx.error(f"{key}.scale", "must be a mapping size -> reference value, e.g. {batch: 1, head_dim: 128}")
        scale = {str(k): _positive(ctx, f"{key}.scale.{k}", v) for k, v in scale.items()}
    holdout = raw.get("holdout") if isinstance(raw.get("holdout"), dict) else None
    return Cell(op=str(raw["op"]), precision=precision, implementation=str(raw.get("implementation", "")),
                axes=list(axes), points=grids, delays=raw["delays"], bytes_per_weight=bpw,
                error=None if error is None else float(error), _flat=flat, scale=scale, holdout=holdout)


def parse_library(text: str, path: Path) -> Library:
    """Validate and build a Library from YAML text (errors name the file, line and key)."""
    ctx = _Ctx(path, text)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SoftsynError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise SoftsynError(f"{path}: a library must be a YAML mapping with keys {', '.join(HEADER_KEYS)}")
    for k in HEADER_KEYS:
        if data.get(k) in (None, ""):
            raise ctx.error(k, "missing (a library header needs " + ", ".join(HEADER_KEYS) + ")")
    if "command" not in data and "source" not in data:
        raise ctx.error("command", "missing: say how the ceilings were measured (`command`, or `source` if copied)")
    if data["format"] != FORMAT_VERSION:
        raise ctx.error("format", f"unsupported format {data['format']!r}; this softsyn reads format {FORMAT_VERSION}")
    c = data["ceilings"]
    if not isinstance(c, dict):
        raise ctx.error("ceilings", "must be a mapping")
    for k in ("memory_bandwidth", "peak_flops", "launch_overhead"):
        if c.get(k) is None:
            raise ctx.error(f"ceilings.{k}", "missing")
    bw = _positive(ctx, "ceilings.memory_bandwidth", c["memory_bandwidth"])
    pf_raw = c["peak_flops"]
    if not isinstance(pf_raw, dict) or not pf_raw:
        raise ctx.error("ceilings.peak_flops", "must be a mapping precision -> FLOP/s, e.g. {fp32: 4.5e11}")
    peak: dict[str, float] = {}
    for p, v in pf_raw.items():
        cp = _canonical_precision(p)
        if cp is None:
            raise ctx.error(f"ceilings.peak_flops.{p}", f"unknown precision; valid: {', '.join(PRECISIONS)}")
        if v is not None:  # null: the provider does not compute in it (falls back, see peak_flops_for)
            peak[cp] = _positive(ctx, f"ceilings.peak_flops.{p}", v)
    if not peak:
        raise ctx.error("ceilings.peak_flops", "no precision has a figure")
    launch = _positive(ctx, "ceilings.launch_overhead", c["launch_overhead"])
    launch_graph = _positive(ctx, "ceilings.launch_overhead_graph", c.get("launch_overhead_graph"), allow_null=True)
    run = _positive(ctx, "ceilings.run_overhead", c.get("run_overhead"), allow_null=True)
    if run is None:  # documented fallback: one node's launch
        run = launch
    cells_raw = data.get("cells") or []
    if not isinstance(cells_raw, list):
        raise ctx.error("cells", "must be a list of cells")
    cells = [_parse_cell(ctx, i, raw) for i, raw in enumerate(cells_raw)]
    header = {k: v for k, v in data.items() if k not in ("ceilings", "cells")}
    if isinstance(header["date"], (_dt.date, _dt.datetime)):
        header["date"] = header["date"].isoformat()
    header = {k: (str(v) if k in ("runtime", "provider", "device", "library") else v) for k, v in header.items()}
    ceilings = Ceilings(memory_bandwidth=bw, peak_flops=peak, launch_overhead=launch,
                        launch_overhead_graph=launch_graph, run_overhead=run)
    return Library(name=str(data["library"]), header=header, ceilings=ceilings, cells=cells, path=path)


def load_library(name_or_path: str | os.PathLike) -> Library:
    """Load a shipped library by name ("cpu-ort", "h200-ort-cuda") or any library YAML by path."""
    spec = os.fspath(name_or_path)
    looks_like_path = spec.endswith((".yaml", ".yml")) or os.sep in spec or "/" in spec
    if looks_like_path or os.path.isfile(spec):
        path = Path(spec)
        if not path.is_file():
            raise SoftsynError(f"{path}: library file not found; {_shipped_hint()}")
        text = path.read_text()
    else:
        res = importlib.resources.files("softsyn.library.libs") / f"{spec}.yaml"
        if not res.is_file():
            raise SoftsynError(f"unknown library {spec!r}: not a shipped library or a .yaml file; {_shipped_hint()}")
        path = Path(str(res))
        text = res.read_text()
    return parse_library(text, path)
