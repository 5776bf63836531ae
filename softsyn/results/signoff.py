"""signoff's result: per path group the predicted and measured run, per op type and per cell (SignoffResult).

flow.signoff fills it, reports.signoff and reports.html render it, signoff.json holds it (to_dict / from_dict).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from softsyn.results.files import json_nulls

# What a measured figure is: one timed call as softsyn.runtime.measure times it (measure reads this line from here)
MEASURED_INTERVAL = ("one run_with_iobinding call, host wall clock: inputs pre-bound on the device, outputs "
                     "bound by name on the device and allocated by the runtime, host dispatch + kernels + the "
                     "provider's end-of-run synchronisation; no host<->device copies, no tokenisation or sampling")
PREDICTED_MEANS = ("data arrival at the group's worst endpoint minus the input delay: the runtime's "
                   "session.run overhead plus every cell on the path (one stream: every cell)")
ERROR_MEANS = "error = (predicted - measured) / measured; negative: the analysis was optimistic"


@dataclass
class CellRow:
    instance: str  # hierarchy/node, as report_timing prints it
    node: str
    op_type: str
    predicted: float  # s
    measured: float  # s (0 for cells the runtime absorbed)
    source: str  # where the predicted delay came from (table/est/annot)
    match: str  # "exact" | "fused-anchor" | "absorbed" | "residual" (the session.run row)
    runtime_op: str = ""

    @property
    def delta(self) -> float:
        return self.measured - self.predicted


@dataclass
class OpRow:
    op_type: str
    cells: int
    predicted: float
    measured: float


@dataclass
class GroupResult:
    name: str
    description: str
    dims: dict[str, int]
    clock_period: float
    input_delay: float
    budget: float  # required - input delay: what one run may take, s (inf when unconstrained)
    predicted: float  # arrival - input delay, s
    measured_median: float
    measured_quiet: float  # the fastest interleaved round's median (softsyn.runtime.measure.Measurement.quiet)
    measured_p10: float
    measured_p90: float
    runs: int
    kernel_sum: float  # sum of the matched kernel times (profiled), s
    residual: float  # measured_median - kernel_sum
    profiler_run: float  # the profiler's own model_run median, s
    profiler_overhead: float  # s per kernel, calibrated and subtracted from each kernel time
    kernel_scale: float  # < 1: profiled kernels summed to more than the timed run and were scaled to it
    predicted_overhead: float  # the analysis's session.run row
    counts: dict[str, int]  # exact / fused-anchor / absorbed / runtime-only
    by_op: list[OpRow]
    cells: list[CellRow]  # every executed netlist cell + the session.run row, largest |delta| first
    runtime_only: dict[str, dict]
    # a torch package's kernels per source-module kind (softsyn.runtime.torch_provenance): count and seconds per step
    # measured, "predicted" the ORT library's estimate of that kind's netlist cells (None: no single kind)
    modules: dict[str, dict] = field(default_factory=dict)
    # a torch package's step through its macro cells (softsyn.timing.macro), measured at compile: a prediction, s
    macro_predicted: float | None = None

    @property
    def predicted_slack(self) -> float:
        return self.budget - self.predicted

    @property
    def measured_slack(self) -> float:
        return self.budget - self.measured_median

    @property
    def p90_slack(self) -> float:
        return self.budget - self.measured_p90

    @property
    def error(self) -> float:
        return (self.predicted - self.measured_median) / self.measured_median if self.measured_median else math.nan

    @property
    def error_quiet(self) -> float:
        """Error against the fastest round: what a library of fastest-pass cells predicts (see measure.Measurement)."""
        return (self.predicted - self.measured_quiet) / self.measured_quiet if self.measured_quiet else math.nan

    @property
    def violated(self) -> bool:
        return self.measured_slack < 0

    def responsible(self, top: int = 5) -> list[CellRow]:
        """The cells whose measured delay most exceeds the prediction (what made the measurement miss)."""
        rows = sorted((c for c in self.cells if c.delta > 0), key=lambda c: -c.delta)
        return rows[:top]


@dataclass
class SignoffResult:
    design: str
    directory: str
    kind: str  # "analyze" | "compile"
    library: str
    library_source: str
    provider: str
    device: str
    runtime: str
    date: str
    runs: int
    warmup: int
    node_time: str
    model: str
    groups: list[GroupResult]
    annotation_file: str = ""
    machine: dict = field(default_factory=dict)  # softsyn.characterize.probe: probe before/after measuring, library reference
    measured_interval: str = MEASURED_INTERVAL
    predicted_means: str = PREDICTED_MEANS
    error_means: str = ERROR_MEANS
    notes: list[str] = field(default_factory=list)

    @property
    def violated(self) -> bool:
        return any(g.violated for g in self.groups)

    def to_dict(self) -> dict:
        """signoff.json's data: an unconstrained clock, budget or slack and an undefined error are null."""
        data = asdict(self)
        for g, obj in zip(data["groups"], self.groups):
            g.update(predicted_slack=obj.predicted_slack, measured_slack=obj.measured_slack, error=obj.error,
                     error_quiet=obj.error_quiet, violated=obj.violated)
        return json_nulls({"schema": "softsyn.signoff/1", "units": "seconds", **data})

    @classmethod
    def from_dict(cls, data: dict) -> "SignoffResult":
        """The result `to_dict` wrote (signoff.json), for re-rendering; null budgets and clocks read back as
        unconstrained (infinite), the derived keys (slacks, errors) are recomputed by the properties."""
        def known(klass, item: dict) -> dict:
            return {f.name: item[f.name] for f in fields(klass) if f.name in item}

        groups = []
        for g in data["groups"]:
            values = known(GroupResult, g)
            for key in ("clock_period", "budget"):
                values[key] = math.inf if values.get(key) is None else values[key]
            values["by_op"] = [OpRow(**known(OpRow, o)) for o in g["by_op"]]
            values["cells"] = [CellRow(**known(CellRow, c)) for c in g["cells"]]
            groups.append(GroupResult(**values))
        return cls(**{**known(cls, data), "groups": groups})
