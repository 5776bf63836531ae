"""Timing and area result objects: the data every report format renders.

OpenSTA's rule: reports never recompute, they render these objects. Every
quantity is SI (seconds, bytes, FLOPs); conversion happens only when printed.
The objects round-trip through JSON (`to_dict` / `from_dict`) so that
`softsyn report KIND DIR` re-renders a saved analysis without re-timing it.
In memory an unconstrained group's clock period, required time and slack are
infinite; in the plain data they are None (JSON null: JSON has no Infinity).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

# imported here because _build finds nested classes in this module's globals and json_io reads Analysis's hints
from softsyn.results.serving import (Distribution, HistogramBin, ServingCheck, ServingResult,  # noqa: F401
                                     ServingHostWork, ServingSchedule, ServingSuggestion, StepPoint)


@dataclass
class PathPoint:
    """One cell on a timing path (a row of report_timing)."""

    name: str  # instance: hierarchy + "/" + node name, e.g. "model.layers.0.mlp.down_proj/MatMul_12"
    cell: str  # library cell, e.g. "MatMul.fp32"
    incr: float  # delay of this cell, s
    arrival: float  # path time after this cell, s
    source: str  # where the delay came from: "table" (measured), "est" (roofline), "annot" (back-annotated)
    hierarchy: str  # module scope, e.g. "model.layers.0.mlp.down_proj" ("" at top)
    op_type: str
    flops: float = 0.0
    bytes: float = 0.0


@dataclass
class Scenario:
    """An operating point: the concrete values bound to the netlist's symbolic dims."""

    name: str  # path group it belongs to
    dims: dict[str, int]
    description: str  # human form, e.g. "decode (batch 1, past 4096)"


@dataclass
class TimingPath:
    """A full path from an input port to an output port under one path group's clock."""

    group: str
    scenario: Scenario
    startpoint: str  # input port the arrival starts from
    endpoint: str  # output port
    clock_period: float
    input_delay: float
    clock_uncertainty: float
    output_delay: float
    points: list[PathPoint]
    arrival: float  # data arrival time at the endpoint
    required: float  # clock_period - uncertainty - output_delay
    slack: float  # required - arrival

    @property
    def met(self) -> bool:
        return self.slack >= 0

    @property
    def levels(self) -> int:
        return len(self.points)


@dataclass
class GroupTiming:
    """report_qor's per-group block plus the paths report_timing can print."""

    name: str
    clock_period: float
    weight: float
    critical_range: float
    scenario: Scenario
    paths: list[TimingPath]  # one per endpoint, worst slack first
    cell_count: int
    estimated_cells: int  # cells whose delay is a roofline estimate
    total_flops: float
    total_bytes: float
    launch: str = ""  # GPU libraries: "CUDA graph (...)" or "eager (why)" (softsyn.timing.capture); "" on a CPU

    @property
    def critical(self) -> TimingPath:
        return self.paths[0]

    @property
    def wns(self) -> float:
        """Worst negative slack (0 when met, as DC prints it)."""
        return min(0.0, self.critical.slack)

    @property
    def tns(self) -> float:
        return sum(p.slack for p in self.paths if p.slack < 0)

    @property
    def violating_paths(self) -> int:
        return sum(1 for p in self.paths if p.slack < 0)


@dataclass
class AreaItem:
    """One row of report_area: a kind (weights fp16, kv_cache, activations) or a hierarchy node."""

    name: str
    bytes: float
    count: int = 0  # parameters / elements / cells behind it
    detail: str = ""


@dataclass
class KVOption:
    """One row of report_area's KV budget table: the KV cache at one dtype (the netlist's, or a lower one)."""

    dtype: str  # kv_cache.dtype value(s) of this element size, e.g. "fp16" or "fp8/int8"
    source: str  # "netlist" (the past-KV inputs as exported) | "estimate" (the same layout at this element size)
    bytes_per_token: float  # per sequence, all layers' K and V
    kv_bytes: float  # at the workload (batch x concurrency x KV length)
    total: float  # VRAM at the workload with this KV dtype
    max_concurrency: int | None  # at the workload's KV length; None: no area_constraint
    max_context: int | None  # KV length at the workload's concurrency; None: no area_constraint
    fits: bool | None  # total <= area_constraint; None: no area_constraint


