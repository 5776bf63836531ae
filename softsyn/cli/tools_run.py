"""The tool commands' bodies: report, passes, characterize, called with their parsed options by their specs in
softsyn.cli.tools."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from softsyn import outdir
from softsyn.cli.common import ANALYSIS_FILE
from softsyn.errors import SoftsynError
from passes import EFFORTS, load_all
from reports import REPORTS, from_json, to_json
from reports.html import HTML_FILE, write_html
from reports.macro_timing import report_macro_timing
from reports.pareto import read_pareto, report_pareto, with_peers, write_files
from softsyn.results.pareto import peer_points
from softsyn.runtime.torch_macros import read_library
from reports.suggest import saved_facts
from softsyn.library.collectives import collective_cells
from softsyn.characterize.plan import characterize as run_characterize, list_cells, unmatched_cells


def report(kind, directory, group, max_paths, fold, digits, peers):
    """`softsyn report` (its options and help: the spec of the same name in softsyn.cli.tools)."""
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
        macros = read_library(directory)  # a torch package's macro cells: its paths through them, measured
        if macros is not None:
            click.echo("\n" + report_macro_timing(analysis, macros, group=group, fold=fold, digits=digits), nl=False)
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


def list_passes():
    """`softsyn passes` (its options and help: the spec of the same name in softsyn.cli.tools)."""
    registered = load_all()
    width = max((len(n) for n in registered), default=0)
    for name in sorted(registered):
        click.echo(f"{name:<{width}}  {registered[name].help}")
    for level in EFFORTS.values():
        click.echo("")
        click.echo(f"effort {level.name}: {level.script_text()}")
        for line in [level.help, *level.step_lines()]:
            click.echo(f"  {line}")


def characterize(runtime, provider, cells, quick, note, cuda_graph, again, list_only, output, quiet):
    """`softsyn characterize` (its options and help: the spec of the same name in softsyn.cli.tools)."""
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
