"""report_verify: the compiled model's outputs against its fp32 reference, per scenario and output.

Renders a softsyn.results.verify.VerifyResult; recomputes nothing. The table is column data
(verify_table): the text here and a JSON reader print the same rows.
"""
from __future__ import annotations

from reports.columns import LOCATE_COLUMNS, VERIFY_COLUMNS
from reports.common import INDENT, Table


def verify_table(result) -> Table:
    """One row per (scenario, output): max abs error, rel error, cosine, top-1 agreement, MET/VIOLATED."""
    return Table(VERIFY_COLUMNS, tuple(
        {"scenario": c.scenario, "output": c.output, "max_abs": c.max_abs, "rel": c.rel, "cosine": c.cosine,
         "top1": c.top1, "over": f"{c.positions_over}/{c.positions}" if c.positions else None,
         "status": "VIOLATED" if c.violations else "MET"} for c in result.checks))


def locate_table(result) -> Table:
    """One row per node located (verify --locate): where the GPU run departs from the CPU run of the same model."""
    return Table(LOCATE_COLUMNS, tuple(
        {"scenario": found.scenario, "node": d.node, "op": d.op, "rel": d.rel, "inputs_rel": d.inputs_rel,
         "output": d.output} for found in result.located for d in found.departures))


def located_lines(result) -> list[str]:
    """What --locate found, per violated scenario: the nodes where it starts, or why none."""
    if not result.located:
        return []
    table = locate_table(result)
    lines = ["", "Located: the compiled model on the target provider against itself on the CPU provider, every node "
             "output compared (rel error over the budget while its inputs agree within it):", ""]
    if table.rows:
        lines += [INDENT + table.header(), INDENT + table.dashes(), *(INDENT + line for line in table.lines())]
        lines += [f"  {found.scenario} {d.node}: {d.cause}" for found in result.located for d in found.departures
                  if d.cause]
    for found in result.located:
        if found.departures:
            continue
        if found.unprobed_rel is not None and found.unprobed_rel > result.max_rel_error:
            lines.append(f"  {found.scenario}: no node departs with every output probed ({found.compared} values agree), "
                         f"but the GPU run as compiled differs from the probed one (rel {found.unprobed_rel:.3e}): "
                         "ONNX Runtime's load-time fusion of the unprobed graph is where to look")
        else:
            lines.append(f"  {found.scenario}: the two providers agree on all {found.compared} values: the compiled "
                         "model departs from the reference on the CPU too (softsyn verify --cpu)")
    return lines


def routed_lines(result) -> list[str]:
    """A routed model whose logits are off at a few positions only: what that pattern usually is."""
    few = result.few_positions_over
    if not (result.routed and few):
        return []
    where = ", ".join(f"{c.scenario}/{c.output} {c.positions_over} of {c.positions}" for c in few)
    return ["", f"Positions over the budget: {where}; the other positions are within it. The model routes tokens "
            f"({result.routed} MoE/QMoE nodes): a token whose top-k experts are near-tied goes to another expert when "
            "rounding moves its router logits, and its output moves by that expert's share. softsyn verify --locate "
            "on the GPU counts such tokens per expert node (docs/commands.md, verify)."]


def report_verify(result, out_dir) -> str:
    ref = result.reference
    table = verify_table(result)
    lines = [f"softsyn verify: {out_dir} ({result.precision}, {result.provider}) vs reference "
             f"{ref.get('source', '?')} ({ref.get('precision', 'fp32')})",
             f"Budget: max rel error {result.max_rel_error:.3e} ({result.budget_source}); min top-1 "
             + (f"{result.min_top1:.4f}" if result.min_top1 is not None else "not set"),
             "rel error = max|compiled - reference| / max|reference| per output tensor", "",
             INDENT + table.header(), INDENT + table.dashes(), *(INDENT + line for line in table.lines()), ""]
    if result.violations:
        lines += [f"VIOLATED: {v}" for v in result.violations]
        lines += routed_lines(result)
        lines += located_lines(result)
    else:
        lines.append(f"verify: all {len(result.checks)} outputs within the accuracy budget")
    return "\n".join(lines) + "\n"
