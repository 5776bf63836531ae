"""`softsyn signoff DIR` on a torch target's artifact (DIR/model.pt2): the package measured per path group beside
the compile's prediction, and its kernels, which no netlist cell maps to yet.

Predicted: the compile's saved analysis (DIR/analysis.json), the ONNX netlist of the same function timed with the
device's ORT library (an estimate of this package, labelled so). Measured: one step of the package at each group's
dims (softsyn.runtime.torch_package.TorchStep: on CUDA a replayed CUDA graph, the device waited for), the groups
interleaved round by round so the machine's drift hits them alike. Kernels: torch.profiler over a few more steps per
group (softsyn.runtime.torch_profile: CUPTI on CUDA, AOTInductor's profiler records on the CPU), every kernel by name
with its count and time per step. No ORT netlist cell is a kernel, so the per-cell tables of an ORT signoff are empty
here and nothing is back-annotated; the compile's provenance map (softsyn.runtime.torch_provenance) says which source
modules each kernel computes, so the measured kernel time is summed per module kind (self_attn, mlp, lm_head, ...)
beside the ORT library's estimate of the netlist cells of that kind, and where the compile characterised the
package's macro cells (DIR/runtime/torch_macros.json) each group's step through them is a second prediction, measured
at compile, beside the ORT library's estimate.
"""
from __future__ import annotations

import datetime
import json
import re
import statistics
from pathlib import Path

import torch

from reports import from_json
from softsyn.errors import SoftsynError
from softsyn.progress import log, step as progress_step
from softsyn.results.signoff import GroupResult, SignoffResult
from softsyn.runtime.artifact import TORCH_PACKAGE, TORCH_PREFILL_PACKAGE
from softsyn.runtime.session import device_name
from softsyn.runtime.torch_package import TorchStep, package_label, packages, read_torch_settings
from softsyn.runtime.torch_macros import MACROS_FILE, read_library
from softsyn.runtime.torch_profile import profile_step
from softsyn.runtime.torch_provenance import UNATTRIBUTED, attribute, module_kind, read_calls
from softsyn.timing import RUN_CALL
from softsyn.timing.macro import macro_path

ANALYSIS_FILE = "analysis.json"
ROUNDS = 5  # interleaved rounds; each group runs runs / ROUNDS steps per round
PROFILED_STEPS = 5
MEASURED_INTERVAL = ("one step of the AOTInductor package, host wall clock: ids and positions made device tensors, "
                     "the call (a replayed CUDA graph when runtime/torch.json says cuda_graphs), the device waited "
                     "for; the KV cache pre-allocated, no tokenisation or sampling")
PREDICTED_MEANS = ("the compile's analysis (analysis.json): the ONNX netlist of the same function timed with the "
                   "device's ORT library, arrival at the worst endpoint minus the input delay: an estimate of this "
                   "package, not a model of its kernels")


