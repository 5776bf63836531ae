"""report_area: VRAM by kind and by hierarchy (repeated indexed scopes folded), its constraint, and the
KV budget: what the constraint leaves for the KV cache, the largest concurrency and context it holds."""
from __future__ import annotations

from softsyn.timing import Analysis, AreaItem, KVBudget
from reports.columns import (AREA_HIERARCHY_COLUMNS, AREA_KIND_COLUMNS, AREA_KV_COLUMNS, AREA_LIMIT_COLUMNS,
                                     AREA_WEIGHT_COLUMNS)
from reports.common import (Table, banner_lines, byte_unit_for, fbytes, fcount, fpercent, indexed_scope,
                                    render, table_header, table_row, table_rule)
from reports.advice import Facts, analysis_facts
from reports.suggest import area_suggestions
from reports.tp import tp_lines


def truncate_hierarchy(items: list[AreaItem], depth: int) -> list[AreaItem]:
    """Aggregate rows whose names agree on the first `depth` dot components (order kept)."""
    out: dict[str, AreaItem] = {}
    for item in items:
        name = ".".join(item.name.split(".")[:depth]) if depth > 0 else item.name
        if name in out:
            agg = out[name]
            agg.bytes += item.bytes
            agg.count += item.count
            if agg.detail != item.detail:
                agg.detail = ""
        else:
            out[name] = AreaItem(name, item.bytes, item.count, item.detail)
    return list(out.values())


def fold_hierarchy(items: list[AreaItem]) -> list[tuple[AreaItem, int]]:
    """Fold rows of repeated indexed scopes (``model.layers.<i>[.rest]``) into
    ``model.layers.*[.rest] (xN, folded)`` with summed bytes and counts; (item, N) pairs,
    N = 0 for rows left as they are. Order: where the first member appeared."""
    groups: dict[str, list[tuple[int, AreaItem]]] = {}
    order: list[tuple[str, AreaItem | None]] = []
    for item in items:
        scope = indexed_scope(item.name)
        if scope is None:
            order.append(("", item))
            continue
        prefix, index, rest = scope
        key = f"{prefix}.*{rest}"
        if key not in groups:
            groups[key] = []
            order.append((key, None))
        groups[key].append((index, item))
    out: list[tuple[AreaItem, int]] = []
    for key, item in order:
        if item is not None:
            out.append((item, 0))
            continue
        members = groups[key]
        n = len({i for i, _ in members})
        if n < 2:
            out.extend((m, 0) for _, m in members)
            continue
        total = sum(m.bytes for _, m in members)
        out.append((AreaItem(f"{key} (x{n}, folded)", total, sum(m.count for _, m in members), ""), n))
    return out


def kv_table(budget: KVBudget) -> Table:
    """One row per KV dtype: the netlist's, then each smaller element size kv_cache.dtype accepts."""
    return Table(AREA_KV_COLUMNS, tuple({c.key: getattr(o, c.key) for c in AREA_KV_COLUMNS} for o in budget.kv_dtypes))


def weight_table(budget: KVBudget) -> Table:
    """One row per weight precision: the netlist's, then each lower one precision.allowed names."""
    return Table(AREA_WEIGHT_COLUMNS,
                 tuple({c.key: getattr(o, c.key) for c in AREA_WEIGHT_COLUMNS} for o in budget.weight_precisions))


def context_note(budget: KVBudget) -> str:
    """Why the largest context stops where it does."""
    if budget.max_positions and budget.max_context == budget.max_positions and budget.max_positions >= budget.length:
        return " (the model's max_position_embeddings)"
    return ""


