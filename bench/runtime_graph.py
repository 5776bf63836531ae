"""What ONNX Runtime actually runs for a model on a provider, measured: the graph after its load-time
optimisers, where each node was placed, the copies it inserted, and the run's host wall time against the
device's busy time.

    python bench/runtime_graph.py --provider cuda MODEL.onnx [MODEL.onnx ...] -o bench/results/runtime-graph-DATE.md
    python bench/runtime_graph.py --provider cuda --families      # the GPT-2-small / BERT-base exports of
                                                                   # bench/family_signoff.py

Per model: the node count of the optimised graph ORT saves (optimized_model_filepath, level ALL) and its
Memcpy nodes; the profiler's node events by provider (which nodes ran on the CPU provider: shape arithmetic
ORT keeps on the host); the median host wall time of one run_with_iobinding call (inputs and outputs on the
device); and, on cuda, CUPTI's kernel and memcpy records (torch.profiler, which traces every kernel of the
process, ORT's included): kernels per run, device busy time per run (the sum of kernel durations), and
copies per run by direction. Busy time well below wall time means the run is host-bound (launches);
a host<->device copy in the middle of a run makes the host wait for the device.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from softsyn.runtime.binding import BoundRunner  # noqa: E402
from softsyn.runtime.session import open_model  # noqa: E402


def feeds_for(path: Path, seq: int) -> dict[str, np.ndarray]:
    """softsyn's seeded scenario inputs for the file (its dims bound by role): batch 1, `seq` tokens, no past."""
    from softsyn.frontends import read_design
    from softsyn.runtime.inputs import scenario_inputs

    netlist = read_design(str(path), progress=False)
    dims = {d: 1 if d == "batch" else 0 if d == "past" else seq for d in netlist.symbolic_dims()}
    return scenario_inputs(netlist, dims, seed=0)


def profile_nodes(path: Path, provider: str, feeds: dict, runs: int) -> tuple[dict, list]:
    """The ORT profiler's node events of `runs` runs: count and summed duration per provider, and the nodes
    the CPU provider ran (name, op)."""
    sess = open_model(path, provider, profile_prefix=str(Path(tempfile.gettempdir()) / f"rg-{path.stem}"))
    for _ in range(runs):
        sess.run(None, feeds)
    events = json.loads(Path(sess.end_profiling()).read_text())
    by_provider: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    cpu_nodes = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        args = e.get("args", {})
        prov = args.get("provider", "?")
        by_provider[prov][0] += 1
        by_provider[prov][1] += e["dur"] * 1e-6
        if prov == "CPUExecutionProvider":
            cpu_nodes[e["name"][:-len("_kernel_time")]] = args.get("op_name", "?")
    per_run = {p: (n / runs, s / runs) for p, (n, s) in by_provider.items()}
    return per_run, sorted(cpu_nodes.items())


