"""Building a back-annotation from a runtime profile (softsyn.results.annotation holds the data and says what it
means): each profiled kernel matched to its netlist node, the rest absorbed or runtime-only, the residual the run
less the kernels."""
from __future__ import annotations

import datetime
from collections import Counter

import onnxruntime

from softsyn.results.annotation import AnnotatedCell, Annotation, GroupAnnotation


def match_profile(netlist_nodes: list[tuple[str, str]], profile) -> tuple[dict[str, AnnotatedCell], list[str], dict[str, dict]]:
    """Map a runtime profile onto netlist nodes [(name, op_type)] -> (cells, absorbed, runtime_only).

    Exact name first; otherwise the longest netlist name N with runtime name starting "N/" (ORT names a
    fused node after its anchor: "node_silu/QuickGeluFusion/"). Everything else is absorbed (netlist
    side) or runtime-only (profile side). A name several netlist nodes share identifies none of them:
    those nodes are neither matched nor absorbed (they keep their library delays).
    """
    counts = Counter(name for name, _ in netlist_nodes)
    names = {name for name, n in counts.items() if n == 1}
    cells: dict[str, AnnotatedCell] = {}
    runtime_only: dict[str, dict] = {}
    for rt_name, node in profile.nodes.items():
        target, match = None, "exact"
        if rt_name in names:
            target = rt_name
        else:
            cut = rt_name.find("/")
            while cut != -1:
                if rt_name[:cut] in names:
                    target, match = rt_name[:cut], "fused-anchor"
                cut = rt_name.find("/", cut + 1)
        if target is None:
            runtime_only[rt_name] = {"op": node.op_type, "delay": node.median}
            continue
        cell = cells.get(target)
        if cell is None:
            cells[target] = AnnotatedCell(node.median, [rt_name], node.op_type, match)
        else:  # several runtime kernels attributed to one netlist node
            cell.delay += node.median
            cell.runtime_nodes.append(rt_name)
            if match == "fused-anchor":
                cell.match = match
    absorbed = [name for name, _ in netlist_nodes if name not in cells and name in names]
    return cells, absorbed, runtime_only


def group_annotation(name: str, dims: dict[str, int], netlist_nodes: list[tuple[str, str]], profile,
                     measurement) -> GroupAnnotation:
    cells, absorbed, runtime_only = match_profile(netlist_nodes, profile)
    kernel_sum = sum(c.delay for c in cells.values())
    # Profiling and timing are separate sessions: on a busy machine the profiled kernels can sum to more than
    # the timed run. A negative residual cannot sit before the first cell (nothing starts before its input
    # arrives), so the kernels are scaled down to the run instead, residual 0, and the scale is recorded.
    scale = 1.0
    if kernel_sum > measurement.median > 0:
        scale = measurement.median / kernel_sum
        for cell in cells.values():
            cell.delay *= scale
        kernel_sum = measurement.median
    return GroupAnnotation(
        name=name, dims={k: int(v) for k, v in dims.items()}, measured_median=measurement.median,
        measured_p10=measurement.p10, measured_p90=measurement.p90, runs=measurement.runs,
        residual=max(0.0, measurement.median - kernel_sum), cells=cells, absorbed=absorbed, runtime_only=runtime_only,
        profiler_run_median=profile.run_median, profiler_overhead_per_node=profile.overhead_per_node,
        kernel_scale=scale)


def new_annotation(design: str, model: str, provider: str, device: str, node_time: str, interval: str) -> Annotation:
    return Annotation(design=design, model=str(model), provider=provider, device=device,
                      runtime=f"onnxruntime {onnxruntime.__version__}",
                      date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                      node_time=node_time, measured_interval=interval)
