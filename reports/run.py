"""report_run: what `softsyn run` measured (TTFT, TPOT, tokens/s), with what it covers; `run_json` the same as JSON.

Renders a softsyn.flow.run.RunResult; the TTFT/TPOT table is column data (RUN_COLUMNS), SI values converted
when printed.
"""
from __future__ import annotations

import json

from reports.columns import RUN_COLUMNS
from reports.common import INDENT, Table

KV_TEXT = {"shared": "one max_length buffer per layer, past and present bound to it, updated in place",
           "grown": "present of each step bound as the next step's past (the graph grows its cache)",
           "static": "one max_length buffer per layer, written in place by each step (a torch package)"}


def run_table(result) -> Table:
    data = result.to_dict()
    rows = []
    for key, interval in (("ttft", f"prefill of {result.settings.prompt_len} tokens -> first token"),
                          ("tpot", "one decode step -> the next token")):
        stats = data[key]
        if stats is not None:
            rows.append({"metric": key.upper(), "median": stats["median"], "p90": stats["p90"], "min": stats["min"],
                         "samples": stats["samples"], "interval": interval})
    return Table(RUN_COLUMNS, tuple(rows))


def report_run(result) -> str:
    data, s = result.to_dict(), result.settings
    table = run_table(result)
    kv = KV_TEXT[result.kv] + (f" ({result.max_length} positions)" if result.max_length else "")
    lines = [f"softsyn run: {result.directory} (design {result.design}) on {result.execution_provider}, {result.device}",
             f"Date: {result.date}",
             f"Workload: batch 1, prompt {s.prompt_len} seeded random token ids (seed {s.seed}), {s.gen} tokens "
             f"generated greedily; {s.runs} timed run{'s' if s.runs != 1 else ''} after {s.warmup} untimed warm-up",
             f"KV cache: {kv}; CUDA graphs {'on' if result.cuda_graph else 'off'}",
             *([f"States: {result.states} conv/recurrent state ports (a hybrid decoder's linear-attention layers), "
                "two buffers each, zeroed before each prompt: a step reads one and writes the other"]
               if result.states else []),
             *([f"CPU view: {result.viewed} GroupQueryAttention nodes with their q/k norms moved out (what only GPU "
                "kernels run; the cuda artifact's CPU equivalent, as verify runs it)"] if result.viewed else []),
             f"Measured: {data['interval']}", "", "Times in ms:",
             INDENT + table.header(), INDENT + table.dashes(),
             *(INDENT + line for line in table.lines()), ""]
    for key, what in (("tokens_per_s", f"{s.gen} tokens / (TTFT + {s.gen - 1} decode steps)"),
                      ("decode_tokens_per_s", "decode steps / their time, prefill left out")):
        stats = data[key]
        label = "tokens/s" if key == "tokens_per_s" else "decode tokens/s"
        lines.append(f"{label + ':':<17}{stats['median']:>10.1f} median over {stats['samples']} runs  ({what})"
                     if stats else f"{label + ':':<17}{'n/a':>10}  (one token generated: no decode step)")
    lines.append(f"tokens: {' '.join(map(str, data['tokens'][:16]))}{' ...' if len(data['tokens']) > 16 else ''}"
                 + ("" if data["tokens_same_every_run"] else "  (NOT the same in every run)"))
    return "\n".join(lines) + "\n"


def run_json(result) -> str:
    return json.dumps(result.to_dict(), indent=1, allow_nan=False) + "\n"
