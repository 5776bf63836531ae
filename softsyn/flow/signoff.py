"""Sign-off: run the design on the real runtime, compare with the analysis, back-annotate (PrimeTime + SDF).

`signoff(DIR, provider, runs)` reads an `analyze -o` directory (analysis.json + design.json, which
records the model spec, constraints, target and ONNX file) or a `compile -o` directory (model.onnx,
netlist.json, runtime/session.json), and for each path group at its scenario dims:

1. measures the model (softsyn.runtime.measure.measure_many: warm run_with_iobinding calls, median and p90; one
   session for every group, timed in interleaved rounds);
2. profiles it per node in a separate session (ORT's profiler, softsyn.runtime.measure.profile_many);
3. maps the profile onto the netlist and builds the group's back-annotation (softsyn.flow.annotate);
4. compares predicted (the analysis's arrival at the worst endpoint minus the input delay: the
   session.run overhead plus every cell) with measured (the median run), per group, per op type
   and per cell, and checks the measured slack = required - input delay - measured median.

Writes DIR/signoff/annotation.json (for `softsyn analyze --annotate`), DIR/signoff/signoff.json and
DIR/reports/signoff.rpt. A group whose measured slack is negative is a violation (exit 1).
"""
from __future__ import annotations

import datetime
import json
import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from softsyn.flow.annotate import group_annotation, new_annotation
from softsyn.results.annotation import Annotation
from softsyn.errors import SoftsynError
from softsyn.frontends.onnx_file import check_external_data
from softsyn.runtime.artifact import check_session, read_json
from softsyn.runtime.decoder import kv_aliases
from softsyn.runtime.block_measure import measure_blocks, profile_blocks
from softsyn.runtime.inputs import scenario_inputs
from softsyn.runtime.measure import measure_many, onnx_path, profile_many
from softsyn.runtime.session import describe_device, device_name
from softsyn.characterize.probe import PROBE_WORKLOAD, speed_probe
from softsyn.progress import log, step
from softsyn.timing import RUN_CALL, cell_timings
from reports.html import write_html
from softsyn.results.files import write_atomic
from softsyn.results.signoff import MEASURED_INTERVAL, CellRow, GroupResult, OpRow, SignoffResult
from softsyn.constraints import Constraints, load_constraints
from softsyn.design import Design
from softsyn.frontends import read_design
from softsyn.frontends.vlm import rejoin
from softsyn.library import load_library
from reports import from_json

COMPOSITE_NOTE = ("a composite: each group's step is one call of each block it runs, in order, one session per "
                  "block, inputs bound on the device before timing (softsyn.runtime.block_measure)")
DESIGN_FILE = "design.json"  # written by `analyze -o`: how to rebuild the design signoff runs
DESIGN_SCHEMA = "softsyn.design/1"
ANALYSIS_FILE = "analysis.json"


# ------------------------------------------------------------------------------------------ inputs

@dataclass
class Target:
    """What signoff needs from DIR."""

    kind: str
    design: object  # softsyn.design.Design
    analysis: object  # softsyn.results.analysis.Analysis
    onnx: Path
    session_options: dict
    cuda_graph: bool = False  # runtime/session.json enables the CUDA EP's graph capture
    blocks: list[dict] | None = None  # a composite's blocks (runtime/session.json): its block files measured in turn


def design_record(spec: str, constraints: str | None, target: str | None, cache_dir: str | None,
                  workload: dict, annotate: str | None, netlist, library: str, materialize: bool = False) -> dict:
    """DIR/design.json for `analyze -o`: enough to rebuild the same design (and find its ONNX) later."""
    try:
        onnx = str(onnx_path(netlist))
    except SoftsynError:
        onnx = None
    absolute = lambda p: str(Path(p).resolve()) if p else None  # noqa: E731
    return {
        "schema": DESIGN_SCHEMA,
        "model": spec,
        "constraints": absolute(constraints),
        "target": target,
        "library": library,
        "workload": {k: v for k, v in workload.items() if v is not None},
        "cache_dir": absolute(cache_dir),
        "annotate": absolute(annotate),
        "materialize": materialize,
        "onnx": onnx,
        "weights": netlist.provenance.get("weights"),
    }


