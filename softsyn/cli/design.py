"""The design commands' specs: analyze, compile, verify, signoff, run (the flow a user takes on one model), their
options and help. Each runs its body in softsyn.cli.design_run, imported only then (softsyn.cli.common.perform)."""
from __future__ import annotations

import click

from softsyn.cli.common import TP_HELP, TPDegree, effort_help, help_with, perform
from softsyn.constraints.reader import MAX_INT
from softsyn.library import shipped_libraries
from passes import EFFORTS

SEED_MAX = 2**32 - 1  # numpy seeds are non-negative; one 32-bit word keeps them what other tools accept too


TARGET_HELP = (f"library name or .yaml path; overrides the constraints' target (shipped: "
               f"{', '.join(shipped_libraries())}). With neither, the shipped CPU library whose device is this "
               "machine's, else the closest, named on stderr. cpu-torch: a PyTorch AOTInductor package (DIR/model.pt2) of "
               "a zoo or Hugging Face decoder, timed with cpu-ort and measured.")


@click.command()
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
def analyze(**options):
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
    perform("softsyn.cli.design_run:analyze", options)


@click.command("compile")
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
def compile_cmd(**options):
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
    perform("softsyn.cli.design_run:compile_cmd", options)


@click.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, SEED_MAX),
              help="seed of the scenario inputs.")
@click.option("--cache-dir", type=click.Path(file_okay=False),
              help="export cache, to re-export the reference if its recorded ONNX file is gone.")
@click.option("--cpu", is_flag=True, help="run the compiled model on the CPU provider, whatever session.json says.")
@click.option("--locate", is_flag=True,
              help="on a violation of a GPU run: run the compiled model node by node on its provider and on the CPU, "
                   "and name the nodes where the GPU's values depart while their inputs agree.")
@click.option("--json", "as_json", is_flag=True,
              help="print the checks as JSON on stdout (per scenario and output; an undefined error is null).")
@click.option("-q", "--quiet", is_flag=True, help="no progress messages on stderr.")
def verify(**options):
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
    perform("softsyn.cli.design_run:verify", options)


@click.command()
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
def signoff(**options):
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
    perform("softsyn.cli.design_run:signoff", options)


@click.command("run")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--prompt-len", default=128, show_default=True, type=click.IntRange(min=1), help="prompt tokens (prefill).")
@click.option("--gen", default=32, show_default=True, type=click.IntRange(min=1), help="tokens to generate.")
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), help="execution provider (default: runtime/session.json's).")
@click.option("--runs", default=3, show_default=True, type=click.IntRange(min=1), help="timed generations.")
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(min=0),
              help="untimed generations first (each reported apart; the first runs the prompt length cold).")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, SEED_MAX),
              help="seed of the random prompt ids.")
@click.option("--json", "as_json", is_flag=True, help="print the numbers as JSON (SI units) instead of the report.")
@click.option("-q", "--quiet", is_flag=True, help="no progress line on stderr.")
def run_cmd(**options):
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
    perform("softsyn.cli.design_run:run_cmd", options)
