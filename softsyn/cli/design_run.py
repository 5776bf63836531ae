"""The design commands' bodies: analyze, compile, verify, signoff, run, called with their parsed options by their
specs in softsyn.cli.design (which `softsyn --help` and a command's --help import without these modules)."""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import click

from softsyn import outdir, progress
from softsyn.cli import common
from softsyn.cli.common import given_paths
from softsyn.design import Design
from reports import (report_qor, report_signoff, report_timing, report_torch_signoff, report_verify, to_json,
                     write_reports)
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
from softsyn.runtime.artifact import is_torch_artifact
from reports.run import report_run, run_json


def analyze(model, constraints_file, out_dir, target, batch, prompt_len, context_len, max_paths, cache_dir,
            annotate_file, materialize, tp, as_json, quiet):
    """`softsyn analyze` (its options and help: the spec of the same name in softsyn.cli.design)."""
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
    served = analysis.serving is not None and analysis.serving.violated  # a serving check is a timing check too
    sys.exit(1 if violated or served else 0)


def compile_cmd(model, constraints_file, effort, out_dir, target, cache_dir, plan, all_logits, tp, as_json, quiet):
    """`softsyn compile` (its options and help: the spec of the same name in softsyn.cli.design)."""
    started = common.STARTED if common.STARTED is not None else time.perf_counter()
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
    violated = violated or (analysis.serving is not None and analysis.serving.violated)
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



def verify(directory, seed, cache_dir, cpu, locate, as_json, quiet):
    """`softsyn verify` (its options and help: the spec of the same name in softsyn.cli.design)."""
    if is_torch_artifact(directory):
        result = _torch_flow().verify(directory, seed=seed, cache_dir=cache_dir, progress_on=not quiet)
    else:
        result = run_verify(directory, seed=seed, cache_dir=cache_dir, cpu=cpu, progress=not quiet, locate=locate)
        if locate and result.violations and not result.located:
            click.echo(f"softsyn verify --locate: nothing located: it compares one model's run on a GPU provider with "
                       f"the CPU's (this run: {result.provider.split()[0]}; a composite's blocks are not located)",
                       err=True)
    if as_json:
        click.echo(json.dumps(json_nulls({"schema": "softsyn.verify/1", "directory": str(directory),
                                          "violations": result.violations, **asdict(result)}),
                              indent=1, allow_nan=False))
    else:
        click.echo(report_verify(result, directory), nl=False)
    sys.exit(1 if result.violations else 0)


def signoff(directory, provider, runs, warmup, profile_runs, groups, top, annotation_out, as_json, quiet):
    """`softsyn signoff` (its options and help: the spec of the same name in softsyn.cli.design)."""
    out = outdir.check(directory, "signoff")
    if is_torch_artifact(directory):  # the package itself measured: ORT signoff would time the ONNX reference
        _torch_signoff(out, provider, runs, warmup, as_json, quiet)
        return
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


def _torch_signoff(out: Path, provider, runs, warmup, as_json, quiet) -> None:
    """signoff of a torch target's package (softsyn.flow.torch_signoff): reports/signoff.rpt, signoff/signoff.json."""
    with outdir.replace(out, "signoff", "", progress=not quiet) as staged:
        result = _torch_flow().signoff(out, provider=provider, runs=runs, warmup=warmup, progress=not quiet)
        text = report_torch_signoff(result)
        click.echo(json.dumps(result.to_dict(), indent=1, allow_nan=False) if as_json else text)
        written = [out / p.relative_to(staged.path) for p in write_results(result, staged.path, text)]
    for path in written:
        if not quiet:
            click.echo(f"[softsyn] wrote {path}", err=True)
    sys.exit(1 if result.violated else 0)


def run_cmd(directory, prompt_len, gen, provider, runs, warmup, seed, as_json, quiet):
    """`softsyn run` (its options and help: the spec of the same name in softsyn.cli.design)."""
    settings = RunSettings(prompt_len, gen, provider, runs, warmup, seed)
    run = _torch_flow().run if is_torch_artifact(directory) else run_artifact
    result = run(directory, settings, show_progress=not quiet)
    click.echo(run_json(result) if as_json else report_run(result), nl=False)


def _torch_flow():
    """softsyn.flow.torch_artifact, imported when DIR holds a torch target's artifact (runtime/torch.json)."""
    # deferred: torch takes seconds to import; only a torch target's artifact needs it
    from softsyn.flow import torch_artifact

    return torch_artifact