def _bad_dir(directory: Path, why: str) -> SoftsynError:
    return SoftsynError(f"{directory}: {why}. signoff takes the output directory of `softsyn analyze MODEL -o DIR` "
                        "(analysis.json + design.json) or of `softsyn compile MODEL -o DIR` (model.onnx + netlist.json)")


def load_target(directory: str | Path, progress: bool = False) -> Target:
    directory = Path(directory)
    if not directory.is_dir():
        raise _bad_dir(directory, "no such directory")
    saved = directory / ANALYSIS_FILE
    analysis = None
    if saved.is_file():
        try:
            analysis = from_json(saved.read_text())
        except (ValueError, TypeError, KeyError) as exc:
            raise _bad_dir(directory, f"{ANALYSIS_FILE} is not a readable softsyn analysis ({exc})") from None
    record = {}
    if (directory / DESIGN_FILE).is_file():
        try:
            record = json.loads((directory / DESIGN_FILE).read_text())
        except ValueError as exc:
            raise _bad_dir(directory, f"{DESIGN_FILE} is not JSON ({exc})") from None

    if (directory / "model.onnx").is_file() and (directory / "netlist.json").is_file():  # compile -o
        session_file = directory / "runtime" / "session.json"
        runtime = check_session(read_json(session_file, "runtime/session.json"), session_file) \
            if session_file.is_file() else {}
        kind = "compile"
        onnx = directory / "model.onnx"
        blocks = runtime.get("blocks") or None
        # a composite's block files joined back into the netlist compile timed (names and cells as it wrote them)
        netlist = rejoin(directory, blocks) if blocks else read_design(str(onnx), progress=progress)
        check_external_data(netlist.model, onnx)  # every weight's bytes there before ONNX Runtime maps them
        meta = _read_json(directory / "netlist.json")
        cons_file = record.get("constraints") or meta.get("constraints_file") or (
            analysis.constraints_file if analysis else None)
        cons = load_constraints(cons_file) if cons_file and Path(cons_file).is_file() else Constraints.default()
        library = load_library(record.get("library") or meta.get("library") or (analysis.library if analysis else None)
                               or cons.target or "cpu-ort")
        design = Design(netlist, cons, library, progress)
        options = runtime.get("session_options", {}) if isinstance(runtime.get("session_options"), dict) else {}
        cuda = (runtime.get("provider_options") or {}).get("CUDAExecutionProvider") or {}
        cuda_graph = str(cuda.get("enable_cuda_graph", "0")) == "1"
    elif analysis is not None:  # analyze -o
        kind = "analyze"
        spec = record.get("model") or analysis.provenance.get("source")
        if not spec:
            raise _bad_dir(directory, f"no {DESIGN_FILE} and the analysis does not name its model")
        saved_cons = analysis.constraints_file
        cons_file = record.get("constraints") or (saved_cons if saved_cons and not saved_cons.startswith("<")
                                                  and saved_cons != "None" else None)
        if cons_file and not Path(cons_file).is_file():
            raise SoftsynError(f"{directory}: the constraints file {cons_file} the analysis used is gone")
        kwargs = dict(constraints=cons_file, target=record.get("library") or analysis.library,
                      cache_dir=record.get("cache_dir"), progress=progress, annotate=record.get("annotate"),
                      **record.get("workload", {}))
        if record.get("materialize"):
            kwargs["materialize"] = True
        design = Design.load(spec, **kwargs)
        onnx = Path(record["onnx"]) if record.get("onnx") and Path(record["onnx"]).is_file() else onnx_path(design.netlist)
        options, cuda_graph, blocks = {}, True, None  # timed as the design.launches say: measured the same way
    else:
        raise _bad_dir(directory, f"neither {ANALYSIS_FILE} nor model.onnx + netlist.json here")
    if "meta" in str(design.netlist.provenance.get("weights", "")):
        raise SoftsynError(f"{directory}: {design.netlist.name} was exported without weights (meta device), so it "
                           "cannot run; re-run analyze with --materialize (seeded random weights) on a machine with "
                           "the RAM for them")
    if analysis is None:
        analysis = design.analyze()
    return Target(kind, design, analysis, onnx, options, cuda_graph, blocks=blocks)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


# ------------------------------------------------------------------------------------------ the flow

