"""Measuring a composite (vision, embedding, decoder: one session each) the way onnxruntime-genai runs it.

A path group runs some of the blocks (the vision encoder alone; embedding and decoder for a text-only prompt or a
decode step; all three for an image task). Its measured interval is one call of each of those blocks in order
(`BlockChain.run`): each a `run_with_iobinding` whose inputs were bound on the device before timing, the prompt's
and the earlier blocks' outputs for that prompt (computed once, untimed), as a runner that hands device tensors
from block to block has them. So the interval is every block's dispatch, kernels and final synchronisation, with
no host copy, as softsyn.runtime.measure times a one-graph model. Per-node times: each block file profiled
(softsyn.runtime.measure.profile_many) on its inputs in every group that runs it; a group's profile is the union of
its blocks' (node names are the joined netlist's: distinct across blocks).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from softsyn.runtime.binding import BoundRunner
from softsyn.runtime.blocks import BlockRunner
from softsyn.runtime.measure import Measurement, Profile, measure_runners, profile_many
from softsyn.runtime.session import SessionSettings

# One group's scenario on a composite: (its seeded feeds, the names of the blocks it runs)
Scenario = tuple[dict[str, np.ndarray], list[str]]


class BlockChain:
    """The bound runners of the blocks one group runs, in order: `run()` calls each once (what a group's step is)."""

    def __init__(self, runners: list[BoundRunner]):
        self.runners = runners
        self.session = runners[-1].session  # measure_runners names the provider from it

    def run(self) -> None:
        for runner in self.runners:
            runner.run()

    __call__ = run


def _runner(folder: Path, blocks: list[dict], provider: str, options: dict | None) -> BlockRunner:
    return BlockRunner(folder, blocks, SessionSettings(provider=provider, options=tuple((options or {}).items())))


def _values(runner: BlockRunner, scenario: Scenario) -> dict[str, np.ndarray]:
    """Every block input of the scenario: its feeds and what the earlier blocks it runs output for them."""
    feeds, names = scenario
    return runner.values(feeds, [b["name"] for b in runner.blocks if b["name"] in names])


def measure_blocks(folder: Path, blocks: list[dict], scenarios: list[Scenario], *, runs: int = 20, warmup: int = 3,
                   provider: str = "cpu", options: dict | None = None,
                   aliases: dict[str, str] | None = None) -> list[Measurement]:
    """Each scenario's chain of blocks timed (softsyn.runtime.measure.measure_runners: interleaved rounds, warmed
    up until settled), one session per block for every scenario."""
    runner = _runner(folder, blocks, provider, options)
    chains = []
    for scenario in scenarios:
        values = _values(runner, scenario)
        chains.append(BlockChain([BoundRunner.from_feeds(runner.sessions[b["name"]], values, provider, aliases)
                                  for b in blocks if b["name"] in scenario[1]]))
    return measure_runners(chains, runs, warmup)


def profile_blocks(folder: Path, blocks: list[dict], scenarios: list[Scenario], *, runs: int = 10, warmup: int = 2,
                   provider: str = "cpu", options: dict | None = None, blocking: bool = False,
                   aliases: dict[str, str] | None = None) -> list[Profile]:
    """Per-node profiles of each scenario: every block it runs profiled on that scenario's inputs of the block."""
    runner = _runner(folder, blocks, provider, options)
    values = [_values(runner, scenario) for scenario in scenarios]
    del runner  # the profiling sessions are the profiler's own
    parts: list[list[Profile]] = [[] for _ in scenarios]
    for b in blocks:
        which = [i for i, (_, names) in enumerate(scenarios) if b["name"] in names]
        if not which:
            continue
        feeds = [{k: values[i][k] for k in b["inputs"]} for i in which]
        for i, prof in zip(which, profile_many(Path(folder) / b["file"], feeds, runs=runs, warmup=warmup,
                                               provider=provider, options=options, blocking=blocking,
                                               aliases=aliases)):
            parts[i].append(prof)
    return [merged(p) for p in parts]


def merged(parts: list[Profile]) -> Profile:
    """One profile of blocks run one after another: their nodes, run times and kernel sums added."""
    first = parts[0]
    return Profile(nodes={name: node for p in parts for name, node in p.nodes.items()},
                   run_median=sum(p.run_median for p in parts), kernel_sum_median=sum(p.kernel_sum_median for p in parts),
                   runs=min(p.runs for p in parts), provider=first.provider, node_time=first.node_time,
                   overhead_per_node=first.overhead_per_node)
