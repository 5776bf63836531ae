"""The tool commands' specs: report (re-print a saved analysis), passes (list them), characterize (measure a
library), their options and help. Each runs its body in softsyn.cli.tools_run, imported only then."""
from __future__ import annotations

import click

from softsyn.cli.common import perform


@click.command()
@click.argument("kind", type=click.Choice(["timing", "qor", "area", "constraint", "json", "html", "pareto"]))
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--group", help="only this path group (timing).")
@click.option("--max-paths", default=1, show_default=True, type=click.IntRange(1, 10), help="paths per group (timing).")
@click.option("--fold/--no-fold", default=True, show_default=True,
              help="fold repeated layers (model.layers.* x28) into one row (timing).")
@click.option("--digits", default=3, show_default=True, type=click.IntRange(0, 9), help="significant digits of times.")
@click.option("--peers", metavar="FILE", help="pareto: other tools' models on the same axes (peers.json, as "
                                              "bench/compare_peers.py writes it); replaces earlier peers.")
def report(**options):
    """Re-print a report from a saved analysis, without re-timing.

    \b
    KIND is one of:
      timing      report_timing: full path, Point / Cell / Incr / Path columns (a torch
                  target's artifact: then its paths through its macro cells, measured)
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
    perform("softsyn.cli.tools_run:report", options)


@click.command("passes")
def list_passes(**options):
    """List the registered passes and the effort scripts that run them."""
    perform("softsyn.cli.tools_run:list_passes", options)


@click.command()
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
def characterize(**options):
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
    perform("softsyn.cli.tools_run:characterize", options)
