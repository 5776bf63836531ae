"""The `softsyn` command line: each command reads like a man page under --help."""
from __future__ import annotations

import errno
import json
import os
import sys
import traceback
from pathlib import Path

import click

from softsyn import __version__, outdir
from softsyn.constraints.model import MAX_DEVICES
from softsyn.constraints.reader import MAX_INT
from softsyn.errors import SoftsynError
from softsyn.passes import EFFORTS

ANALYSIS_FILE = "analysis.json"
# OSErrors that are the machine refusing (full disk, read-only, permissions, a path longer than it allows), not a
# softsyn bug: exit 2
ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG}


def _effort_help() -> str:
    """The effort levels for compile's --help: name and help, then its numbered steps."""
    width = max(len(name) for name in EFFORTS) + 2
    lines, earlier = [], []
    for level in EFFORTS.values():
        lines.append(f"  {level.name:<{width}}{level.help}")
        step_lines = level.step_lines()
        bases = [b for b in earlier if level.steps[:len(b.steps)] == b.steps]
        if bases:  # a level extending one below it: that level's steps once, then what this level adds
            base = max(bases, key=lambda b: len(b.steps))
            step_lines = [f"1-{len(base.steps)}. as {base.name}", *step_lines[len(base.steps):]]
        lines += [f"  {'':<{width}}{line}" for line in step_lines]
        earlier.append(level)
    return "\n    ".join(lines)


class TPDegree(click.ParamType):
    """--tp: a tensor-parallel degree (an integer >= 1) or `auto` (the smallest that fits area_constraint)."""

    name = "N|auto"

    def convert(self, value, param, ctx):
        if isinstance(value, int) or value == "auto":
            return value
        text = str(value).strip().lower()
        if text == "auto":
            return "auto"
        if text.isdigit() and 1 <= int(text) <= MAX_DEVICES:
            return int(text)
        self.fail(f"{value!r} is not a tensor-parallel degree; valid: an integer 1..{MAX_DEVICES} or auto", param, ctx)


TP_HELP = ("tensor parallelism over N devices (Megatron column/row splits, vocab-parallel embedding and lm_head, "
           "expert parallel MoE), or auto: the smallest N whose per-device VRAM fits area_constraint; timing and "
           "area are then one device's, and the plan per N is printed (overrides parallel.tensor).")


def _help_with(**fields):
    """Fill {field} markers of a command's docstring before click reads it (click takes the help from it)."""
    def fill(f):
        for key, text in fields.items():
            f.__doc__ = f.__doc__.replace("{" + key + "}", text)
        return f
    return fill


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="softsyn")
@click.option("--debug", is_flag=True, help="on an internal error (exit status 3), print Python's trace; "
                                            "may be given anywhere on the line.")
def main(debug):
    """softsyn - timing-driven synthesis of neural-network inference.

    \b
    Reads a model into a netlist of cells, binds every cell to a kernel
    library characterised on a runtime and device, and times every path group
    (prefill/TTFT, decode/TPOT, encoder...) against the latency budget in a
    constraints file, printing Design Compiler / PrimeTime style reports.

    \b
    MODEL may be a .onnx file, a Hugging Face model folder or config.json, or
    a built-in zoo name: qwen3-tiny, llama-tiny, qwen3-moe-tiny, qwen3-0.6b,
    qwen3-1.7b, qwen3-8b, qwen3-30b-a3b, qwen3-235b-a22b, minilm (optionally prefixed "zoo:").

    \b
    Exit codes: 0 success, 1 timing or area violated, 2 bad input (one
    line naming the file, line, key or node), 3 internal error (rerun with
    --debug for the trace). Output directories hold softsyn-manifest.json,
    the list of what softsyn wrote there; only those files are ever
    replaced, and a non-empty directory without one is refused.
    """
    del debug  # read by run(), which maps exceptions to exit codes and prints the trace


