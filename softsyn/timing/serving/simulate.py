"""A discrete-event simulation of continuous batching (iteration-level scheduling, as vLLM's scheduler does).

Each iteration: move the requests that have arrived to the waiting queue; admit waiting requests first come,
first served while the running batch is below max_batch and the KV budget holds the request's whole sequence
(prompt + generated tokens, reserved at admission: no preemption); then run one step: every admitted request's
prefill (which yields its first token), then one decode step of the requests already running (one token each).
An idle engine (nothing running) waits for up to batch_timeout after the first waiting request arrived, or until
max_batch requests wait, before it starts, so arrivals close together share the first iteration. A request whose
sequence alone exceeds the KV budget, or is longer than the positions the design holds per sequence (its KV
length: an engine refuses such a prompt or stops at that length), is rejected (counted, never completed). Step times come from a StepTable;
the host work around them, when modelled, from HostWork, including a prompt length's first-run cost the first time
the engine meets that length (Scheduler.warm: lengths it ran before the trace). With Scheduler.bucket a prompt is
prefilled right-padded to a multiple of it (its time, host work and first run those of the padded length, its KV
reservation at least that length). The simulation is deterministic for given requests.

TTFT = first token - arrival; TPOT = (last token - first token) / (generated - 1), per request with more than one
token (vLLM's benchmark definition); e2e = last token - arrival; queue = admission - arrival; throughput =
generated tokens of completed requests / (last completion - first arrival). The shape of the steps it formed is
kept for the engines' settings (softsyn.emit.engine_serving): the most tokens one step carried (the admitted
prompts plus one per running decode) and the distinct decode batch sizes (running sequences in a step).

A stretch of decode-only steps that changes nothing but the running sequences' lengths (no sequence finishes, and
no arrival could be admitted before its last step) is advanced at once in numpy (`_Engine.coast`): the same
floating-point operations in the same order as one step at a time, so every result is identical (tests/timing/
test_serving_fast.py compares both on random traces).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from softsyn.constraints.serving import padded_length
from softsyn.timing.serving.host import HostWork
from softsyn.timing.serving.steps import StepTable
from softsyn.timing.serving.workload import Requests

COAST_MIN = 8  # decode-only steps: a shorter stretch is stepped one at a time (numpy's per-call cost is higher)


@dataclass(frozen=True)
class Scheduler:
    max_batch: int
    batch_timeout: float  # s
    kv_tokens: float | None  # KV budget in tokens; None: unlimited
    max_len: int | None = None  # positions the design holds per sequence (prompt + generated); None: unlimited
    host: HostWork | None = None  # the engine's host work per iteration (softsyn.timing.serving.host); None: none
    warm: frozenset[int] = frozenset()  # prefill lengths the engine ran before the trace (no first-shape cost)
    bucket: int | None = None  # prompts right-padded to a multiple of this many tokens (serving.prompt_buckets)

    def prefill_len(self, prompt: int) -> int:
        """The length a prompt is prefilled at: itself, or padded up to its bucket."""
        return padded_length(prompt, self.bucket)


@dataclass
class Outcome:
    ttft: np.ndarray  # s, per completed request
    tpot: np.ndarray  # s, per completed request with more than one token
    e2e: np.ndarray
    queue: np.ndarray
    completed: int
    rejected: int
    throughput: float
    too_long: int = 0  # of the rejected: longer than Scheduler.max_len  # generated tokens/s
    max_step_tokens: int = 0  # the most tokens one step carried: admitted prompts + running decodes
    busy: float = 0.0  # s the engine ran iterations, host work included
    host: float = 0.0  # s of it host work (Scheduler.host)
    decode_batches: tuple[int, ...] = ()  # distinct decode batch sizes the steps ran, ascending


class Queue:
    """The scheduler's request state and its rules, apart from how a step is timed: arrivals into the waiting queue,
    when an idle engine starts, FCFS admission within max_batch and the KV budget. The simulation's engine and a
    harness that serves the artifact on the wall clock (bench/serving_validate.py) share it, so both admit alike."""

    def __init__(self, reqs: Requests, sched: Scheduler):
        self.reqs, self.sched = reqs, sched
        n = len(reqs.arrival)
        self.first, self.last, self.admitted = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
        self.waiting: deque[int] = deque()
        self.running: list[list] = []  # [request, cached tokens, tokens left, ...]
        self.next, self.kv_used, self.done, self.rejected, self.too_long = 0, 0, 0, 0, 0
        self.rows: dict[int, int] = {}  # running request -> its row in the engine's KV buffer (a batch of N: rows 0..N-1)

    def need(self, r: int) -> int:
        """KV positions request r holds: its prompt and generated tokens (a padded prompt's padding at prefill)."""
        prompt = int(self.reqs.prompt[r])
        return max(prompt + int(self.reqs.gen[r]), self.sched.prefill_len(prompt))

    def arrive(self, now: float) -> None:
        arrival = self.reqs.arrival
        while self.next < len(arrival) and arrival[self.next] <= now:
            self.waiting.append(self.next)
            self.next += 1

    def idle_start(self, now: float) -> float:
        """When an idle engine starts: the batch_timeout after the first waiting arrival, or when max_batch wait."""
        missing = self.sched.max_batch - len(self.waiting)
        if missing <= 0:
            return now
        fill = self.next + missing - 1
        filled = self.reqs.arrival[fill] if fill < len(self.reqs.arrival) else np.inf
        return max(now, min(self.reqs.arrival[self.waiting[0]] + self.sched.batch_timeout, filled))

    def admit(self) -> list[int]:
        admitted: list[int] = []
        budget = self.sched.kv_tokens
        while self.waiting and len(self.running) + len(admitted) < self.sched.max_batch:
            r = self.waiting[0]
            if self.sched.max_len is not None and self.need(r) > self.sched.max_len:
                self.waiting.popleft()  # longer than the design's sequence: never served
                self.rejected += 1
                self.too_long += 1
                self.done += 1
                continue
            if budget is not None and self.kv_used + self.need(r) > budget:
                if self.running or admitted or self.need(r) <= budget:
                    break
                self.waiting.popleft()  # alone it does not fit: never served
                self.rejected += 1
                self.done += 1
                continue
            self.waiting.popleft()
            self.kv_used += self.need(r)
            admitted.append(r)
        return admitted

    def seat(self, admitted: list[int]) -> None:
        """The admitted requests take the rows after the running ones (their prefills write there)."""
        if admitted:
            base = len(self.running)
            self.rows.update((r, base + i) for i, r in enumerate(admitted))

    def place(self, still: list[list]) -> list[tuple[int, int, int]]:
        """Keep the running sequences `still` in rows 0..len(still)-1 (a decode binds a batch as one block of rows):
        each row freed below that count takes the sequence of a row above it, so a finished sequence costs at most one
        KV row move and one in the top rows none. Reorders `still` by row; returns the moves, (from row, to row,
        cached positions to copy)."""
        n = len(still)
        rows = self.rows if len(self.rows) == n else {s[0]: self.rows[s[0]] for s in still}
        self.rows = rows
        if all(rows[s[0]] < n for s in still):  # rows 0..n-1 taken (nothing finished below): no move, order kept
            return []
        holes = sorted(set(range(n)) - set(rows.values()))
        movers = sorted((s for s in still if rows[s[0]] >= n), key=lambda s: rows[s[0]])
        moves = []
        for hole, s in zip(holes, movers):
            moves.append((rows[s[0]], hole, int(s[1])))
            rows[s[0]] = hole
        self.rows = rows
        still.sort(key=lambda s: rows[s[0]])
        return moves


class _Engine(Queue):
    """The simulation's state; `run` advances it to the last completion."""

    def __init__(self, reqs: Requests, table: StepTable, sched: Scheduler):
        super().__init__(reqs, sched)
        self.table, self.t = table, 0.0
        self.max_step_tokens, self.decode_batches = 0, set()
        self.busy, self.host = 0.0, 0.0
        self.seen = set(sched.warm)  # prompt lengths run so far

    def step(self, admitted: list[int]) -> None:
        start, host = self.t, self.sched.host
        self.seat(admitted)
        prompts = [self.sched.prefill_len(int(self.reqs.prompt[r])) for r in admitted]
        dt = sum(self.table.prefill(p) for p in prompts)
        if host is not None:  # the inputs, bindings, logits and argmax around the run calls
            fresh = set(prompts) - self.seen
            self.seen |= fresh
            work = host.step(len(self.running), prompts, len(fresh))
            dt += work
            self.host += work
        tokens = sum(prompts) + len(self.running)
        self.max_step_tokens = max(self.max_step_tokens, tokens)
        if self.running:
            self.decode_batches.add(len(self.running))
            dt += self.table.decode(len(self.running), sum(s[1] for s in self.running) / len(self.running))
        self.t = start + dt
        still = []
        for s in self.running:
            s[1] += 1
            s[2] -= 1
            if s[2] > 0:
                still.append(s)
            else:
                self.finish(s[0])
        for r in admitted:
            self.admitted[r], self.first[r] = start, self.t
            if self.reqs.gen[r] > 1:
                still.append([r, int(self.reqs.prompt[r]), int(self.reqs.gen[r]) - 1])
            else:
                self.finish(r)
        moves = self.place(still)  # after the tokens are stamped, as an engine refills rows before the next step
        if host is not None and moves:
            self.host += host.moves(moves)
            self.t += host.moves(moves)
        self.busy += self.t - start
        self.running = still

    def coast(self) -> bool:
        """Run the decode-only steps before the running batch's first finish, stopping before a step that starts at or
        after the next arrival when that arrival would be admitted (a free batch slot, nobody waiting on the KV
        budget), as `step` would one at a time: the same sums in the same order (np.cumsum adds in sequence). False,
        nothing done, when fewer than COAST_MIN such steps are left."""
        n = len(self.running)
        left = min(s[2] for s in self.running) - 1  # the step after these finishes a sequence: `step` runs it
        if left < COAST_MIN:
            return False
        past = sum(s[1] for s in self.running)
        dt = self.table.decodes(n, (past + n * np.arange(left)) / n)
        host = self.sched.host
        work = host.step(n, []) if host is not None else 0.0
        if host is not None:
            dt = work + dt
        t = np.cumsum(np.concatenate(([self.t], dt)))  # t[k]: when step k starts
        steps = left
        if n < self.sched.max_batch and not self.waiting and self.next < len(self.reqs.arrival):
            # an arrival by a step's start is admitted there (or rejected): stop before that step
            steps = min(left, int(np.searchsorted(t[1:], self.reqs.arrival[self.next], side="left")) + 1)
        self.busy = float(np.cumsum(np.concatenate(([self.busy], np.diff(t[:steps + 1]))))[-1])
        if host is not None:
            self.host = float(np.cumsum(np.concatenate(([self.host], np.full(steps, work))))[-1])
        self.t = float(t[steps])
        self.max_step_tokens = max(self.max_step_tokens, n)
        self.decode_batches.add(n)
        for s in self.running:
            s[1] += steps
            s[2] -= steps
        return True

    def finish(self, r: int) -> None:
        self.last[r] = self.t
        self.kv_used -= self.need(r)
        self.done += 1

    def run(self) -> None:
        n = len(self.reqs.arrival)
        while self.done < n:
            self.arrive(self.t)
            if not self.running:
                if not self.waiting:
                    self.t = float(self.reqs.arrival[self.next])
                    continue
                start = self.idle_start(self.t)
                if start > self.t:
                    self.t = float(start)
                    continue
            admitted = self.admit()
            if admitted or self.running:
                if admitted or not self.coast():
                    self.step(admitted)


def simulate(reqs: Requests, table: StepTable, sched: Scheduler) -> Outcome:
    engine = _Engine(reqs, table, sched)
    engine.run()
    ok = ~np.isnan(engine.last)
    arrival, gen = reqs.arrival[ok], reqs.gen[ok]
    first, last = engine.first[ok], engine.last[ok]
    multi = gen > 1
    span = float(last.max() - reqs.arrival[0]) if ok.any() else 0.0
    return Outcome(ttft=first - arrival, tpot=(last[multi] - first[multi]) / (gen[multi] - 1), e2e=last - arrival,
                   queue=engine.admitted[ok] - arrival, completed=int(ok.sum()), rejected=engine.rejected,
                   too_long=engine.too_long,
                   throughput=float(gen.sum()) / span if span > 0 else 0.0,
                   max_step_tokens=engine.max_step_tokens, decode_batches=tuple(sorted(engine.decode_batches)),
                   busy=engine.busy, host=engine.host)
