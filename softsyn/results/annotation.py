"""Back-annotation: measured per-node delays that replace the library's for matching cells (SDF's role).

`softsyn signoff` writes an annotation file (softsyn.flow.annotate builds it from a profile); `softsyn analyze
--annotate FILE` (and compile) reads it (load_annotation) and times every annotated group's cells from it, source
"annot", instead of the library.

ONNX Runtime rewrites the graph when a session starts (constant folding, fusions), so the graph it
executes is not the netlist. The annotation keeps the round trip exact by construction, per group:

- ``cells``: netlist node -> measured kernel time (the profiler's, less its calibrated own cost per
  kernel: softsyn.runtime.measure.calibrate_profiler). A netlist node matches a profiled node by name
  ("exact"), or is the anchor of a runtime fusion whose name starts with the netlist name + "/"
  (e.g. "node_MatMul_240/MatMulScaleFusion/": "fused-anchor", the fused kernel's whole time);
- ``absorbed``: netlist nodes the runtime never ran as their own kernel (folded, or fused into an
  anchor): annotated 0 s, their cost is inside the anchor or the residual;
- ``runtime_only``: profiled nodes no netlist node accounts for (their time is in the residual);
- ``residual``: measured run time (median) - sum(cells), attached to the session.run overhead row
  (cell "Run.residual"): host dispatch and binding, executor gaps between kernels, end-of-run
  synchronisation, runtime-only nodes. When the profiled kernels sum to more than the unprofiled
  timed run (a busy machine), the kernel times are scaled to the run (``kernel_scale`` < 1) and
  the residual is 0, because a negative delay before the first cell cannot be timed.

So the annotated arrival minus the input delay equals the measured median, and the per-cell
figures are the profiler's.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from softsyn.errors import SoftsynError
from softsyn.results.files import write_atomic

SCHEMA = "softsyn.annotation/1"
RESIDUAL_CELL = "Run.residual"
RESIDUAL_NOTE = ("measured run time (median) minus the sum of the matched kernel times: host dispatch and "
                 "IO binding, executor gaps between kernels, end-of-run synchronisation, runtime-only nodes")


@dataclass
class AnnotatedCell:
    delay: float  # s, median kernel time (sum over the runtime nodes it maps to)
    runtime_nodes: list[str]
    runtime_op: str  # op type the runtime ran (may differ from the netlist's after a fusion)
    match: str  # "exact" | "fused-anchor"


@dataclass
class GroupAnnotation:
    name: str
    dims: dict[str, int]
    measured_median: float  # s, the timed runs (unprofiled session)
    measured_p10: float
    measured_p90: float
    runs: int
    residual: float  # s, measured_median - sum(cells)
    cells: dict[str, AnnotatedCell]
    absorbed: list[str]
    runtime_only: dict[str, dict]  # runtime node -> {"op": ..., "delay": s}
    profiler_run_median: float = 0.0  # the profiler's own model_run median (profiled session), s
    profiler_overhead_per_node: float = 0.0  # s, calibrated profiler cost subtracted from every kernel time
    kernel_scale: float = 1.0  # < 1 when the profiled kernels summed to more than the timed run (see group_annotation)
    residual_note: str = RESIDUAL_NOTE

    @property
    def kernel_sum(self) -> float:
        return sum(c.delay for c in self.cells.values())

    def delay(self, node_name: str) -> float | None:
        """Annotated delay of a netlist node; None when the annotation does not know the node."""
        cell = self.cells.get(node_name)
        if cell is not None:
            return cell.delay
        if node_name in self._absorbed:
            return 0.0
        return None

    @property
    def _absorbed(self) -> set[str]:
        cached = self.__dict__.get("_absorbed_set")
        if cached is None:
            cached = self.__dict__["_absorbed_set"] = set(self.absorbed)
        return cached


@dataclass
class Annotation:
    design: str
    model: str  # ONNX file that was run
    provider: str
    device: str
    runtime: str
    date: str
    node_time: str  # "kernel" | "host-launch"
    measured_interval: str
    groups: dict[str, GroupAnnotation] = field(default_factory=dict)
    path: str = ""

    def for_group(self, name: str, dims: dict[str, int]) -> GroupAnnotation | None:
        """The annotation of a path group: same name and same scenario dims, else any group with the same dims."""
        dims = {k: int(v) for k, v in dims.items()}
        group = self.groups.get(name)
        if group is not None and group.dims == dims:
            return group
        for other in self.groups.values():
            if other.dims == dims:
                return other
        return None

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("path")
        for g in data["groups"].values():
            g.pop("_absorbed_set", None)
        return {"schema": SCHEMA, "units": "seconds", **data}

    def save(self, path: str | Path) -> Path:
        self.path = str(path)
        return write_atomic(Path(path), json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n")


def load_annotation(path: str | Path) -> Annotation:
    """Read an annotation file written by `softsyn signoff` (SoftsynError with the file name if it is not one)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise SoftsynError(f"{path}: cannot read annotation file: {exc.strerror}") from None
    except ValueError as exc:
        raise SoftsynError(f"{path}: not JSON ({exc}); expected an annotation written by softsyn signoff") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise SoftsynError(f"{path}: not a softsyn annotation (schema {data.get('schema') if isinstance(data, dict) else None!r}, "
                           f"expected {SCHEMA!r}); write one with `softsyn signoff DIR`")
    try:
        groups = {}
        for name, g in data["groups"].items():
            g = dict(g)
            g["cells"] = {k: AnnotatedCell(**v) for k, v in g["cells"].items()}
            g["dims"] = {k: int(v) for k, v in g["dims"].items()}
            groups[name] = GroupAnnotation(**g)
        keys = ("design", "model", "provider", "device", "runtime", "date", "node_time", "measured_interval")
        return Annotation(**{k: data[k] for k in keys}, groups=groups, path=str(path))
    except (KeyError, TypeError) as exc:
        raise SoftsynError(f"{path}: malformed annotation ({type(exc).__name__}: {exc})") from None