def kv_budget_lines(budget: KVBudget, unit: str) -> list[str]:
    """The KV budget block: the per-token figure, the subtraction that leaves the budget, the largest
    concurrency and context, then the dtype and weight tables."""
    b = budget
    lines = [f"KV budget (derived from the netlist's {b.tensors} past-KV inputs {b.layout} {b.dtype} "
             f"and area_constraint)",
             f"KV per token:  {fbytes(b.bytes_per_token, 'KB')} per sequence, all layers' K and V",
             f"KV length:     {b.length} tokens per sequence ({b.length_key}), batch {b.batch} x concurrency "
             f"{b.concurrency}"]
    if b.state_bytes:
        lines.append(f"States:        {fbytes(b.state_bytes, 'MB' if b.state_bytes >= 1e6 else 'KB')} per sequence "
                     "(the linear-attention layers' conv and recurrent states: a fixed size, any length), in every "
                     "KV figure below")
    if b.limit is None:
        lines += ["No VRAM constraint (area_constraint) set: no KV budget; "
                  f"the KV cache at the workload is {fbytes(b.kv_bytes, unit)}."]
    else:
        row = lambda name, x: table_row(AREA_LIMIT_COLUMNS, {"name": name, "bytes": fbytes(x, unit)})[0]  # noqa: E731
        lines += ["", row("max_area (VRAM limit)", b.limit), row("weights and constants", -b.weights),
                  row(f"workspace (activation peak, {b.workspace_scenario})", -b.workspace),
                  table_rule(AREA_LIMIT_COLUMNS), row("available for the KV cache", b.available),
                  row("KV cache at the workload", b.kv_bytes), "",
                  f"Largest concurrency at {b.length} tokens:  {b.max_concurrency:,} (sequences of batch {b.batch})",
                  f"Largest context at concurrency {b.concurrency}:  {b.max_context:,} tokens{context_note(b)}"]
        others = [p for p in b.workspace_points if p.length != b.length]
        if others:
            lines.append("Workspace at other KV lengths (the scenarios that read the cache re-bound): "
                         + ", ".join(f"{p.length} {'token' if p.length == 1 else 'tokens'} {fbytes(p.bytes, unit)}" for p in others)
                         + "; linear between, which the convex peak stays under.")
        lines.append(f"Concurrent sequences share the workspace of one run at batch {b.batch} (the timed scenarios).")
    kv, weights = kv_table(b), weight_table(b)
    lines += ["", kv.header(), kv.dashes(), *kv.lines(byte_unit=unit)]
    if len(b.weight_precisions) > 1:
        lines += ["", weights.header(), weights.dashes(), *weights.lines(byte_unit=unit)]
    lines.append("Rows marked estimate: the netlist's KV layout at each dtype's element size (scales not counted)"
                 + ("; weights at 2 B (fp16/bf16), 1.0625 B (int8) or 0.5625 B (int4) per parameter (MatMulNBits, "
                    "an fp16 scale per 32)" if len(b.weight_precisions) > 1 else "")
                 + ("; fp8 at 1.03125 B (MatMulBlockQuantizedFp8Weight, an fp32 scale per 128)"
                    if any(w.precision == "fp8" for w in b.weight_precisions) else "")
                 + "; the workspace as measured with the netlist's KV dtype.")
    if b.requested_dtype and b.requested_dtype != b.dtype:
        lines.append(f"kv_cache.dtype {b.requested_dtype} is not applied to this netlist (its KV inputs are "
                     f"{b.dtype}): its row above is what it would take.")
    return lines


def report_area(analysis: Analysis, hierarchy_depth: int = 3, facts: Facts | None = None) -> str:
    area = analysis.area
    unit = byte_unit_for(area.total, area.limit)
    whole = area.total or 1.0

    def row(item: AreaItem, detail: str | None = None) -> dict:
        return {"name": item.name, "bytes": fbytes(item.bytes, unit),
                "count": fcount(item.count) if item.count else "",
                "percent": fpercent(item.bytes / whole), "detail": item.detail if detail is None else detail}

    def lines(columns, values) -> list[str]:
        return table_row(columns, values)

    kind_rows = [line for k in area.by_kind for line in lines(AREA_KIND_COLUMNS, row(k))]
    kind_total = lines(AREA_KIND_COLUMNS, row(AreaItem("Total VRAM", area.total, 0), ""))

    hier = fold_hierarchy(truncate_hierarchy(area.by_hierarchy, hierarchy_depth))
    hier_rows = []
    for item, n in hier:
        detail = f"{fbytes(item.bytes / n, unit)} each" if n else None
        hier_rows += lines(AREA_HIERARCHY_COLUMNS, row(item, detail))
    hier_sum = sum(i.bytes for i, _ in hier)
    hier_total = lines(AREA_HIERARCHY_COLUMNS,
                       row(AreaItem("Total (hierarchy)", hier_sum, sum(i.count for i, _ in hier)),
                           "" if abs(hier_sum - area.total) < 0.5 else
                           "rows attributed to a scope; the rest is not hierarchical"))

    if area.limit is None:
        constraint = ["No VRAM constraint (area_constraint) set: unconstrained."]
    else:
        rule = table_rule(AREA_LIMIT_COLUMNS)
        c = lambda name, b: lines(AREA_LIMIT_COLUMNS, {"name": name, "bytes": fbytes(b, unit)})[0]  # noqa: E731
        constraint = [c("max_area (VRAM limit)", area.limit), c("total VRAM", area.total), rule,
                      c(f"slack ({'MET' if area.slack >= 0 else 'VIOLATED'})", area.slack)]

    options = [f"-hierarchy_depth {hierarchy_depth}"]
    return render("area.j2", banner=banner_lines("area", analysis, options),
                  kind_header=table_header(AREA_KIND_COLUMNS), kind_rule=table_rule(AREA_KIND_COLUMNS),
                  kind_rows=kind_rows, kind_total=kind_total,
                  hier_header=table_header(AREA_HIERARCHY_COLUMNS), hier_rule=table_rule(AREA_HIERARCHY_COLUMNS),
                  hier_rows=hier_rows, hier_total=hier_total, depth=hierarchy_depth,
                  parameters=fcount(area.parameters), kv_detail=area.kv_detail,
                  activation_scenario=area.activation_scenario, constraint=constraint,
                  kv_budget=kv_budget_lines(area.kv_budget, unit) if area.kv_budget else [],
                  tp_lines=tp_lines(analysis.tp, unit), suggestions=area_suggestions(area, facts or analysis_facts(analysis)))