def wall_time(runner, runs: int) -> tuple[float, float]:
    """(median, p10) seconds of one run_with_iobinding call of a softsyn.runtime.binding.BoundRunner."""
    for _ in range(10):
        runner.run()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        runner.run()
        times.append(time.perf_counter() - t)
    times.sort()
    return statistics.median(times), times[len(times) // 10]


def cupti(runner, runs: int) -> dict:
    """Kernels, device busy time and copies per run, from CUPTI (torch.profiler) over `runs` runs."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    runner.run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(runs):
            runner.run()
        torch.cuda.synchronize()
    trace = Path(tempfile.gettempdir()) / "rg-cupti.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text()).get("traceEvents", [])
    kernels = [e for e in events if e.get("cat") == "kernel"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    directions = collections.Counter(str(e.get("args", {}).get("kind", e.get("name", "?"))) for e in copies)
    top = collections.Counter()
    for e in kernels:
        top[e["name"][:60]] += e["dur"]
    return {"kernels_per_run": len(kernels) / runs, "busy_s": sum(e["dur"] for e in kernels) * 1e-6 / runs,
            "copies_per_run": {k: v / runs for k, v in directions.items()},
            "copy_s": sum(e["dur"] for e in copies) * 1e-6 / runs,
            "top_kernels_us_per_run": {k: v / runs for k, v in top.most_common(8)}}


def optimised_graph(path: Path, providers: list[str], out_dir: Path) -> tuple[int, collections.Counter]:
    """Nodes of the graph ORT runs (level ALL, partitioned, Memcpy nodes inserted), saved without weights.
    Its own SessionOptions: the external-initializer config entries are not SessionSettings fields."""
    so = ort.SessionOptions()
    target = out_dir / f"{path.stem}.ort-optimized.onnx"
    so.optimized_model_filepath = str(target)
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", f"{path.stem}.opt.data")
    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    ort.InferenceSession(str(path), so, providers=providers)
    graph = onnx.load(str(target), load_external_data=False).graph
    (out_dir / f"{path.stem}.opt.data").unlink(missing_ok=True)
    return len(graph.node), collections.Counter(n.op_type for n in graph.node)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", type=Path)
    ap.add_argument("--families", action="store_true", help="export and measure bench/family_signoff.py's models")
    ap.add_argument("--provider", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--keep", type=Path, help="folder for the optimised graphs (no weights)")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    models = list(args.models)
    if args.families:
        sys.path.insert(0, str(ROOT / "bench"))
        import family_signoff

        work = Path(tempfile.gettempdir()) / "softsyn-families"
        work.mkdir(parents=True, exist_ok=True)
        models += [family_signoff.export(name, work) for name in family_signoff.FAMILIES]
    providers = (["CUDAExecutionProvider", "CPUExecutionProvider"] if args.provider == "cuda"
                 else ["CPUExecutionProvider"])
    keep = args.keep or Path(tempfile.mkdtemp())
    keep.mkdir(parents=True, exist_ok=True)
    lines = [f"# What ONNX Runtime runs ({args.provider}), {datetime.date.today()}", "",
             f"Command: `python bench/runtime_graph.py {' '.join(sys.argv[1:])}`",
             f"onnxruntime {ort.__version__}, batch 1, {args.seq} tokens, {args.runs} timed runs", ""]
    for path in models:
        model = onnx.load(str(path), load_external_data=False)
        feeds = feeds_for(path, args.seq)
        n_opt, ops = optimised_graph(path, providers, keep)
        per_provider, cpu_nodes = profile_nodes(path, args.provider, feeds, 10)
        runner = BoundRunner.from_feeds(open_model(path, args.provider), feeds, args.provider)
        median, p10 = wall_time(runner, args.runs)
        lines += [f"## {path.stem}", "",
                  f"- netlist nodes {len(model.graph.node)}; ORT's optimised graph {n_opt} nodes "
                  f"(Memcpy: {ops.get('MemcpyToHost', 0)} to host, {ops.get('MemcpyFromHost', 0)} from host)",
                  f"- optimised ops: {dict(ops.most_common())}",
                  "- profiler node events per run: " + ", ".join(f"{p} {n:.0f} nodes {s * 1e3:.3f} ms host"
                                                                for p, (n, s) in sorted(per_provider.items())),
                  f"- run_with_iobinding wall: median {median * 1e3:.3f} ms, p10 {p10 * 1e3:.3f} ms"]
        if args.provider == "cuda":
            c = cupti(runner, 20)
            lines += [f"- CUPTI per run: {c['kernels_per_run']:.0f} kernels, device busy {c['busy_s'] * 1e3:.3f} ms, "
                      f"copies {c['copies_per_run']} ({c['copy_s'] * 1e6:.1f} us)",
                      f"- busy / wall: {c['busy_s'] / median:.2f}",
                      "- top kernels (us per run): " + "; ".join(f"{k} {v:.1f}" for k, v in
                                                                 c["top_kernels_us_per_run"].items())]
        shown = ", ".join(f"{n} ({op})" for n, op in cpu_nodes[:40]) + (f" ... ({len(cpu_nodes)} in all)" if len(cpu_nodes) > 40 else "")
        lines += [f"- nodes on the CPU provider: {shown or 'none'}", ""]
        print("\n".join(lines[-8:]), flush=True)
    text = "\n".join(lines) + "\n"
    if args.output:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