@dataclass
class WeightOption:
    """Weights stored at one precision (the netlist's, or a lower one the constraints allow)."""

    precision: str  # "fp16", "int8", "int4" ...
    source: str  # "netlist" | "estimate" (bytes per parameter of that precision, scales included)
    weight_bytes: float  # weights and constants
    total: float  # VRAM at the workload with these weights
    max_concurrency: int | None  # at the workload's KV length; None: no area_constraint or no KV cache
    fits: bool | None


@dataclass
class WorkspacePoint:
    """The workspace (activation peak over the scenarios) with the scenarios that read the cache re-bound
    at another KV length."""

    length: int  # KV tokens per sequence
    bytes: float


@dataclass
class KVBudget:
    """What area_constraint leaves for the KV cache, derived from the netlist's past-KV inputs:
    available = limit - weights (and constants) - workspace; the largest concurrency and context it holds."""

    tensors: int  # past-KV graph inputs (K and V of every layer)
    layout: str  # their shape, e.g. "[batch, 8, past, 128]" ("mixed" when they differ)
    dtype: str  # their element type, e.g. "fp16"
    bytes_per_token: float  # per sequence: sum over the inputs of the non-batch, non-past dims x element size
    batch: int
    concurrency: int
    length: int  # KV tokens per sequence (kv_cache.max_length, else the workload's context)
    length_key: str  # the constraints key that set `length`
    limit: float | None  # area_constraint, bytes
    weights: float  # weights and constants, bytes
    workspace: float  # activation peak of the timed scenarios, bytes
    workspace_scenario: str
    workspace_points: list[WorkspacePoint]  # the workspace measured at KV lengths (`length` first), by re-binding
    available: float | None  # bytes left for KV; None: no area_constraint
    max_concurrency: int | None  # at `length`
    max_context: int | None  # at `concurrency`
    max_positions: int | None  # the model's max_position_embeddings, where its config gives one
    requested_dtype: str | None  # kv_cache.dtype from the constraints
    kv_dtypes: list[KVOption] = field(default_factory=list)
    weight_precisions: list[WeightOption] = field(default_factory=list)
    state_bytes: float = 0.0  # per sequence: a hybrid decoder's conv and recurrent states (a fixed size, any length)

    @property
    def kv_bytes(self) -> float:
        """The KV cache at the workload, a hybrid decoder's states included."""
        return (self.bytes_per_token * self.length + self.state_bytes) * self.batch * self.concurrency


@dataclass
class AreaResult:
    """VRAM: weights by dtype + KV cache at the workload + activation/workspace peak."""

    by_kind: list[AreaItem]
    by_hierarchy: list[AreaItem]
    total: float
    limit: float | None  # area_constraint, bytes
    parameters: int
    kv_detail: str  # how the KV figure was sized, e.g. "batch 1 x context 4096 x 36 layers x 8 kv heads x 128 x 2 B x 2"
    activation_scenario: str  # which group's scenario set the activation peak
    kv_budget: KVBudget | None = None  # None: no KV cache (or an analysis.json written before the budget existed)

    @property
    def slack(self) -> float | None:
        return None if self.limit is None else self.limit - self.total


@dataclass
class TPRow:
    """One tensor-parallel degree of the plan: one device's VRAM and each group's critical arrival."""

    n: int
    weights: float  # bytes per device: weights and constants
    kv_cache: float  # bytes per device at the workload
    workspace: float  # bytes per device: the activation peak
    total: float
    fits: bool | None  # total <= area_constraint (per device); None: no area_constraint
    arrival: dict[str, float]  # group -> critical path arrival, s (input delay included)
    collective_time: dict[str, float]  # group -> collectives on that critical path, s
    collectives: int  # collectives per step (all groups alike)
    kv_heads_per_device: int


@dataclass
class TPPlan:
    """Tensor parallelism: the degree analysed, the smallest degree whose device VRAM fits, and the plan per degree."""

    n: int  # the degree the analysis is per device of
    heads: int
    kv_heads: int
    experts: int
    devices: int  # the most devices the plan considered (parallel.devices)
    limit: float | None  # area_constraint, per device
    smallest_fit: int | None  # None: no degree up to `devices` fits (or no area_constraint: 1)
    collectives: str  # the collective library and whether its delays are estimates
    layout: str  # Partition.describe() at `n`
    weights: str | None = None  # parallel.weights what-if (int8/int4 weight matmuls, estimate)
    rows: list[TPRow] = field(default_factory=list)


