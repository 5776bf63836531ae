"""Output error of int4/int8 MatMulNBits (and fp8 on fp16/bf16 designs) on a model, measured as the compile loop does.

    python bench/sensitivity.py [MODEL] [-c constraints.yaml] [--mode cell|role|both]

Runs effort low's passes, then quantises the candidate MatMuls at int4 and at int8 (and fp8,
MatMulBlockQuantizedFp8Weight, where the design computes in fp16/bf16: the op's activation types) whether or not the
library says it is faster, runs the design on every path group's seeded inputs (on the target's device when it is
here, else ORT CPU, the CPU view for a CUDA design) and prints verify's relative error:
- `cell`: each cell alone, per cell, and the medians per precision: the figures behind
  passes.optimize.sensitivity.PRIOR_ERROR;
- `role`: each role group (sensitivity.roles) quantised at once, per role, with each cell's share (the loop's
  sensitivity for designs over optimize.MEASURE_LIMIT), and the whole model at each precision measured end to end
  against the estimate (search.map_error) from the shares;
- `both`: the two, and per role the share against the cells' own errors, and both estimates of the whole model.
Results are cached like the loop's.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = ("int4", "int8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="zoo:qwen3-wide")
    parser.add_argument("-c", "--constraints", default=str(ROOT / "constraints" / "cpu-loop.yaml"))
    parser.add_argument("--mode", choices=("cell", "role", "both"), default="cell")
    args = parser.parse_args()

    import passes
    from softsyn.design import Design
    from passes.optimize import mapping, search, sensitivity

    design = Design.load(args.model, args.constraints, progress=False, materialize=True)  # real sizes: seeded weights
    for step in passes.effort("low").steps:
        passes.run_pass(design, step.pass_name, dict(step.options))
    cands, _ = mapping.candidates(design)
    precisions = PRECISIONS + (("fp8",) if cands and all(c.current in ("fp16", "bf16") for c in cands) else ())
    cands = [mapping.Candidate(c.name, c.hierarchy, c.k, c.n, c.current, (c.current, *precisions), c.params)
             for c in cands]
    per_cell = per_role = None
    if args.mode in ("cell", "both"):
        per_cell, how = sensitivity.measure(design, cands)
        print(f"{args.model}: {len(cands)} cells; {how}")
        print(f"{'cell':44} {'k x n':>12} " + " ".join(f"{p:>10}" for p in precisions))
        for c in cands:
            print(f"{c.hierarchy or c.name:44} {f'{c.k}x{c.n}':>12} "
                  + " ".join(f"{per_cell[c.name][p]:10.3e}" for p in precisions))
        for p in precisions:
            print(f"median {p}: {statistics.median(per_cell[c.name][p] for c in cands):.3e}")
    if args.mode in ("role", "both"):
        per_role, how = sensitivity.measure_per_role(design, cands, print)
        groups = sensitivity.roles(design, cands)
        print(f"\n{args.model}: {how}")
        print(f"{'role':52} {'cells':>5} " + " ".join(f"{p + ' group':>11} {p + ' share':>11}" for p in precisions)
              + ("  " + " ".join(f"{p + ' cells med':>14} {p + ' cells max':>14}" for p in precisions)
                 if per_cell else ""))
        for role, cells in groups.items():
            share = {p: per_role[cells[0].name][p] for p in precisions}
            line = f"{role:52} {len(cells):5} " + " ".join(
                f"{share[p] * len(cells) ** 0.5:11.3e} {share[p]:11.3e}" for p in precisions)
            if per_cell:
                line += "  " + " ".join(f"{statistics.median(per_cell[c.name][p] for c in cells):14.3e} "
                                        f"{max(per_cell[c.name][p] for c in cells):14.3e}" for p in precisions)
            print(line)
        runner = sensitivity.Runner(design)
        for p in precisions:
            measured = runner.error({c.name: p for c in cands})
            line = (f"all {len(cands)} cells {p} ({runner.where}): measured {measured:.3e}; estimate from the role "
                    f"shares {search.map_error(per_role[c.name][p] for c in cands):.3e}")
            if per_cell:
                line += (f", from the cells' own errors {search.map_error(per_cell[c.name][p] for c in cands):.3e} "
                         f"(their sum {sum(per_cell[c.name][p] for c in cands):.3e})")
            print(line)


if __name__ == "__main__":
    main()
