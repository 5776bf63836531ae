"""report_run: what `softsyn run` measured (TTFT, TPOT, tokens/s), with what it covers; `run_json` the same as JSON.

Renders a softsyn.flow.run.RunResult; the TTFT/TPOT table is column data (RUN_COLUMNS), the phases of each step
(PHASE_COLUMNS) the rows of softsyn.flow.run_phases that the JSON's `breakdown` holds, SI values converted when
printed.
"""
from __future__ import annotations

import json

from reports.columns import PHASE_COLUMNS, RUN_COLUMNS
from reports.common import INDENT, Table, ftime

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
    return "\n".join(lines + phase_lines(data)) + "\n"


STEP_NAMES = {"ttft": "prefill", "tpot": "decode"}  # the phase rows' step (never "TTFT": scripts key on that row)


def phase_table(data: dict) -> Table:
    """Per step kind: the median-ranked sample's phases (they sum to its total) and each phase's median."""
    rows = [{"step": STEP_NAMES[key], **parts[which]} for key, parts in data["breakdown"].items() if parts
            for which in ("median_sample", "phase_medians")]
    return Table(PHASE_COLUMNS, tuple(rows))


def _ms(seconds: float) -> str:
    return ftime(seconds, "ms", 3)


def _phases(row: dict) -> str:
    return f"run call {_ms(row['run'])} + inputs {_ms(row['inputs'])} + readback {_ms(row['readback'])}"


def _sum_line(label: str, row: dict) -> str:
    return f"{label} {_ms(row['total'])} ms = {_phases(row)} ({row['sample']}, the median-ranked one; measured)"


def phase_lines(data: dict) -> list[str]:
    """Where TTFT and TPOT go: the phase table, the sums, the warm-up's prefills and the signed-off steps."""
    table = phase_table(data)
    if not table.rows:
        return []
    lines = ["", "Where a step's time goes (ms, measured; a sample's phases sum to its total):",
             INDENT + table.header(), INDENT + table.dashes(), *(INDENT + line for line in table.lines())]
    lines += [f"  {name}: {what}" for name, what in data["phases"].items()]
    lines.append(f"Each timed run's TTFT, in order (ms): {' '.join(_ms(t) for t in data['ttft_runs'])}")
    for key in ("ttft", "tpot"):
        if data["breakdown"][key]:
            lines.append(_sum_line(f"{STEP_NAMES[key].capitalize()} ({key.upper()})",
                                   data["breakdown"][key]["median_sample"]))
    for w in data["warmups"]:
        state = ("the first run of this prompt length on the session (cold)" if w["cold"]
                 else "the prompt length had run before")
        lines.append(f"Warm-up {w['warmup']} (untimed, not in TTFT): prefill {_ms(w['ttft'])} ms = {_phases(w)}; {state}")
    if data["cold_ttft"]:
        lines.append("Note: a timed prefill was the first run of its prompt length on the session (--warmup 0): "
                     "TTFT includes that cold run")
    return lines + signed_off_lines(data)


def signed_off_lines(data: dict) -> list[str]:
    """The step times softsyn signoff measured for DIR, against this run's (None where it has none)."""
    info = data.get("signed_off")
    if not info:
        return []
    if info["problem"]:
        return [f"Signed off ({info['file']}): none to compare: {info['problem']}"]
    lines = [f"Signed off ({info['file']}, {info['date']}), its run call's median per group:"]
    for g in info["groups"]:
        key = "ttft" if g["kind"] == "prefill" else "tpot"
        ours = data[key]["median"] if data[key] else None
        parts = data["breakdown"].get(key)
        if g["same_step"] and ours and parts:
            compare = (f"{key.upper()} {_ms(ours)} ms median is {ours / g['median']:.2f}x it, its run call "
                       f"{_ms(parts['phase_medians']['run'])} ms {parts['phase_medians']['run'] / g['median']:.2f}x")
        else:
            compare = (f"not this run's step (prompt {data['prompt_len']}, decode pasts {data['prompt_len']}-"
                       f"{data['prompt_len'] + data['gen'] - 2}): not compared")
        lines.append(f"  {g['description']}: {_ms(g['median'])} ms; {compare}")
    return lines


def run_json(result) -> str:
    return json.dumps(result.to_dict(), indent=1, allow_nan=False) + "\n"
