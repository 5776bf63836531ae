"""Target libraries: what a runtime x device can do, Liberty in spirit.

A `Library` is one runtime x device: its header, measured `Ceilings` and `Cell`s, each a measured delay
table for one op x precision x implementation (the YAML format: softsyn.library.load; the table lookup
and extrapolation rules: softsyn.library.interp).

Delay lookup (`Library.delay`): a cell matches when op and precision are equal (and `implementation`,
if the caller names one) and every axis is present in `sizes`; among matches, the one whose grid lies
nearest the sizes (`Library.cell_for`). Otherwise the delay is the roofline estimate, source "est":
    max(flops / peak_flops_for(precision), bytes_moved / memory_bandwidth) + launch_overhead
The `Run` cell (axis `ios`: graph inputs + outputs) gives the fixed cost of one run call
(`Library.run_delay`); without it, ceilings.run_overhead. Characterised cells also carry `holdout`
(measured interpolation error).

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

import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from softsyn.errors import SoftsynError
from softsyn.library import interp

PRECISIONS = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4")
_ALIASES = {"float32": "fp32", "float": "fp32", "float64": "fp64", "double": "fp64", "float16": "fp16",
            "half": "fp16", "bfloat16": "bf16", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "e4m3": "fp8",
            "e5m2": "fp8", "float8": "fp8", "uint8": "int8", "uint4": "int4"}
_GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider", "ROCMExecutionProvider",
                  "MIGraphXExecutionProvider", "NvTensorRTRTXExecutionProvider")
_WEIGHT_ONLY = ("int4", "int8", "fp8")


def canonical_precision(precision: str) -> str | None:
    """The library's name for a precision ("float16" -> "fp16"), or None if it names none."""
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


@dataclass(frozen=True)
class ServingHost:
    """The host work of one continuous-batching iteration around the run calls, measured on the target by
    softsyn.characterize.host (the library's `serving_host:` block), SI units. What a serving simulation charges per
    iteration is these figures at the design's sizes (softsyn.timing.serving.host)."""

    iteration: float  # s: an iteration's fixed cost (inputs updated in place, the logits' argmax, ids to the host)
    input_bandwidth: float  # B/s: input bytes made and updated in place (a decode's attention_mask rows)
    sample_bandwidth: float  # B/s: logits bytes the argmax reads where the engine samples (device on a GPU)
    readback_bandwidth: float  # B/s: an output copied to the host (a prefill's logits)
    bind: float  # s per io_binding bind call (a prefill binds every layer's past and present key and value)
    move: float  # s: a KV row-move copy's fixed cost (its bytes at ceilings.memory_bandwidth)
    device: str  # the machine the probe ran on
    date: str
    command: str
    # s: what the first run at an input shape a session has not met costs beyond a repeat, per distinct GEMM shape and
    # per other node (a prompt length served for the first time); None: not measured (probed before 2026-12-06)
    first_shape_gemm: float | None = None
    first_shape_node: float | None = None


HOST_BOUND = 1.5  # a GPU cell delay within this factor of its table's floor was host (launch) bound
GRAPH_SUFFIX = "-graph"  # implementation suffix of a cell timed as CUDA graph replays (Library.graph_delay)
GRAPH_ROW_AXES = ("m", "q_tokens")  # a graph table's rows: a decode step's batch of sequences
GRAPH_MAX_ROWS = 16  # rows a graph table holds at most (batched decode up to serving's usual max_batch)


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
    _flat: list[float] = field(default_factory=list, repr=False)  # delays row-major (derived when not given)
    scale: dict[str, float] | None = None  # size -> reference value the table was measured at
    holdout: dict | None = None  # measured interpolation error: median_pct, max_pct, points, ...
    attributes: dict[str, int] | None = None  # node attributes the table was measured with, which a node the
    # compile writes carries (MatMulNBits' accuracy_level on the CPU: softsyn.characterize.recipes)

    def __post_init__(self):
        if not self._flat:
            self._flat = interp.flatten(self.delays, len(self.points))

    @property
    def name(self) -> str:
        return f"{self.op}.{self.precision}.{self.implementation}"

    @cached_property
    def floor(self) -> float:
        """The table's smallest entry: the fixed per-node cost of the op."""
        return min(self._flat)

    def lookup(self, sizes: dict[str, float]) -> tuple[float, bool]:
        """(delay s, extrapolated?) at `sizes` (must hold every axis); rules in softsyn.library.interp."""
        return interp.lookup(self.axes, self.points, self._flat, sizes)

    def outside(self, sizes: dict) -> float:
        """How far `sizes` lie outside the grid (0: inside; see interp.outside)."""
        return interp.outside(self.axes, self.points, sizes)

    def scaled(self, value: float, sizes: dict, memory_time: float | None = None) -> tuple[float, bool]:
        """Apply the cell's scale rule to a table value: (delay, scaled?) (see interp.scaled). `memory_time` (GPU
        libraries: the node's bytes over the device's bandwidth): a table measured at batch 1 serves batch N as one
        launch whose sequences run side by side, so its delay is the longer of the batch-1 delay and the floor plus
        the memory time, never more than the linear rule's (batch 1 occupies a few of the SMs: qwen3-1.7b's decode
        at 16 sequences over 1536 positions measured 2.93 ms where the linear rule gave 4.13, 2026-12-03)."""
        if not self.scale:
            return value, False
        linear, scaled = interp.scaled(self.scale, self.floor, value, sizes)
        if scaled and memory_time is not None and float(sizes.get("batch") or 1) > 1 and "batch" in self.scale:
            return min(linear, max(value, self.floor + memory_time)), True
        return linear, scaled


