"""The `serving:` block of a constraints file: a load (arrival rate, request lengths), a scheduler's limits and the
budgets its simulation is checked against (softsyn.timing.serving).

    serving:
      arrival_rate: 20/s            # Poisson arrivals (softsyn.units.parse_rate: /s, /min)
      max_batch: 16                 # sequences decoding together at most
      batch_timeout: 50ms           # the longest an idle engine waits to group arrivals before a prefill
      prompt_len: {p50: 512, p99: 2048}   # tokens; a single integer is a fixed length
      gen_len: {p50: 128, p99: 512}
      ttft: {p50: 300ms, p99: 800ms}      # budgets; any may be left out (then it is not checked)
      tpot: {p99: 50ms}
      throughput: {min: 200/s}      # generated tokens per second
      requests: 2000                # simulated requests
      seed: 0                       # the simulation's random stream
      warm_prompts: false           # true: the engine runs a prefill at every prompt length it may meet at load
      prompt_buckets: 64            # prompts right-padded to a multiple of 64 tokens (fewer prefill shapes)

Decisions: the block's values are frozen dataclasses (a simulation re-run with one knob changed uses
`dataclasses.replace`); a length's p99 is at least its p50; at least one budget must be given (a serving block with
nothing to check is a mistake); every error is one line naming the file, the line and the dotted key.
"""
from __future__ import annotations

from dataclasses import dataclass

from yaml.nodes import MappingNode, Node

from softsyn.units import UnitError, parse_rate

__all__ = ["Lengths", "Serving", "SERVING_KEYS", "padded_length", "read_serving"]

SERVING_KEYS: dict[str, tuple[str, ...]] = {
    "serving": ("arrival_rate", "max_batch", "batch_timeout", "prompt_len", "gen_len", "ttft", "tpot", "throughput",
                "requests", "seed", "warm_prompts", "prompt_buckets"),
    "serving.lengths": ("p50", "p99"),
    "serving.ttft": ("p50", "p99"),
    "serving.tpot": ("p50", "p99"),
    "serving.throughput": ("min",),
}
MAX_RATE = 1e6  # requests or tokens per second
MAX_REQUESTS = 1_000_000  # simulated requests (a million steps of Python take tens of seconds)
MAX_TOKENS = 1 << 20  # one request's prompt or generation


@dataclass(frozen=True)
class Lengths:
    """A length distribution given by its median and 99th percentile (tokens)."""

    p50: int
    p99: int


@dataclass(frozen=True)
class Serving:
    arrival_rate: float  # requests/s
    prompt_len: Lengths
    gen_len: Lengths
    max_batch: int = 16
    batch_timeout: float = 0.05  # s
    ttft_p50: float | None = None  # s; None: not checked
    ttft_p99: float | None = None
    tpot_p50: float | None = None
    tpot_p99: float | None = None
    throughput_min: float | None = None  # generated tokens/s
    requests: int = 2000
    seed: int = 0
    warm_prompts: bool = False  # every prompt length prefilled once at load: none pays its first-shape cost later
    prompt_buckets: int | None = None  # tokens: prompts right-padded to a multiple of it; None: run at their length

    def padded(self, prompt: int) -> int:
        """The length a prompt of `prompt` tokens is prefilled at."""
        return padded_length(prompt, self.prompt_buckets)


