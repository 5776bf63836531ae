"""The host work of a continuous-batching iteration at a design's sizes: the library's measured `serving_host:`
figures (softsyn.characterize.host) times what one iteration moves for this design. The simulation adds it to the
step table's run-call times (softsyn.timing.serving.simulate); without the block there is none (and the report says
the host is not modelled).

    decode of N rows   iteration + N x buffer positions x mask bytes / input_bandwidth
                       + N x vocab x logits bytes / sample_bandwidth
    prefill of p       iteration + 4 x layers x bind + 3 x p x 8 / input_bandwidth
                       + (p or 1) x vocab x logits bytes / readback_bandwidth (every position's logits come back when
                       the graph returns them all) + vocab x logits bytes / sample_bandwidth
    KV row moves       move + moved rows x cached positions x KV bytes per token x 2 / memory_bandwidth (one copy
                       of the moved rows' cached positions: read and written)
    a prompt length    distinct GEMM shapes x first_shape_gemm + other nodes x first_shape_node, once per prompt
    met first          length the engine has not run before (none where the library has no figures)
"""
from __future__ import annotations

from dataclasses import dataclass

from softsyn.library.model import ServingHost


@dataclass(frozen=True)
class HostWork:
    """Seconds of host work per iteration, per running sequence, per prompt and prompt token, per KV move (SI)."""

    iteration: float  # s, every iteration
    per_sequence: float  # s per decoding row (its mask row, its logits' argmax)
    prefill: float  # s per admitted prompt (binding, its logits' argmax)
    per_token: float  # s per prompt token (its inputs, its logits back when the graph returns every position's)
    move: float  # s per iteration that moves KV rows
    per_moved_token: float  # s per cached position moved (all layers' key and value, read and written)
    source: str  # where the figures were measured, for the reports
    first_shape: float | None = None  # s, once per prompt length the engine runs first; None: not measured

    def moves(self, moves: list[tuple[int, int, int]]) -> float:
        """One copy of the moved rows' cached positions (the longest, for every row: one strided copy)."""
        return self.move + len(moves) * max(m[2] for m in moves) * self.per_moved_token if moves else 0.0

    def step(self, n: int, prompts: list[int], fresh: int = 0) -> float:
        """An iteration's host work: the decode's, each prompt's, and the fixed cost once (a prefill-only step too);
        `fresh` of the prompts at a length the engine meets first."""
        if not (n or prompts):
            return 0.0
        return (self.iteration + n * self.per_sequence + sum(self.prefill + p * self.per_token for p in prompts)
                + fresh * (self.first_shape or 0.0))

    def describe(self) -> str:
        first = ("a prompt length's first run not measured (the block predates the probe): no cost for it"
                 if self.first_shape is None else f"{self.first_shape * 1e6:.1f} us once per prompt length met first")
        return (f"{self.iteration * 1e6:.1f} us per iteration + {self.per_sequence * 1e6:.2f} us per decoding "
                f"sequence; {self.prefill * 1e6:.1f} us per prompt + {self.per_token * 1e9:.1f} ns per prompt token; "
                f"KV row moves {self.move * 1e6:.1f} us + {self.per_moved_token * 1e9:.2f} ns per cached position "
                f"moved; {first} ({self.source})")


def host_work(host: ServingHost, memory_bandwidth: float, *, vocab: int, logits_bytes: int, positions: int,
              mask_bytes: int, layers: int, kv_bytes_per_token: float, all_logits: bool, library: str,
              gemms: int = 0, nodes: int = 0) -> HostWork:  # gemms: distinct GEMM shapes; nodes: the others
    """`host` (a library's measured block) at a design's sizes: its vocabulary and logits element, the KV buffer's
    positions per sequence and the attention_mask's element, its layers and KV bytes per token (all layers' K and
    V), whether a prefill returns every position's logits (`all_logits`) or the last one's, its distinct GEMM
    shapes and its other nodes (what a prompt length met first costs)."""
    logits = vocab * logits_bytes
    first = None if host.first_shape_gemm is None else \
        gemms * host.first_shape_gemm + nodes * (host.first_shape_node or 0.0)
    return HostWork(
        iteration=host.iteration,
        per_sequence=positions * mask_bytes / host.input_bandwidth + logits / host.sample_bandwidth,
        prefill=4 * layers * host.bind + logits / host.sample_bandwidth
        + (0.0 if all_logits else logits / host.readback_bandwidth),
        per_token=3 * 8 / host.input_bandwidth + (logits / host.readback_bandwidth if all_logits else 0.0),
        move=host.move, per_moved_token=2 * kv_bytes_per_token / memory_bandwidth, first_shape=first,
        source=f"measured on {host.device}, {host.date} (library {library} serving_host)")
