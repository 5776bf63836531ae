"""Measuring a model on the real runtime: warm IO-bound runs and per-node profiles.

What the measured interval covers (`measure`): one `run_with_iobinding` call, wall clock on the
host (time.perf_counter before and after). The inputs are bound once before timing (on the device
for CUDA: `OrtValue.ortvalue_from_numpy(x, "cuda", 0)`), the outputs are bound by name to the same
device and allocated by ONNX Runtime inside the call (softsyn.runtime.binding.BoundRunner.from_feeds);
the call returns after the execution provider synchronised (ORT synchronises the CUDA stream at the
end of a run), so the interval is host dispatch + every kernel + the final synchronisation. No
copies to or from the host, no tokenisation or sampling: the constraints' input and output delays
stand for those, so compare measured against the predicted arrival minus the input delay. This is the method of
`shared/reference/h200.md` (wall clock around run_with_iobinding, inputs and outputs on the GPU).

Per-node times (`profile`) come from ONNX Runtime's own profiler (SessionOptions.enable_profiling)
in a separate session, so profiling never inflates the measured medians: JSON trace events with
cat "Node" and name "<node>_kernel_time" (args.op_name, dur in µs) per run, runs delimited by the
cat "Session" "model_run" events. On the CPU provider a kernel time is the kernel's wall time. On
CUDA the kernels are asynchronous, so a node's kernel_time is its host-side launch time unless the
profile is taken with CUDA_LAUNCH_BLOCKING=1 (`profile(..., blocking=True)` runs it in a
subprocess that sets it), which makes each node's time include its GPU execution.
"""
from __future__ import annotations

import bisect
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from softsyn.errors import SoftsynError
from softsyn.netlist import Netlist
from softsyn.runtime.binding import BoundRunner
from softsyn.runtime.session import IR_VERSION, open_model



@dataclass
class Measurement:
    median: float  # s
    p90: float
    runs: int
    provider: str
    p10: float = 0.0
    samples: list[float] = field(default_factory=list)
    round_medians: list[float] = field(default_factory=list)  # one per interleaved round (measure_many)

    @property
    def quiet(self) -> float:
        """The fastest round's median: the run time of a machine not disturbed by neighbours, which is what a
        library characterised as the fastest of its passes predicts (a shared VM drifts 30 % within a minute:
        a 256^3 numpy matmul took 189 us, then 142 us, 5 s apart)."""
        return min(self.round_medians) if self.round_medians else self.median

    @property
    def summary(self) -> str:
        return f"median {self.median * 1e3:.3f} ms, p90 {self.p90 * 1e3:.3f} ms over {self.runs} runs ({self.provider})"


@dataclass
class NodeProfile:
    """One node of the runtime's (optimised) graph: its median kernel time over the profiled runs."""

    name: str
    op_type: str
    provider: str
    median: float  # s, kernel time less the calibrated profiler overhead per kernel (floored at 0)
    runs: int  # runs the node appeared in
    raw: float = 0.0  # s, interquartile mean of the profiler's kernel_time durations, as recorded


@dataclass
class Profile:
    """Per-node kernel times of the graph the runtime actually executed."""

    nodes: dict[str, NodeProfile]  # by runtime node name, in first-execution order
    run_median: float  # median of the profiler's own "model_run" durations, s
    kernel_sum_median: float  # median over runs of the sum of the node times, s
    runs: int
    provider: str
    node_time: str  # "kernel" (CPU, or CUDA with CUDA_LAUNCH_BLOCKING) | "host-launch" (async CUDA)
    trace: str = ""  # path of the JSON trace (kept only when asked)
    overhead_per_node: float = 0.0  # s, the profiler's own cost per kernel_time event, subtracted from each node

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Profile":
        data = dict(data)
        data["nodes"] = {k: NodeProfile(**v) for k, v in data["nodes"].items()}
        return cls(**data)


def onnx_path(netlist: Netlist) -> Path:
    """The ONNX file behind a netlist (its export cache entry or the file it was read from)."""
    cached = netlist.provenance.get("cache", {}).get("path")
    candidates = [Path(cached) / "model.onnx"] if cached else []
    candidates += [Path(netlist.provenance.get(k, "")) for k in ("file", "source")]
    for path in candidates:
        if path.suffix == ".onnx" and path.is_file():
            return path
    raise SoftsynError(f"{netlist.name}: no ONNX file on disk to run (provenance: {netlist.provenance.get('source')})")