@main.command()
@click.argument("model")
@click.option("-c", "--constraints", "constraints_file", type=click.Path(dir_okay=False),
              help="constraints.yaml: clock_period, input/output delays, area_constraint, path_groups...")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False),
              help="write DIR/reports/*.rpt and DIR/analysis.json (DIR: new, empty or an earlier analyze output; "
                   "replaced atomically, files softsyn did not write are kept).")
@click.option("--target", help="library name or .yaml path; overrides the constraints' target "
                               "(shipped: cpu-ort, h200-ort-cuda).")
@click.option("--batch", type=click.IntRange(1, MAX_INT), help="workload batch size (overrides the constraints).")
@click.option("--prompt-len", type=click.IntRange(1, MAX_INT), help="prefill tokens (overrides the constraints).")
@click.option("--context-len", type=click.IntRange(0, MAX_INT),
              help="decode context length (overrides the constraints).")
@click.option("--max-paths", default=1, show_default=True, type=click.IntRange(1, 10),
              help="paths printed per group in the timing report.")
@click.option("--cache-dir", type=click.Path(file_okay=False), help="export cache (default $SOFTSYN_CACHE or ~/.cache/softsyn).")
@click.option("--annotate", "annotate_file", type=click.Path(dir_okay=False),
              help="back-annotation from `softsyn signoff` (DIR/signoff/annotation.json): measured delays replace "
                   "the library's for the cells and groups it covers (source annot).")
@click.option("--materialize", is_flag=True,
              help="export real-size models with seeded random weights (not weightless), so signoff can run "
                   "them; needs RAM for the weights.")
@click.option("--tp", type=TPDegree(), help=TP_HELP)
@click.option("-q", "--quiet", is_flag=True, help="no progress messages on stderr.")
def analyze(model, constraints_file, out_dir, target, batch, prompt_len, context_len, max_paths, cache_dir,
            annotate_file, materialize, tp, quiet):
    """Time MODEL against its constraints and print timing and QoR reports.

    \b
    Reads MODEL into a netlist, resolves the path groups (a decoder LLM gets
    prefill and decode by default, bound to the workload's prompt and context
    lengths), computes every cell's delay from the target library (a roofline
    estimate, marked (est), where no measured table exists), then arrival,
    required time and slack per group, and VRAM: weights + KV cache +
    activation peak.

    \b
    Prints the worst path of each group (folded by layer) and the QoR summary.
    With -o DIR, also writes DIR/reports/{timing,timing_full,qor,area,
    constraint}.rpt, DIR/analysis.json for `softsyn report`,
    DIR/design.json (model, constraints, ONNX file) for `softsyn signoff`
    and DIR/reports/report.html (one self-contained page of it all).
    With --annotate FILE, measured delays from a signoff replace the
    library's (back-annotation).

    \b
    Examples:
      softsyn analyze zoo:qwen3-tiny -c constraints/cpu-tiny.yaml -o out/tiny
      softsyn analyze zoo:qwen3-8b --target h200-ort-cuda --context-len 4096
      softsyn analyze model.onnx -c constraints/guide-short.yaml
      softsyn analyze zoo:qwen3-tiny -c constraints/cpu-tiny.yaml --annotate out/tiny/signoff/annotation.json

    Exit status: 0 when every group meets its clock and VRAM fits, 1 on a
    violation, 2 on bad input.
    """
    from softsyn.design import Design
    from softsyn.reports import report_qor, report_timing, write_reports

    if out_dir:
        outdir.check(out_dir, "analyze", _given_paths(model))
    design = Design.load(model, constraints_file, target=target, cache_dir=cache_dir, progress=not quiet,
                         annotate=annotate_file, batch=batch, prompt_len=prompt_len, context_len=context_len,
                         tp=tp, **({"materialize": True} if materialize else {}))
    analysis = design.analyze()
    click.echo(report_timing(analysis, max_paths=max_paths, fold=True))
    click.echo(report_qor(analysis))
    if out_dir:
        from softsyn.reports.common import write_atomic
        from softsyn.reports.html import write_html
        from softsyn.flow.signoff import DESIGN_FILE, design_record

        record = design_record(model, constraints_file, target, cache_dir, dict(
            batch=batch, prompt_len=prompt_len, context_len=context_len), annotate_file, design.netlist,
            design.library.name if Path(design.library.path).parent.name == "libs" else str(design.library.path), materialize)
        with outdir.replace(out_dir, "analyze", design.netlist.name, model=model,
                            inputs=outdir.input_paths(design.netlist.provenance), progress=not quiet) as staged:
            written = write_reports(analysis, staged.path) + [
                write_atomic(staged.path / DESIGN_FILE, json.dumps(record, indent=1, allow_nan=False) + "\n")]
            written.append(write_html(staged.path))
        for path in written:
            if not quiet:
                click.echo(f"[softsyn] wrote {staged.out / path.relative_to(staged.path)}", err=True)
    violated = analysis.violating_paths > 0 or (analysis.area.slack is not None and analysis.area.slack < 0)
    sys.exit(1 if violated else 0)