def signoff(directory: str | Path, *, provider: str = "cpu", runs: int = 20, warmup: int = 3,
            profile_runs: int | None = None, annotation_out: str | Path | None = None, progress: bool = True,
            groups: list[str] | None = None, blocking_profile: bool | None = None) -> SignoffResult:
    """Measure the groups of an `analyze -o` DIRECTORY on `provider` (one session, interleaved), profile them per
    node, compare with the saved analysis cell by cell, and write the back-annotation (default
    DIRECTORY/signoff/annotation.json)."""
    directory = Path(directory)
    target = load_target(directory, progress=False)
    design, analysis = target.design, target.analysis
    netlist = design.netlist
    device = device_name(provider)
    blocking = provider == "cuda" if blocking_profile is None else blocking_profile
    node_time = "kernel" if provider != "cuda" or blocking else "host-launch"
    annotation: Annotation = new_annotation(netlist.name, str(target.onnx), "", device, node_time, MEASURED_INTERVAL)
    chosen = _chosen_groups(design, analysis, groups, directory)
    # One session (one per block of a composite) measures every group, interleaved; one profiling session (a
    # subprocess on CUDA) profiles them.
    scenarios = [scenario_inputs(netlist, group.scenario.dims) for group, _ in chosen]
    sessions = "one session per block" if target.blocks else "one session"
    log(f"signoff: measuring {len(chosen)} group(s) x {runs} runs on {provider} ({sessions}, interleaved): "
        + "; ".join(group.scenario.description for group, _ in chosen), enabled=progress)
    load_before, probe_before = os.getloadavg()[0], speed_probe(provider)
    cpu_before = cpu_seconds()
    # a group the design times as a captured CUDA graph is measured as one, where its settings enable it
    graphs = [provider == "cuda" and target.cuda_graph and not target.blocks
              and getattr(design.launches.get(group.name), "captured", False) for group, _ in chosen]
    if any(graphs):
        log("signoff: " + ", ".join(g.name for (g, _), on in zip(chosen, graphs) if on)
            + " measured as a CUDA graph replay (enable_cuda_graph=1, a session each); per-node profiles run eagerly",
            enabled=progress)
    aliases = kv_aliases(netlist)
    with step(f"signoff: timing {len(chosen)} group(s) x {runs} runs", enabled=progress,
              done="signoff: timed runs"):
        if target.blocks:  # each group's blocks in turn (softsyn.runtime.block_measure)
            measured = measure_blocks(directory, target.blocks, _block_scenarios(chosen, scenarios, target),
                                      runs=runs, warmup=warmup, provider=provider, options=target.session_options,
                                      aliases=aliases)
        else:
            measured = measure_many(target.onnx, scenarios, runs=runs, warmup=warmup, provider=provider,
                                    options=target.session_options, cuda_graphs=graphs, aliases=aliases)
    neighbours = neighbours_share(cpu_before, cpu_seconds())
    machine = machine_state(probe_before, speed_probe(provider), design.library, describe_device(provider),
                            (load_before, os.getloadavg()[0]), neighbours)
    log("signoff: profiling per node" + (" (CUDA_LAUNCH_BLOCKING=1)" if blocking and provider == "cuda" else ""),
        enabled=progress)
    with step("signoff: per-node profiles", enabled=progress, done="signoff: profiled"):
        profiling = dict(runs=profile_runs or max(3, min(runs, 10)), warmup=2, provider=provider,
                         options=target.session_options, blocking=blocking, aliases=aliases)
        profiles = (profile_blocks(directory, target.blocks, _block_scenarios(chosen, scenarios, target), **profiling)
                    if target.blocks else profile_many(target.onnx, scenarios, **profiling))
    results = []
    for (group, timing), m, prof in zip(chosen, measured, profiles):
        annotation.provider = m.provider
        ga = group_annotation(group.name, group.scenario.dims, [(n.name, n.op_type) for n in netlist.nodes()], prof, m)
        annotation.groups[group.name] = ga
        results.append(_group_result(design, group, timing, measured=(m, prof, ga)))
        log(f"  {group.name}: predicted {results[-1].predicted * 1e3:.3f} ms, measured {m.summary}", enabled=progress)

    out = Path(annotation_out) if annotation_out else directory / "signoff" / "annotation.json"
    annotation.save(out)
    return SignoffResult(
        design=netlist.name, directory=str(directory), kind=target.kind, library=analysis.library,
        library_source=analysis.library_source, provider=annotation.provider, device=device, runtime=annotation.runtime,
        date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"), runs=runs, warmup=warmup,
        node_time=node_time, model=str(target.onnx), groups=results, annotation_file=str(out), machine=machine,
        notes=list(analysis.notes) + ([COMPOSITE_NOTE] if target.blocks else []))


