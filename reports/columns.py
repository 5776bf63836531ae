"""Every report table's columns, in one place: the text reports print them and a JSON or HTML
consumer reads the same definitions (`Column.to_dict`) next to the rows (reports.common.Table).

Timing, area and constraint tables use the DC layout (a width includes the column's padding);
fusion, signoff and verify use the format-spec layout (`gap` blanks, then the width).
"""
from __future__ import annotations

from reports.common import Column

# ------------------------------------------------------------------------------------------ DC layout

TIMING_COLUMNS: tuple[Column, ...] = (
    Column("point", "Point", 48, "left"),
    Column("cell", "Cell", 34, "left"),
    Column("incr", "Incr", 12, "right", "time"),
    Column("path", "Path", 11, "right", "time"),
)

AREA_KIND_COLUMNS: tuple[Column, ...] = (
    Column("name", "Kind", 30, "left"),
    Column("bytes", "Bytes", 14, "right", "bytes"),
    Column("count", "Count", 10, "right", "count"),
    Column("percent", "Percent", 9, "right", "percent"),
    Column("pad", "", 2, "left"),
    Column("detail", "Detail", 40, "left"),
)
AREA_HIERARCHY_COLUMNS: tuple[Column, ...] = (Column("name", "Hierarchy", 40, "left"), *AREA_KIND_COLUMNS[1:])
AREA_LIMIT_COLUMNS: tuple[Column, ...] = (Column("name", "", 40, "left"), Column("bytes", "", 14, "right", "bytes"))

CONSTRAINT_DELAY_COLUMNS: tuple[Column, ...] = (
    Column("object", "Endpoint", 30, "left"),
    Column("required", "Required Path Delay", 20, "right", "time"),
    Column("actual", "Actual Path Delay", 20, "right", "time"),
    Column("slack", "Slack", 14, "right", "time"),
    Column("pad", "", 2, "left"),
    Column("status", "", 10, "left"),
)
CONSTRAINT_AREA_COLUMNS: tuple[Column, ...] = (
    Column("object", "Design", 30, "left"),
    Column("required", "Required Area", 20, "right", "bytes"),
    Column("actual", "Actual Area", 20, "right", "bytes"),
    Column("slack", "Slack", 14, "right", "bytes"),
    Column("pad", "", 2, "left"),
    Column("status", "", 10, "left"),
)

# ------------------------------------------------------------------------------------------ format-spec layout

# report_area's KV budget: one row per KV dtype (softsyn.results.analysis.KVOption), one per weight precision
# (WeightOption); the keys are those objects' fields.
AREA_KV_COLUMNS: tuple[Column, ...] = (
    Column("dtype", "KV dtype", 10),
    Column("source", "Source", 9, gap=1),
    Column("bytes_per_token", "Per token", 11, "right", "bytes", unit="KB", gap=1),
    Column("kv_bytes", "KV (workload)", 13, "right", "bytes", gap=1),
    Column("total", "Total VRAM", 12, "right", "bytes", gap=1),
    Column("max_concurrency", "Max concurrency", 15, "right", "count", fmt="{:,}", missing="-", gap=1),
    Column("max_context", "Max context", 12, "right", "count", fmt="{:,}", missing="-", gap=1),
    Column("fits", "Fits", 4, missing="-", gap=2),
)
AREA_WEIGHT_COLUMNS: tuple[Column, ...] = (
    Column("precision", "Weights", 10),
    Column("source", "Source", 9, gap=1),
    Column("weight_bytes", "Bytes", 11, "right", "bytes", gap=1),
    Column("total", "Total VRAM", 26, "right", "bytes", gap=1),
    Column("max_concurrency", "Max concurrency", 15, "right", "count", fmt="{:,}", missing="-", gap=1),
    Column("fits", "Fits", 4, missing="-", gap=15),
)

FUSION_COLUMNS: tuple[Column, ...] = (
    Column("kind", "Fusion kind", 16),
    Column("candidates", "Candidates", 11, "right", "count"),
    Column("fused", "Fused", 7, "right", "count"),
    Column("missed", "Missed", 8, "right", "count"),
    Column("percent", "Coverage", 10, "right", "number", fmt="{:.0f}%", missing="-"),  # 0..100, as Coverage.percent
    Column("target_op", "Runtime op", 40, gap=2),
)
FUSION_MISS_COLUMNS: tuple[Column, ...] = (  # every candidate site a rule did not fuse, and why
    Column("kind", "Fusion kind", 16),
    Column("site", "Site", 60, gap=2),
    Column("reason", "Reason", 60, gap=2),
)