@main.command()
@click.argument("kind", type=click.Choice(["timing", "qor", "area", "constraint", "json", "html"]))
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--group", help="only this path group (timing).")
@click.option("--max-paths", default=1, show_default=True, type=click.IntRange(1, 10), help="paths per group (timing).")
@click.option("--fold/--no-fold", default=True, show_default=True,
              help="fold repeated layers (model.layers.* x28) into one row (timing).")
@click.option("--digits", default=3, show_default=True, type=click.IntRange(0, 9), help="significant digits of times.")
def report(kind, directory, group, max_paths, fold, digits):
    """Re-print a report from a saved analysis, without re-timing.

    \b
    KIND is one of:
      timing      report_timing: full path, Point / Cell / Incr / Path columns
      qor         report_qor: per-group WNS, TNS, violating paths, cells, area
      area        report_area: VRAM by kind and by hierarchy, the KV budget
      constraint  report_constraint -all_violators
      json        the same path objects as JSON (SI units)
      html        re-render DIRECTORY/reports/report.html (one self-contained page:
                  verdicts, waterfalls, precision map, VRAM, compile log, sign-off,
                  fusion, suggestions) and print its path
    DIRECTORY is an `analyze -o` or `compile -o` output directory (holding analysis.json).

    \b
    Example:
      softsyn report timing out/tiny --group decode --max-paths 3 --no-fold
    """
    from softsyn.reports import REPORTS, from_json, to_json

    if kind == "html":
        from softsyn.reports.html import HTML_FILE, write_html

        out = outdir.check(directory, "report")
        with outdir.replace(out, "report", "", progress=False) as staged:
            write_html(staged.path, out)
        click.echo(out / HTML_FILE)
        return
    saved = Path(directory) / ANALYSIS_FILE
    if not saved.is_file():
        raise SoftsynError(f"{directory}: no {ANALYSIS_FILE} here; run `softsyn analyze MODEL -o {directory}` first")
    try:
        analysis = from_json(saved.read_text())
    except (OSError, ValueError) as exc:
        raise SoftsynError(f"{saved}: not a readable softsyn analysis ({exc}); re-run softsyn analyze") from None
    if group is not None:
        try:
            analysis.group(group)
        except KeyError as exc:
            raise SoftsynError(exc.args[0]) from None
    if kind == "json":
        click.echo(to_json(analysis))
    elif kind == "timing":
        click.echo(REPORTS["timing"](analysis, group=group, max_paths=max_paths, fold=fold, significant_digits=digits))
    else:
        click.echo(REPORTS[kind](analysis))


@main.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="ONNX Runtime execution provider to measure on.")
@click.option("--runs", default=20, show_default=True, type=click.IntRange(min=1),
              help="timed runs per path group (median and p90 reported).")
