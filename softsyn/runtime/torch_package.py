"""Running a torch target's artifact: DIR/model.pt2 (an AOTInductor package) as DIR/runtime/torch.json describes it.

The package is one step of the decoder over a static KV cache: (input_ids [B, seq], position_ids [B, seq], the
cache's key and value per layer [B, kv_heads, max_length, head_dim]) -> (logits [B, seq, vocab], the caches with the
step's keys and values written at its positions). One package serves prefill (seq = the prompt) and decode (seq 1);
the positions say where the step's tokens go, every row of a batch at the same positions.

runtime/torch.json is untrusted input: its fields are checked (types, bounds) and its package path kept inside DIR
(softsyn.frontends.onnx_file.inside) before the package is opened.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np
import torch

from softsyn.constraints.reader import MAX_INT
from softsyn.errors import SoftsynError
from softsyn.frontends.onnx_file import inside
from softsyn.runtime.artifact import TORCH_FILE, read_json
from softsyn.runtime.generate import Generation

FORMAT = "softsyn.torch/1"
CACHE_KEYS = ("layers", "kv_heads", "head_dim", "max_length")


def read_torch_settings(directory: str | Path) -> dict:
    """DIR/runtime/torch.json, checked: a SoftsynError naming the file and key otherwise."""
    path = Path(directory) / TORCH_FILE
    settings = read_json(path, "runtime/torch.json")
    if not isinstance(settings, dict) or settings.get("format") != FORMAT:
        raise SoftsynError(f"{path}: format: not {FORMAT}; re-run softsyn compile")
    inside(directory, settings.get("package"), "package", path)
    cache = settings.get("kv_cache")
    if not isinstance(cache, dict):
        raise SoftsynError(f"{path}: kv_cache: not an object; re-run softsyn compile")
    for key in CACHE_KEYS:
        if not (type(cache.get(key)) is int and 1 <= cache[key] <= MAX_INT):
            raise SoftsynError(f"{path}: kv_cache.{key}: not an integer 1..{MAX_INT}; re-run softsyn compile")
    if not (type(settings.get("vocab_size")) is int and 1 <= settings["vocab_size"] <= MAX_INT):
        raise SoftsynError(f"{path}: vocab_size: not an integer 1..{MAX_INT}; re-run softsyn compile")
    if settings.get("dtype") not in ("float32",):
        raise SoftsynError(f"{path}: dtype: {settings.get('dtype')!r} is not built; valid: float32")
    for key in ("reference", "accuracy", "scenarios"):
        if not isinstance(settings.get(key) or {}, dict):
            raise SoftsynError(f"{path}: {key}: not an object; re-run softsyn compile")
    return settings


class TorchStep:
    """The loaded package and its cache layout: one call is one step."""

    def __init__(self, directory: str | Path, settings: dict):
        package = inside(directory, settings["package"], "package", Path(directory) / TORCH_FILE)
        if not package.is_file():
            raise SoftsynError(f"{package}: no such package (runtime/torch.json names it); re-run softsyn compile")
        try:
            self.runner = torch._inductor.aoti_load_package(str(package))
        except Exception as exc:  # torch raises many types for a package it cannot load
            raise SoftsynError(f"{package}: torch cannot load the package ({type(exc).__name__}: "
                               f"{' '.join(str(exc).split())[:300]}); re-run softsyn compile") from None
        self.cache = settings["kv_cache"]
        self.vocab_size = settings["vocab_size"]
        self.dtype = getattr(torch, settings["dtype"])

    @property
    def max_length(self) -> int:
        return self.cache["max_length"]

    def empty_cache(self, batch: int = 1, past: list[np.ndarray] | None = None) -> list[torch.Tensor]:
        """Zeroed key and value buffers per layer, `past` (arrays [B, kv_heads, n, head_dim]) in their first n."""
        shape = (batch, self.cache["kv_heads"], self.max_length, self.cache["head_dim"])
        buffers = [torch.zeros(shape, dtype=self.dtype) for _ in range(2 * self.cache["layers"])]
        for buffer, held in zip(buffers, past or []):
            if held.shape[2] > self.max_length:
                raise SoftsynError(f"a past of {held.shape[2]} positions does not fit the package's KV cache of "
                                   f"{self.max_length}; re-run softsyn compile with a larger kv_cache.max_length")
            buffer[:, :, :held.shape[2]] = torch.from_numpy(np.ascontiguousarray(held)).to(self.dtype)
        return buffers

    def __call__(self, ids: np.ndarray, start: int, cache: list[torch.Tensor]) -> tuple[torch.Tensor, list]:
        """(logits [B, seq, vocab], the updated cache) of `ids` [B, seq] at positions start..start+seq-1."""
        batch, seq = ids.shape
        if start + seq > self.max_length:
            raise SoftsynError(f"positions up to {start + seq} do not fit the package's KV cache of {self.max_length}")
        positions = torch.arange(start, start + seq, dtype=torch.int64).expand(batch, seq).contiguous()
        with torch.no_grad():
            out = self.runner(torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)), positions, *cache)
        return out[0], list(out[1:])

    def generate(self, prompt: np.ndarray, gen: int) -> Generation:
        """`gen` greedy tokens after `prompt` (1-D ids), each step timed on the host wall clock."""
        prompt = np.asarray(prompt, dtype=np.int64).reshape(1, -1)
        n = prompt.shape[1]
        if n < 1 or gen < 1 or n + gen - 1 > self.max_length:
            raise SoftsynError(f"prompt {n} + {gen} generated tokens need {n + gen - 1} positions; the package's KV "
                               f"cache holds {self.max_length}; valid: prompt >= 1, gen >= 1, prompt + gen - 1 <= "
                               f"{self.max_length}")
        cache = self.empty_cache()
        t0 = time.perf_counter()
        logits, cache = self(prompt, 0, cache)
        token = int(torch.argmax(logits[0, -1]))
        ttft = time.perf_counter() - t0
        tokens, tpot = [token], []
        for i in range(1, gen):
            t = time.perf_counter()
            logits, cache = self(np.array([[token]]), n + i - 1, cache)
            token = int(torch.argmax(logits[0, -1]))
            tpot.append(time.perf_counter() - t)
            tokens.append(token)
        return Generation(tuple(tokens), ttft, tuple(tpot), "static")

    def measure(self, dims: dict[str, int], runs: int = 10, warmup: int = 2) -> float:
        """The median seconds of one step at a path group's dims (batch, seq, past), seeded ids, a zeroed cache."""
        batch, seq, past = dims.get("batch", 1), dims.get("seq", 1), dims.get("past", 0)
        ids = np.random.default_rng(0).integers(0, self.vocab_size, size=(batch, seq), dtype=np.int64)
        cache = self.empty_cache(batch)
        times = []
        for r in range(warmup + runs):
            t = time.perf_counter()
            self(ids, past, cache)
            if r >= warmup:
                times.append(time.perf_counter() - t)
        return statistics.median(times)