def _block_scenarios(chosen: list, scenarios: list[dict], target: Target) -> list[tuple[dict, list[str]]]:
    """(feeds, the blocks the group runs) per chosen group of a composite."""
    every = [b["name"] for b in target.blocks]
    return [(feeds, group.blocks or every) for (group, _), feeds in zip(chosen, scenarios)]


def _chosen_groups(design, analysis, groups: list[str] | None, directory: Path) -> list:
    """(group, its saved timing) for each path group `groups` names (all when None) that the analysis timed."""
    chosen = []
    for group in design.groups:
        if groups and group.name not in groups:
            continue
        try:
            timing = analysis.group(group.name)
        except KeyError:
            timing = None
        if timing is not None and timing.paths:
            chosen.append((group, timing))
    if not chosen:
        raise SoftsynError(f"{directory}: no path group to sign off" + (f" among {', '.join(groups)}" if groups else ""))
    return chosen


def _group_result(design, group, timing, measured: tuple) -> GroupResult:
    """One group's comparison: `measured` = (its measurement, its per-node profile, its GroupAnnotation)."""
    m, prof, ga = measured
    netlist = design.netlist
    netlist_nodes = [(n.name, n.op_type) for n in netlist.nodes() if _runs(netlist, group, n)]
    critical = timing.critical
    run_point = {p.name: p for p in critical.points}.get(RUN_CALL)
    rows = _cell_rows(design, group, critical, ga)
    by_op: dict[str, OpRow] = {}
    for r in rows:
        row = by_op.setdefault(r.op_type, OpRow(r.op_type, 0, 0.0, 0.0))
        row.cells += 1
        row.predicted += r.predicted
        row.measured += r.measured
    rows.sort(key=lambda r: -abs(r.delta))
    counts = {"exact": sum(1 for c in ga.cells.values() if c.match == "exact"),
              "fused-anchor": sum(1 for c in ga.cells.values() if c.match == "fused-anchor"),
              "absorbed": sum(1 for name, op in netlist_nodes if name not in ga.cells and op != "Constant"),
              "constant": sum(1 for _, op in netlist_nodes if op == "Constant"),
              "runtime-only": len(ga.runtime_only), "profiled": len(prof.nodes)}
    budget = min(p.required - p.input_delay for p in timing.paths)
    return GroupResult(
        name=group.name, description=group.scenario.description, dims=dict(group.scenario.dims),
        clock_period=timing.clock_period, input_delay=critical.input_delay, budget=budget,
        predicted=critical.arrival - critical.input_delay, measured_median=m.median, measured_quiet=m.quiet,
        measured_p10=m.p10, measured_p90=m.p90, runs=m.runs, kernel_sum=ga.kernel_sum, residual=ga.residual,
        profiler_run=prof.run_median, profiler_overhead=prof.overhead_per_node, kernel_scale=ga.kernel_scale,
        predicted_overhead=run_point.incr if run_point else 0.0, counts=counts,
        by_op=sorted(by_op.values(), key=lambda o: -abs(o.measured - o.predicted)), cells=rows,
        runtime_only=ga.runtime_only)


def _runs(netlist, group, node) -> bool:
    """Whether the group runs this cell: every cell, or in a composite the cells of the blocks the group runs."""
    return not group.blocks or netlist.block_of(node) in group.blocks


