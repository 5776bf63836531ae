"""How long the compile loop takes on a real-size plan, excluding the export (cached).

    python bench/loop_speed.py [MODEL] [-c constraints.yaml] [--effort ultra]

Loads MODEL weightless (the export cached under $SOFTSYN_CACHE: run it once first, or the load includes it),
then times `compile_design` (flatten, fuse, precision, kv_layout, optimize, emit of the plan) and prints the
seconds, the compile log and the optimize pass's counts. Default: zoo:qwen3-8b, constraints/chat-h200-int4.yaml,
ultra: the issue's bound is 60 s on a 2-core machine.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="zoo:qwen3-8b")
    parser.add_argument("-c", "--constraints", default=str(ROOT / "constraints" / "chat-h200-int4.yaml"))
    parser.add_argument("--effort", default="ultra")
    args = parser.parse_args()

    from softsyn.design import Design
    from softsyn.flow.compile import compile_design
    from softsyn.flow.verify import reference_record

    start = time.perf_counter()
    design = Design.load(args.model, args.constraints, progress=False)
    loaded = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        analysis, path = compile_design(design, args.effort, Path(tmp) / "out",
                                        reference_record(args.model, design.netlist), plan=True)
        elapsed = time.perf_counter() - start
        print((path / "compile.log").read_text())
        rpt = path / "reports" / "precision.rpt"
        if rpt.is_file():
            print("\n".join(rpt.read_text().splitlines()[:12]))
    print(f"load (export cached): {loaded:.1f} s")
    print(f"compile --effort {args.effort} --plan {args.model}: {elapsed:.1f} s (excluding the export)")


if __name__ == "__main__":
    main()