@click.option("--warmup", default=3, show_default=True, type=click.IntRange(min=0),
              help="warm-up block: untimed runs before each timed turn, in blocks of this many until one is within 5 %% of the block before.")
@click.option("--profile-runs", type=click.IntRange(min=1), help="profiled runs per group (default min(runs, 10), at least 3).")
@click.option("--group", "groups", multiple=True, help="only this path group (repeatable).")
@click.option("--top", default=10, show_default=True, type=click.IntRange(1, 100), help="rows per error table.")
@click.option("-o", "--annotation", "annotation_out", type=click.Path(dir_okay=False),
              help="where to write the back-annotation (default DIR/signoff/annotation.json).")
@click.option("-q", "--quiet", is_flag=True, help="no progress messages on stderr.")
def signoff(directory, provider, runs, warmup, profile_runs, groups, top, annotation_out, quiet):
    """Measure the design on the real runtime, compare with the analysis, and back-annotate.

    \b
    DIRECTORY is the output of `softsyn analyze MODEL -o DIR` (analysis.json +
    design.json) or of `softsyn compile MODEL -o DIR` (model.onnx +
    netlist.json + runtime/session.json). For each path group, at its
    scenario dims: warm-up, then RUNS timed run_with_iobinding calls (inputs
    and outputs bound on the device; median and p90), and a separate run
    under ONNX Runtime's profiler for per-node kernel times.

    \b
    Prints predicted (arrival - input delay) vs measured (median run) per
    group with both slacks, then per group the op types and cells with the
    largest error, and for a violated group the cells responsible. Writes
    DIR/reports/signoff.rpt, DIR/signoff/signoff.json, DIR/reports/report.html
    (now with predicted vs measured) and the
    back-annotation DIR/signoff/annotation.json (per group: measured kernel
    time of each netlist cell the runtime ran, the cells it fused or folded
    away, and the residual on the session.run row) for
    `softsyn analyze --annotate`.

    \b
    Examples:
      softsyn analyze zoo:qwen3-tiny -c constraints/cpu-tiny.yaml -o out/tiny
      softsyn signoff out/tiny --runs 50
      softsyn analyze zoo:qwen3-tiny -c constraints/cpu-tiny.yaml --annotate out/tiny/signoff/annotation.json

    Exit status: 0 when every group's measured time meets its clock, 1 when
    a measured group violates, 2 on bad input.
    """
    from softsyn.reports import report_signoff
    from softsyn.flow.signoff import signoff as run_signoff, write_results

    out = outdir.check(directory, "signoff")
    annotation = Path(annotation_out).absolute() if annotation_out else out / "signoff" / "annotation.json"
    inside = out in annotation.parents
    with outdir.replace(out, "signoff", "", progress=not quiet) as staged:
        result = run_signoff(directory, provider=provider, runs=runs, warmup=warmup, profile_runs=profile_runs,
                             annotation_out=staged.path / annotation.relative_to(out) if inside else annotation,
                             progress=not quiet, groups=list(groups) or None)
        result.annotation_file = str(annotation)
        text = report_signoff(result, top=top)
        click.echo(text)
        written = [out / p.relative_to(staged.path) for p in write_results(result, staged.path, text)]
    for path in written + [annotation]:
        if not quiet:
            click.echo(f"[softsyn] wrote {path}", err=True)
    sys.exit(1 if result.violated else 0)


@main.command("compile")
@click.argument("model")
@click.option("-c", "--constraints", "constraints_file", type=click.Path(dir_okay=False),
              help="constraints.yaml: clocks, path groups, accuracy budget, precision, dont_touch...")
@click.option("--effort", default="low", show_default=True, type=click.Choice(list(EFFORTS)),
              help="pass script to run (see `softsyn passes`).")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="output DIR (new, empty, or an earlier softsyn output; replaced atomically, files softsyn "
                   "did not write are kept).")
