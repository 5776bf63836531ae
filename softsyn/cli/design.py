"""The design commands: analyze, compile, verify, signoff, run (the flow a user takes on one model)."""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import click

from softsyn import outdir, progress
from softsyn.cli import app
from softsyn.cli.app import TP_HELP, TPDegree, effort_help, given_paths, help_with, main
from softsyn.constraints.reader import MAX_INT
from softsyn.library import shipped_libraries
from passes import EFFORTS
from softsyn.design import Design
from reports import report_qor, report_signoff, report_timing, report_verify, to_json, write_reports
from reports.advice import design_facts
from softsyn.results.files import json_nulls, write_atomic
from reports.html import write_html
from softsyn.flow.signoff import DESIGN_FILE, design_record, signoff as run_signoff, write_results
from softsyn.flow.compile import check_effort, compile_design
from softsyn.emit import require_weights
from softsyn.flow.verify import reference_record, verify as run_verify
from softsyn.frontends.onnx_file import check_external_data
from softsyn.frontends import seeded_weight_bytes
from softsyn.frontends.materialize import MATERIALISE_FACTOR, available_memory
from softsyn.units import fmt_bytes
from softsyn.flow.run import RunSettings, run as run_artifact
from reports.run import report_run, run_json


TARGET_HELP = (f"library name or .yaml path; overrides the constraints' target (shipped: "
               f"{', '.join(shipped_libraries())}). With neither, the shipped CPU library whose device is this "
               "machine's, else the closest, named on stderr.")


@main.command()
@click.argument("model")
@click.option("-c", "--constraints", "constraints_file", type=click.Path(dir_okay=False),
              help="constraints.yaml: clock_period, input/output delays, area_constraint, path_groups...")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False),
              help="write DIR/reports/*.rpt and DIR/analysis.json (DIR: new, empty or an earlier analyze output; "
                   "replaced atomically, files softsyn did not write are kept).")
@click.option("--target", help=TARGET_HELP)
@click.option("--batch", type=click.IntRange(1, MAX_INT), help="workload batch size (overrides the constraints).")
@click.option("--prompt-len", type=click.IntRange(1, MAX_INT), help="prefill tokens (overrides the constraints).")
@click.option("--context-len", type=click.IntRange(0, MAX_INT),
              help="decode context length (overrides the constraints).")
@click.option("--max-paths", default=1, show_default=True, type=click.IntRange(1, 10),
              help="paths printed per group in the timing report.")
@click.option("--cache-dir", type=click.Path(file_okay=False), help="export cache (default $SOFTSYN_CACHE, else $XDG_CACHE_HOME/softsyn, else ~/.cache/softsyn).")
@click.option("--annotate", "annotate_file", type=click.Path(dir_okay=False),
              help="back-annotation from `softsyn signoff` (DIR/signoff/annotation.json): measured delays replace "
                   "the library's for the cells and groups it covers (source annot).")
@click.option("--materialize", is_flag=True,
              help="export real-size models with seeded random weights (not weightless), so signoff can run "
                   "them; needs RAM for the weights.")
@click.option("--tp", type=TPDegree(), help=TP_HELP)
@click.option("--json", "as_json", is_flag=True, help="print the analysis as JSON on stdout (SI units; the schema of "
                                                      "`softsyn report json`) instead of the reports.")
