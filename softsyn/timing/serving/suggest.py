"""Suggestions for a violated serving check, each quantified by re-running the simulation with one knob changed:
the arrival rate (the highest at which the latency checks meet, by bisection over the same seeded requests, their
arrival times scaled), max_batch (the value nearest the given one that meets every check, else the best one tried), weight precision (the
step table re-timed with the design's weight matmuls as int8/int4 MatMulNBits: the STA's what-if, an estimate),
KV dtype int8 (half or a quarter of the KV bytes per token: more sequences admitted under the same budget), and the
engine's steps (the smallest uniform speed-up of every step, decode and prefill alike, at which every check meets: the
target the compile loop's weight map is given, passes.optimize.serving_target), and, when the host model charges a
prompt length's first run, every length prefilled at load (serving.warm_prompts) and prompts padded to a few
bucket lengths (serving.prompt_buckets)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from softsyn.constraints.serving import Serving
from softsyn.results.serving import ServingSuggestion
from softsyn.timing.serving.checks import checks, summary
from softsyn.timing.serving.simulate import Scheduler, simulate
from softsyn.timing.serving.steps import StepTable
from softsyn.timing.serving.workload import Requests, requests
from softsyn.units import fmt_time


@dataclass(frozen=True)
class Knobs:
    """What the suggestions may change: the table at another weight precision (None: the analysis cannot re-time
    it, and why), the KV budget at int8 (None: no area_constraint, or the KV cache is int8 or smaller already)."""

    retime: Callable[[str], StepTable | None]  # precision -> the step table with weights at it (None: not timed)
    precision_why: str  # why a precision is not quantified ("" when it is)
    kv_int8_tokens: float | None
    kv_why: str


def _run(serving: Serving, reqs: Requests, table: StepTable, sched: Scheduler) -> tuple[bool, str, float]:
    """(every check met, the summary, the worst relative slack) of one re-run."""
    outcome = simulate(reqs, table, sched)
    rows = checks(serving, outcome)
    worst = min((c.slack / c.required for c in rows), default=0.0)
    return all(c.met for c in rows), summary(rows, outcome), worst


RATE_STEPS = 6  # bisection steps: the rate to within 1/64 of the given one


def arrival_rate(serving: Serving, table: StepTable, sched: Scheduler) -> ServingSuggestion | None:
    """The highest arrival rate (bisected below the given one) at which every latency check meets; None without a
    latency budget. Throughput is left out: it rises with the rate, so no single highest rate holds for it."""
    latency = replace(serving, throughput_min=None)
    if latency.ttft_p50 is latency.ttft_p99 is latency.tpot_p50 is latency.tpot_p99 is None:
        return None
    low, high, best = 0.0, serving.arrival_rate, None
    for _ in range(RATE_STEPS):
        mid = (low + high) / 2
        met, text, _ = _run(latency, requests(replace(serving, arrival_rate=mid)), table, sched)
        if met:
            low, best = mid, text
        else:
            high = mid
    if best is None:
        return ServingSuggestion("rate", f"arrival_rate {serving.arrival_rate:g}/s -> below {high:.3g}/s",
                                 "no rate tried meets the latency checks (simulated, est)", False)
    return ServingSuggestion("rate", f"arrival_rate {serving.arrival_rate:g}/s -> {low:.3g}/s (the highest within "
                             f"{serving.arrival_rate / 2 ** RATE_STEPS:.2g}/s meeting the latency checks)", best, True)


def max_batch(serving: Serving, reqs: Requests, table: StepTable, sched: Scheduler) -> ServingSuggestion:
    tried = sorted({1 << k for k in range(12) if (1 << k) <= table.batches[-1]} - {sched.max_batch},
                   key=lambda n: (abs(n - sched.max_batch), n))
    best = None
    for n in tried:
        met, text, worst = _run(serving, reqs, table, replace(sched, max_batch=n))
        if met:
            return ServingSuggestion("max_batch", f"max_batch {sched.max_batch} -> {n}", text, True, n)
        if best is None or worst > best[2]:
            best = (n, text, worst)
    if best is None:
        return ServingSuggestion("max_batch", "max_batch: no other value timed", "not quantified", None)
    return ServingSuggestion("max_batch", f"max_batch {sched.max_batch} -> {best[0]} (best of "
                             f"{', '.join(map(str, sorted(tried)))}; none meets)", best[1], False, best[0])


def precision(serving: Serving, reqs: Requests, base: StepTable, knobs: Knobs,
              sched: Scheduler) -> list[ServingSuggestion]:
    if knobs.precision_why:
        return [ServingSuggestion("precision", "weights int8/int4", f"not quantified: {knobs.precision_why}", None)]
    out = []
    for p in ("int8", "int4"):
        table = knobs.retime(p)
        if table is None:
            out.append(ServingSuggestion("precision", f"weights {p}", "not quantified: the library cannot time it",
                                         None))
            continue
        met, text, _ = _run(serving, reqs, table, sched)
        n, past = sched.max_batch, serving.prompt_len.p50 + serving.gen_len.p50 // 2
        step = (f"decode at batch {n}, past {past}: {fmt_time(base.decode(n, past), 'ms', 3)} -> "
                f"{fmt_time(table.decode(n, past), 'ms', 3)}")
        out.append(ServingSuggestion("precision", f"weight matmuls {p} (MatMulNBits what-if; {step})", text, met))
    return out


def kv_dtype(serving: Serving, reqs: Requests, table: StepTable, knobs: Knobs,
             sched: Scheduler) -> ServingSuggestion:
    if knobs.kv_int8_tokens is None:
        return ServingSuggestion("kv_dtype", "kv_cache.dtype int8", f"not simulated: {knobs.kv_why}", None)
    met, text, _ = _run(serving, reqs, table, replace(sched, kv_tokens=knobs.kv_int8_tokens))
    return ServingSuggestion("kv_dtype", f"kv_cache.dtype int8 (KV budget {sched.kv_tokens:,.0f} -> "
                             f"{knobs.kv_int8_tokens:,.0f} tokens)", text, met)


SCALE_FLOOR = 0.25  # the fastest engine the steps suggestion tries: every step at a quarter of its time
SCALE_STEPS = 5  # bisection steps over [SCALE_FLOOR, 1]: the scale to within 0.025


def steps(serving: Serving, reqs: Requests, table: StepTable, sched: Scheduler) -> ServingSuggestion:
    """The largest uniform scale of every step time (decode and prefill, host work unchanged) at which every check
    meets, bisected over [SCALE_FLOOR, 1]; its `scale` is that factor (None when even the floor does not meet: the
    load, the KV budget or the host binds, not the steps)."""
    met, text, _ = _run(serving, reqs, table.scaled(SCALE_FLOOR, SCALE_FLOOR), sched)
    if not met:
        return ServingSuggestion("steps", f"every step x{SCALE_FLOOR:g} (decode and prefill)",
                                 f"still violated: {text}; faster steps alone do not meet it", False)
    low, high, best = SCALE_FLOOR, 1.0, text
    for _ in range(SCALE_STEPS):
        mid = (low + high) / 2
        met, text, _ = _run(serving, reqs, table.scaled(mid, mid), sched)
        if met:
            low, best = mid, text
        else:
            high = mid
    return ServingSuggestion("steps", f"every step x{low:.3f} (decode and prefill {(1 - low) * 100:.0f} % faster: "
                             "the weight map's target in the compile loop)", best, True, scale=low)


def warm_prompts(serving: Serving, reqs: Requests, table: StepTable, sched: Scheduler) -> ServingSuggestion | None:
    """Every prompt length prefilled once at load (serving.warm_prompts), when the host model charges a first run
    at a new length and the engine does not warm them yet; None otherwise."""
    if serving.warm_prompts or sched.host is None or not sched.host.first_shape:
        return None
    longest = int(reqs.prompt.max())
    lengths = frozenset(sched.prefill_len(n) for n in range(1, longest + 1))
    met, text, _ = _run(serving, reqs, table, replace(sched, warm=lengths))
    load = sum(table.prefill(n) for n in lengths) + len(lengths) * sched.host.first_shape  # each paid once at load
    return ServingSuggestion("warm_prompts", f"serving.warm_prompts: true ({len(lengths)} prefill lengths up to "
                             f"{max(lengths)} run at load, {fmt_time(load, 's', 1)} est; "
                             f"{fmt_time(sched.host.first_shape, 'ms', 2)} per first-met length saved)", text, met)


BUCKET = 64  # tokens: the prompt_buckets suggestion's padding (a few percent of a typical prompt's compute)


def prompt_buckets(serving: Serving, reqs: Requests, table: StepTable, sched: Scheduler) -> ServingSuggestion | None:
    """Prompts padded to multiples of BUCKET tokens (serving.prompt_buckets: fewer prefill shapes, each met first
    once), when the host model charges a first run at a new length and the block pads none yet; None otherwise."""
    if serving.prompt_buckets or sched.host is None or not sched.host.first_shape:
        return None
    met, text, _ = _run(serving, reqs, table, replace(sched, bucket=BUCKET))
    return ServingSuggestion("prompt_buckets", f"serving.prompt_buckets: {BUCKET} (compiled with it: prompts "
                             f"right-padded to multiples of {BUCKET} tokens, logits at each row's last real token)",
                             text, met, BUCKET)


def suggestions(serving: Serving, reqs: Requests, table: StepTable, sched: Scheduler,
                knobs: Knobs) -> list[ServingSuggestion]:
    rate = arrival_rate(serving, table, sched)
    first = [s for s in (warm_prompts(serving, reqs, table, sched), prompt_buckets(serving, reqs, table, sched)) if s]
    return [*([rate] if rate is not None else []), max_batch(serving, reqs, table, sched),
            *precision(serving, reqs, table, knobs, sched), kv_dtype(serving, reqs, table, knobs, sched),
            *first, steps(serving, reqs, table, sched)]
