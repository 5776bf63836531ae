"""Roofline estimate vs ONNX Runtime CPU measurement, per path group, in one run.

    python bench/estimate_vs_measured.py [MODEL ...] [-c constraints/cpu-tiny.yaml] [--runs 20]

Predicted = the group's data arrival at its worst endpoint minus the input
delay (the session.run overhead plus every cell), i.e. what one session.run
call should take. Measured = median of RUNS warm session.run calls on the
same netlist at the same scenario dims (softsyn.runtime.measure says what that covers).
"""
from __future__ import annotations

import argparse
import datetime
import platform

import onnxruntime

from softsyn.design import Design
from softsyn.runtime.inputs import scenario_inputs
from softsyn.runtime.measure import measure, onnx_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=["zoo:qwen3-tiny"])
    parser.add_argument("-c", "--constraints", default="constraints/cpu-tiny.yaml")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()

    print(f"# {datetime.date.today()}  onnxruntime {onnxruntime.__version__} CPU  {platform.processor() or platform.machine()}")
    print(f"{'model':<16} {'group':<8} {'scenario':<34} {'estimate':>10} {'measured':>10} {'p90':>10} {'meas/est':>9}")
    for spec in args.models:
        design = Design.load(spec, args.constraints, progress=False)
        analysis = design.analyze()
        path = onnx_path(design.netlist)
        for group, timing in zip(design.groups, analysis.groups):
            predicted = timing.critical.arrival - timing.critical.input_delay
            feeds = scenario_inputs(design.netlist, group.scenario.dims)
            m = measure(path, feeds, runs=args.runs)
            dims = ", ".join(f"{k} {v}" for k, v in group.scenario.dims.items())
            print(f"{design.netlist.name:<16} {group.name:<8} {dims:<34} {predicted * 1e3:>8.3f}ms "
                  f"{m.median * 1e3:>8.3f}ms {m.p90 * 1e3:>8.3f}ms {m.median / predicted:>8.1f}x")


if __name__ == "__main__":
    main()
