"""The `softsyn` command line: each command reads like a man page under --help."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from softsyn import __version__
from softsyn.errors import SoftsynError

MARKER = "analysis.json"  # a directory holding this file is softsyn output and may be rewritten


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="softsyn")
def main():
    """softsyn - timing-driven synthesis of neural-network inference.

    \b
    Reads a model into a netlist of cells, binds every cell to a kernel
    library characterised on a runtime and device, and times every path group
    (prefill/TTFT, decode/TPOT, encoder...) against the latency budget in a
    constraints file, printing Design Compiler / PrimeTime style reports.

    \b
    MODEL may be a .onnx file, a Hugging Face model folder or config.json, or
    a built-in zoo name: qwen3-tiny, llama-tiny, qwen3-moe-tiny, qwen3-0.6b,
    qwen3-1.7b, qwen3-8b, minilm (optionally prefixed "zoo:").

    \b
    Exit codes: 0 success, 1 timing or area violated, 2 bad input.
    """


@main.command()
@click.argument("model")
@click.option("-c", "--constraints", "constraints_file", type=click.Path(dir_okay=False),
              help="constraints.yaml: clock_period, input/output delays, area_constraint, path_groups...")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False),
              help="write DIR/reports/*.rpt and DIR/analysis.json (an existing DIR must be softsyn output).")
@click.option("--target", help="library name or .yaml path; overrides the constraints' target "
                               "(shipped: cpu-ort, h200-ort-cuda).")
@click.option("--batch", type=click.IntRange(min=1), help="workload batch size (overrides the constraints).")
@click.option("--prompt-len", type=click.IntRange(min=1), help="prefill tokens (overrides the constraints).")
@click.option("--context-len", type=click.IntRange(min=0), help="decode context length (overrides the constraints).")
@click.option("--max-paths", default=1, show_default=True, type=click.IntRange(1, 10),
              help="paths printed per group in the timing report.")
@click.option("--cache-dir", type=click.Path(file_okay=False), help="export cache (default $SOFTSYN_CACHE or ~/.cache/softsyn).")
@click.option("-q", "--quiet", is_flag=True, help="no progress messages on stderr.")
def analyze(model, constraints_file, out_dir, target, batch, prompt_len, context_len, max_paths, cache_dir, quiet):
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
    constraint}.rpt and DIR/analysis.json for `softsyn report`.

    \b
    Examples:
      softsyn analyze zoo:qwen3-tiny -c constraints/cpu-tiny.yaml -o out/tiny
      softsyn analyze zoo:qwen3-8b --target h200-ort-cuda --context-len 4096
      softsyn analyze model.onnx -c constraints/guide-short.yaml

    Exit status: 0 when every group meets its clock and VRAM fits, 1 on a
    violation, 2 on bad input.
    """
    from softsyn.design import Design
    from softsyn.reports import report_qor, report_timing, write_reports

    out = _prepare_out_dir(out_dir) if out_dir else None
    design = Design.load(model, constraints_file, target=target, cache_dir=cache_dir, progress=not quiet,
                         batch=batch, prompt_len=prompt_len, context_len=context_len)
    analysis = design.analyze()
    click.echo(report_timing(analysis, max_paths=max_paths, fold=True))
    click.echo(report_qor(analysis))
    if out is not None:
        for path in write_reports(analysis, out):
            if not quiet:
                click.echo(f"[softsyn] wrote {path}", err=True)
    violated = analysis.violating_paths > 0 or (analysis.area.slack is not None and analysis.area.slack < 0)
    sys.exit(1 if violated else 0)


@main.command()
@click.argument("kind", type=click.Choice(["timing", "qor", "area", "constraint", "json"]))
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
      area        report_area: VRAM by kind and by hierarchy
      constraint  report_constraint -all_violators
      json        the same path objects as JSON (SI units)
    DIRECTORY is an `analyze -o` output directory (holding analysis.json).

    \b
    Example:
      softsyn report timing out/tiny --group decode --max-paths 3 --no-fold
    """
    from softsyn.reports import REPORTS, from_json, to_json

    saved = Path(directory) / MARKER
    if not saved.is_file():
        raise SoftsynError(f"{directory}: no {MARKER} here; run `softsyn analyze MODEL -o {directory}` first")
    try:
        analysis = from_json(saved.read_text())
    except (ValueError, TypeError, KeyError) as exc:
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


def _prepare_out_dir(out_dir: str) -> Path:
    """Refuse to write into a directory the user made for something else."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        raise SoftsynError(f"{out}: exists and is not a softsyn output directory (no {MARKER}); "
                           "choose a new or empty directory so nothing of yours is overwritten")
    return out


def run():
    """Entry point: user errors print one line and exit 2, never a traceback."""
    try:
        main(standalone_mode=False)
    except SoftsynError as exc:
        click.echo(f"softsyn: error: {exc}", err=True)
        sys.exit(2)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("Aborted!", err=True)
        sys.exit(130)


if __name__ == "__main__":
    run()
