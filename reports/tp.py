"""The tensor-parallel plan block of report_area and report_qor: per degree, one device's VRAM and each
group's critical arrival (the collectives on it, the speed-up over one device), the smallest degree that
fits, and where the collective delays come from."""
from __future__ import annotations

from softsyn.timing import TPPlan
from reports.columns import TP_COLUMNS, tp_group_columns
from reports.common import Table, fbytes


def tp_table(plan: TPPlan) -> Table:
    groups = list(plan.rows[0].arrival) if plan.rows else []
    columns = TP_COLUMNS + tuple(c for g in groups for c in tp_group_columns(g))
    one = next((r for r in plan.rows if r.n == 1), None)
    rows = []
    for r in plan.rows:
        row = {c.key: getattr(r, c.key) for c in TP_COLUMNS}
        for g in groups:
            row[f"{g}.arrival"] = r.arrival[g]
            row[f"{g}.collectives"] = r.collective_time[g]
            row[f"{g}.speedup"] = one.arrival[g] / r.arrival[g] if one and r.arrival[g] else None
        rows.append(row)
    return Table(columns, tuple(rows))


def tp_lines(plan: TPPlan | None, byte_unit: str) -> list[str]:
    """The plan block (empty without tensor parallelism)."""
    if plan is None:
        return []
    limit = "no area_constraint" if plan.limit is None else f"area_constraint {fbytes(plan.limit, byte_unit)} per device"
    if plan.limit is None:
        smallest = "no area_constraint: every degree fits"
    elif plan.smallest_fit is None:
        smallest = f"none up to {plan.devices} devices fits"
    else:
        smallest = f"TP={plan.smallest_fit}"
    table = tp_table(plan)
    what_if = (f"Weights as MatMulNBits {plan.weights} (parallel.weights, estimate: the weight matmuls timed as "
               f"MatMulNBits.{plan.weights} cells at block 32 and sized at its bytes per parameter)") if plan.weights else ""
    return [f"Tensor parallelism (this analysis is one of {plan.n} device{'s' if plan.n > 1 else ''}; {limit})",
            plan.layout, *([what_if] if what_if else []),
            f"Smallest degree that fits: {smallest}",
            "", table.header(), table.dashes(), *table.lines(byte_unit=byte_unit),
            "Times (ms): each group's critical arrival per device (est where the library has no table), comm: the "
            "collectives on that path, x: speed-up over TP=1.",
            f"Collectives: {plan.collectives}; degrees that divide the {plan.heads} query heads, up to "
            f"parallel.devices {plan.devices}."]
