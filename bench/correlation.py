"""Correlation: analyze + signoff over the zoo; predicted vs measured per model and path group.

    python bench/correlation.py                       # CPU: tiny zoo + MiniLM, ORT CPU provider
    python bench/correlation.py --provider cuda       # GPU: qwen3-0.6b/1.7b/8b fp16, ORT CUDA provider
    python bench/correlation.py --models qwen3-tiny --runs 50

For each model: writes constraints with one path group per scenario (clocks left loose: this
measures correlation, not closure), runs the analysis (`softsyn analyze -o`), then `softsyn
signoff` on it, and prints predicted (arrival - input delay), measured (median of RUNS warm
run_with_iobinding calls, inputs and outputs bound on the device; h200.md's method), p90 and
error = (predicted - measured) / measured, then the median and worst |error| per model and
overall. Results go to bench/results/correlation-<provider>-<date>.md (with the command,
versions and device); each model's analyze/signoff directory stays under --work.

GPU: the real-size zoo models are exported with seeded random fp16 weights (read_design(...,
materialize=True)); that needs RAM for the weights (16 GB for the 8B) and the export takes minutes.
The target library there is h200-ort-cuda. Per-node profiles on CUDA run with CUDA_LAUNCH_BLOCKING=1.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DECODER_CPU = {
    "prefill16": {"kind": "prefill", "dims": {"batch": 1, "seq": 16, "past": 0}},
    "prefill128": {"kind": "prefill", "dims": {"batch": 1, "seq": 128, "past": 0}},
    "prefill128b4": {"kind": "prefill", "dims": {"batch": 4, "seq": 128, "past": 0}},
    "decode128": {"kind": "decode", "dims": {"batch": 1, "seq": 1, "past": 128}},
    "decode512": {"kind": "decode", "dims": {"batch": 1, "seq": 1, "past": 512}},
    "decode512b4": {"kind": "decode", "dims": {"batch": 4, "seq": 1, "past": 512}},
}
ENCODER_CPU = {
    "enc16": {"kind": "encoder", "dims": {"batch": 1, "seq": 16}},
    "enc128": {"kind": "encoder", "dims": {"batch": 1, "seq": 128}},
    "enc128b4": {"kind": "encoder", "dims": {"batch": 4, "seq": 128}},
}
DECODER_GPU = {
    "prefill512": {"kind": "prefill", "dims": {"batch": 1, "seq": 512, "past": 0}},
    "decode512": {"kind": "decode", "dims": {"batch": 1, "seq": 1, "past": 512}},
    "decode4096": {"kind": "decode", "dims": {"batch": 1, "seq": 1, "past": 4096}},
}
PLANS = {
    "cpu": {"target": "cpu-ort", "models": {"qwen3-tiny": DECODER_CPU, "llama-tiny": DECODER_CPU,
                                            "qwen3-moe-tiny": DECODER_CPU, "minilm": ENCODER_CPU}},
    "cuda": {"target": "h200-ort-cuda", "models": {"qwen3-0.6b": DECODER_GPU, "qwen3-1.7b": DECODER_GPU,
                                                   "qwen3-8b": DECODER_GPU}},
}


def constraints_yaml(target: str, groups: dict) -> str:
    lines = [f"target: {target}", "input_delay: 1ms", "output_delay: 0ms", "path_groups:"]
    for name, g in groups.items():
        dims = ", ".join(f"{k}: {v}" for k, v in g["dims"].items())
        lines += [f"  {name}:", f"    kind: {g['kind']}", "    clock_period: 100s", f"    dims: {{{dims}}}"]
    return "\n".join(lines) + "\n"


def analyze_dir(spec: str, constraints: Path, out: Path, materialize: bool) -> None:
    """What `softsyn analyze SPEC -c CONSTRAINTS -o OUT [--materialize]` writes."""
    from softsyn.design import Design
    from reports import write_reports
    from reports.common import write_atomic
    from softsyn.flow.signoff import DESIGN_FILE, design_record

    design = Design.load(spec, constraints, progress=True, materialize=materialize)
    analysis = design.analyze()
    write_reports(analysis, out)
    record = design_record(spec, str(constraints), None, None, {}, None, design.netlist, design.library.name,
                           materialize)
    write_atomic(out / DESIGN_FILE, json.dumps(record, indent=1) + "\n")


def _versions() -> str:
    out = []
    for pkg in ("softsyn", "onnxruntime-gpu", "onnxruntime", "torch", "transformers", "onnx", "onnxscript"):
        try:
            out.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            pass
    return ", ".join(out)


# a measurement stands when the machine-speed probe before and after it read within this factor of the library's
# fastest probe: the VM's slow phases (ORT's two-thread work 1.4-1.7x slower for minutes) otherwise decide the error
SPEED_BAND = 1.25


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--provider", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--models", nargs="*", help="subset of the plan's models")
    parser.add_argument("--target", help="library name or YAML path (default: the plan's, cpu-ort / h200-ort-cuda)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--settle", type=float, default=180.0,
                        help="seconds to wait before each model for the machine to run at the library's probe speed")
    parser.add_argument("--retries", type=int,
                        help=f"measure a model again when the probe before or after it read slower than {SPEED_BAND}x "
                             "the library's (the attempt nearest the library's speed is kept); default 2 on the CPU, "
                             "0 on CUDA (a real-size sign-off takes minutes)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "softsyn-correlation",
                        help="analyze/signoff directories (default $TMPDIR/softsyn-correlation)")
    parser.add_argument("-o", "--output", type=Path, help="results file (default bench/results/correlation-PROVIDER-DATE.md)")
    args = parser.parse_args()

    if args.retries is None:
        args.retries = 2 if args.provider == "cpu" else 0
    from softsyn.errors import SoftsynError
    from softsyn.runtime.session import device_name
    from reports import report_signoff
    from softsyn.flow.signoff import signoff, write_results

    plan = dict(PLANS[args.provider])
    if args.target:
        plan["target"] = str(Path(args.target).resolve()) if Path(args.target).exists() else args.target
    models = args.models or list(plan["models"])
    started = datetime.datetime.now().astimezone()
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    from softsyn.library import load_library
    from softsyn.characterize.probe import SETTLE_NEAR, settle
    try:
        reference = (load_library(plan["target"]).header.get("probe") or {}).get("fastest_s")
    except SoftsynError as exc:
        print(f"correlation: {exc}", file=sys.stderr)
        return 2
    rows, failures, settles = [], [], []
    for model in models:
        groups = plan["models"].get(model) or (DECODER_GPU if args.provider == "cuda" else DECODER_CPU)
        out = args.work / f"{model}-{args.provider}"
        out.mkdir(parents=True, exist_ok=True)
        cons = out / "constraints.yaml"
        cons.write_text(constraints_yaml(plan["target"], groups))
        t0 = time.perf_counter()
        try:
            analyze_dir(f"zoo:{model}", cons, out, materialize=args.provider == "cuda")
            attempts = []  # (slowest probe / library's, result): the first within SPEED_BAND stands
            for _ in range(1 + args.retries):
                readings, waited, ok = settle(args.provider, timeout=args.settle, reference=reference)
                print(f"[bench] machine before {model}: probe {readings[-1] * 1e6:.0f} us"
                      + (f" (library {reference * 1e6:.0f} us)" if reference else "") + f" after {waited:.0f} s"
                      + ("" if ok else ": did not settle at the library's speed, measuring anyway"), file=sys.stderr)
                result = signoff(out, provider=args.provider, runs=args.runs, warmup=args.warmup)
                m = result.machine
                slowest = max(m["probe_before_s"], m["probe_after_s"]) / reference if reference else 1.0
                attempts.append((slowest, result))
                if slowest <= SPEED_BAND:
                    break
                print(f"[bench] {model}: the machine slowed to {slowest:.2f}x the library's probe while measuring: "
                      "measuring again", file=sys.stderr)
            slowest, result = min(attempts, key=lambda a: a[0])
        except SoftsynError as exc:
            print(f"{model}: {exc}", file=sys.stderr)
            failures.append((model, str(exc)))
            continue
        settles.append(f"{model}: {len(attempts)} attempt(s) (slowest probe " + ", ".join(
            f"{a:.2f}x" for a, _ in attempts) + f"; kept {slowest:.2f}x)")
        write_results(result, out, report_signoff(result))
        for g in result.groups:
            rows.append({"model": model, "group": g.name, "dims": g.dims, "predicted": g.predicted,
                         "measured": g.measured_median, "p90": g.measured_p90, "error": g.error,
                         "quiet": g.measured_quiet, "error_quiet": g.error_quiet,
                         "machine": result.machine.get("factor"),
                         "kernels": g.kernel_sum, "residual": g.residual, "scale": g.kernel_scale})
        print(f"[bench] {model}: {len(result.groups)} groups in {time.perf_counter() - t0:.0f} s", file=sys.stderr)

    lines = table(rows, derate=args.provider == "cpu")
    device = device_name(args.provider)
    head = [f"# Correlation, {args.provider}: softsyn analyze (library {plan['target']}) vs signoff", "",
            f"- date: {started.isoformat(timespec='seconds')}",
            f"- command: `{command}`",
            f"- device: {device}; provider {'CUDAExecutionProvider' if args.provider == 'cuda' else 'CPUExecutionProvider'}",
            f"- versions: {_versions()}; Python {platform.python_version()}",
            f"- runs: {args.runs} per group after {args.warmup} warm-up, one session per model, groups interleaved in "
            "10 rounds (each round's turn starts with untimed runs until the group's run time settles: blocks of the "
            "warm-up count until one is within 5 % of the block before, softsyn.runtime.measure.warm_up); profile 10 runs per group",
            "- quiet: the fastest round's median, the undisturbed machine that the library (each cell the fastest of its "
            "passes) describes; error q = (predicted - quiet) / quiet",
            "- machine: softsyn.characterize.probe's workload timed before and after each model's measurements over the library's "
            "fastest probe (> 1: the machine ran slower than when the tables were measured); error q derated = "
            "(predicted x machine - quiet) / quiet" + ("" if args.provider == "cpu" else
            "; not on a GPU: the probe's host work does not scale a GPU run (2026-11-30, H200: 1.7-1.87x while the quiet "
            "errors were -0.8 % to -12.8 %)"),
            "- predicted: arrival at the worst endpoint minus the input delay (session.run overhead + every cell)",
            "- measured: one run_with_iobinding call, inputs/outputs bound on the device, wall clock, median",
            "- error: (predicted - measured) / measured; negative = the analysis is optimistic",
            "- kernels / residual: the signoff's split of the measured run (profiled kernel times less the calibrated "
            "profiler cost; residual = host overhead, gaps, runtime-only nodes)"]
    if load is not None:
        head.append(f"- load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores"
                    + (" (shared machine: timings are noisy)" if load[0] > 0.5 else ""))
    head.append(f"- machine state: before each attempt the probe must read steady and within {SETTLE_NEAR}x the library's fastest "
                f"{reference * 1e6 if reference else float('nan'):.0f} us (softsyn.characterize.probe.settle, at most {args.settle:.0f} s); "
                f"a model whose probe before or after its measurement read slower than {SPEED_BAND}x is measured again "
                f"(at most {args.retries} times; the attempt nearest the library's speed is kept): " + "; ".join(settles))
    text = "\n".join(head + [""] + lines)
    if failures:
        text += "\n\nFailed:\n" + "\n".join(f"- {m}: {e}" for m, e in failures)
    print(text)
    output = args.output or ROOT / "bench" / "results" / f"correlation-{args.provider}-{started.date()}.md"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text + "\n")
    print(f"[bench] wrote {output}", file=sys.stderr)
    return 1 if failures else 0


def table(rows: list[dict], derate: bool = True) -> list[str]:
    """Per group, then per model: errors against the median run, the quiet round, and the quiet round with the
    prediction derated by the machine factor (softsyn.characterize.probe: how much slower than at characterisation the
    machine ran while measuring; shown only when the library records a probe, and with `derate`: on the H200 the
    probe read 1.7-1.87x while the quiet errors were -0.8 % to -12.8 %, so it derates nothing there)."""
    for r in rows:
        m = r.get("machine") if derate else None
        r["error_derated"] = (r["predicted"] * m - r["quiet"]) / r["quiet"] if m else None
    derated = any(r["error_derated"] is not None for r in rows)
    lines = ["| model | group | scenario | predicted ms | measured ms | p90 ms | quiet ms | machine | error | error q "
             + ("| error q derated " if derated else "") + "| kernels ms | residual ms |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if derated else "") + "---:|---:|"]
    for r in rows:
        dims = ", ".join(f"{k} {v}" for k, v in r["dims"].items())
        machine = f"{r['machine']:.2f}x" if r.get("machine") else "n/a"
        lines.append(f"| {r['model']} | {r['group']} | {dims} | {r['predicted'] * 1e3:.3f} | {r['measured'] * 1e3:.3f} "
                     f"| {r['p90'] * 1e3:.3f} | {r['quiet'] * 1e3:.3f} | {machine} | {r['error'] * 100:+.1f}% | "
                     f"{r['error_quiet'] * 100:+.1f}% | "
                     + (f"{r['error_derated'] * 100:+.1f}% | " if derated and r["error_derated"] is not None
                        else "n/a | " if derated else "")
                     + f"{r['kernels'] * 1e3:.3f} | {r['residual'] * 1e3:.3f}{' (scaled)' if r['scale'] < 1 else ''} |")
    keys = [("error", "median run"), ("error_quiet", "quiet")] + ([("error_derated", "quiet, derated")] if derated else [])
    lines += ["", "| model | groups | " + " | ".join(f"median abs error ({n}) | worst ({n})" for _, n in keys) + " |",
              "|---|---:|" + "---:|---|" * len(keys)]
    by_model: dict[str, list[dict]] = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(r)
    for model, rs in list(by_model.items()) + ([("all", rows)] if rows else []):
        cells = []
        for key, _ in keys:
            have = [r for r in rs if r.get(key) is not None]
            if not have:
                cells += ["n/a", "n/a"]
                continue
            worst = max(have, key=lambda r: abs(r[key]))
            cells += [f"{statistics.median(abs(r[key]) for r in have) * 100:.1f}%",
                      f"{worst[key] * 100:+.1f}% ({worst['model'] + ' ' if model == 'all' else ''}{worst['group']})"]
        lines.append(f"| {model} | {len(rs)} | " + " | ".join(cells) + " |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
