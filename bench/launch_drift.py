"""How steady is the host that launches the kernels? Samples the launch overhead and the machine-speed probe.

    python bench/launch_drift.py --provider cuda --seconds 120 --target softsyn/library/libs/h200-ort-cuda.yaml

A plain-export decoder on the H200 is host-bound (2,600-3,300 kernel launches per step), so its predicted time is
mostly ceilings.launch_overhead x kernels, a figure of the host at the time the library was measured. This bench
samples, every few seconds for --seconds, what one more node adds to a run (softsyn.characterize.ceilings' Add chain minus a
1-Add graph, sessions built once) and softsyn.characterize.probe's workload, with the load average, and prints each sample and
the spread against the library's figures: how far a prediction can move on this machine without any model change.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from softsyn.characterize.ceilings import CEILING_PLANS, overhead_runners, time_overheads
    from softsyn.errors import SoftsynError
    from softsyn.library import load_library
    from softsyn.characterize.probe import speed_probe

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--provider", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--seconds", type=float, default=120.0, help="how long to sample (default 120)")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples (default 5)")
    ap.add_argument("--target", help="library whose launch_overhead and probe the samples are set against")
    ap.add_argument("-o", "--output", help="also write the table (Markdown) here")
    args = ap.parse_args(argv)

    try:
        lib = load_library(args.target) if args.target else None
    except SoftsynError as exc:
        print(f"launch_drift: {exc}", file=sys.stderr)
        return 2
    lib_launch = lib.ceilings.launch_overhead if lib else None
    lib_probe = (lib.header.get("probe") or {}).get("fastest_s") if lib else None
    chain = CEILING_PLANS[args.provider].chain_n  # the ceilings' own chain length on this provider
    runners = overhead_runners(args.provider, chain)
    rows, start = [], time.perf_counter()
    print(f"[drift] sampling launch overhead and probe on {args.provider} for {args.seconds:.0f} s", file=sys.stderr)
    while time.perf_counter() - start < args.seconds or not rows:
        t = time.perf_counter() - start
        launch = time_overheads(runners, chain, samples=20, inner=10, warmup=3)[0]
        probe = speed_probe(args.provider)
        rows.append((t, launch, probe, os.getloadavg()[0]))
        print(f"[drift] {t:6.1f} s  launch {launch * 1e6:5.2f} us  probe {probe * 1e6:6.1f} us  "
              f"load {rows[-1][3]:.2f}", file=sys.stderr)
        time.sleep(max(0.0, args.every - (time.perf_counter() - start - t)))

    def spread(values: list[float], ref: float | None) -> str:
        lo, med, hi = min(values), statistics.median(values), max(values)
        text = f"{lo * 1e6:.2f} / {med * 1e6:.2f} / {hi * 1e6:.2f} us"
        return text + (f" (library {ref * 1e6:.2f} us: {lo / ref:.2f}x .. {hi / ref:.2f}x)" if ref else "")

    out = [f"# Launch drift, {args.provider}: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
           "", f"- command: `python bench/launch_drift.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
           f"- launch overhead min / median / max: {spread([r[1] for r in rows], lib_launch)}",
           f"- probe min / median / max: {spread([r[2] for r in rows], lib_probe)}", "",
           "| t s | launch us | probe us | load avg |", "|---:|---:|---:|---:|"]
    out += [f"| {t:.1f} | {la * 1e6:.2f} | {p * 1e6:.1f} | {ld:.2f} |" for t, la, p, ld in rows]
    text = "\n".join(out) + "\n"
    print(text)
    if args.output:
        Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
