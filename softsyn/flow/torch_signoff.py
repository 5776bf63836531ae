"""`softsyn signoff DIR` on a torch target's artifact (DIR/model.pt2): the package measured per path group beside
the compile's prediction, and its kernels, which no netlist cell maps to yet.

Predicted: the compile's saved analysis (DIR/analysis.json), the ONNX netlist of the same function timed with the
device's ORT library (an estimate of this package, labelled so). Measured: one step of the package at each group's
dims (softsyn.runtime.torch_package.TorchStep: on CUDA a replayed CUDA graph, the device waited for), the groups
interleaved round by round so the machine's drift hits them alike. Kernels: torch.profiler over a few more steps per
group on CUDA, every kernel by name with its count and time per step (on the CPU the package's kernels run inside
AOTInductor's compiled C++, out of the profiler's sight); they are reported as runtime-only: Inductor's kernels are not characterised as cells of a library yet (issue 28's macro cells), so the
per-cell tables of an ORT signoff are empty here, and nothing is back-annotated.
"""
from __future__ import annotations

import datetime
import json
import re
import statistics
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from reports import from_json
from softsyn.errors import SoftsynError
from softsyn.progress import log, step as progress_step
from softsyn.results.signoff import GroupResult, SignoffResult
from softsyn.runtime.artifact import TORCH_PACKAGE
from softsyn.runtime.session import device_name
from softsyn.runtime.torch_package import TorchStep, read_torch_settings
from softsyn.timing import RUN_CALL

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
    step = TorchStep(out, settings)
    chosen = [(g, settings["scenarios"][g.name]["dims"]) for g in analysis.groups  # dims checked on reading
              if g.paths and g.name in settings["scenarios"]]
    fits = [(g, dims) for g, dims in chosen if dims.get("past", 0) + dims.get("seq", 1) <= step.max_length]
    if not fits:
        raise SoftsynError(f"{directory}: no path group of the analysis fits the package's KV cache of "
                           f"{step.max_length} positions; nothing to sign off")
    log(f"signoff: {len(fits)} group(s) x {runs} steps of {TORCH_PACKAGE} on {device}, {ROUNDS} interleaved rounds",
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
        kernels = {g.name: _kernels(step, dims) for g, dims in fits}
    groups = [_group_result(g, dims, samples[g.name], medians[g.name], kernels[g.name]) for g, dims in fits]
    skipped = [g.name for g, _ in chosen if (g, settings["scenarios"][g.name]["dims"]) not in fits]
    notes = [f"{', '.join(skipped)}: not measured (past + seq exceed the package's KV cache of {step.max_length})"] \
        if skipped else []
    notes.append("kernels are runtime-only: Inductor's kernels are not cells of a characterised library yet, so no "
                 "per-cell comparison and no back-annotation" + ("" if step.device == "cuda" else "; on the CPU they run "
                 "inside AOTInductor's compiled C++, which torch.profiler does not see into (none listed)"))
    return SignoffResult(
        design=analysis.design, directory=str(directory), kind="compile", library=analysis.library,
        library_source=f"{analysis.library_source}; an estimate of the ONNX netlist, not of {TORCH_PACKAGE}",
        provider=f"torch {torch.__version__} ({device.upper()}, {settings['dtype']}"
                 f"{', CUDA graphs' if step.graphs else ''})",
        device=device_name(device), runtime="AOTInductor", date=datetime.datetime.now().astimezone().isoformat(
            timespec="seconds"), runs=len(next(iter(samples.values()))), warmup=warmup,
        node_time="kernel", model=str(out / TORCH_PACKAGE), groups=groups, measured_interval=MEASURED_INTERVAL,
        predicted_means=PREDICTED_MEANS, notes=notes + list(analysis.notes))


def _analysis(out: Path):
    path = out / ANALYSIS_FILE
    if not path.is_file():
        raise SoftsynError(f"{out}: no {ANALYSIS_FILE} (the compile's prediction); re-run softsyn compile")
    try:
        return from_json(path.read_text())
    except (ValueError, TypeError, KeyError) as exc:
        raise SoftsynError(f"{path}: not a readable softsyn analysis ({exc}); re-run softsyn compile") from None


def _kernels(step: TorchStep, dims: dict) -> dict[str, dict]:
    """Per CUDA kernel name: count and seconds per step, over PROFILED_STEPS steps (CUPTI via torch.profiler, which
    also sees the kernels a CUDA graph replays). Empty on the CPU: the package's kernels run inside AOTInductor's
    compiled C++, which the profiler does not see into."""
    if step.device != "cuda":
        return {}
    step.time_steps(dims, 1)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step.time_steps(dims, PROFILED_STEPS)
    by_name: dict[str, list] = {}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        seconds = event.device_time * 1e-6
        entry = by_name.setdefault(_label(event.name), [0, 0.0])
        entry[0] += 1
        entry[1] += seconds
    return {name: {"count": n / PROFILED_STEPS, "seconds": s / PROFILED_STEPS} for name, (n, s) in
            sorted(by_name.items(), key=lambda kv: -kv[1][1])}


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
