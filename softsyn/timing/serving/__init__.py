"""Serving under load: step times from the STA (steps), requests (workload), a simulation of continuous batching
(simulate), its checks with slack (checks) and quantified suggestions (suggest). `serving_analysis` puts them
together for Design.analyze; everything it reports is simulated over step times estimated from the library."""
from __future__ import annotations

from dataclasses import replace

from softsyn.constraints.serving import Serving
from softsyn.results.serving import ServingHostWork, ServingResult, ServingSchedule
from softsyn.timing.serving.checks import checks, distributions, histogram
from softsyn.timing.serving.host import HostWork, host_work
from softsyn.timing.serving.simulate import Scheduler, simulate
from softsyn.timing.serving.steps import StepTable, TimeAt, step_table
from softsyn.timing.serving.suggest import Knobs, suggestions
from softsyn.timing.serving.workload import cap, requests
from softsyn.units import fmt_time

__all__ = ["serving_analysis", "grid_for", "HostWork", "host_work", "Knobs", "Scheduler", "StepTable", "simulate",
           "requests", "step_table"]

MODEL = ("continuous batching (iteration-level, FCFS admission between steps within max_batch and the KV budget, "
         "whole sequence reserved); decode step at the batch's mean past, a prefill per admitted prompt, a mixed "
         "step = prefills + decode; step times: the STA's critical arrival at those dims from the library, "
         "tabulated and interpolated (est), plus the engine's host work per iteration (Host, below)")
BATCH_HEADROOM = 4  # the table covers batches up to this many times max_batch, for the max_batch suggestion


def grid_for(serving: Serving) -> dict:
    """step_table's limits for a serving block (time_at excluded)."""
    return {"max_batch": serving.max_batch * BATCH_HEADROOM, "max_prompt": cap(serving.prompt_len),
            "max_context": cap(serving.prompt_len) + cap(serving.gen_len)}


def warm_lengths(serving: Serving) -> frozenset[int]:
    """The prefill lengths an engine with serving.warm_prompts runs at load: every one the requests may have (with
    serving.prompt_buckets, the bucket lengths)."""
    return frozenset(serving.padded(n) for n in range(1, cap(serving.prompt_len) + 1))


def _load(serving: Serving, kv_tokens: float | None) -> str:
    p, g = serving.prompt_len, serving.gen_len
    kv = f"KV budget {kv_tokens:,.0f} tokens" if kv_tokens is not None else "KV budget unlimited (no area_constraint)"
    return (f"{serving.requests} requests, Poisson at {serving.arrival_rate:g}/s (seed {serving.seed}); prompt "
            f"p50/p99 {p.p50}/{p.p99}, gen p50/p99 {g.p50}/{g.p99} tokens (lognormal); max_batch {serving.max_batch}, "
            f"batch_timeout {fmt_time(serving.batch_timeout, 'ms', 1)}; {kv}")


def host_result(host: HostWork | None, why: str, outcome, bare) -> tuple[ServingHostWork, list]:
    """The host work's report row and the distributions with their host columns: each percentile with host work
    less the same percentile of `bare`, the simulation without it."""
    rows = distributions(outcome)
    if host is None:
        return ServingHostWork("not modelled", why), rows
    for row, without in zip(rows, distributions(bare)):
        row.host_p50, row.host_p99 = row.p50 - without.p50, row.p99 - without.p99
    share = outcome.host / outcome.busy if outcome.busy else 0.0
    line = f"{host.describe()}; {share:.0%} of the simulated engine's busy time"
    return ServingHostWork("measured", line, iteration=host.iteration, per_sequence=host.per_sequence,
                           prefill=host.prefill, per_token=host.per_token, move=host.move,
                           per_moved_token=host.per_moved_token, share=share, first_shape=host.first_shape), rows


def serving_analysis(serving: Serving, time_at: TimeAt, kv_tokens: float | None, knobs: Knobs,
                     sequence: tuple[int, str] | None = None, host: HostWork | None = None,
                     host_why: str = "") -> ServingResult:
    """Time the step table with `time_at`, simulate `serving`'s load, check it; when a check fails, re-run with each
    of `knobs` changed. `sequence`: (positions the design holds per sequence, the key that set it); longer requests
    are rejected, and a load with rejected requests is violated whatever its latencies. `host`: the engine's host
    work per iteration, added to every step (None: not modelled, `host_why` says why)."""
    table = step_table(time_at, **grid_for(serving))
    reqs = requests(serving)
    sched = Scheduler(serving.max_batch, serving.batch_timeout, kv_tokens, sequence[0] if sequence else None, host,
                      warm=warm_lengths(serving) if serving.warm_prompts else frozenset(), bucket=serving.prompt_buckets)
    outcome = simulate(reqs, table, sched)
    bare = simulate(reqs, table, replace(sched, host=None)) if host is not None else outcome
    host_row, rows_dist = host_result(host, host_why, outcome, bare)
    rows = checks(serving, outcome)
    offered = serving.arrival_rate * float(reqs.gen.mean())
    notes = []
    if serving.throughput_min is not None and serving.throughput_min > offered:
        notes.append(f"throughput.min {serving.throughput_min:,.0f} tok/s is above what the arrivals offer "
                     f"({offered:,.0f} tok/s = rate x mean gen_len): no engine meets it at this arrival rate")
    if serving.prompt_buckets:
        notes.append(f"serving.prompt_buckets {serving.prompt_buckets}: each prompt is prefilled right-padded to a "
                     f"multiple of {serving.prompt_buckets} tokens (its step time, host work and KV reservation "
                     "those of the padded length); the compiled model takes each row's logits at its last real token")
    if outcome.too_long:
        longest = int((reqs.prompt + reqs.gen).max())
        notes.append(f"{outcome.too_long} of {serving.requests} requests need more positions (prompt + gen, up to "
                     f"{longest}) than the design holds per sequence ({sequence[0]}, {sequence[1]}) and were "
                     f"rejected: raise {sequence[1]} to {longest} or shorten serving.prompt_len / gen_len")
    if serving.warm_prompts:
        lengths = warm_lengths(serving)
        every = f"every prompt length 1..{max(lengths)}" if not serving.prompt_buckets else \
            f"the {len(lengths)} bucket lengths {serving.prompt_buckets}..{max(lengths)}"
        first = (host.first_shape or 0.0) if host is not None else 0.0
        load = sum(table.prefill(n) for n in lengths) + len(lengths) * first
        notes.append(f"serving.warm_prompts: the engine prefills {every} once at load, {fmt_time(load, 's', 1)} (est, "
                     "the step table's prefill times and each length's first-run cost summed), so no request pays a "
                     "prompt length's first-run cost")
    if outcome.rejected > outcome.too_long:
        notes.append(f"{outcome.rejected - outcome.too_long} requests never fit the KV budget alone and were rejected")
    result = ServingResult(load=_load(serving, kv_tokens), model=MODEL, requests=serving.requests,
                           completed=outcome.completed, throughput=outcome.throughput, offered=offered,
                           kv_tokens=kv_tokens, rejected=outcome.rejected, checks=rows,
                           distributions=rows_dist, host=host_row,
                           histogram=histogram(outcome),
                           steps=table.points(), notes=notes,
                           schedule=ServingSchedule(outcome.max_step_tokens, list(outcome.decode_batches),
                                                    int((reqs.prompt + reqs.gen).max())))
    if result.violated:
        result.suggestions = suggestions(serving, reqs, table, sched, knobs)
    return result
