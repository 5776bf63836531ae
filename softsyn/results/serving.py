"""What a serving simulation produced (softsyn.timing.serving): the checks with slack, the distributions, the step
table it ran on and the suggestions, as plain data the reports render and analysis.json holds. Every figure is
simulated over step times estimated from the library: none is measured."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ServingCheck:
    """One serving timing check: a latency percentile below its budget, or throughput above its minimum.

    Latency: slack = required - achieved (s). Throughput: slack = achieved - required (tokens/s), so a negative
    slack is a violation either way."""

    group: str  # ttft_p50 | ttft_p99 | tpot_p50 | tpot_p99 | throughput
    kind: str  # "time" (s) | "rate" (tokens/s)
    required: float
    achieved: float
    slack: float

    @property
    def met(self) -> bool:
        return self.slack >= 0


@dataclass
class Distribution:
    """One simulated metric over the requests (s; throughput has none)."""

    metric: str  # ttft | tpot | e2e | queue
    p50: float
    p90: float
    p99: float
    mean: float
    max: float
    host_p50: float | None = None  # s of p50 that is host work: p50 with it - p50 of the same simulation without it
    host_p99: float | None = None  # None: the host is not modelled (the library has no serving_host)


@dataclass
class HistogramBin:
    """Requests whose metric lies in [low, high) (the last bin includes its high end)."""

    metric: str  # ttft | tpot
    low: float  # s
    high: float
    count: int


@dataclass
class StepPoint:
    """One point of the step-time table: the STA's critical arrival at these dims."""

    kind: str  # "decode" | "prefill"
    batch: int
    tokens: int  # decode: the sequences' (mean) cached tokens; prefill: prompt length
    time: float  # s


@dataclass
class ServingSuggestion:
    """One knob changed and the simulation re-run: what changed and what it gave."""

    knob: str  # rate | max_batch | precision | kv_dtype | warm_prompts | prompt_buckets | steps
    change: str  # e.g. "max_batch 16 -> 32"
    result: str  # e.g. "ttft_p99 412.0 ms, tpot_p99 1.2 ms, 1,900 tok/s: all met"
    meets: bool | None  # every check met after the change; None: not quantified
    value: int | None = None  # the knob's new value where it is a number (max_batch), for the serving pass
    scale: float | None = None  # steps: the uniform step-time factor that meets every check, for the optimize pass


@dataclass
class ServingSchedule:
    """The steps the simulated scheduler formed, for the engines' batching settings (softsyn.emit.engine_serving)."""

    max_step_tokens: int  # the most tokens one step carried: the prompts admitted in it + one per running decode
    decode_batches: list[int]  # the distinct decode batch sizes (sequences running in a step), ascending
    longest: int  # the longest simulated request, prompt + generated tokens


@dataclass
class ServingHostWork:
    """The engine's host work per iteration the simulation added to the step times (softsyn.timing.serving.host), or
    why it added none. Figures in s (per_token: per prompt token; per_moved_token: per cached position moved)."""

    status: str  # "measured" (the library's serving_host block, probed on its machine) | "not modelled"
    line: str  # the figures and where they were measured, or why there are none
    iteration: float = 0.0
    per_sequence: float = 0.0
    prefill: float = 0.0
    per_token: float = 0.0
    move: float = 0.0
    per_moved_token: float = 0.0
    share: float = 0.0  # host seconds / the simulated engine's busy seconds
    first_shape: float | None = None  # once per prompt length the engine meets first; None: not measured


@dataclass
class ServingResult:
    """The serving analysis of one design: the load, the checks, the distributions, the steps and suggestions."""

    load: str  # the workload and scheduler in words
    model: str  # how steps are timed and scheduled, in words
    requests: int
    completed: int
    throughput: float  # generated tokens/s
    offered: float  # tokens/s the arrivals ask for (rate x mean gen_len)
    kv_tokens: float | None  # KV budget in tokens (None: no area_constraint, not binding)
    rejected: int = 0  # requests never served (too long for the design, or over the KV budget alone)
    checks: list[ServingCheck] = field(default_factory=list)
    distributions: list[Distribution] = field(default_factory=list)
    histogram: list[HistogramBin] = field(default_factory=list)  # TTFT and TPOT, binned (the HTML page's charts)
    steps: list[StepPoint] = field(default_factory=list)
    suggestions: list[ServingSuggestion] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    schedule: ServingSchedule | None = None  # None: an analysis.json written before it was kept
    host: ServingHostWork | None = None  # None: an analysis.json written before host work was modelled

    @property
    def violated(self) -> bool:
        """A check missed, or requests the design could not serve at all (the latencies cover only the served)."""
        return any(not c.met for c in self.checks) or self.rejected > 0
