"""accuracy.fallback: bf16 — the design the loop takes when its best map is over the accuracy budget.

The seeds' rule (FP8 on the low-precision paths, fall back to full BF16 when accuracy drops too far): when every map
the loop proposed failed its end-to-end check, the design does not keep a quantised cell; it falls back to uniform
bf16, and the log names the map that failed first (the best by the loop's cost), by how much, and what it fell back
to. What uniform bf16 is depends on the target (docs/decisions/2026-12-03-bf16-cells.md):

- a GPU target whose library has MatMul.bf16: every MatMul candidate of the loop as a bf16 cell (passes.optimize.mapping
  .bf16_cell), the fallback map checked end to end like any other and recorded with its measured error; attention and
  the norms stay fp16 (the per-cell bf16 option is the MatMul's; a bf16 region takes a bf16 KV cache, not built);
- any other target (the CPU: no bf16 MatMul kernel; a GPU library without the cell): the float design the loop started
  from (fp16 on a GPU, fp32 on the CPU), as `precision.default: bf16` is realised at effort low, said in the log. Not
  an error when the constraints are read: one constraints file serves every target.

The same uniform bf16 (`uniform_cells`) is the compile loop's start where precision.default is bf16
(`start_from_bf16`): the loop's moves go from those bf16 cells (docs/compile-loop.md).
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

from passes.optimize import search
from passes.optimize.sensitivity import PRIOR_ERROR
from passes.rules.bf16 import BF16, realisable, start_why_not



@dataclass(frozen=True)
class Fallback:
    """What session.json's precision_map.fallback records (plain data)."""
    rule: str  # accuracy.fallback's value
    failed_map: dict[str, int]  # the best map that failed: its moved cells by precision
    failed_error: float  # its end-to-end error (measured)
    limit: float  # what the check allowed (CHECK_SHARE of the budget)
    budget: float  # accuracy.max_rel_error (or the default)
    attempts: int  # maps checked and rejected
    realised: str  # "bf16" (the loop's MatMul cells), or the float precision kept ("fp16", "fp32")
    cells: int  # cells realised bf16
    checked_error: float | None  # the fallback map's end-to-end error (None: not run, or nothing moved)
    why: str  # the line the log prints


def uniform_cells(design, offered) -> tuple[list, str]:
    """(the candidates uniform bf16 makes bf16 cells, why none where it makes none): every MatMul candidate with a bf16
    option, on a target that realises it (`realisable`). The one place both the fallback and the bf16 start read."""
    why_not = realisable(design)
    cands = [c for c in offered if c.op == "MatMul" and BF16 in c.options] if not why_not else []
    if not why_not and not cands:
        why_not = "no MatMul candidate has a bf16 option (an fp16 cell the library has MatMul.bf16 for)"
    return cands, why_not


def start_from_bf16(design, cands) -> tuple[list, list, str | None]:
    """(candidates, the cells started bf16, why not): where `start_why_not` is "", each candidate `uniform_cells`
    takes lists bf16 first (the start, priced and measured as the bf16 cell) and its quantised moves after it; fp16 is
    no longer an option (the user's default is bf16: a cell the loop does not move stays bf16). Elsewhere the
    candidates as they are, and why (None: precision.default is not bf16)."""
    why = start_why_not(design)
    if why != "":
        return cands, [], why
    cells, why = uniform_cells(design, cands)
    if not cells:
        return cands, [], why
    started = {c.name for c in cells}
    return [dataclasses.replace(c, options=(BF16, *(p for p in c.options[1:] if p != BF16)))
            if c.name in started else c for c in cands], cells, ""


def fall_back(design, report, propose, *, offered, tables, errors, budget: float, limit: float, build_problem):
    """The fallback outcome (search.Outcome), the problem it stands on and the candidates its rows are read for.
    `propose`: the loop's Proposer (its rejected maps, its runner); `offered`: the candidates before pruning, `tables`
    their delay tables; `errors`: the measured per-cell errors; `budget`: the estimate's share of the budget; `limit`:
    the check's; `build_problem`: the loop's (passes.optimize.build_problem)."""
    moved, failed, _ = propose.rejected[0]
    cands, why_not = uniform_cells(design, offered)
    fb = [dataclasses.replace(c, options=(c.current, BF16) if c in cands else (c.current,)) for c in offered]
    cell_errors = {c.name: {c.current: 0.0, **({BF16: errors.get(c.name, {}).get(BF16) or PRIOR_ERROR[BF16]}
                                               if c in cands else {})} for c in offered}
    mapping = {c.name: BF16 if c in cands else c.current for c in offered}
    checked = None
    if cands and propose.runner is not None:
        checked = propose.runner.error({c.name: BF16 for c in cands})
        share = search.cell_error(checked, len(cands))
        for c in cands:  # the map's measured error shared by the combination rule (as per role)
            cell_errors[c.name][BF16] = share
    problem = build_problem(design, fb, cell_errors, budget, tables)
    report.explored.add(problem, mapping, "fallback uniform bf16")
    if checked is not None:
        report.explored.checked(problem, mapping, checked)
        report.checked_error = checked
    mix = dict(Counter(moved.values()))
    over = failed - limit
    head = (f"accuracy.fallback bf16: the best map ({len(moved)} cells: "
            + ", ".join(f"{n} {p}" for p, n in sorted(mix.items()))
            + f") measured {failed:.3e} against {limit:.3e} ({limit / propose.budget:.0%} of the budget {propose.budget:.3e}): "
            f"over by {over:.3e} (+{over / limit:.0%}); {len(propose.rejected)} map"
            f"{'s' if len(propose.rejected) != 1 else ''} failed")
    if why_not:
        float_p = next((c.current for c in offered), "fp16")
        why = (f"{head}; fell back to uniform bf16, realised as the float design before the map ({float_p}): "
               f"{why_not}")
    else:
        measured = (f"its end-to-end check {checked:.3e}" + (" (over the budget too: kept, as the rule says)"
                                                             if checked > limit else "")
                    if checked is not None else "not checked here (no weights to run)")
        why = (f"{head}; fell back to uniform bf16: {len(cands)} MatMul cells bf16 (attention and norms stay fp16), "
               f"{measured}")
    report.fallback = Fallback(rule=BF16, failed_map=mix, failed_error=failed, limit=limit, budget=propose.budget,
                               attempts=len(propose.rejected), realised=BF16 if cands else
                               next((c.current for c in offered), "fp16"), cells=len(cands), checked_error=checked,
                               why=why)
    report.notes.append(why)
    design.log(f"optimize: {why}")
    return search.outcome(problem, mapping, [f"{c.name}: {c.current} -> bf16 (fallback)" for c in cands]), problem, fb
