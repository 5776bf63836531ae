"""How cells' errors combine: a map's measured end-to-end error against the sum, the root sum of squares and the max.

    python bench/error_combination.py [--maps N] [--seed S] [-o out.md]

For each model (zoo:qwen3-wide, seeded weights, constraints/cpu-loop.yaml; the pretrained zoo:minilm,
embedding-cpu.yaml), after effort low's passes: every candidate cell's error alone at int4 and int8 (the compile
loop's sensitivities, cached), then N seeded random maps (subsets of 2..all cells; all int4, all int8 or mixed),
each run end to end on ORT CPU the way the loop's check runs it (verify's relative error, max|q - d| / max|d|).
Prints, per map, the measured error, the three estimates and measured/estimate, then per estimate the median and
worst ratio, the fraction of maps it under-estimates, and the safety factor on the RSS that covers every map.
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"zoo:qwen3-wide": "cpu-loop.yaml", "zoo:minilm": "embedding-cpu.yaml"}

def rules() -> dict:
    """The estimates compared: the old sum, the plain RSS, the max, and the loop's rule (search.map_error)."""
    from passes.optimize.search import ERROR_SAFETY, map_error

    return {"sum": sum, "rss": lambda es: math.sqrt(sum(e * e for e in es)), "max": max,
            f"rss x{ERROR_SAFETY}": map_error}


def random_maps(cells: list[str], n: int, rng: random.Random) -> list[dict[str, str]]:
    """n maps: sizes spread over 2..len(cells), each all int4, all int8 or mixed (a coin per cell), in turn."""
    maps = []
    for i in range(n):
        size = 2 + round((len(cells) - 2) * (i / max(1, n - 1)) ** 1.5)  # more small maps than large ones
        chosen = rng.sample(cells, size)
        kind = ("int4", "int8", "mixed")[i % 3]
        maps.append({c: (rng.choice(("int4", "int8")) if kind == "mixed" else kind) for c in chosen})
    return maps


def measure_model(model: str, constraints: Path, n_maps: int, seed: int) -> list[dict]:
    import passes
    from softsyn.design import Design
    from passes.optimize import mapping, sensitivity

    design = Design.load(model, constraints, progress=False)
    for step in passes.effort("low").steps:
        passes.run_pass(design, step.pass_name, dict(step.options))
    cands, _ = mapping.candidates(design)
    cands = [mapping.Candidate(c.name, c.hierarchy, c.k, c.n, c.current, (c.current, "int4", "int8"), c.params)
             for c in cands]
    start = time.perf_counter()
    errors, how = sensitivity.measure(design, cands)
    print(f"{model}: {len(cands)} cells; {how} ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    runner = sensitivity.Runner(design)
    rows = []
    for i, m in enumerate(random_maps([c.name for c in cands], n_maps, random.Random(seed)), 1):
        cell_errors = [errors[c][p] for c, p in m.items()]
        kinds = sorted(set(m.values()))
        rows.append({"model": model, "cells": len(m), "kind": kinds[0] if len(kinds) == 1 else "mixed",
                     "measured": runner.error(m), **{r: f(cell_errors) for r, f in rules().items()}})
        if i % 10 == 0:
            print(f"  {i}/{n_maps} maps measured", file=sys.stderr)
    return rows


def render(rows: list[dict]) -> str:
    names = list(rules())
    lines = ["| model | cells | kind | measured | " + " | ".join(names) + " | " + " | ".join(f"meas/{k}" for k in names)
             + " |", "|---" * (4 + 2 * len(names)) + "|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['cells']} | {r['kind']} | {r['measured']:.3e} | "
                     + " | ".join(f"{r[k]:.3e}" for k in names) + " | "
                     + " | ".join(f"{r['measured'] / r[k]:.2f}" for k in names) + " |")
    lines += ["", "| model | estimate | median meas/est | worst meas/est | under-estimates |", "|---|---|---|---|---|"]
    for model in [*dict.fromkeys(r["model"] for r in rows), "all"]:
        mine = [r for r in rows if model in ("all", r["model"])]
        for k in names:
            ratios = [r["measured"] / r[k] for r in mine]
            under = sum(1 for x in ratios if x > 1)
            lines.append(f"| {model} | {k} | {statistics.median(ratios):.2f} | {max(ratios):.2f} | "
                         f"{under}/{len(ratios)} ({under / len(ratios):.0%}) |")
    ratios = sorted(r["measured"] / r["rss"] for r in rows)
    lines += ["", f"RSS safety factor covering every map: {ratios[-1]:.2f}; the 95th percentile: "
              f"{ratios[min(len(ratios) - 1, math.ceil(0.95 * len(ratios)) - 1)]:.2f}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--maps", type=int, default=30, help="random maps per model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--output", type=Path)
    args = parser.parse_args()
    rows = []
    for model in args.models:
        rows += measure_model(model, ROOT / "constraints" / MODELS.get(model, "cpu-loop.yaml"), args.maps, args.seed)
    text = render(rows)
    print(text)
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