@click.option("--target", help="library name or .yaml path; overrides the constraints' target.")
@click.option("--cache-dir", type=click.Path(file_okay=False), help="export cache (default $SOFTSYN_CACHE or ~/.cache/softsyn).")
@click.option("--plan", is_flag=True,
              help="weightless compile: the design, reports, netlist.json and runtime settings, no model.onnx "
                   "(what a model too big to materialise on this machine gets).")
@click.option("--all-logits", is_flag=True,
              help="keep every position's logits at prefill (kv_layout's last_token_logits off: the lm_head then "
                   "runs on the whole prompt).")
@click.option("--tp", type=TPDegree(), help=TP_HELP)
@click.option("-q", "--quiet", is_flag=True, help="no progress messages on stderr.")
@_help_with(efforts=_effort_help())
def compile_cmd(model, constraints_file, effort, out_dir, target, cache_dir, plan, all_logits, tp, quiet):
    """Compile MODEL for its target: run the effort's passes, emit an ONNX model and runtime settings.

    \b
    Effort scripts (passes run top to bottom, re-timed after each):
    {efforts}

    \b
    Writes, atomically (a failed or killed compile leaves DIR as it was):
      DIR/model.onnx (+ model.onnx.data)  the compiled model, onnx.checker-clean
      DIR/netlist.json                    every cell: hierarchy, op, library cell, precision, delay per group
      DIR/runtime/session.json            ORT providers and options, IO dtypes, scenario dims, KV ports,
                                          the fp32 reference `softsyn verify` compares against
      DIR/reports/*.rpt, DIR/analysis.json  timing, QoR, area, constraint (and fusion) reports
      DIR/compile.log, compile_log.json   one row per step: elapsed, phase, WNS, TNS, area, worst group
      DIR/reports/report.html             the design at a glance (`softsyn report html DIR` re-renders it)
      DIR/softsyn-manifest.json           what softsyn wrote (only those files are ever replaced)
    The MODEL you gave is never modified, and may not be inside DIR. The
    model is refused (exit 2) when ONNX Runtime cannot load it with the
    target's providers. Prints the compile log and QoR.

    \b
    Example:
      softsyn compile zoo:qwen3-tiny -c constraints/cpu-tiny.yaml --effort low -o out/tiny
      softsyn verify out/tiny

    Exit status: 0 when every group meets its clock and VRAM fits, 1 on a
    violation (the design is still written), 2 on bad input.
    """
    from softsyn.flow.compile import check_effort, compile_design
    from softsyn.design import Design
    from softsyn.emit import require_weights
    from softsyn.flow.verify import reference_record
    from softsyn.frontends.onnx_file import check_external_data
    from softsyn.reports import report_qor

    out = outdir.check(out_dir, "compile", _given_paths(model))
    check_effort(effort)
    plan = plan or _plan_instead(model, quiet)
    design = Design.load(model, constraints_file, target=target, cache_dir=cache_dir, progress=not quiet,
                         materialize=not plan, tp=tp)
    if not plan:
        require_weights(design.netlist)
        check_external_data(design.netlist.model, design.netlist.provenance.get("file") or model)
    outdir.check(out, "compile", outdir.input_paths(design.netlist.provenance))
    options = {"kv_layout": {"last_token_logits": False}} if all_logits else None
    analysis, path = compile_design(design, effort, out, reference_record(model, design.netlist), plan=plan,
                                    options=options)
    click.echo((path / "compile.log").read_text())
    click.echo(report_qor(analysis))
    if not quiet:
        click.echo(f"[softsyn] wrote {path}", err=True)
    violated = analysis.violating_paths > 0 or (analysis.area.slack is not None and analysis.area.slack < 0)
    if violated:  # the best design found is written; what violates, and what would close it
        click.echo((path / "reports" / "constraint.rpt").read_text())
    sys.exit(1 if violated else 0)