# the HTML report's header: each path group's verdict with the budget's delays (a TimingPath's fields)
VERDICT_COLUMNS: tuple[Column, ...] = (
    Column("group", "Group", 10),
    Column("scenario", "Scenario", 30, gap=1),
    Column("clock_period", "Clock", 10, "right", "time", missing="none", gap=1),
    Column("input_delay", "Input delay", 11, "right", "time", gap=1),
    Column("output_delay", "Output delay", 12, "right", "time", gap=1),
    Column("clock_uncertainty", "Uncertainty", 11, "right", "time", gap=1),
    Column("arrival", "Arrival", 10, "right", "time", gap=1),
    Column("slack", "Slack", 10, "right", "time", missing="-", gap=1),
    Column("status", "Status", 13, gap=2),
)


def _time(key: str, title: str, width: int) -> Column:
    return Column(key, title, width, "right", "time", gap=1)


def _error(key: str, title: str) -> Column:
    """(predicted - measured) / measured; None (measured 0) prints n/a."""
    return Column(key, title, 8, "right", "percent", fmt="{:+.1%}", missing="n/a", gap=1)


SIGNOFF_GROUP_COLUMNS: tuple[Column, ...] = (
    Column("group", "Group", 10),
    Column("scenario", "Scenario", 30, gap=1),
    _time("budget", "Budget", 9),
    _time("predicted", "Predicted", 10),
    _time("measured", "Measured", 10),
    _time("p90", "p90", 9),
    _time("quiet", "Quiet", 9),
    _error("error", "Error"),
    _error("error_quiet", "Err q"),
    _time("predicted_slack", "Slack pred", 11),
    _time("measured_slack", "Slack meas", 11),
    Column("status", "Status", 24, gap=2),
)
SIGNOFF_OP_COLUMNS: tuple[Column, ...] = (
    Column("op_type", "Op", 26),
    Column("cells", "Cells", 6, "right", "count", gap=1),
    _time("predicted", "Predicted", 10),
    _time("measured", "Measured", 10),
    _time("delta", "Delta", 10),
    _error("error", "Error"),
)
SIGNOFF_KERNEL_COLUMNS: tuple[Column, ...] = (  # a torch package's kernels, which no netlist cell maps to yet
    Column("kernel", "Kernel (runtime-only)", 60, clip=True),
    Column("count", "Per step", 8, "right", "number", "{:.0f}", gap=1),
    _time("seconds", "Time", 10),
    Column("share", "Share", 8, "right", "percent", fmt="{:.1%}", missing="-", gap=1),
)
SIGNOFF_MODULE_COLUMNS: tuple[Column, ...] = (  # a torch package's kernels summed per source-module kind (provenance)
    Column("kind", "Module kind", 40, clip=True),
    Column("count", "Kernels", 8, "right", "number", "{:.0f}", gap=1),
    _time("seconds", "Measured", 10),
    Column("predicted", "Pred (est)", 10, "right", "time", missing="-", gap=1),
    Column("share", "Share", 8, "right", "percent", fmt="{:.1%}", missing="-", gap=1),
)
MACRO_COLUMNS: tuple[Column, ...] = (  # a torch package's macro cells (softsyn.runtime.torch_macros) in launch order
    Column("instance", "Macro cell (module instance)", 40, clip=True),
    Column("kernels", "Kernels", 8, "right", "number", "{:g}", gap=1),
    Column("cells", "Cells", 6, "right", "count", gap=1),
    _time("seconds", "Measured", 10),
    Column("est", "Est", 10, "right", "time", missing="-", gap=1),
    Column("share", "Share", 8, "right", "percent", fmt="{:.1%}", missing="-", gap=1),
)
SIGNOFF_CELL_COLUMNS: tuple[Column, ...] = (
    Column("instance", "Instance", 58, clip=True),
    Column("op_type", "Op", 14, gap=1),
    _time("predicted", "Pred", 8),
    _time("measured", "Meas", 8),
    _time("delta", "Delta", 8),
    Column("match", "Match", 40, gap=2),
)

VERIFY_COLUMNS: tuple[Column, ...] = (
    Column("scenario", "Scenario", 10),
    Column("output", "Output", 24, gap=1),
    Column("max_abs", "Max abs", 10, "right", "number", fmt="{:.3e}", gap=1),
    Column("rel", "Rel error", 10, "right", "number", fmt="{:.3e}", gap=1),
    Column("cosine", "Cosine", 10, "right", "number", fmt="{:.6f}", gap=1),
    Column("top1", "Top-1", 7, "right", "percent", fmt="{:.4f}", missing="-", gap=1),
    Column("over", "Positions over", 14, "right", missing="-", gap=1),  # logits: positions over budget / compared
    Column("status", "Status", 8, gap=2),
)