@click.option("-q", "--quiet", is_flag=True, help="no progress messages on stderr.")
def analyze(model, constraints_file, out_dir, target, batch, prompt_len, context_len, max_paths, cache_dir,
            annotate_file, materialize, tp, as_json, quiet):
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
      softsyn analyze zoo:qwen3-tiny -c constraints/cpu-tiny.yaml \\
          --annotate out/tiny/signoff/annotation.json

    Exit status: 0 when every group meets its clock and VRAM fits, 1 on a
    violation, 2 on bad input.
    """
    if out_dir:
        outdir.check(out_dir, "analyze", given_paths(model))
    design = Design.load(model, constraints_file, target=target, cache_dir=cache_dir, progress=not quiet,
                         annotate=annotate_file, batch=batch, prompt_len=prompt_len, context_len=context_len,
                         tp=tp, **({"materialize": True} if materialize else {}))
    analysis = design.analyze()
    facts = design_facts(design, analysis)
    if as_json:
        click.echo(to_json(analysis), nl=False)
    else:
        click.echo(report_timing(analysis, max_paths=max_paths, fold=True, facts=facts))
        click.echo(report_qor(analysis, facts=facts))
    if out_dir:
        record = design_record(
            model, constraints_file, target, cache_dir, workload=dict(batch=batch, prompt_len=prompt_len,
                                                                      context_len=context_len),
            annotate=annotate_file, netlist=design.netlist,
            library=(design.library.name if Path(design.library.path).parent.name == "libs"
                     else str(design.library.path)), materialize=materialize)
        with outdir.replace(out_dir, "analyze", design.netlist.name, model=model,
                            inputs=outdir.input_paths(design.netlist.provenance), progress=not quiet) as staged:
            written = write_reports(analysis, staged.path, facts=facts) + [
                write_atomic(staged.path / DESIGN_FILE, json.dumps(record, indent=1, allow_nan=False) + "\n")]
            written.append(write_html(staged.path))
        for path in written:
            if not quiet:
                click.echo(f"[softsyn] wrote {staged.out / path.relative_to(staged.path)}", err=True)
    violated = analysis.violating_paths > 0 or (analysis.area.slack is not None and analysis.area.slack < 0)
    sys.exit(1 if violated else 0)


@main.command("compile")
@click.argument("model")
@click.option("-c", "--constraints", "constraints_file", type=click.Path(dir_okay=False),
              help="constraints.yaml: clocks, path groups, accuracy budget, precision, dont_touch...")
@click.option("--effort", default="low", show_default=True, type=click.Choice(list(EFFORTS)),
              help="pass script to run (see `softsyn passes`).")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="output DIR (new, empty, or an earlier softsyn output; replaced atomically, files softsyn "
                   "did not write are kept).")
@click.option("--target", help=TARGET_HELP)
@click.option("--cache-dir", type=click.Path(file_okay=False), help="export cache (default $SOFTSYN_CACHE, else $XDG_CACHE_HOME/softsyn, else ~/.cache/softsyn).")
@click.option("--plan", is_flag=True,
              help="weightless compile: the design, reports, netlist.json and runtime settings, no model.onnx "
                   "(what a model too big to materialise on this machine gets).")
@click.option("--all-logits", is_flag=True,
              help="keep every position's logits at prefill (kv_layout's last_token_logits off: the lm_head then "
                   "runs on the whole prompt).")
@click.option("--tp", type=TPDegree(), help=TP_HELP)
@click.option("--json", "as_json", is_flag=True,
              help="print one JSON object on stdout (SI units): the output directory, whether a constraint is "
                   "violated, the compile log's rows and the final analysis, instead of the log and QoR.")
@click.option("-q", "--quiet", is_flag=True, help="no progress messages on stderr.")
@help_with(efforts=effort_help())
def compile_cmd(model, constraints_file, effort, out_dir, target, cache_dir, plan, all_logits, tp, as_json, quiet):
    """Compile MODEL for its target: run the effort's passes, emit an ONNX model and runtime settings.

    \b
    Effort scripts (passes run top to bottom, re-timed after each):
    {efforts}

    \b
    Writes, atomically (a failed or killed compile leaves DIR as it was):
      DIR/model.onnx (+ .data)   the compiled model, onnx.checker-clean
      DIR/netlist.json           every cell: hierarchy, op, library cell, precision,
                                 delay per group
      DIR/runtime/session.json   ORT providers and options, IO dtypes, scenario dims,
                                 KV ports, the fp32 reference `softsyn verify` uses
      DIR/genai_config.json      a decoder's onnxruntime-genai configuration
      DIR/reports/*.rpt          timing, QoR, area, constraint, fusion reports
      DIR/analysis.json          the analysis `softsyn report` re-renders
      DIR/compile.log            one row per step: elapsed wall time, phase, WNS,
                                 TNS, area, worst group (compile_log.json: the same)
      DIR/reports/report.html    the design at a glance (`softsyn report html DIR`)
      DIR/softsyn-manifest.json  what softsyn wrote (only those files are replaced)
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
    started = app.STARTED if app.STARTED is not None else time.perf_counter()
    out = outdir.check(out_dir, "compile", given_paths(model))
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
                                    options=options, started=started)
    violated = analysis.violating_paths > 0 or (analysis.area.slack is not None and analysis.area.slack < 0)
    if as_json:
        click.echo(json.dumps({"schema": "softsyn.compile/1", "directory": str(path), "violated": violated,
                               "compile_log": json.loads((path / "compile_log.json").read_text()),
                               "analysis": json.loads(to_json(analysis))}, indent=1, allow_nan=False))
    else:
        click.echo((path / "compile.log").read_text())
        click.echo((path / "reports" / "qor.rpt").read_text())  # as written: its advice knows the compile's facts
    if not quiet:
        click.echo(f"[softsyn] wrote {path}", err=True)
    if violated and not as_json:  # the best design found is written; what violates, and what would close it
        click.echo((path / "reports" / "constraint.rpt").read_text())
    sys.exit(1 if violated else 0)


def _plan_instead(model: str, quiet: bool) -> bool:
    """Whether a model without weights of its own is too big to materialise here (then it gets the plan)."""
    with progress.step(f"{model}: sizing its weights", enabled=not quiet):
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
@click.option("--json", "as_json", is_flag=True,
              help="print the checks as JSON on stdout (per scenario and output; an undefined error is null).")
@click.option("-q", "--quiet", is_flag=True, help="no progress messages on stderr.")
def verify(directory, seed, cache_dir, cpu, as_json, quiet):
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
    result = run_verify(directory, seed=seed, cache_dir=cache_dir, cpu=cpu, progress=not quiet)
    if as_json:
        click.echo(json.dumps(json_nulls({"schema": "softsyn.verify/1", "directory": str(directory),
                                          "violations": result.violations, **asdict(result)}),
                              indent=1, allow_nan=False))
    else:
        click.echo(report_verify(result, directory), nl=False)
    sys.exit(1 if result.violations else 0)


@main.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="ONNX Runtime execution provider to measure on.")
@click.option("--runs", default=20, show_default=True, type=click.IntRange(min=1),
              help="timed runs per path group (median and p90 reported).")
@click.option("--warmup", default=3, show_default=True, type=click.IntRange(min=0),
              help="warm-up block: untimed runs before each timed turn, in blocks of this many until one is within 5 % of the block before.")
@click.option("--profile-runs", type=click.IntRange(min=1), help="profiled runs per group (default min(runs, 10), at least 3).")
@click.option("--group", "groups", multiple=True, help="only this path group (repeatable).")
@click.option("--top", default=10, show_default=True, type=click.IntRange(1, 100), help="rows per error table.")
@click.option("-o", "--annotation", "annotation_out", type=click.Path(dir_okay=False),
              help="where to write the back-annotation (default DIR/signoff/annotation.json).")
@click.option("--json", "as_json", is_flag=True,
              help="print the sign-off as JSON on stdout (signoff.json's content) instead of the report.")
@click.option("-q", "--quiet", is_flag=True, help="no progress messages on stderr.")
def signoff(directory, provider, runs, warmup, profile_runs, groups, top, annotation_out, as_json, quiet):
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
      softsyn analyze zoo:qwen3-tiny -c constraints/cpu-tiny.yaml \\
          --annotate out/tiny/signoff/annotation.json

    Exit status: 0 when every group's measured time meets its clock, 1 when
    a measured group violates, 2 on bad input.
    """
    out = outdir.check(directory, "signoff")
    annotation = Path(annotation_out).absolute() if annotation_out else out / "signoff" / "annotation.json"
    inside = out in annotation.parents
    with outdir.replace(out, "signoff", "", progress=not quiet) as staged:
        result = run_signoff(directory, provider=provider, runs=runs, warmup=warmup, profile_runs=profile_runs,
                             annotation_out=staged.path / annotation.relative_to(out) if inside else annotation,
                             progress=not quiet, groups=list(groups) or None)
        result.annotation_file = str(annotation)
        text = report_signoff(result, top=top)
        click.echo(json.dumps(result.to_dict(), indent=1, allow_nan=False) if as_json else text)
        written = [out / p.relative_to(staged.path) for p in write_results(result, staged.path, text)]
    for path in written + [annotation]:
        if not quiet:
            click.echo(f"[softsyn] wrote {path}", err=True)
    sys.exit(1 if result.violated else 0)


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
    result = run_artifact(directory, RunSettings(prompt_len, gen, provider, runs, warmup, seed), show_progress=not quiet)
    click.echo(run_json(result) if as_json else report_run(result), nl=False)