def _cell_rows(design, group, critical, ga) -> list[CellRow]:
    """Predicted vs measured per cell, the session.run residual first. Predicted: the saved analysis's critical path
    (one stream: every executed cell); any cell it lacks (or whose instance name repeats) is re-timed from the
    design's library."""
    netlist = design.netlist
    nodes = netlist.nodes()
    instances = [f"{netlist.hierarchy(n)}/{n.name}" if netlist.hierarchy(n) else n.name for n in nodes]
    unique = {name for name, count in Counter(instances).items() if count == 1}  # what a saved point can name
    saved = {p.name: p for p in critical.points}
    run_point = saved.get(RUN_CALL)
    rows = [CellRow(instance=RUN_CALL, node=RUN_CALL, op_type="Run", predicted=run_point.incr if run_point else 0.0,
                    measured=ga.residual, source=run_point.source if run_point else "est", match="residual",
                    runtime_op="session.run residual")]
    recomputed = None
    for i, (node, instance) in enumerate(zip(nodes, instances)):
        if node.op_type == "Constant" or not _runs(netlist, group, node):
            continue
        point = saved.get(instance) if instance in unique else None
        if point is None:
            if recomputed is None:
                recomputed = cell_timings(netlist, design.library, netlist.bind(group.scenario.dims))
            predicted, source = recomputed[i].delay, recomputed[i].source
        else:
            predicted, source = point.incr, point.source
        cell = ga.cells.get(node.name)
        rows.append(CellRow(instance=instance, node=node.name, op_type=node.op_type, predicted=predicted,
                            measured=cell.delay if cell else 0.0, source=source,
                            match=cell.match if cell else "absorbed", runtime_op=cell.runtime_op if cell else ""))
    return rows


def machine_state(before: float, after: float, library, device: str = "",
                  load: tuple[float, float] | None = None, neighbours: float | None = None) -> dict:
    """The machine around the measurements: the probe against the library's fastest probe
    (softsyn.characterize.probe), whether this is the device the library was characterised on (`same_device`,
    None when the library does not say), the 1-minute load average before and after with the core count, and
    `neighbours`: the share of all cores other processes used while the runs were timed (neighbours_share).

    Both decide what a sign-off's error means: a library characterised on another CPU predicts that CPU (cpu-ort:
    an AMD EPYC; qwen3-wide decode measured 2.4-2.6x its prediction on a 2-core Intel Xeon whose probe read
    2.4-2.8x), and on a CPU whose cores are all taken ORT's intra-op pool waits at every parallel kernel for a
    worker the scheduler parked (the same decode: 6.7 ms alone, 26-37 ms beside two busy processes)."""
    reference = (library.header.get("probe") or {}).get("fastest_s")
    library_device = str(library.header.get("device") or "")
    now = (before + after) / 2
    return {"probe_before_s": before, "probe_after_s": after, "reference_s": reference,
            "factor": now / float(reference) if reference else None,
            "workload": PROBE_WORKLOAD, "device": device, "library_device": library_device,
            "same_device": same_device(library_device, device) if library_device and device else None,
            "load_before": load[0] if load else None, "load_after": load[1] if load else None,
            "cores": os.cpu_count(), "neighbours": neighbours}


def cpu_seconds() -> tuple[float, float, float] | None:
    """(wall clock, CPU seconds every process used, CPU seconds this process used) now, from /proc/stat and
    os.times(); None where /proc/stat is not there."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    own = os.times()
    return time.monotonic(), (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK"), own.user + own.system


def neighbours_share(before, after) -> float | None:
    """The share of all cores (0-1) that other processes used between two cpu_seconds() samples: the 1-minute load
    average lags (it read 2.55 while both cores sat 95 % idle) and counts this process too."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    others = (after[1] - before[1]) - (after[2] - before[2])
    return min(1.0, max(0.0, others / ((after[0] - before[0]) * (os.cpu_count() or 1))))


def same_device(a: str, b: str) -> bool:
    """Whether two device descriptions (softsyn.runtime.session.describe_device: "MODEL, N cores (ISA)" or a
    GPU's "NAME, MEMORY, DRIVER") name the same processor: the model name and, on a CPU, the core count."""
    def key(text: str) -> tuple[str, str]:
        cores = re.search(r"(\d+) cores", text)
        return text.split(",")[0].strip().lower(), cores.group(1) if cores else ""

    return key(a) == key(b)


def write_results(result: SignoffResult, directory: str | Path, report_text: str) -> list[Path]:
    directory = Path(directory)
    written = [write_atomic(directory / "reports" / "signoff.rpt", report_text),
               write_atomic(directory / "signoff" / "signoff.json",
                            json.dumps(result.to_dict(), indent=1, allow_nan=False) + "\n")]
    return written + [write_html(directory, result.directory)]  # the page, with the rest read from DIR itself
