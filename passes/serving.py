"""serving (effort medium and up, after optimize): the engines' max_batch chosen against the serving checks.

A constraints file's `serving:` block gives a load (arrival rate, prompt and output lengths), the engines' batching
(max_batch, batch_timeout) and budgets (TTFT p50/p99, TPOT p99, throughput) that softsyn.timing.serving checks by
simulating continuous batching over the design's timed steps. serving.max_batch is where the search starts, not a
budget: when a check is violated, this pass takes the max_batch the simulation's suggestion found meeting every check
(the value nearest the given one among powers of two within the step table), through Design.choose_max_batch, so the
analysis, report_qor and the emitted engine settings (max_num_seqs, cuda-graph capture sizes) use it. When no value
meets every check the design keeps the given max_batch, and the note names the best one tried and what it gave;
the other suggestions (arrival rate, weight precision, KV dtype) stay in report_qor for the user. The weight map and
the KV dtype are the optimize pass's moves, judged on the path groups' slack (the KV dtype on the serving checks
too: passes.optimize.kv_moves); everything here is simulated over step times the library estimates (est).
"""
from __future__ import annotations

from dataclasses import dataclass

from passes import PassReport, PassResult, register


@dataclass
class ServingReport(PassReport):
    given: int  # serving.max_batch in the constraints
    chosen: int | None  # what the pass set (None: the given one kept)
    line: str  # what it did, or why not

    def log_notes(self) -> list[str]:
        return [self.line]

    def artifact_notes(self) -> list[str]:
        return [self.line]


@register("serving", "serving checks: the engines' max_batch the continuous-batching simulation meets them with")
def run(design) -> PassResult:
    serving = design.constraints.serving
    if serving is None:
        return PassResult({}, None)
    analysis = design.analyze()
    result = analysis.serving
    if result is None:
        return PassResult({}, None)
    given = serving.max_batch
    if not result.violated:
        line = f"serving: every check met at max_batch {design.serving.max_batch} (simulated, est)"
        return PassResult({}, ServingReport(given, None, line))
    suggestion = next((s for s in result.suggestions if s.knob == "max_batch"), None)
    if suggestion is None or suggestion.value is None:
        line = f"serving: violated at max_batch {given}, and no other max_batch was timed; see report_qor's suggestions"
        return PassResult({}, ServingReport(given, None, line))
    if not suggestion.meets:
        line = (f"serving: violated at max_batch {given}; kept: no max_batch tried meets every check (best: "
                f"{suggestion.change}: {suggestion.result}); see report_qor's other suggestions")
        return PassResult({}, ServingReport(given, None, line))
    # the suggestion is the same simulation at that max_batch: the compile's re-timing after this pass shows it again
    design.choose_max_batch(suggestion.value)
    line = (f"serving: max_batch {given} -> {suggestion.value} (serving.max_batch {given} violated; simulated, est): "
            f"{suggestion.result}")
    return PassResult({"max_batch": 1}, ServingReport(given, suggestion.value, line))
