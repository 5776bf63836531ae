"""The tool commands: report (re-render a directory's reports), passes (the registered passes and effort scripts),
characterize (measure a library)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from softsyn import outdir
from softsyn.cli.app import ANALYSIS_FILE, main
from softsyn.errors import SoftsynError
from passes import EFFORTS, load_all
from reports import REPORTS, from_json, to_json
from reports.html import HTML_FILE, write_html
from reports.pareto import read_pareto, report_pareto, with_peers, write_files
from softsyn.results.pareto import peer_points
from reports.suggest import saved_facts
from softsyn.library.collectives import collective_cells
from softsyn.characterize.plan import characterize as run_characterize, list_cells, unmatched_cells


@main.command()
@click.argument("kind", type=click.Choice(["timing", "qor", "area", "constraint", "json", "html", "pareto"]))
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--group", help="only this path group (timing).")
@click.option("--max-paths", default=1, show_default=True, type=click.IntRange(1, 10), help="paths per group (timing).")
@click.option("--fold/--no-fold", default=True, show_default=True,
              help="fold repeated layers (model.layers.* x28) into one row (timing).")
@click.option("--digits", default=3, show_default=True, type=click.IntRange(0, 9), help="significant digits of times.")
@click.option("--peers", metavar="FILE", help="pareto: other tools' models on the same axes (peers.json, as "
                                              "bench/compare_peers.py writes it); replaces earlier peers.")
def report(kind, directory, group, max_paths, fold, digits, peers):
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
      pareto      the compile loop's latency-error front (reports/pareto.rpt); with
                  --peers FILE, re-rendered (.rpt, .json, report.html) with those peers
    DIRECTORY is an `analyze -o` or `compile -o` output directory (holding analysis.json).

    \b
    Example:
      softsyn report timing out/tiny --group decode --max-paths 3 --no-fold
      softsyn report pareto out/tiny --peers peers.json
    """
    if peers is not None and kind != "pareto":
        raise SoftsynError(f"--peers goes with KIND pareto (not {kind}): softsyn report pareto {directory} --peers FILE")
    if kind == "pareto":
        click.echo(pareto_report(directory, peers), nl=False)
        return
    if kind == "html":
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
    facts = saved_facts(directory)  # the advice agrees with what the command that wrote DIR knew
    if kind == "json":
        click.echo(to_json(analysis))
    elif kind == "timing":
        click.echo(REPORTS["timing"](analysis, group=group, max_paths=max_paths, fold=fold, significant_digits=digits,
                                     facts=facts))
    else:
        click.echo(REPORTS[kind](analysis, facts=facts))


def pareto_report(directory, peers: str | None) -> str:
    """DIRECTORY's pareto.rpt; with `peers`, the front re-rendered with them (pareto.rpt, pareto.json, report.html)."""
    out = outdir.check(directory, "report")
    points = read_pareto(out)
    if peers is None:
        return report_pareto(points)
    try:
        data = json.loads(Path(peers).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SoftsynError(f"{peers}: not a readable peers file ({' '.join(str(exc).split())[:200]}); "
                           "bench/compare_peers.py --peers-json FILE writes one") from None
    points = with_peers(points, *peer_points(data, peers))
    with outdir.replace(out, "report", "", progress=False) as staged:
        write_files(points, staged.path)
        write_html(staged.path, out)
    return report_pareto(points)


@main.command("passes")
def list_passes():
    """List the registered passes and the effort scripts that run them."""
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
              help="(cuda) graph tables: MatMul, MatMulNBits, MatMulBlockQuantizedFp8Weight and attention at one row, "
                   "and a decode step's small nodes (norms, Split, Mul, QuickGelu, Slice, ReduceSum, Gather) at decode "
                   "sizes, timed as CUDA graph replays: what a captured decode step's kernels cost (no host share).")
@click.option("--again", is_flag=True,
              help="measure the --cells given again though FILE has them (after a recipe change); each entry is "
                   "replaced when its new measurement is written.")
@click.option("--list", "list_only", is_flag=True, help="list the cells and their grid/hold-out point counts; measure nothing.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="library YAML to write (resumed if it exists).")
@click.option("-q", "--quiet", is_flag=True, help="no progress on stderr.")
def characterize(runtime, provider, cells, quick, note, cuda_graph, again, list_only, output, quiet):
    """Measure a library's delay tables on this machine's runtime and device.

    \b
    For every cell the provider runs (MatMul/Gemm at each precision it
    computes in, MatMulNBits int4/int8 at block 32/64/128, on CUDA
    MatMulBlockQuantizedFp8Weight fp8 at the same blocks, DequantizeLinear
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
      softsyn characterize --provider cuda --graph -o h200-ort-cuda.yaml   # + CUDA-graph tables
      # on a multi-GPU host: the collectives, one process per GPU (NCCL)
      softsyn characterize --provider cuda -o h200-nccl.yaml \\
          --cells 'AllReduce*,AllGather*,ReduceScatter*' 
    """
    if cells is not None:
        if not cells.strip(", "):
            raise SoftsynError("characterize --cells: empty; give comma-separated globs on OP or OP.PRECISION "
                               "(see characterize --list)")
        unmatched = [p for p in unmatched_cells(provider, cells, cuda_graph) if cuda_graph or not collective_cells(p)]
        if unmatched:
            raise SoftsynError(f"characterize --cells {cells!r}: {', '.join(unmatched)} names no cell on "
                               f"--provider {provider}{' --graph' if cuda_graph else ''}; valid: globs on OP or "
                               "OP.PRECISION such as MatMul*, Softmax.fp32 (characterize --list shows them)")
    if list_only:
        rows = list_cells(provider, quick, cells, cuda_graph)
        for name, grid, hold in rows:
            click.echo(f"{name:<48} {grid:>5} grid + {hold:>3} hold-out points")
        click.echo(f"{len(rows)} cells, {sum(g + h for _, g, h in rows)} points")
        return
    if not output:
        raise SoftsynError("characterize: -o FILE is required (the library YAML to write or resume)")
    if again and not cells:
        raise SoftsynError("characterize --again measures the --cells given again: name them with --cells")
    argv = " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("softsyn") else None
    command = "softsyn " + (argv or f"characterize --runtime {runtime} --provider {provider}"
                            + (f" --cells '{cells}'" if cells else "") + (" --quick" if quick else "") + f" -o {output}")
    collectives = collective_cells(cells)
    if collectives:  # AllReduce / AllGather / ReduceScatter: one process per device, a collective library
        if len(collectives) != len([p for p in cells.split(",") if p.strip()]):
            raise SoftsynError(f"characterize --cells {cells!r}: collectives ({', '.join(collectives)}) are measured "
                               "apart from kernel cells (their own library, one process per device); give them alone")
        # deferred: torch.distributed, seconds to import, only for characterising collectives
        from softsyn.characterize.collectives import characterize_collectives

        path = characterize_collectives(provider, output, collectives, quick=quick, progress=not quiet,
                                        command=command)
        click.echo(f"[softsyn] wrote {path}", err=True)
        return
    run_characterize(provider, output, cells=cells, quick=quick, progress=not quiet, command=command, note=note,
                     cuda_graph=cuda_graph, again=again)