LOCATE_COLUMNS: tuple[Column, ...] = (  # verify --locate: nodes whose GPU output departs from the CPU's
    Column("scenario", "Scenario", 10),
    Column("node", "Node", 48, gap=1, clip=True),
    Column("op", "Op", 20, gap=1),
    Column("rel", "Rel error", 10, "right", "number", fmt="{:.3e}", gap=1),
    Column("inputs_rel", "Inputs", 10, "right", "number", fmt="{:.3e}", gap=1),
    Column("output", "Output", 32, gap=2, clip=True),
)

RUN_COLUMNS: tuple[Column, ...] = (  # softsyn run: TTFT and TPOT over the timed runs
    Column("metric", "Metric", 6),
    _time("median", "Median", 10),
    _time("p90", "p90", 10),
    _time("min", "Min", 10),
    Column("samples", "Samples", 8, "right", "count", gap=1),
    Column("interval", "Interval", 40, gap=2),
)

PHASE_COLUMNS: tuple[Column, ...] = (  # softsyn run: where a step's time goes (softsyn.flow.run_phases rows)
    Column("step", "Step", 7),
    Column("sample", "Sample", 18, gap=1),
    _time("total", "Total", 10),
    _time("inputs", "Inputs", 10),
    _time("run", "Run call", 10),
    _time("readback", "Readback", 10),
)

# report_area / report_qor's tensor-parallel plan: one row per degree (softsyn.results.analysis.TPRow); a group's
# columns (its critical arrival per device, the collectives on that path, the speed-up over one device) by
# tp_group_columns.
TP_COLUMNS: tuple[Column, ...] = (
    Column("n", "TP", 3, "right", "count"),
    Column("kv_heads_per_device", "KV heads", 8, "right", "count", gap=1),
    Column("weights", "Weights", 11, "right", "bytes", gap=1),
    Column("kv_cache", "KV cache", 11, "right", "bytes", gap=1),
    Column("workspace", "Workspace", 11, "right", "bytes", gap=1),
    Column("total", "VRAM/device", 12, "right", "bytes", gap=1),
    Column("fits", "Fits", 4, missing="-", gap=2),
)


def tp_group_columns(group: str) -> tuple[Column, ...]:
    return (_time(f"{group}.arrival", f"{group}", max(9, len(group) + 5)),
            _time(f"{group}.collectives", "comm", 8),
            Column(f"{group}.speedup", "x", 5, "right", "number", fmt="{:.2f}", missing="-", gap=1))


def precision_columns(groups: list[str]) -> tuple[Column, ...]:
    """report_precision's columns: the cell, requested and realised precision, its error, its change per group."""
    return (Column("cell", "Cell", 44), Column("requested", "Requested", 9, gap=1),
            Column("realised", "Realised", 8, gap=1),
            Column("error", "Error", 9, "right", "number", fmt="{:.2e}", gap=1),
            *(_time(f"delta_{g}", f"d {g} (ms)", 14) for g in groups))


# report_precision's measured re-timing (ultra): per round and group, predicted next to measured, baseline and map.
RETIME_COLUMNS: tuple[Column, ...] = (
    Column("round", "Round", 5, "right", "count"),
    Column("group", "Group", 10, gap=1),
    _time("predicted_base", "Pred base (ms)", 14),
    _time("measured_base", "Meas base (ms)", 14),
    _time("predicted_map", "Pred map (ms)", 13),
    _time("measured_map", "Meas map (ms)", 13),
    Column("ratio", "Paired", 6, "right", "number", fmt="{:.3f}", gap=1),
    Column("spread", "p10-p90", 11, "right", gap=1),
    _time("slack_map", "Meas slack (ms)", 15),
    Column("verdict", "Map", 8, gap=1),
)



def pareto_columns(groups: list[str]) -> tuple[Column, ...]:
    """report_pareto's columns (reports.pareto): where the point comes from, its precision mix, per group the
    predicted (tables, est) and the measured latency, its error and how it was obtained, whether it is on the front
    and kept, and its label last (a label of any length leaves the columns in place)."""
    width = lambda g: max(10, len(g) + 5)  # noqa: E731
    return (Column("origin", "Origin", 7), Column("mix", "Mix", 30, gap=1),
            *(Column(f"pred_{g}", f"Pred {g}", width(g), "right", "time", missing="-", gap=1) for g in groups),
            *(Column(f"meas_{g}", f"Meas {g}", width(g), "right", "time", missing="-", gap=1) for g in groups),
            Column("error", "Error", 9, "right", "number", fmt="{:.3e}", missing="-", gap=1),
            Column("how", "How", 4, gap=1), Column("front", "Front", 5, gap=1), Column("kept", "Kept", 4, gap=1),
            Column("label", "Label", 5, gap=1))

# ------------------------------------------------------------------------------------------ the HTML page's views