@dataclass
class Analysis:
    """Everything one `softsyn analyze` produced; the root object reports render."""

    design: str
    library: str
    library_source: str  # "roofline estimate" or "characterised <date>"
    version: str
    date: str
    provenance: dict
    constraints_file: str
    groups: list[GroupTiming]
    area: AreaResult
    cell_counts: dict[str, int]  # op type -> count
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what the figures cannot be trusted for (every report's banner)
    tp: TPPlan | None = None  # tensor parallelism: the analysis is of one of tp.n devices
    serving: ServingResult | None = None  # constraints' serving block: the simulated checks (softsyn.timing.serving)

    @property
    def wns(self) -> float:
        return min((g.wns for g in self.groups), default=0.0)

    @property
    def tns(self) -> float:
        return sum(g.tns for g in self.groups)

    @property
    def violating_paths(self) -> int:
        return sum(g.violating_paths for g in self.groups)

    @property
    def limiting_group(self) -> tuple[GroupTiming, float] | None:
        """The group the optimiser serves first, with its weighted slack: slack x weight when it violates, slack /
        weight when it meets (a heavier group's margin counts as smaller); None without a constrained group."""
        weighted = [(g, g.critical.slack * g.weight if g.critical.slack < 0 else g.critical.slack / max(g.weight, 1e-9))
                    for g in self.groups if math.isfinite(g.critical.slack)]
        return min(weighted, key=lambda x: x[1]) if weighted else None

    def group(self, name: str) -> GroupTiming:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(f"no path group {name!r}; groups are: {', '.join(g.name for g in self.groups)}")

    def to_dict(self) -> dict:
        """Plain data for JSON: what is infinite because no clock was given is None."""
        return _nulls(asdict(self), type(self).__name__)

    @classmethod
    def from_dict(cls, data: dict) -> "Analysis":
        return _build(cls, data)


# (class, field) that are infinite when a group has no clock: written None, read back as infinity
UNCONSTRAINED_FIELDS = {("GroupTiming", "clock_period"), ("TimingPath", "clock_period"), ("TimingPath", "required"),
                        ("TimingPath", "slack")}


def _nulls(data: dict, cls: str) -> dict:
    """``data`` (asdict of ``cls``) with the infinite UNCONSTRAINED_FIELDS set to None."""
    for name, value in data.items():
        nested = _NESTED.get((cls, name))
        if nested is not None:
            for item in value if isinstance(value, list) else [value]:
                if item is not None:  # an optional part (a design without a KV cache has no KV budget)
                    _nulls(item, nested)
        elif (cls, name) in UNCONSTRAINED_FIELDS and isinstance(value, float) and math.isinf(value):
            data[name] = None
    return data


_NESTED = {
    ("Analysis", "groups"): "GroupTiming",
    ("Analysis", "area"): "AreaResult",
    ("GroupTiming", "scenario"): "Scenario",
    ("GroupTiming", "paths"): "TimingPath",
    ("TimingPath", "scenario"): "Scenario",
    ("TimingPath", "points"): "PathPoint",
    ("AreaResult", "by_kind"): "AreaItem",
    ("AreaResult", "by_hierarchy"): "AreaItem",
    ("AreaResult", "kv_budget"): "KVBudget",
    ("KVBudget", "kv_dtypes"): "KVOption",
    ("KVBudget", "weight_precisions"): "WeightOption",
    ("KVBudget", "workspace_points"): "WorkspacePoint",
    ("Analysis", "tp"): "TPPlan",
    ("TPPlan", "rows"): "TPRow",
    ("Analysis", "serving"): "ServingResult",
    ("ServingResult", "checks"): "ServingCheck",
    ("ServingResult", "distributions"): "Distribution",
    ("ServingResult", "steps"): "StepPoint",
    ("ServingResult", "histogram"): "HistogramBin",
    ("ServingResult", "suggestions"): "ServingSuggestion",
    ("ServingResult", "schedule"): "ServingSchedule",
    ("ServingResult", "host"): "ServingHostWork",
}



def _build(cls, data: dict):
    kwargs = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        if value is None and (cls.__name__, f.name) in UNCONSTRAINED_FIELDS:
            value = math.inf
        nested = _NESTED.get((cls.__name__, f.name))
        if nested is not None and value is not None:
            sub = globals()[nested]
            value = [_build(sub, v) for v in value] if isinstance(value, list) else _build(sub, value)
        kwargs[f.name] = value
    return cls(**kwargs)