def _plan_instead(model: str, quiet: bool) -> bool:
    """Whether a model without weights of its own is too big to materialise here (then it gets the plan)."""
    from softsyn.frontends import seeded_weight_bytes
    from softsyn.frontends.materialize import MATERIALISE_FACTOR, available_memory
    from softsyn.units import fmt_bytes

    need = seeded_weight_bytes(model)
    if need is None:
        return False
    ram = available_memory()
    if ram is not None and need * MATERIALISE_FACTOR > ram:
        click.echo(f"[softsyn] {model}: its seeded weights ({fmt_bytes(need)}) need about "
                   f"{fmt_bytes(need * MATERIALISE_FACTOR)} of RAM to materialise (estimate) and this machine has "
                   f"{fmt_bytes(ram)} available: writing the weightless plan (--plan), no model.onnx", err=True)
        return True
    if not quiet:
        click.echo(f"[softsyn] {model} has no weights of its own: compiling it with seeded random weights "
                   f"({fmt_bytes(need)}; timing does not depend on their values)", err=True)
    return False


@main.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--seed", default=0, show_default=True, help="seed of the scenario inputs.")
@click.option("--cache-dir", type=click.Path(file_okay=False),
              help="export cache, to re-export the reference if its recorded ONNX file is gone.")
@click.option("--cpu", is_flag=True, help="run the compiled model on the CPU provider, whatever session.json says.")
def verify(directory, seed, cache_dir, cpu):
    """Compare a compiled model with its fp32 reference on the same inputs.

    \b
    DIRECTORY is a `softsyn compile -o` output. For every scenario (path
    group) both models run on ONNX Runtime with the same seeded inputs; per
    output it prints max abs error, rel error = max|compiled - reference| /
    max|reference|, cosine similarity and, for logits, top-1 agreement,
    against the accuracy budget (constraints accuracy.max_rel_error, default
    1e-4 for fp32 and 1e-2 for fp16; accuracy.min_top1 when given).

    Exit status: 0 within budget, 1 on a violation, 2 on bad input.
    """
    from softsyn.flow.verify import verify as run_verify
    from softsyn.reports import report_verify

    result = run_verify(directory, seed=seed, cache_dir=cache_dir, cpu=cpu)
    click.echo(report_verify(result, directory), nl=False)
    sys.exit(1 if result.violations else 0)


@main.command("run")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--prompt-len", default=128, show_default=True, type=click.IntRange(min=1), help="prompt tokens (prefill).")
@click.option("--gen", default=32, show_default=True, type=click.IntRange(min=1), help="tokens to generate.")
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), help="execution provider (default: runtime/session.json's).")
@click.option("--runs", default=3, show_default=True, type=click.IntRange(min=1), help="timed generations.")
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(min=0), help="untimed generations first.")
@click.option("--seed", default=0, show_default=True, help="seed of the random prompt ids.")
@click.option("--json", "as_json", is_flag=True, help="print the numbers as JSON (SI units) instead of the report.")
@click.option("-q", "--quiet", is_flag=True, help="no progress line on stderr.")
def run_cmd(directory, prompt_len, gen, provider, runs, warmup, seed, as_json, quiet):
    """Generate with a compiled decoder on ONNX Runtime and print TTFT, TPOT and tokens/s.

    \b
    DIRECTORY is a `softsyn compile -o` output of a decoder LLM. Its
    model.onnx runs with its runtime/session.json settings (providers,
    provider and session options): a prefill of PROMPT_LEN seeded random
    token ids, then a greedy decode loop of GEN tokens feeding the KV cache
    as the graph declares it (present bound as the next past, or one shared
    max_length buffer updated in place). Times are host wall clock per step:
    its inputs put on the device, one run_with_iobinding, the logits copied
    to the host and their argmax; TTFT is the prefill step, TPOT a decode
    step (median and p90 over every step of the timed runs), tokens/s the
    generated tokens over TTFT plus their decode steps.

    \b
    Example:
      softsyn compile zoo:qwen3-tiny -c constraints/cpu-tiny.yaml -o out/tiny
      softsyn run out/tiny --prompt-len 128 --gen 32 --json

    Exit status: 0 when it generated, 2 on bad input (DIRECTORY missing, a
    plan without model.onnx, not a softsyn compile output, not a decoder
    with a KV cache; one line), 3 internal error.
    """
    from softsyn.flow.run import RunSettings, run as run_artifact
    from softsyn.reports.run import report_run, run_json

    result = run_artifact(directory, RunSettings(prompt_len, gen, provider, runs, warmup, seed), show_progress=not quiet)
    click.echo(run_json(result) if as_json else report_run(result), nl=False)


