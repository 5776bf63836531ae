"""Step times of a serving engine, tabulated from the STA on a small grid and interpolated.

A decode step at batch N times the netlist bound at {batch: N, seq: 1, past: P}, where P is the running sequences'
mean cached length: every sequence sits in one shared KV buffer set at its own length, attention's work is linear in
each sequence's length (so the mean gives the batch's total) and the weight GEMMs do not depend on it. A prefill is
one prompt's call at {batch: 1, seq: L, past: 0}. A mixed step (prefills joining running decodes) runs each prefill
call, then the decode call: a graph with one [batch, seq] shape cannot hold both, and an ONNX Runtime engine runs
them one after the other in the same iteration. Between grid points the table interpolates linearly (bilinear in
N and P for decode), beyond its last point it extrapolates along the last segment. Every time is the library's
estimate of the design's critical path at those dims (the STA's, no new measurement).
"""
from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from softsyn.results.serving import StepPoint

TimeAt = Callable[[dict], float]  # scenario dims -> the design's critical arrival there, s


def _axis(limit: int, first: int = 1, factor: int = 2) -> list[int]:
    """`first`, `first` x factor ... up to and including `limit`."""
    points, n = [], first
    while n < limit:
        points.append(n)
        n *= factor
    return points + [limit]


def _segment(axis: list[int], x: float) -> tuple[int, float]:
    """(index i, weight w): x = axis[i] * (1 - w) + axis[i + 1] * w, w beyond [0, 1] outside the axis."""
    if len(axis) == 1:
        return 0, 0.0
    i = min(max(bisect.bisect_right(axis, x) - 1, 0), len(axis) - 2)
    return i, (x - axis[i]) / (axis[i + 1] - axis[i])


@dataclass
class StepTable:
    batches: list[int]  # decode grid: batch sizes
    pasts: list[int]  # decode grid: mean cached tokens
    decode_times: list[list[float]]  # [batch index][past index], s
    prompts: list[int]  # prefill grid: prompt lengths
    prefill_times: list[float]  # s

    def decode(self, batch: int, past: float) -> float:
        i, u = _segment(self.batches, batch)
        j, v = _segment(self.pasts, past)
        t = self.decode_times
        i1, j1 = min(i + 1, len(self.batches) - 1), min(j + 1, len(self.pasts) - 1)
        low = t[i][j] * (1 - v) + t[i][j1] * v
        high = t[i1][j] * (1 - v) + t[i1][j1] * v
        return max(low * (1 - u) + high * u, 0.0)

    def decodes(self, batch: int, pasts: np.ndarray) -> np.ndarray:
        """decode(batch, p) for each p of `pasts`: decode's operations in its order, elementwise in numpy, so each
        value equals decode's bit for bit (the simulation's decode-only stretches rely on it)."""
        i, u = _segment(self.batches, batch)
        low_row = np.asarray(self.decode_times[i])
        high_row = np.asarray(self.decode_times[min(i + 1, len(self.batches) - 1)])
        axis = np.asarray(self.pasts)
        if len(axis) == 1:
            j = j1 = np.zeros(len(pasts), dtype=np.intp)
            v = np.zeros(len(pasts))
        else:
            j = np.clip(np.searchsorted(axis, pasts, side="right") - 1, 0, len(axis) - 2)
            j1 = j + 1
            v = (pasts - axis[j]) / (axis[j1] - axis[j])
        low = low_row[j] * (1 - v) + low_row[j1] * v
        high = high_row[j] * (1 - v) + high_row[j1] * v
        return np.maximum(low * (1 - u) + high * u, 0.0)

    def prefill(self, prompt: int) -> float:
        i, w = _segment(self.prompts, prompt)
        t = self.prefill_times
        return max(t[i] * (1 - w) + t[min(i + 1, len(t) - 1)] * w, 0.0)

    def scaled(self, decode: float, prefill: float) -> "StepTable":
        """Every step time multiplied (a what-if: another precision's speed-up)."""
        return StepTable(self.batches, self.pasts, [[x * decode for x in row] for row in self.decode_times],
                         self.prompts, [x * prefill for x in self.prefill_times])

    @classmethod
    def from_points(cls, points: list[StepPoint]) -> "StepTable":
        """The table `points()` listed (analysis.json's serving.steps), so a run is simulated on the step times a
        compile recorded; a grid with a missing decode point is a ValueError naming it."""
        decode = {(p.batch, p.tokens): p.time for p in points if p.kind == "decode"}
        batches, pasts = sorted({n for n, _ in decode}), sorted({t for _, t in decode})
        missing = [(n, t) for n in batches for t in pasts if (n, t) not in decode]
        if missing or not decode:
            raise ValueError(f"step points: no decode time at batch {missing[0][0]}, past {missing[0][1]}" if missing
                             else "step points: no decode point")
        prefill = sorted((p.tokens, p.time) for p in points if p.kind == "prefill")
        if not prefill:
            raise ValueError("step points: no prefill point")
        return cls(batches, pasts, [[decode[(n, t)] for t in pasts] for n in batches],
                   [n for n, _ in prefill], [t for _, t in prefill])

    def points(self) -> list[StepPoint]:
        decode = [StepPoint("decode", n, p, self.decode_times[i][j])
                  for i, n in enumerate(self.batches) for j, p in enumerate(self.pasts)]
        return decode + [StepPoint("prefill", 1, n, t) for n, t in zip(self.prompts, self.prefill_times)]


def step_table(time_at: TimeAt, max_batch: int, max_prompt: int, max_context: int) -> StepTable:
    """Time the grid: batch 1, 2, 4 ... max_batch; mean past 0 and 64, 256, 1024 ... max_context (decode is
    linear in past: a sparse axis suffices); prompts 16, 32 ... max_prompt. `time_at` binds and times the design
    (Design.step_time)."""
    batches = _axis(max_batch)
    pasts = [0] + _axis(max(max_context, 64), 64, 4)
    prompts = _axis(max(max_prompt, 16), 16)
    decode = [[time_at({"batch": n, "seq": 1, "past": p}) for p in pasts] for n in batches]
    prefill = [time_at({"batch": 1, "seq": n, "past": 0}) for n in prompts]
    return StepTable(batches, pasts, decode, prompts, prefill)
