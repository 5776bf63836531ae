"""Every zoo model through the compile loop's three searches: medium, high and ultra, predicted latency per group.

    python bench/loop_family.py [MODEL ...]

Per model and constraints file (decoders: constraints/cpu-loop.yaml and constraints/chat-h200-int4.yaml; the
encoder: constraints/embedding-cpu.yaml) it runs effort low's passes, tabulates the optimize pass's problem
(sensitivity measured where the model runs here, the labelled prior for weightless real-size netlists), runs the
greedy, the ILP and the recovery on it, and prints each map's predicted extra cost per group (the tables'
estimate, s; on a CPU target the sum the STA adds up) and the precisions it uses. It checks that high and ultra
are at least as fast as medium in every group and that every chosen precision has a library cell on the target.
Exit status 1 if a check fails.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DECODER_FILES = ("cpu-loop.yaml", "chat-h200-int4.yaml")


def run(model: str, constraints: Path) -> bool:
    from softsyn import passes
    from softsyn.design import Design
    from softsyn.passes import optimize
    from softsyn.passes.precision import mapping

    design = Design.load(model, constraints, progress=False)
    for step in passes.effort("low").steps:
        passes.run_pass(design, step.pass_name, dict(step.options))
    cands, _ = mapping.candidates(design)
    if not cands:
        print(f"{model} x {constraints.name}: no candidate cells")
        return True
    cands, _, tables = optimize.prune(design, cands)
    errors, how, _ = optimize.sensitivities(design, cands)
    problem = optimize.build_problem(design, cands, errors, optimize.accuracy_budget(design) * optimize.ESTIMATE_SHARE,
                                     tables)
    maps = {mode: optimize.search_map(problem, mode, 200, optimize.OptimizeReport(mode, how, problem.budget))
            for mode in ("greedy", "ilp", "ultra")}
    medium, high, ultra = maps["greedy"], maps["ilp"], maps["ultra"]
    ceiling = {g: problem.slack[g] - s for g, s in medium.slack.items()}
    ok = True
    print(f"{model} x {constraints.name} ({design.library.name}, {len(cands)} cells; sensitivity {how.split(':')[0]})")
    for name, out in (("medium", medium), ("high", high), ("ultra", ultra)):
        extra = {g: problem.slack[g] - s for g, s in out.slack.items()}
        used = sorted(set(out.mapping.values()))
        runnable = all(p == problem.options[c][0] or mapping.has_cell(design.library, "MatMulNBits", p)
                       for c, p in out.mapping.items())
        faster = all(extra[g] <= ceiling[g] + 1e-9 for g in extra)
        ok &= runnable and faster
        print(f"  {name:6}  " + "  ".join(f"{g} {extra[g] * 1e3:+.3f} ms (est) slack {out.slack[g] * 1e3:+.3f} ms"
                                          for g in extra)
              + f"  error {out.error:.2e}  {'/'.join(used)}  {'ok' if runnable and faster else 'FAIL'}")
    return ok


def main() -> None:
    from softsyn.frontends import zoo

    models = sys.argv[1:] or [f"zoo:{name}" for name in zoo.names()]
    ok = True
    for model in models:
        files = ("embedding-cpu.yaml",) if model.endswith("minilm") else DECODER_FILES
        for name in files:
            ok &= run(model, ROOT / "constraints" / name)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
