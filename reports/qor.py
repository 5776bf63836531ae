"""report_qor: DC's quality-of-results summary, per path group, then cells, area and rules."""
from __future__ import annotations

from softsyn.timing import Analysis, AreaResult
from reports.common import (banner_lines, byte_unit_for, fbytes, fcount, ftime, is_unconstrained,
                                    render)
from reports.advice import Facts, analysis_facts
from reports.suggest import area_suggestions, timing_suggestions
from reports.serving import serving_lines
from reports.tp import tp_lines

LABEL_WIDTH = 28
VALUE_WIDTH = 14
RULE = "-" * 50


def kv(label: str, value: str, unit: str = "", note: str = "", width: int = LABEL_WIDTH) -> str:
    """``Critical Path Length:            1.698 ms`` -- label left, value right, unit and notes after."""
    line = f"{label + ':':<{width}}{value:>{VALUE_WIDTH}}"
    if unit:
        line += f" {unit}"
    if note:
        line += f"  {note}"
    return line


def split_unit(text: str) -> tuple[str, str]:
    """``"3.440 GB"`` -> ("3.440", "GB"); ``"8.19 G"`` -> ("8.19", "G"); ``"512"`` -> ("512", "")."""
    number, _, unit = text.partition(" ")
    return number, unit


def kv_bytes(label: str, b: float, unit: str, note: str = "") -> str:
    return kv(label, *split_unit(fbytes(b, unit)), note=note)


def area_split(area: AreaResult) -> dict[str, float]:
    """Weights / KV cache / activations / other bytes from AreaResult.by_kind names."""
    split = {"weights": 0.0, "kv_cache": 0.0, "activations": 0.0, "other": 0.0}
    for item in area.by_kind:
        name = item.name.lower()
        if name.startswith("weight"):
            split["weights"] += item.bytes
        elif name.startswith("kv"):
            split["kv_cache"] += item.bytes
        elif name.startswith(("activation", "workspace")):
            split["activations"] += item.bytes
        else:
            split["other"] += item.bytes
    return split


def group_block(g, unit: str, digits: int) -> list[str]:
    t = lambda s: ftime(s, unit, digits)  # noqa: E731
    if not g.paths:
        return [f"{'Scenario:':<{LABEL_WIDTH}}{g.scenario.description}", "(no timing paths)"]
    c = g.critical
    unconstrained = is_unconstrained(g.clock_period)
    return [
        f"{'Scenario:':<{LABEL_WIDTH}}{g.scenario.description}",
        kv("Levels of Logic", str(c.levels)),
        kv("Critical Path Length", t(c.arrival), unit),
        kv("Critical Path Slack", "unconstrained" if unconstrained else t(c.slack), "" if unconstrained else unit),
        kv("Critical Path Clk Period", "none" if unconstrained else t(g.clock_period), "" if unconstrained else unit),
        kv("Total Negative Slack", t(g.tns), unit),
        kv("No. of Violating Paths", str(g.violating_paths)),
        kv("Estimated cells", f"{g.estimated_cells} of {g.cell_count}", "(roofline)"),
        kv("Work", split_unit(fcount(g.total_flops))[0], split_unit(fcount(g.total_flops))[1] + "FLOP"),
        kv_bytes("Bytes Moved", g.total_bytes, byte_unit_for(g.total_bytes)),
    ] + ([f"{'Launch:':<{LABEL_WIDTH}}{g.launch}"] if g.launch else [])


def report_qor(analysis: Analysis, significant_digits: int = 3, time_unit: str = "ms", facts: Facts | None = None) -> str:
    unit, digits = time_unit, significant_digits
    groups = [{"name": g.name, "lines": group_block(g, unit, digits)} for g in analysis.groups]

    counts = sorted(analysis.cell_counts.items(), key=lambda kv_: (-kv_[1], kv_[0]))
    width = max([LABEL_WIDTH] + [len(op) + 2 for op, _ in counts])
    cell_lines = [kv(op, str(n), width=width) for op, n in counts]
    cell_total = kv("Total Number of Cells", str(sum(analysis.cell_counts.values())), width=width)

    area = analysis.area
    bunit = byte_unit_for(area.total, area.limit)
    split = area_split(area)
    area_lines = [kv_bytes("Weights", split["weights"], bunit, f"({fcount(area.parameters)} parameters)"),
                  kv_bytes("KV Cache", split["kv_cache"], bunit),
                  kv_bytes("Activations", split["activations"], bunit,
                           f"(peak, {area.activation_scenario} scenario)" if area.activation_scenario else "")]
    if split["other"]:
        area_lines.append(kv_bytes("Other", split["other"], bunit))
    area_lines.append(kv_bytes("Total VRAM", area.total, bunit))
    area_lines.append(kv("VRAM Limit", "none") if area.limit is None else kv_bytes("VRAM Limit", area.limit, bunit))

    if area.limit is None:
        rule_lines = [kv("Area (VRAM) Violation", "unconstrained")]
    else:
        slack = area.slack
        rule_lines = [kv("Area (VRAM) Violation", "yes" if slack < 0 else "no",
                         note=f"(slack {fbytes(slack, bunit)})")]
    facts = facts or analysis_facts(analysis)
    rule_lines.append(kv("Accuracy", "fell back to uniform bf16" if facts.fallback else "not checked",
                         note=f"({facts.fallback.split(': ', 1)[-1]})" if facts.fallback else ""))

    wns, tns = analysis.wns, analysis.tns
    closing = (f"Design  WNS: {ftime(wns, unit, digits)}  TNS: {ftime(tns, unit, digits)}  "
               f"Number of Violating Paths: {analysis.violating_paths}  ({unit})")
    limiting = analysis.limiting_group
    if limiting is not None and len(analysis.groups) > 1:
        g, weighted = limiting
        how = "x" if g.critical.slack < 0 else "/"
        closing = (f"Limiting group: {g.name} (weighted slack {ftime(weighted, unit, digits)} {unit} = slack "
                   f"{ftime(g.critical.slack, unit, digits)} {unit} {how} weight {g.weight:g}; the optimiser serves "
                   "it first)"
                   f"\n  {closing}")
    if analysis.serving is not None:
        bad = [c.group for c in analysis.serving.checks if not c.met]
        closing += (f"\n  Serving: {len(bad)} of {len(analysis.serving.checks)} checks violated"
                    f"{' (' + ', '.join(bad) + ')' if bad else ''} (simulated, est)")
    suggestions = (timing_suggestions(analysis.groups, unit, digits, facts=facts)
                   + area_suggestions(area, facts))
    return render("qor.j2", banner=banner_lines("qor", analysis, []), groups=groups, rule=RULE,
                  cell_lines=cell_lines, cell_total=cell_total, area_lines=area_lines, rule_lines=rule_lines,
                  closing=closing, notes=analysis.notes, tp_lines=tp_lines(analysis.tp, bunit),
                  serving_lines=serving_lines(analysis.serving, unit, digits),
                  suggestions=suggestions,
                  constraints_file=analysis.constraints_file)