def signoff(directory: str | Path, provider: str | None = None, runs: int = 20, warmup: int = 3,
            progress: bool = True) -> SignoffResult:
    out = Path(directory)
    settings = read_torch_settings(out)
    device = settings["device"]
    if provider not in (None, device):
        raise SoftsynError(f"{directory}: a {settings.get('target')} package runs on the {device.upper()}; valid "
                           f"--provider: {device}")
    analysis = _analysis(out)
    calls = {name: read_calls(out, entry["kernels"])  # before any step runs: a bad map is bad input, said at once
             for name, entry in packages(settings).items()}
    macros = read_library(out)  # the compile's macro cells: a prediction of each step, measured there
    step = TorchStep(out, settings)
    label = package_label(settings)
    chosen = [(g, settings["scenarios"][g.name]["dims"]) for g in analysis.groups  # dims checked on reading
              if g.paths and g.name in settings["scenarios"]]
    fits = [(g, dims) for g, dims in chosen if dims.get("past", 0) + dims.get("seq", 1) <= step.max_length]
    if not fits:
        raise SoftsynError(f"{directory}: no path group of the analysis fits the package's KV cache of "
                           f"{step.max_length} positions; nothing to sign off")
    log(f"signoff: {len(fits)} group(s) x {runs} steps of {label} on {device}, {ROUNDS} interleaved rounds",
        enabled=progress)
    per_round = max(1, runs // ROUNDS)
    samples: dict[str, list[float]] = {g.name: [] for g, _ in fits}
    medians: dict[str, list[float]] = {g.name: [] for g, _ in fits}
    with progress_step(f"signoff: timing {len(fits)} group(s)", enabled=progress, done="signoff: timed steps"):
        for group, dims in fits:
            step.time_steps(dims, warmup)  # capture and warm each shape before any round is timed
        for _ in range(ROUNDS):
            for group, dims in fits:
                times = step.time_steps(dims, per_round)
                samples[group.name] += times
                medians[group.name].append(statistics.median(times))
    with progress_step("signoff: kernels per group (torch.profiler)", enabled=progress, done="signoff: profiled"):
        profiles = {g.name: profile_step(step, dims, PROFILED_STEPS) for g, dims in fits}
    groups = []
    for g, dims in fits:
        profiled = profiles[g.name]
        result = _group_result(g, dims, samples[g.name], medians[g.name], _by_name(list(profiled.kernels)))
        result.modules = kernels_by_module(g, list(profiled.kernels), calls[step.package_for(dims.get("seq", 1))],
                                           profiled.named)
        path = macro_path(g.critical, macros.group(g.name)) if macros and macros.group(g.name) else None
        result.macro_predicted = path.arrival - path.input_delay if path else None
        groups.append(result)
    skipped = [g.name for g, _ in chosen if (g, settings["scenarios"][g.name]["dims"]) not in fits]
    notes = [f"{', '.join(skipped)}: not measured (past + seq exceed the package's KV cache of {step.max_length})"] \
        if skipped else []
    notes.append("kernels are runtime-only in the per-cell comparison: no ORT netlist cell is a kernel, so no back-"
                 "annotation; the package's macro cells (one per source module instance) are compared per group" + (
                     "" if any(p.kernels for p in profiles.values()) else "; torch.profiler saw no kernel of the "
                     "package (a CPU package compiled without Inductor's cpp.enable_kernel_profile records: none listed)"))
    if macros is None:
        notes.append(f"no {MACROS_FILE} (a package compiled before macro cells): predicted from the ORT library only")
    else:
        notes.append(f"macro cells: {MACROS_FILE}, measured on {macros.device} at {macros.date}: a prediction of each "
                     "step from the compile's measurement of its kernels")
    for name in (n for n, c in calls.items() if not c):
        notes.append(f"no {step.packages[name]['kernels']} (a package compiled before the provenance map): "
                     f"{step.packages[name]['file']}'s kernels not mapped to modules")
    return SignoffResult(
        design=analysis.design, directory=str(directory), kind="compile", library=analysis.library,
        library_source=f"{analysis.library_source}; an estimate of the ONNX netlist, not of {TORCH_PACKAGE}"
                       + ("" if len(calls) == 1 else f" or {TORCH_PREFILL_PACKAGE}"),
        provider=f"torch {torch.__version__} ({device.upper()}, {settings['dtype']}"
                 f"{', CUDA graphs' if step.graphs else ''})",
        device=device_name(device), runtime="AOTInductor", date=datetime.datetime.now().astimezone().isoformat(
            timespec="seconds"), runs=len(next(iter(samples.values()))), warmup=warmup,
        node_time="kernel", model=f"{out}/{label}", groups=groups, measured_interval=MEASURED_INTERVAL,
        predicted_means=PREDICTED_MEANS, notes=notes + list(analysis.notes))


def _analysis(out: Path):
    path = out / ANALYSIS_FILE
    if not path.is_file():
        raise SoftsynError(f"{out}: no {ANALYSIS_FILE} (the compile's prediction); re-run softsyn compile")
    try:
        return from_json(path.read_text())
    except (ValueError, TypeError, KeyError) as exc:
        raise SoftsynError(f"{path}: not a readable softsyn analysis ({exc}); re-run softsyn compile") from None


def _by_name(profiled: list[tuple[str, float]]) -> dict[str, dict]:
    """Per kernel name: count and seconds per step, largest first."""
    by_name: dict[str, list] = {}
    for name, seconds in profiled:
        entry = by_name.setdefault(_label(name), [0, 0.0])
        entry[0] += 1
        entry[1] += seconds
    return {name: {"count": n / PROFILED_STEPS, "seconds": s / PROFILED_STEPS} for name, (n, s) in
            sorted(by_name.items(), key=lambda kv: -kv[1][1])}


def kernels_by_module(group, profiled: list[tuple[str, float]], calls, named: bool = False) -> dict[str, dict]:
    """Per module kind: the kernels the provenance map attributes to it (count and seconds per step, measured) and
    the ORT library's time for the netlist cells of that kind on the group's critical path (an estimate; None for a
    kernel fusing several kinds, which no single netlist kind matches). {} without a map or a profile."""
    if not calls or not profiled:
        return {}
    rows: dict[str, dict] = {}
    for (_, seconds), call in zip(profiled, attribute([name for name, _ in profiled], calls, named=named)):
        row = rows.setdefault(call.kind if call else UNATTRIBUTED, {"count": 0.0, "seconds": 0.0})
        row["count"] += 1 / PROFILED_STEPS
        row["seconds"] += seconds / PROFILED_STEPS
    predicted: dict[str, float] = {}
    for point in group.critical.points:
        if point.hierarchy:
            kind = module_kind(point.hierarchy)
            predicted[kind] = predicted.get(kind, 0.0) + point.incr
    for kind, row in rows.items():
        row["predicted"] = predicted.get(kind)
    return dict(sorted(rows.items(), key=lambda kv: -kv[1]["seconds"]))


def _label(name: str) -> str:
    """A kernel's name without template arguments and return type, short enough for a table cell."""
    name = re.sub(r"<.*", "", name.removeprefix("void ")).strip()
    return (name.split("::")[-1] if "::" in name else name)[:60]


def _group_result(group, dims: dict, samples: list[float], medians: list[float], kernels: dict) -> GroupResult:
    critical = group.critical
    run_point = {p.name: p for p in critical.points}.get(RUN_CALL)
    ordered = sorted(samples)
    kernel_sum = sum(k["seconds"] for k in kernels.values())
    median = statistics.median(samples)
    return GroupResult(
        name=group.name, description=group.scenario.description, dims=dict(dims), clock_period=group.clock_period,
        input_delay=critical.input_delay, budget=min(p.required - p.input_delay for p in group.paths),
        predicted=critical.arrival - critical.input_delay, measured_median=median, measured_quiet=min(medians),
        measured_p10=ordered[len(ordered) // 10], measured_p90=ordered[min(len(ordered) - 1, len(ordered) * 9 // 10)],
        runs=len(samples), kernel_sum=kernel_sum, residual=median - kernel_sum, profiler_run=0.0,
        profiler_overhead=0.0, kernel_scale=1.0, predicted_overhead=run_point.incr if run_point else 0.0,
        counts={"exact": 0, "fused-anchor": 0, "absorbed": 0, "constant": 0, "runtime-only": len(kernels),
                "profiled": len(kernels)},
        by_op=[], cells=[], runtime_only=json.loads(json.dumps(kernels)))