# time per op type on a group's critical path (reports.views.op_time); flops / bytes: the cells' work
OP_TIME_COLUMNS: tuple[Column, ...] = (
    Column("op", "Op type", 28),
    Column("cells", "Cells", 6, "right", "count", gap=1),
    _time("time", "Time", 10),
    Column("share", "Share", 7, "right", "percent", gap=1),
    Column("flops", "FLOP", 10, "right", "number", fmt="{:.3g}", missing="-", gap=1),
    Column("bytes", "Bytes", 10, "right", "number", fmt="{:.3g}", missing="-", gap=1),
)

# the roofline (reports.views.roofline): a cell's achieved rates from its delay against the library's ceilings
ROOFLINE_COLUMNS: tuple[Column, ...] = (
    Column("name", "Cell", 40, clip=True),
    Column("op", "Op type", 20, gap=1),
    _time("time", "Delay", 10),
    Column("source", "Source", 12, gap=1),
    Column("intensity", "FLOP/byte", 10, "right", "number", fmt="{:.3g}", gap=1),
    Column("flops_rate", "FLOP/s", 10, "right", "number", fmt="{:.3g}", gap=1),
    Column("bytes_rate", "Bytes/s", 10, "right", "number", fmt="{:.3g}", gap=1),
    Column("roof", "Of roof", 8, "right", "percent", gap=1),
    Column("measured", "Profiled", 10, "right", "time", missing="-", gap=1),
    Column("measured_rate", "Profiled FLOP/s", 10, "right", "number", fmt="{:.3g}", missing="-", gap=1),
)
CEILING_COLUMNS: tuple[Column, ...] = (
    Column("ceiling", "Ceiling", 28),
    Column("value", "Value", 12, "right", "number", fmt="{:.3g}", gap=1),
    Column("unit", "Unit", 8, gap=1),
)

# a signed-off group's kernels in the path's order (reports.views.timeline)
TIMELINE_COLUMNS: tuple[Column, ...] = (
    Column("instance", "Cell", 40, clip=True),
    Column("op", "Op type", 20, gap=1),
    _time("start", "Start", 10),
    _time("predicted", "Predicted", 10),
    _time("measured", "Measured", 10),
)

# endpoint slacks per group, binned (reports.views.slack_histogram)
SLACK_BIN_COLUMNS: tuple[Column, ...] = (
    _time("low", "From", 10),
    _time("high", "To", 10),
    Column("paths", "Paths", 6, "right", "count", gap=1),
)


# ------------------------------------------------------------------------------------------ serving (simulated, est)

# reports.serving: the serving checks (softsyn.results.serving.ServingCheck), latency in time units, throughput in
# tokens/s (slack = achieved - minimum), the simulated distributions and the quantified suggestions
SERVING_TIME_COLUMNS: tuple[Column, ...] = (
    Column("group", "Group", 12),
    _time("required", "Required", 12),
    _time("achieved", "Achieved", 12),
    _time("slack", "Slack", 12),
    Column("status", "Status", 26, gap=2),
)
SERVING_RATE_COLUMNS: tuple[Column, ...] = (
    Column("group", "Group", 12),
    Column("required", "Min tok/s", 12, "right", "number", fmt="{:,.1f}", gap=1),
    Column("achieved", "Achieved", 12, "right", "number", fmt="{:,.1f}", gap=1),
    Column("slack", "Slack", 12, "right", "number", fmt="{:,.1f}", gap=1),
    Column("status", "Status", 26, gap=2),
)
SERVING_DISTRIBUTION_COLUMNS: tuple[Column, ...] = (
    Column("metric", "Metric", 8),
    _time("p50", "p50", 10),
    _time("p90", "p90", 10),
    _time("p99", "p99", 10),
    _time("mean", "Mean", 10),
    _time("max", "Max", 10),
    # how much of p50 / p99 is the engine's host work (the same simulation without it, subtracted); "-": not modelled
    Column("host_p50", "Host p50", 10, "right", "time", gap=1, missing="-"),
    Column("host_p99", "Host p99", 10, "right", "time", gap=1, missing="-"),
)
SERVING_SUGGESTION_COLUMNS: tuple[Column, ...] = (
    Column("knob", "Knob", 10),
    Column("meets", "Meets", 5, missing="-", gap=1),
    Column("change", "Change", 72, gap=2),
    Column("result", "Simulated result", 60, gap=2),
)
SERVING_STEP_COLUMNS: tuple[Column, ...] = (
    Column("kind", "Step", 8),
    Column("batch", "Batch", 6, "right", "count", gap=1),
    Column("tokens", "Past/prompt", 12, "right", "count", gap=1),
    _time("time", "Time", 10),
)