@main.command("passes")
def list_passes():
    """List the registered passes and the effort scripts that run them."""
    from softsyn.passes import load_all

    registered = load_all()
    width = max((len(n) for n in registered), default=0)
    for name in sorted(registered):
        click.echo(f"{name:<{width}}  {registered[name].help}")
    for level in EFFORTS.values():
        click.echo("")
        click.echo(f"effort {level.name}: {level.script_text()}")
        for line in [level.help, *level.step_lines()]:
            click.echo(f"  {line}")


@main.command()
@click.option("--runtime", type=click.Choice(["ort"]), default="ort", show_default=True,
              help="runtime to characterise (ONNX Runtime).")
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="execution provider: cpu (CPUExecutionProvider) or cuda (CUDAExecutionProvider, IO on the GPU).")
@click.option("--cells", "cells", metavar="PATTERN",
              help="only cells matching these comma-separated globs on OP or OP.PRECISION "
                   "(e.g. 'MatMul*', 'GroupQueryAttention.fp16', 'Run').")
@click.option("--quick", is_flag=True, help="small grid and few samples (CI: the CPU library in under 3 min).")
@click.option("--note", help="status line recorded in the header (e.g. 'preliminary: shared, noisy machine').")
@click.option("--graph", "cuda_graph", is_flag=True,
              help="(cuda) graph tables: MatMul, MatMulNBits and attention at one row timed as CUDA graph replays, "
                   "what a captured decode step's kernels cost (no host share).")
