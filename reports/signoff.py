"""report_signoff: predicted (analysis) vs measured (runtime) per path group, op type and cell.

Renders a softsyn.flow.signoff.SignoffResult; recomputes nothing. PrimeTime's sign-off summary in shape:
banner, what was measured, one line per group (predicted, measured, error, both slacks), then per
group the measured breakdown, the op types and the cells with the largest error, and for each
violated group the cells responsible.
"""
from __future__ import annotations

from softsyn.reports.common import BANNER_RULE, INDENT, fpercent, ftime, is_unconstrained


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{x * 100:+.1f}%"


def _machine_line(result) -> list[str]:
    m = result.machine
    if not m:
        return []
    probe = f"probe {m['probe_before_s'] * 1e6:.1f} / {m['probe_after_s'] * 1e6:.1f} us before / after measuring"
    if m.get("factor") and result.provider.startswith("CPU"):
        return [f"{INDENT}Machine  : {probe}; the library's fastest {m['reference_s'] * 1e6:.1f} us: this machine ran "
                f"{m['factor']:.2f}x the speed the tables describe (> 1: slower; softsyn.characterize.probe)."]
    if m.get("factor"):  # the probe's host work does not scale a GPU run (H200 2026-11-30: 1.7-1.87x, errors -1..-13 %)
        return [f"{INDENT}Machine  : {probe}; the library's fastest {m['reference_s'] * 1e6:.1f} us ({m['factor']:.2f}x): "
                "the host's state, not a factor for this GPU run (bench/launch_drift.py samples the launch overhead)."]
    return [f"{INDENT}Machine  : {probe}; the library records no probe to compare with."]


