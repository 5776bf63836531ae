"""The simulated requests: Poisson arrivals and lognormal lengths fitted to the constraints' p50 and p99.

A lognormal with median p50 and 99th percentile p99 has mu = ln(p50), sigma = ln(p99 / p50) / z(0.99); lengths
are drawn from it, rounded, and clipped to [1, LENGTH_CAP x p99] (the tail beyond is a few requests in a
thousand; the step table is timed up to the cap). One seeded numpy Generator draws everything, in a fixed order,
so a seed gives the same requests every run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from softsyn.constraints.serving import Lengths, Serving

Z99 = 2.3263478740408408  # the standard normal's 99th percentile
LENGTH_CAP = 2  # lengths are clipped at this many times their p99


@dataclass(frozen=True)
class Requests:
    arrival: np.ndarray  # s, ascending
    prompt: np.ndarray  # tokens
    gen: np.ndarray  # tokens to generate (>= 1)


def cap(lengths: Lengths) -> int:
    return LENGTH_CAP * lengths.p99


def _lengths(rng: np.random.Generator, lengths: Lengths, n: int) -> np.ndarray:
    sigma = math.log(lengths.p99 / lengths.p50) / Z99
    drawn = np.exp(rng.normal(math.log(lengths.p50), sigma, n))
    return np.clip(np.rint(drawn), 1, cap(lengths)).astype(np.int64)


def requests(serving: Serving) -> Requests:
    rng = np.random.default_rng(serving.seed)
    n = serving.requests
    arrival = np.cumsum(rng.exponential(1.0 / serving.arrival_rate, n))
    return Requests(arrival, _lengths(rng, serving.prompt_len, n), _lengths(rng, serving.gen_len, n))