def padded_length(prompt: int, bucket: int | None) -> int:
    """A prompt's length right-padded up to a multiple of `bucket` (None or 0: its own length)."""
    return prompt if not bucket else -(-prompt // bucket) * bucket


def _lengths(reader, node: Node, key: str) -> Lengths:
    if not isinstance(node, MappingNode):
        n = reader.integer(node, key, 1, MAX_TOKENS)
        return Lengths(n, n)
    e = reader.mapping(node, key, SERVING_KEYS["serving.lengths"])
    for name in SERVING_KEYS["serving.lengths"]:
        if name not in e:
            raise reader.fail(node, key, f"needs p50 and p99 (tokens), e.g. {{p50: 512, p99: 2048}}; {name} missing")
    p50, p99 = (reader.integer(e[k][1], f"{key}.{k}", 1, MAX_TOKENS) for k in ("p50", "p99"))
    if p99 < p50:
        raise reader.fail(e["p99"][1], f"{key}.p99", f"{p99} is below p50 ({p50}); a 99th percentile is at least the "
                                                      "median")
    return Lengths(p50, p99)


def _rate(reader, node: Node, key: str) -> float:
    raw = reader.scalar(node, key, "a rate, e.g. 20/s")
    try:
        rate = parse_rate(raw)
    except UnitError as exc:
        raise reader.fail(node, key, str(exc)) from None
    if not 0 < rate <= MAX_RATE:
        raise reader.fail(node, key, f"{raw!r}: valid: a rate above 0 and at most {MAX_RATE:.0f}/s")
    return rate


def _budgets(reader, entries: dict, name: str) -> dict[str, float]:
    """`ttft`/`tpot`: percentile -> time."""
    key = f"serving.{name}"
    e = reader.mapping(entries[name][1], key, SERVING_KEYS[key])
    return {f"{name}_{p}": reader.time(v, f"{key}.{p}", positive=True) for p, (_, v) in e.items()}


def read_serving(reader, node: Node) -> Serving:
    """The `serving:` block, read with the constraints file's YamlReader (its errors name file, line and key)."""
    e = reader.mapping(node, "serving", SERVING_KEYS["serving"])
    for name in ("arrival_rate", "prompt_len", "gen_len"):
        if name not in e:
            raise reader.fail(node, "serving", f"{name} is required (e.g. arrival_rate: 20/s, prompt_len: "
                                               "{p50: 512, p99: 2048}, gen_len: {p50: 128, p99: 512})")
    values: dict = {"arrival_rate": _rate(reader, e["arrival_rate"][1], "serving.arrival_rate"),
                    "prompt_len": _lengths(reader, e["prompt_len"][1], "serving.prompt_len"),
                    "gen_len": _lengths(reader, e["gen_len"][1], "serving.gen_len")}
    if "max_batch" in e:
        values["max_batch"] = reader.integer(e["max_batch"][1], "serving.max_batch", 1, 4096)
    if "batch_timeout" in e:
        values["batch_timeout"] = reader.time(e["batch_timeout"][1], "serving.batch_timeout")
    for name in ("ttft", "tpot"):
        if name in e:
            values.update(_budgets(reader, e, name))
    if "throughput" in e:
        t = reader.mapping(e["throughput"][1], "serving.throughput", SERVING_KEYS["serving.throughput"])
        if "min" in t:
            values["throughput_min"] = _rate(reader, t["min"][1], "serving.throughput.min")
    if "requests" in e:
        values["requests"] = reader.integer(e["requests"][1], "serving.requests", 10, MAX_REQUESTS)
    if "seed" in e:
        values["seed"] = reader.integer(e["seed"][1], "serving.seed", 0)
    if "warm_prompts" in e:
        warm = reader.value(e["warm_prompts"][1])
        if not isinstance(warm, bool):
            raise reader.fail(e["warm_prompts"][1], "serving.warm_prompts", f"{warm!r}: valid: true or false")
        values["warm_prompts"] = warm
    if "prompt_buckets" in e:
        values["prompt_buckets"] = reader.integer(e["prompt_buckets"][1], "serving.prompt_buckets", 1, MAX_TOKENS)
    serving = Serving(**values)
    budgets = (serving.ttft_p50, serving.ttft_p99, serving.tpot_p50, serving.tpot_p99, serving.throughput_min)
    if all(b is None for b in budgets):
        raise reader.fail(node, "serving", "no budget to check; give at least one of ttft: {p50, p99}, "
                                           "tpot: {p50, p99}, throughput: {min}")
    return serving
