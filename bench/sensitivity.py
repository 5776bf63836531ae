"""Per-cell output error of int4 and int8 MatMulNBits on a model, measured the way the compile loop measures it.

    python bench/sensitivity.py [MODEL] [-c constraints.yaml]

Runs effort low's passes, then quantises each candidate MatMul alone (ONNX Runtime's quantiser, block 32,
symmetric) at int4 and at int8 whether or not the library says it is faster, runs the design on every path
group's seeded inputs on ORT CPU and prints verify's relative error per cell and the medians per precision: the
figures behind softsyn.passes.precision.sensitivity.PRIOR_ERROR. Results are cached like the loop's.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="zoo:qwen3-wide")
    parser.add_argument("-c", "--constraints", default=str(ROOT / "constraints" / "cpu-loop.yaml"))
    args = parser.parse_args()

    from softsyn import passes
    from softsyn.design import Design
    from softsyn.passes.precision import mapping, sensitivity

    design = Design.load(args.model, args.constraints, progress=False)
    for step in passes.effort("low").steps:
        passes.run_pass(design, step.pass_name, dict(step.options))
    cands, _ = mapping.candidates(design)
    cands = [mapping.Candidate(c.name, c.hierarchy, c.k, c.n, c.current, (c.current, "int4", "int8"), c.params)
             for c in cands]
    errors, how = sensitivity.measure(design, cands)
    print(f"{args.model}: {len(cands)} cells; {how}")
    print(f"{'cell':44} {'k x n':>12} {'int4':>10} {'int8':>10}")
    for c in cands:
        print(f"{c.hierarchy or c.name:44} {f'{c.k}x{c.n}':>12} {errors[c.name]['int4']:10.3e} {errors[c.name]['int8']:10.3e}")
    for p in ("int4", "int8"):
        print(f"median {p}: {statistics.median(errors[c.name][p] for c in cands):.3e}")


if __name__ == "__main__":
    main()