def measure(model_path: Path, feeds: dict[str, np.ndarray], runs: int = 20, warmup: int = 3,
            provider: str = "cpu", options: dict | None = None) -> Measurement:
    """Median, p10 and p90 of `runs` warm run_with_iobinding calls (see softsyn.results.signoff.MEASURED_INTERVAL)."""
    return measure_many(model_path, [feeds], runs, warmup, provider, options)[0]


SETTLED = 1.05  # warm-up: a block of calls no more than this much faster than the block before it has settled
WARM_CAP = 10  # warm-up: at most this many blocks of `warmup` calls per turn


def warm_up(runner: BoundRunner, warmup: int) -> int:
    """Untimed calls until the scenario's run time stops falling: blocks of `warmup` calls until a block's median is
    within SETTLED of the block before it (WARM_CAP blocks at most); returns the calls made. A fixed count left
    timed calls in the recovery tail after another scenario's run: qwen3-moe-tiny decode128 after a batch-4 prefill
    on 2 CPU cores read 515, 323, 263, 214, 205, 188, 176, 168, 164, 160 us over its first ten calls, 149 us by the
    twentieth, 142 us from then on; with 5 warm-up calls its timed ones read 168-182 us against 132-141 us alone."""
    block, previous, calls = max(warmup, 1), math.inf, 0
    for _ in range(WARM_CAP):
        median = statistics.median(_timed_calls(runner, block))
        calls += block
        if median * SETTLED >= previous:
            break
        previous = median
    return calls


def _timed_calls(runner: BoundRunner, n: int) -> list[float]:
    """Wall-clock seconds of `n` calls, one by one."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        runner.run()
        times.append(time.perf_counter() - start)
    return times


def measure_many(model_path: Path, scenarios: list[dict[str, np.ndarray]], runs: int = 20, warmup: int = 3,
                 provider: str = "cpu", options: dict | None = None, rounds: int = 10,
                 cuda_graphs: list[bool] | None = None, aliases: dict[str, str] | None = None) -> list[Measurement]:
    """measure() for several scenarios on ONE session (a big model loads once), interleaved: `rounds` rounds,
    each timing runs/rounds calls of every scenario in turn, so a drift of the machine (clocks, a neighbour's
    load) lands on every scenario alike instead of on whichever was timed last. Each scenario's turn starts
    with untimed calls until its run time has settled (warm_up): the first calls after another scenario's run
    find cold caches and a reshaped memory arena (on 2 CPU cores, qwen3-tiny decode after a batch-4 prefill: p90
    2x the median without them).
    `cuda_graphs[i]` (provider cuda): scenario i runs as a captured CUDA graph (enable_cuda_graph=1), in a session
    of its own, since a graph replays one set of shapes and addresses; its first warm-up call captures it.
    `aliases` {output: input}: outputs bound to their input's buffer (BoundRunner.from_feeds)."""
    runners = bound_runners(model_path, scenarios, provider, options, cuda_graphs, aliases)
    return measure_runners(runners, runs, warmup, rounds)


def bound_runners(model_path: Path, scenarios: list[dict[str, np.ndarray]], provider: str = "cpu",
                  options: dict | None = None, cuda_graphs: list[bool] | None = None,
                  aliases: dict[str, str] | None = None) -> list[BoundRunner]:
    """One runner per scenario as measure_many times them: one session for the eager scenarios, a session of its own
    (enable_cuda_graph=1) for each captured one."""
    graphed = [bool(g) and provider == "cuda" for g in (cuda_graphs or [False] * len(scenarios))]
    sess = open_model(model_path, provider, options) if not all(graphed) else None
    return [BoundRunner.from_feeds(open_model(model_path, provider, options, cuda_graph=True) if g else sess,
                                   feeds, provider, aliases) for feeds, g in zip(scenarios, graphed)]