@dataclass
class Library:
    name: str
    header: dict
    ceilings: Ceilings
    cells: list[Cell]
    path: Path
    serving_host: ServingHost | None = None  # None: not measured on this target (the simulation then has no host work)

    @property
    def provider(self) -> str:
        return str(self.header.get("provider", ""))

    def has_cell(self, op_type: str, precision: str) -> bool:
        """Whether the library measured any cell of `op_type` at `precision` (eager or graph table)."""
        return any(c.op == op_type and c.precision == precision for c in self.cells)

    def node_attributes(self, op_type: str, precision: str) -> dict[str, int]:
        """The node attributes `op_type` at `precision` was measured with (its eager table's `attributes`): a node
        the compile writes for that cell carries them, so it runs the kernel the table timed. {} when none."""
        for c in self.cells:
            if c.op == op_type and c.precision == precision and not c.implementation.endswith(GRAPH_SUFFIX):
                return dict(c.attributes or {})
        return {}

    @property
    def is_gpu(self) -> bool:
        """True when the execution provider runs on a GPU (CUDA / TensorRT)."""
        p = self.provider
        return p in _GPU_PROVIDERS or "cuda" in p.lower() or "tensorrt" in p.lower()

    def peak_flops_for(self, precision: str) -> float:
        """Peak FLOP/s for `precision`, with the documented fallback (see module docstring)."""
        p = canonical_precision(precision)
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

    def does_not_run(self, op_type: str, precision: str) -> str | None:
        """The reason the characterisation recorded when `op_type` at `precision` failed to run on this provider
        (its header's not_characterised entry saying "does not run"), else None."""
        p = canonical_precision(precision) or precision
        for key, why in (self.header.get("not_characterised") or {}).items():
            if str(key).startswith(f"{op_type}.{p}.") and str(why).startswith("does not run"):
                return "does not run"
        return None

    def cell_for(self, op_type: str, precision: str, sizes: dict | None = None,
                 implementation: str | None = None) -> Cell | None:
        """The first cell matching op, precision (and implementation) whose axes are all in `sizes`; among
        it and later cells with the same axes (e.g. MatMul.fp32 batched-expert and batched), the one whose grid lies nearest the sizes
        (Cell.outside, 0 when the grid covers them), the first in library order on a tie."""
        p = canonical_precision(precision) or precision
        best, best_d = None, math.inf
        for c in self.cells:
            if c.op != op_type or c.precision != p:
                continue
            if implementation is not None and c.implementation != implementation:
                continue
            if implementation is None and c.implementation.endswith(GRAPH_SUFFIX):
                continue  # a graph table times a captured group only (graph_delay)
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

    def device_in_graph(self, op_type: str, precision: str, sizes: dict | None, device: float,
                        bytes_moved: float | None = None) -> float:
        """Seconds a kernel whose eager device time is `device` holds the device inside a captured CUDA graph: its
        graph table's time where there is one (graph_delay), else `device` or what one more node costs inside a
        graph (ceilings.launch_overhead_graph), whichever is longer."""
        graph = self.graph_delay(op_type, precision, sizes, bytes_moved)
        return graph if graph is not None else max(device, self.ceilings.launch_overhead_graph or 0.0)

    def graph_delay(self, op_type: str, precision: str, sizes: dict | None,
                    bytes_moved: float | None = None) -> float | None:
        """Seconds a node holds the device inside a captured CUDA graph, from its graph table (implementation
        `*-graph`, measured as graph replays), or None: no such table, `sizes` off an axis the table holds at one
        value, or more rows (m, q_tokens) than it measured (tables of 2026-12-02 hold one row; newer ones rows up to
        GRAPH_MAX_ROWS, a batched decode step's)."""
        if not sizes:
            return None
        p = canonical_precision(precision) or precision
        for c in self.cells:
            if c.op != op_type or c.precision != p or not c.implementation.endswith(GRAPH_SUFFIX):
                continue
            if any(a not in sizes or sizes[a] is None for a in c.axes):
                continue
            if any(len(g) == 1 and sizes[a] != g[0] for a, g in zip(c.axes, c.points)):
                continue
            if any(a in GRAPH_ROW_AXES and sizes[a] > max(g) for a, g in zip(c.axes, c.points)):
                continue  # more rows than the table measured: the eager table's scaling, not an extrapolated graph
            value, _ = c.lookup(sizes)
            return c.scaled(value, sizes, self.memory_time(bytes_moved))[0]
        return None

    def memory_time(self, bytes_moved: float | None) -> float | None:
        """Seconds `bytes_moved` take at the device's measured bandwidth, on a GPU; None on a CPU (a table measured
        at batch 1 already keeps its cores busy, so the linear batch rule holds there) or when the bytes are not
        known (a missing count must not read as zero bytes: that would cap a batch at its batch-1 delay)."""
        if bytes_moved is None or not self.is_gpu or not self.ceilings.memory_bandwidth:
            return None
        return bytes_moved / self.ceilings.memory_bandwidth

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
            value, scaled = cell.scaled(value, sizes, self.memory_time(bytes_moved))  # type: ignore[arg-type]
            return value, ("table-extrap" if extrap or scaled else "table")
        return self.roofline(precision, flops, bytes_moved), "est"

    def _split(self, cell: Cell | None, precision: str, flops: float, bytes_moved: float,
               delay: float) -> tuple[float, float]:
        if not self.is_gpu:
            return delay, 0.0
        c = self.ceilings
        if not flops and not bytes_moved:
            return c.launch_overhead, 0.0
        if cell is not None and delay > HOST_BOUND * cell.floor:
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