def report_signoff(result, top: int = 10, unit: str = "ms", digits: int = 3) -> str:
    t = lambda s: ftime(s, unit, digits)  # noqa: E731
    out = [BANNER_RULE, "Report : signoff", f"        -provider {result.provider} -runs {result.runs} -warmup {result.warmup}",
           f"Design : {result.design} ({result.kind} output {result.directory})",
           f"Library: {result.library}" + (f" ({result.library_source})" if result.library_source else ""),
           f"Runtime: {result.runtime} {result.provider} on {result.device}",
           f"Model  : {result.model}",
           f"Date   : {result.date}", BANNER_RULE, ""]
    out += [f"{INDENT}Measured : {result.measured_interval}; median of {result.runs} warm runs, each group's turn "
            f"after untimed runs in blocks of {result.warmup} until its run time settled.",
            f"{INDENT}Predicted: {result.predicted_means}.",
            f"{INDENT}Compared : predicted vs measured median; slack = required - input delay - time "
            "(the input delay is charged to both). Quiet: the fastest of the interleaved rounds' medians, the "
            "undisturbed machine a library of fastest-pass cells describes; Err q = error against it.",
            f"{INDENT}Cells    : profiler kernel times (" + (
                "kernel wall time" if result.node_time == "kernel" else
                "host-side launch times: CUDA kernels are asynchronous, so per-cell figures are NOT GPU times") +
            ") in a separate profiled session; the session.run row carries the residual "
            "(measured - sum of kernels: host overhead, gaps, synchronisation, runtime-only nodes).",
            f"{INDENT}Error    : {result.error_means}.", *_machine_line(result), ""]
    head = (f"{INDENT}{'Group':<10} {'Scenario':<30} {'Budget':>9} {'Predicted':>10} {'Measured':>10} {'p90':>9} "
            f"{'Quiet':>9} {'Error':>8} {'Err q':>8} {'Slack pred':>11} {'Slack meas':>11}  Status")
    out += [head, INDENT + "-" * (len(head) - len(INDENT))]
    for g in result.groups:
        dims = ", ".join(f"{k} {v}" for k, v in g.dims.items())
        unconstrained = is_unconstrained(g.budget)
        status = "unconstrained" if unconstrained else (
            "VIOLATED" if g.violated else "MET") + (" (predicted MET)" if g.violated and g.predicted_slack >= 0 else "")
        out.append(f"{INDENT}{g.name:<10} {dims:<30} {t(g.budget):>9} {t(g.predicted):>10} {t(g.measured_median):>10} "
                   f"{t(g.measured_p90):>9} {t(g.measured_quiet):>9} {_pct(g.error):>8} {_pct(g.error_quiet):>8} "
                   f"{t(g.predicted_slack):>11} {t(g.measured_slack):>11}  "
                   f"{status}")
    out.append(f"{INDENT}(times in {unit})")
    for g in result.groups:
        c = g.counts
        out += ["", f"{INDENT}Path Group '{g.name}': {g.description}", INDENT + "-" * 60,
                f"{INDENT}Measured {t(g.measured_median)} {unit} (p10 {t(g.measured_p10)}, p90 {t(g.measured_p90)}, "
                f"quiet {t(g.measured_quiet)}, {g.runs} runs) = kernels {t(g.kernel_sum)} + residual {t(g.residual)} {unit}",
                f"{INDENT}Profiled session: model_run {t(g.profiler_run)} {unit}; profiler cost "
                f"{g.profiler_overhead * 1e6:.2f} us per kernel (calibrated) subtracted from each kernel time",
                *([f"{INDENT}Kernel times scaled by {g.kernel_scale:.3f}: the profiled kernels summed to more than the "
                   "timed run (separate sessions on a busy machine); the residual is 0"] if g.kernel_scale < 1 else []),
                f"{INDENT}Predicted {t(g.predicted)} {unit} = session.run {t(g.predicted_overhead)} + cells "
                f"{t(g.predicted - g.predicted_overhead)} {unit}",
                f"{INDENT}Runtime graph: {c['profiled']} kernels profiled; netlist cells matched {c['exact']} by name, "
                f"{c['fused-anchor']} as fusion anchors, {c['absorbed']} absorbed (folded/fused: 0 s), "
                f"{c['constant']} constants; {c['runtime-only']} runtime-only kernels (in the residual)",
                "", f"{INDENT}By op type (largest |measured - predicted| first)",
                f"{INDENT}{'Op':<26} {'Cells':>6} {'Predicted':>10} {'Measured':>10} {'Delta':>10} {'Error':>8}"]
        for o in g.by_op[:top]:
            err = (o.predicted - o.measured) / o.measured if o.measured else float("nan")
            out.append(f"{INDENT}{o.op_type:<26} {o.cells:>6} {t(o.predicted):>10} {t(o.measured):>10} "
                       f"{t(o.measured - o.predicted):>10} {_pct(err):>8}")
        out += ["", f"{INDENT}Cells with the largest error (by instance)",
                f"{INDENT}{'Instance':<58} {'Op':<14} {'Pred':>8} {'Meas':>8} {'Delta':>8}  Match"]
        for r in g.cells[:top]:
            name = r.instance if len(r.instance) <= 58 else "..." + r.instance[-55:]
            match = r.match + (f" ({r.runtime_op})" if r.runtime_op and r.runtime_op != r.op_type else "")
            out.append(f"{INDENT}{name:<58} {r.op_type:<14} {t(r.predicted):>8} {t(r.measured):>8} "
                       f"{t(r.delta):>8}  {match} [{r.source}]")
        if g.violated:
            over = g.measured_median - g.budget
            out += ["", f"{INDENT}VIOLATED: '{g.name}' measured {t(g.measured_median)} {unit} against a budget of "
                    f"{t(g.budget)} {unit} (slack {t(g.measured_slack)} {unit}); the analysis predicted "
                    f"{t(g.predicted)} {unit} (slack {t(g.predicted_slack)} {unit}).",
                    f"{INDENT}Cells responsible (measured - predicted, largest first; {t(over)} {unit} over budget):"]
            for r in g.responsible():
                out.append(f"{INDENT}  {r.instance}  {r.op_type}  +{t(r.delta)} {unit}"
                           f" ({fpercent(r.delta / g.measured_median)} of the run)")
    if result.notes:
        out += [""] + [f"{INDENT}Note: {n}" for n in result.notes]
    out += ["", f"{INDENT}Back-annotation: {result.annotation_file}",
            f"{INDENT}  re-time with it: softsyn analyze MODEL -c CONSTRAINTS --annotate {result.annotation_file}"]
    violated = [g.name for g in result.groups if g.violated]
    out += ["", f"{INDENT}signoff: " + (f"VIOLATED ({', '.join(violated)})" if violated else "all groups MET")]
    return "\n".join(line.rstrip() for line in out) + "\n"