def measure_runners(runners: list[BoundRunner], runs: int = 20, warmup: int = 3, rounds: int = 10,
                    order=None) -> list[Measurement]:
    """The interleaved timing loop of measure_many on runners already bound (any sessions, any models): `rounds`
    rounds, each warming up and timing runs/rounds calls of every runner in turn. `order(r)`: the runners' indices
    in round r (default: as given; an A/B comparison alternates the pair's order, so neither always runs second)."""
    rounds = max(1, min(rounds, runs))
    times: list[list[float]] = [[] for _ in runners]
    by_round: list[list[float]] = [[] for _ in runners]
    for r in range(rounds):
        per_round = runs // rounds + (1 if r < runs % rounds else 0)
        for i in (order(r) if order else range(len(runners))):
            warm_up(runners[i], warmup)
            this_round = _timed_calls(runners[i], per_round)
            times[i] += this_round
            by_round[i].append(statistics.median(this_round))
    out = []
    for runner, samples, medians in zip(runners, times, by_round):
        ordered = sorted(samples)
        out.append(Measurement(statistics.median(ordered), _quantile(ordered, 0.9), len(samples),
                               runner.session.get_providers()[0], p10=_quantile(ordered, 0.1), samples=samples,
                               round_medians=medians))
    return out


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def parse_profile(events: list[dict], warmup: int = 0, provider: str = "CPUExecutionProvider",
                  node_time: str = "kernel", runs_slice: tuple[int, int] | None = None) -> Profile:
    """Per-node median kernel times from an ONNX Runtime profiler trace (list of trace events).

    Runs are the cat "Session" "model_run" events; a node event belongs to the run whose interval
    contains its start. `runs_slice` (start, stop) keeps those runs only (one scenario of a trace that
    profiled several in turn); then the first `warmup` of them are dropped. Without model_run events
    (a trace cut short) every node event counts as one sample.
    """
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    if runs_slice is not None:
        runs = runs[runs_slice[0]:runs_slice[1]]
    runs = runs[warmup:]
    per_node: dict[str, list[float]] = {}
    info: dict[str, tuple[str, str]] = {}
    per_run_sum = [0.0] * len(runs)
    starts = [r["ts"] for r in runs]
    for e in sorted((e for e in events if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")),
                    key=lambda e: e["ts"]):
        if runs:
            idx = _run_index(starts, runs, e["ts"])
            if idx is None:
                continue
            per_run_sum[idx] += e["dur"] * 1e-6
        elif runs_slice is not None:
            continue
        name = e["name"][: -len("_kernel_time")]
        args = e.get("args", {})
        per_node.setdefault(name, []).append(e["dur"] * 1e-6)
        info.setdefault(name, (args.get("op_name", ""), args.get("provider", "")))
    nodes = {name: NodeProfile(name, info[name][0], info[name][1], _iqm(d), len(d), _iqm(d))
             for name, d in per_node.items()}
    run_median = statistics.median(r["dur"] * 1e-6 for r in runs) if runs else 0.0
    kernel_sum = statistics.median(per_run_sum) if runs else sum(n.median for n in nodes.values())
    return Profile(nodes, run_median, kernel_sum, len(runs), provider, node_time)


def _iqm(values: list[float]) -> float:
    """Interquartile mean: robust like the median, but resolves below the trace's 1 µs tick."""
    ordered = sorted(values)
    n = len(ordered)
    middle = ordered[n // 4: n - n // 4] or ordered
    return sum(middle) / len(middle)


def calibrate_profiler(provider: str = "cpu", nodes: int = 200, runs: int = 100) -> float:
    """The profiler's own cost per kernel, s: a chain of `nodes` Adds on a [1, 8] tensor, profiled kernel time
    (interquartile mean) minus its true per-node time (unprofiled: (T(chain) - T(one Add)) / (nodes - 1))."""
    key = (provider, nodes)
    if key in _CALIBRATION:
        return _CALIBRATION[key]

    def chain(n: int) -> bytes:
        one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
        names = ["x"] + [f"t{i}" for i in range(n - 1)] + ["y"]
        body = [helper.make_node("Add", [names[i], "one"], [names[i + 1]], name=f"add_{i}") for i in range(n)]
        graph = helper.make_graph(body, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [one])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION).SerializeToString()

    feeds = {"x": np.zeros((1, 8), np.float32)}
    options = {"graph_optimization_level": "ORT_DISABLE_ALL"}
    with tempfile.TemporaryDirectory(prefix="softsyn-cal-") as tmp:
        paths = []
        for n in (1, nodes):
            path = Path(tmp) / f"chain{n}.onnx"
            path.write_bytes(chain(n))
            paths.append(path)
        short = measure(paths[0], feeds, runs=runs, warmup=5, provider=provider, options=options).median
        long = measure(paths[1], feeds, runs=runs, warmup=5, provider=provider, options=options).median
        true_per_node = max(0.0, (long - short) / (nodes - 1))
        prof = profile(paths[1], feeds, runs=max(5, runs // 10), warmup=2, provider=provider, options=options,
                       calibrate=False)
    recorded = statistics.median(n.raw for n in prof.nodes.values())
    _CALIBRATION[key] = max(0.0, recorded - true_per_node)
    return _CALIBRATION[key]


_CALIBRATION: dict = {}


def _run_index(starts: list[float], runs: list[dict], ts: float) -> int | None:
    i = bisect.bisect_right(starts, ts) - 1
    if i < 0 or ts > runs[i]["ts"] + runs[i]["dur"]:
        return None
    return i


def profile(model_path: Path, feeds: dict[str, np.ndarray], runs: int = 10, warmup: int = 2,
            provider: str = "cpu", options: dict | None = None, keep_trace: str | Path | None = None,
            blocking: bool = False, calibrate: bool = True) -> Profile:
    """Profile `runs` warm runs per node (a separate profiling session; see the module docstring).

    The profiler costs a few µs per kernel_time event on the CPU (more than a small kernel takes), so
    with `calibrate` each node's time is its recorded time less `calibrate_profiler()`'s figure
    (floored at 0); `NodeProfile.raw` keeps the recorded one.
    blocking=True (CUDA): run in a subprocess with CUDA_LAUNCH_BLOCKING=1 so node times include the GPU work.
    """
    return profile_many(model_path, [feeds], runs=runs, warmup=warmup, provider=provider, options=options,
                        keep_trace=keep_trace, blocking=blocking, calibrate=calibrate)[0]


def profile_many(model_path: Path, scenarios: list[dict[str, np.ndarray]], runs: int = 10, warmup: int = 2,
                 provider: str = "cpu", options: dict | None = None, keep_trace: str | Path | None = None,
                 blocking: bool = False, calibrate: bool = True, aliases: dict[str, str] | None = None) -> list[Profile]:
    """profile() for several scenarios on one profiling session: warmup + runs of each in turn, one trace."""
    if blocking and provider == "cuda":
        return _profile_subprocess(model_path, scenarios, runs=runs, warmup=warmup, provider=provider, options=options,
                                   keep_trace=keep_trace, aliases=aliases)
    with tempfile.TemporaryDirectory(prefix="softsyn-prof-") as tmp:
        sess = open_model(model_path, provider, options, profile_prefix=str(Path(tmp) / "ort"))
        for feeds in scenarios:
            runner = BoundRunner.from_feeds(sess, feeds, provider, aliases)
            for _ in range(warmup + runs):
                runner.run()
        trace = sess.end_profiling()
        events = json.loads(Path(trace).read_text())
        if keep_trace:
            Path(keep_trace).parent.mkdir(parents=True, exist_ok=True)
            Path(keep_trace).write_text(json.dumps(events))
    cuda = provider == "cuda"
    node_time = "kernel" if not cuda or os.environ.get("CUDA_LAUNCH_BLOCKING") == "1" else "host-launch"
    per = warmup + runs
    results = []
    overhead = calibrate_profiler(provider) if calibrate else 0.0
    for i in range(len(scenarios)):
        result = parse_profile(events, warmup=warmup, provider=sess.get_providers()[0], node_time=node_time,
                               runs_slice=(i * per, (i + 1) * per))
        result.trace = str(keep_trace or "")
        if calibrate:
            result.overhead_per_node = overhead
            for node in result.nodes.values():
                node.median = max(0.0, node.raw - overhead)
        results.append(result)
    return results


def _profile_subprocess(model_path, scenarios, *, runs, warmup, provider, options, keep_trace,
                        aliases) -> list[Profile]:
    with tempfile.TemporaryDirectory(prefix="softsyn-prof-") as tmp:
        for i, feeds in enumerate(scenarios):
            np.savez(Path(tmp) / f"feeds{i}.npz", **feeds)
        job = {"model": str(model_path), "scenarios": len(scenarios), "runs": runs, "warmup": warmup,
               "provider": provider, "options": options or {}, "keep_trace": str(keep_trace or ""),
               "out": str(Path(tmp) / "profile.json"), "aliases": aliases or {}}
        (Path(tmp) / "job.json").write_text(json.dumps(job))
        env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
        proc = subprocess.run([sys.executable, "-m", "softsyn.runtime.measure", str(Path(tmp) / "job.json")], env=env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SoftsynError(f"profiling {model_path} with CUDA_LAUNCH_BLOCKING=1 failed: "
                               f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
        return [Profile.from_dict(d) for d in json.loads((Path(tmp) / "profile.json").read_text())]


def _main(job_file: str) -> None:
    job = json.loads(Path(job_file).read_text())
    scenarios = []
    for i in range(job["scenarios"]):
        with np.load(Path(job_file).parent / f"feeds{i}.npz") as data:
            scenarios.append({k: data[k] for k in data.files})
    results = profile_many(Path(job["model"]), scenarios, runs=job["runs"], warmup=job["warmup"],
                           provider=job["provider"], options=job["options"], keep_trace=job["keep_trace"] or None,
                           aliases=job.get("aliases") or None)
    Path(job["out"]).write_text(json.dumps([r.to_dict() for r in results]))


if __name__ == "__main__":
    _main(sys.argv[1])