@click.option("--list", "list_only", is_flag=True, help="list the cells and their grid/hold-out point counts; measure nothing.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="library YAML to write (resumed if it exists).")
@click.option("-q", "--quiet", is_flag=True, help="no progress on stderr.")
def characterize(runtime, provider, cells, quick, note, cuda_graph, list_only, output, quiet):
    """Measure a library's delay tables on this machine's runtime and device.

    \b
    For every cell the provider runs (MatMul/Gemm at each precision it
    computes in, MatMulNBits int4/int8 at block 32/64/128, DequantizeLinear
    fp8/int8, GroupQueryAttention, MultiHeadAttention, the layer norms,
    RotaryEmbedding, Gelu variants, Gather, Softmax, element-wise ops,
    reductions, Transpose/Reshape/Concat/..., and the per-call overhead of a
    run), builds a small ONNX graph per grid point, times it warm with inputs
    and outputs bound on the device, and writes the cell's delay table with
    its index axes. Hold-out points between grid points are measured too; the
    table's own interpolation error is written per cell and in the header.

    \b
    Resumable: cells already in FILE are skipped, and FILE is rewritten
    atomically after each cell, so an interrupted run continues where it
    stopped. Precisions the provider does not compute in (CPU: ORT inserts
    Casts; CUDA: a node would fall back to the CPU) are listed in the header's
    not_characterised with the reason.

    \b
    Examples:
      softsyn characterize --provider cpu -o softsyn/library/libs/cpu-ort.yaml
      softsyn characterize --provider cpu --quick --cells 'MatMul*' -o /tmp/mm.yaml
      softsyn characterize --provider cuda -o h200-ort-cuda.yaml      # on the GPU machine
      softsyn characterize --provider cuda --graph -o h200-ort-cuda.yaml   # + graph tables (decode as a CUDA graph)
      softsyn characterize --provider cuda --cells 'AllReduce*,AllGather*,ReduceScatter*' -o h200-nccl.yaml
                                       # on a multi-GPU host: collectives, one process per GPU (NCCL)
    """
    from softsyn.characterize.collectives import characterize_collectives, collective_cells
    from softsyn.characterize.plan import characterize as run_characterize, list_cells

    if list_only:
        rows = list_cells(provider, quick, cells)
        for name, grid, hold in rows:
            click.echo(f"{name:<48} {grid:>5} grid + {hold:>3} hold-out points")
        click.echo(f"{len(rows)} cells, {sum(g + h for _, g, h in rows)} points")
        return
    if not output:
        raise SoftsynError("characterize: -o FILE is required (the library YAML to write or resume)")
    argv = " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("softsyn") else None
    command = "softsyn " + (argv or f"characterize --runtime {runtime} --provider {provider}"
                            + (f" --cells '{cells}'" if cells else "") + (" --quick" if quick else "") + f" -o {output}")
    collectives = collective_cells(cells)
    if collectives:  # AllReduce / AllGather / ReduceScatter: one process per device, a collective library
        if len(collectives) != len([p for p in cells.split(",") if p.strip()]):
            raise SoftsynError(f"characterize --cells {cells!r}: collectives ({', '.join(collectives)}) are measured "
                               "apart from kernel cells (their own library, one process per device); give them alone")
        path = characterize_collectives(provider, output, collectives, quick=quick, progress=not quiet,
                                        command=command)
        click.echo(f"[softsyn] wrote {path}", err=True)
        return
    run_characterize(provider, output, cells=cells, quick=quick, progress=not quiet, command=command, note=note,
                     cuda_graph=cuda_graph)


def _given_paths(model: str) -> list[Path]:
    """MODEL when it names a file or folder (a zoo name does not)."""
    path = Path(model).expanduser()
    return [path] if not model.startswith("zoo:") and path.exists() else []


def _one_line(text) -> str:
    return " ".join(str(text).split())


def run(argv: list[str] | None = None) -> None:
    """Entry point. Exit 0 met, 1 violated, 2 bad input, 3 internal error; every error is one line on
    stderr ("softsyn: error: ..." or "softsyn: internal error: ..."), the trace only with --debug."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    if debug:  # a global flag, honoured wherever it is on the line
        args = ["--debug"] + [a for a in args if a != "--debug"]
    try:
        code = main.main(args, prog_name="softsyn", standalone_mode=False)
    except SoftsynError as exc:
        _fail(debug, f"softsyn: error: {_one_line(exc)}", 2)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help())
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "softsyn"
        _fail(False, f"softsyn: error: {where}: {_one_line(exc.format_message())} (see {where} --help)", 2)
    except click.ClickException as exc:
        _fail(False, f"softsyn: error: {_one_line(exc.format_message())}", 2)
    except (click.exceptions.Abort, KeyboardInterrupt):
        _fail(False, "softsyn: interrupted", 130)
    except BrokenPipeError:  # the reader of our output went away (`softsyn report ... | head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
    except OSError as exc:
        if exc.errno not in ENVIRONMENT_ERRNOS:
            _internal(debug, exc)
        _fail(debug, f"softsyn: error: {exc.filename or ''}{': ' if exc.filename else ''}{exc.strerror}", 2)
    except Exception as exc:
        _internal(debug, exc)
    sys.exit(code if isinstance(code, int) else 0)


def _internal(debug: bool, exc: Exception) -> None:
    hint = "" if debug else " (rerun with --debug for the trace)"
    _fail(debug, f"softsyn: internal error: {type(exc).__name__}: {_one_line(exc)}{hint}", 3)


def _fail(debug: bool, line: str, code: int) -> None:
    if debug:
        traceback.print_exc()
    click.echo(line, err=True)
    sys.exit(code)


if __name__ == "__main__":
    run()
