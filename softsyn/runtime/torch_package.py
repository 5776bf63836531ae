"""Running a torch target's artifact: DIR/model.pt2 (an AOTInductor package) as DIR/runtime/torch.json describes it.

The package is one step of the decoder over a static KV cache the caller owns: (input_ids [B, seq], position_ids
[B, seq], slots [S] = arange(S), the cache's key and value per layer [B, kv_heads, max_length, head_dim]) -> logits
[B, seq, vocab]; the step writes its keys and values into the cache tensors in place, at its positions (every row of
a batch at the same positions), and attends over the first S slots, those at or before each query's position. The
runner gives S as the filled prefix rounded up to SPAN_STEP (at most max_length): a decode at 512 reads 768 slots,
not the whole cache, and a long generation crosses a few spans; a package whose entry says `span` "end" (a prompt
form that takes its causal mask from the shapes: the last position is S - 1) gets exactly the filled prefix.
DIR/model.pt2 serves prefill (seq = the prompt) and decode (seq 1); a target with a prefill attention form adds
DIR/model-prefill.pt2, the same step in that form, which serves the steps of seq >= its `min_seq` (2): torch.json's
`packages` names each package, its kernel map, the query lengths it serves, its span and where its weights are
(`constants`: "own", or "decode": model-prefill.pt2 holds none and runs on model.pt2's, one copy in memory:
softsyn.runtime.torch_weights; where this torch refuses, model-prefill.pt2 gets a copy of its own, or model.pt2
serves every step, and `TorchStep.weights` says which). On CUDA (`cuda_graphs`) each step shape (package, batch,
seq, span) is captured once as a CUDA graph over fixed buffers (the cache keeps its addresses: TorchStep owns one per batch size) and replayed.

runtime/torch.json is untrusted input: its fields are checked (types, bounds) and every path it names kept inside
DIR (softsyn.frontends.onnx_file.inside) before a package is opened.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from softsyn.constraints.reader import MAX_INT
from softsyn.errors import SoftsynError
from softsyn.frontends.onnx_file import inside
from softsyn.runtime.artifact import TORCH_FILE, read_json, scenarios_problem
from softsyn.runtime.torch_provenance import KERNELS_FILE
from softsyn.runtime.torch_weights import (OWN, SHARED, SharedWeights, SharingUnavailable, load_copied,
                                          load_shared)
from softsyn.runtime.generate import Generation

FORMAT = "softsyn.torch/3"  # /3: the slots input (attention over a span); /2: the cache written in place
SPAN_STEP = 256  # the attended span rounds up to a multiple of this: fewer captured graphs, at most 255 idle slots
ROUNDED, END = "rounded", "end"  # torch.json's packages.<name>.span: S rounded up to SPAN_STEP, or exactly the last
SPANS = (ROUNDED, END)  # position + 1 (a package whose attention applies its causal mask from the shapes alone)
CACHE_KEYS = ("layers", "kv_heads", "head_dim", "max_length")
DTYPES = ("float32", "float16", "bfloat16")
DEVICES = ("cpu", "cuda")
DECODE, PREFILL = "decode", "prefill"  # torch.json's `packages` keys: the all-steps (or decode) one, the seq > 1 one
INPUT_ALIGN = 8  # int64s: 64 bytes, where position_ids start in a step's flat input array


def attended_span(end: int, max_length: int) -> int:
    """The slots a step whose last position is end - 1 attends over: `end` rounded up to SPAN_STEP, at most the
    cache's length."""
    return min(max_length, -(-end // SPAN_STEP) * SPAN_STEP)


def read_torch_settings(directory: str | Path) -> dict:
    """DIR/runtime/torch.json, checked: a SoftsynError naming the file and key otherwise."""
    path = Path(directory) / TORCH_FILE
    settings = read_json(path, "runtime/torch.json")
    if not isinstance(settings, dict) or settings.get("format") != FORMAT:
        raise SoftsynError(f"{path}: format: not {FORMAT}; re-run softsyn compile")
    inside(directory, settings.get("package"), "package", path)
    check_packages(directory, settings, path)
    cache = settings.get("kv_cache")
    if not isinstance(cache, dict):
        raise SoftsynError(f"{path}: kv_cache: not an object; re-run softsyn compile")
    for key in CACHE_KEYS:
        if not (type(cache.get(key)) is int and 1 <= cache[key] <= MAX_INT):
            raise SoftsynError(f"{path}: kv_cache.{key}: not an integer 1..{MAX_INT}; re-run softsyn compile")
    if not (type(settings.get("vocab_size")) is int and 1 <= settings["vocab_size"] <= MAX_INT):
        raise SoftsynError(f"{path}: vocab_size: not an integer 1..{MAX_INT}; re-run softsyn compile")
    for key, valid in (("dtype", DTYPES), ("device", DEVICES)):
        if settings.get(key) not in valid:
            raise SoftsynError(f"{path}: {key}: {settings.get(key)!r} is not one of {', '.join(valid)}")
    if not isinstance(settings.get("cuda_graphs", False), bool):
        raise SoftsynError(f"{path}: cuda_graphs: not true or false; re-run softsyn compile")
    for key in ("reference", "accuracy"):
        if not isinstance(settings.get(key) or {}, dict):
            raise SoftsynError(f"{path}: {key}: not an object; re-run softsyn compile")
    problem = scenarios_problem(settings)
    if problem:
        raise SoftsynError(f"{path}: {problem}; re-run softsyn compile")
    return settings


def packages(settings: dict) -> dict[str, dict]:
    """torch.json's packages (read_torch_settings checked them): {DECODE: {file, kernels, min_seq}[, PREFILL: ...]};
    a file of format /3 written before `packages` has the one package `package` with the map `kernels`."""
    return settings.get("packages") or {DECODE: {"file": settings["package"], "min_seq": 1,
                                                 "kernels": settings.get("kernels", KERNELS_FILE)}}


def package_label(settings: dict) -> str:
    """The packages a step may run, for log lines: "model.pt2", or "model.pt2; model-prefill.pt2 at seq >= 2"."""
    entries = packages(settings)
    return "; ".join([entries[DECODE]["file"]] + [f"{e['file']} at seq >= {e['min_seq']}" for name, e in
                                                  entries.items() if name != DECODE])


def check_packages(directory: str | Path, settings: dict, path: Path) -> None:
    """torch.json's `packages` (optional): DECODE, the file `package` names, from min_seq 1; PREFILL beside it from
    a min_seq of 2 or more; every file and kernel map inside DIR. A SoftsynError naming the file and key otherwise."""
    entries = settings.get("packages")
    if entries is None:
        return
    if not isinstance(entries, dict) or DECODE not in entries or not set(entries) <= {DECODE, PREFILL}:
        raise SoftsynError(f"{path}: packages: not an object of {DECODE} (and {PREFILL}) packages; re-run softsyn "
                           "compile")
    for name, entry in entries.items():
        key = f"packages.{name}"
        if not isinstance(entry, dict):
            raise SoftsynError(f"{path}: {key}: not an object (file, kernels, min_seq); re-run softsyn compile")
        inside(directory, entry.get("file"), f"{key}.file", path)
        inside(directory, entry.get("kernels"), f"{key}.kernels", path)
        low, high = (1, 1) if name == DECODE else (2, MAX_INT)  # decode serves what no other package does
        if not (type(entry.get("min_seq")) is int and low <= entry["min_seq"] <= high):
            raise SoftsynError(f"{path}: {key}.min_seq: {json.dumps(entry.get('min_seq'))} is not valid; valid: "
                               f"{'1' if name == DECODE else f'an integer 2..{MAX_INT}'}; re-run softsyn compile")
        if entry.get("span", ROUNDED) not in SPANS:
            raise SoftsynError(f"{path}: {key}.span: {json.dumps(entry.get('span'))} is not valid; valid: "
                               f"{' or '.join(json.dumps(v) for v in SPANS)}; re-run softsyn compile")
        valid = (OWN,) if name == DECODE else (OWN, SHARED)  # only model.pt2 can hold the weights another reads
        if entry.get("constants", OWN) not in valid:
            raise SoftsynError(f"{path}: {key}.constants: {json.dumps(entry.get('constants'))} is not valid; valid: "
                               f"{' or '.join(json.dumps(v) for v in valid)}; re-run softsyn compile")
    if entries[DECODE]["file"] != settings["package"]:
        raise SoftsynError(f"{path}: packages.{DECODE}.file: {json.dumps(entries[DECODE]['file'])} is not the file "
                           f"`package` names ({json.dumps(settings['package'])}); re-run softsyn compile")


def step_inputs(ids: np.ndarray, start: int, out: np.ndarray | None = None) -> np.ndarray:
    """A step's input_ids and position_ids in one flat int64 array (`out`, or a new one of input_slots(ids.shape)),
    so one copy moves both to the device: ids first, positions at INPUT_ALIGN (each a contiguous [B, seq] view at a
    64-byte boundary: Inductor's kernels may assume aligned inputs)."""
    batch, seq = ids.shape
    n, pad = input_slots(ids.shape)
    flat = np.empty(2 * pad, np.int64) if out is None else out
    flat[:n] = ids.reshape(-1)
    flat[pad:pad + n] = np.tile(np.arange(start, start + seq, dtype=np.int64), batch)
    return flat


def input_slots(shape: tuple[int, int]) -> tuple[int, int]:
    """(B * seq, where position_ids start in step_inputs' flat array: B * seq rounded up to INPUT_ALIGN)."""
    n = int(shape[0]) * int(shape[1])
    return n, -(-n // INPUT_ALIGN) * INPUT_ALIGN


def input_views(flat: torch.Tensor, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, position_ids) [B, seq] as views of step_inputs' flat layout."""
    n, pad = input_slots(shape)
    return flat[:n].view(shape), flat[pad:pad + n].view(shape)


class Graphed:
    """One step shape captured as a CUDA graph over fixed buffers. A call writes the ids and positions into a pinned
    host array and moves them with one asynchronous copy into the buffer the graph reads, then replays the graph; the
    logits are read from its output buffer (valid until the next replay). Staging through pinned memory, without
    per-call index kernels, trims the host part of a step (a decode step's time outside kernels was 0.13 ms above ORT's
    on the H200, 2026-12-03; not yet measured with this staging)."""

    def __init__(self, runner, cache: list[torch.Tensor], ids: np.ndarray, start: int, slots: torch.Tensor):
        self.shape = ids.shape
        self.staged = torch.empty(2 * input_slots(ids.shape)[1], dtype=torch.int64, pin_memory=True)
        self.inputs = torch.empty_like(self.staged, device="cuda")
        self.copied = torch.cuda.Event()
        tokens, positions = input_views(self.inputs, self.shape)
        self.stage(ids, start)
        # warm-up on a side stream (as torch.cuda.graphs asks) with the real inputs: the step it computes is the one
        # the caller asked for, so the cache slots it writes hold the right values (each replay writes them alike)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            first(runner(tokens, positions, slots, *cache))
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.no_grad():
            self.logits = first(runner(tokens, positions, slots, *cache))

    def stage(self, ids: np.ndarray, start: int) -> None:
        """The step's ids and positions into the graph's input buffer (one host-to-device copy, stream-ordered)."""
        self.copied.synchronize()  # the previous copy has read the pinned array before it is overwritten
        step_inputs(ids, start, self.staged.numpy())
        self.inputs.copy_(self.staged, non_blocking=True)
        self.copied.record()

    def __call__(self, ids: np.ndarray, start: int) -> torch.Tensor:
        self.stage(ids, start)
        self.graph.replay()
        return self.logits


def first(out) -> torch.Tensor:
    """The logits of a package call (AOTInductor returns the one output bare or in a list, by torch version)."""
    return out[0] if isinstance(out, (list, tuple)) else out


class TorchStep:
    """The loaded package, its cache layout and (on CUDA) its captured step shapes: one call is one step."""

    def __init__(self, directory: str | Path, settings: dict):
        self.device = settings["device"]
        self.graphs = bool(settings.get("cuda_graphs")) and self.device == "cuda"
        self.packages = packages(settings)
        self.target = settings.get("target")
        where = Path(directory) / TORCH_FILE
        self.paths = {name: inside(directory, entry["file"], f"packages.{name}.file", where)
                      for name, entry in self.packages.items()}
        self.shared: SharedWeights | None = None  # the one copy both packages read, when they share
        self.weights = ""  # where the weights are held, for log lines (set by _load_all)
        self.runners = self._load_all()
        self.cache = settings["kv_cache"]
        self.vocab_size = settings["vocab_size"]
        self.dtype = getattr(torch, settings["dtype"])
        self._captured: dict[tuple, Graphed] = {}  # (package, batch, seq, span, the cache's address) -> its graph
        self._slots: dict[int, torch.Tensor] = {}  # span -> arange(span) on the device (fixed: graphs read it)
        self._owned: dict[int, list[torch.Tensor]] = {}  # batch -> the cache generate and measure reuse

    def _load_all(self) -> dict:
        """Each package's runner. A prefill package without weights ("constants": "decode") reads model.pt2's: one
        copy (torch_weights.load_shared); where this torch refuses, it is given a copy of them, or dropped (model.pt2
        serves every step); self.weights says which, never silently."""
        prefill = self.packages.get(PREFILL)
        if prefill is None or prefill.get("constants", OWN) == OWN:
            runners = {name: self._load(path) for name, path in self.paths.items()}
            self.weights = (f"weights held {len(runners)} times: each package its own copy" if len(runners) > 1
                            else "weights held once, in the package")
            return runners
        for path in self.paths.values():
            self._check_file(path)
        decode, other = self.paths[DECODE], self.paths[PREFILL]
        try:
            runners, self.shared = load_shared(decode, other, self.device, self._load)
            self.weights = f"weights held once: {other.name} reads {decode.name}'s (user-managed constants)"
            return runners
        except SharingUnavailable as exc:
            why = str(exc)
        runners = {DECODE: self._load(decode)}
        try:  # model.pt2 loaded whole (its own copy); the prefill program gets a second
            runners[PREFILL] = load_copied(decode, other, self.device, self._load)
            self.weights = f"weights held twice: {other.name} could not share {decode.name}'s ({why}); it got a copy"
        except SharingUnavailable as again:
            self.packages = {DECODE: self.packages[DECODE]}
            self.weights = (f"weights held once, by {decode.name}, which serves every step: {other.name} holds none "
                            f"and this torch cannot give it {decode.name}'s ({why}; {again})")
        return runners

    def _check_file(self, package: Path) -> None:
        if not package.is_file():
            raise SoftsynError(f"{package}: no such package (runtime/torch.json names it); re-run softsyn compile")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise SoftsynError(f"{package}: compiled for CUDA ({self.target}) and torch sees no CUDA device here; run "
                               "it on the GPU machine")

    def _load(self, package: Path):
        self._check_file(package)
        try:  # run_single_threaded: no model-instance events between runs, which a stream capture forbids
            return torch._inductor.aoti_load_package(str(package), run_single_threaded=self.graphs)
        except Exception as exc:  # torch raises many types for a package it cannot load
            raise SoftsynError(f"{package}: torch cannot load the package ({type(exc).__name__}: "
                               f"{' '.join(str(exc).split())[:300]}); re-run softsyn compile") from None

    def package_for(self, seq: int) -> str:
        """Which package runs a step of `seq` query positions: PREFILL from its min_seq on, when there is one."""
        prefill = self.packages.get(PREFILL)
        return PREFILL if prefill is not None and seq >= prefill["min_seq"] else DECODE

    @property
    def max_length(self) -> int:
        return self.cache["max_length"]

    def empty_cache(self, batch: int = 1, past: list[np.ndarray] | None = None) -> list[torch.Tensor]:
        """Zeroed key and value buffers per layer on the package's device, `past` (arrays [B, kv_heads, n,
        head_dim]) in their first n."""
        shape = (batch, self.cache["kv_heads"], self.max_length, self.cache["head_dim"])
        buffers = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(2 * self.cache["layers"])]
        for buffer, held in zip(buffers, past or []):
            if held.shape[2] > self.max_length:
                raise SoftsynError(f"a past of {held.shape[2]} positions does not fit the package's KV cache of "
                                   f"{self.max_length}; re-run softsyn compile with a larger kv_cache.max_length")
            buffer[:, :, :held.shape[2]] = torch.from_numpy(np.ascontiguousarray(held)).to(self.dtype)
        return buffers

    def owned_cache(self, batch: int) -> list[torch.Tensor]:
        """One cache per batch size kept for the step's life, so captured graphs stay valid across generations
        (slots after a query's position are masked: a new generation needs no zeroing)."""
        if batch not in self._owned:
            self._owned[batch] = self.empty_cache(batch)
        return self._owned[batch]

    def span(self, end: int, package: str = DECODE) -> int:
        """The slots a step of `package` ending at position end - 1 attends over: rounded up (attended_span), or
        exactly `end` for a package whose torch.json entry says span "end"."""
        return end if self.packages[package].get("span", ROUNDED) == END else attended_span(end, self.max_length)

    def __call__(self, ids: np.ndarray, start: int, cache: list[torch.Tensor]) -> torch.Tensor:
        """The logits [B, seq, vocab] (on the package's device) of `ids` [B, seq] at positions start..start+seq-1;
        their keys and values are written into `cache`."""
        batch, seq = ids.shape
        if start + seq > self.max_length:
            raise SoftsynError(f"positions up to {start + seq} do not fit the package's KV cache of {self.max_length}")
        ids = np.asarray(ids, dtype=np.int64)
        package = self.package_for(seq)
        span = self.span(start + seq, package)
        if span not in self._slots:
            self._slots[span] = torch.arange(span, dtype=torch.int64, device=self.device)
        slots = self._slots[span]
        if not self.graphs:
            flat = torch.from_numpy(step_inputs(ids, start)).to(self.device)
            with torch.no_grad():
                return first(self.runners[package](*input_views(flat, ids.shape), slots, *cache))
        key = (package, batch, seq, span, cache[0].data_ptr())
        if key not in self._captured:  # its warm-up runs this step once; the replay below runs it again, alike
            self._captured[key] = Graphed(self.runners[package], cache, ids, start, slots)
        return self._captured[key](ids, start)

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def generate(self, prompt: np.ndarray, gen: int) -> Generation:
        """`gen` greedy tokens after `prompt` (1-D ids), each step timed on the host wall clock."""
        prompt = np.asarray(prompt, dtype=np.int64).reshape(1, -1)
        n = prompt.shape[1]
        if n < 1 or gen < 1 or n + gen - 1 > self.max_length:
            raise SoftsynError(f"prompt {n} + {gen} generated tokens need {n + gen - 1} positions; the package's KV "
                               f"cache holds {self.max_length}; valid: prompt >= 1, gen >= 1, prompt + gen - 1 <= "
                               f"{self.max_length}")
        cache = self.owned_cache(1)
        t0 = time.perf_counter()
        token = int(torch.argmax(self(prompt, 0, cache)[0, -1]))  # int() waits for the device
        ttft = time.perf_counter() - t0
        tokens, tpot = [token], []
        for i in range(1, gen):
            t = time.perf_counter()
            token = int(torch.argmax(self(np.array([[token]]), n + i - 1, cache)[0, -1]))
            tpot.append(time.perf_counter() - t)
            tokens.append(token)
        return Generation(tuple(tokens), ttft, tuple(tpot), "static")

    def time_steps(self, dims: dict[str, int], runs: int) -> list[float]:
        """Seconds of each of `runs` steps at a path group's dims (batch, seq, past): seeded ids, the step's own cache,
        each run waiting for the device (a replayed graph when cuda_graphs)."""
        batch, seq, past = dims.get("batch", 1), dims.get("seq", 1), dims.get("past", 0)
        ids = np.random.default_rng(0).integers(0, self.vocab_size, size=(batch, seq), dtype=np.int64)
        cache = self.owned_cache(batch)
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            self(ids, past, cache)
            self.sync()
            times.append(time.perf_counter() - t)
        return times

    def measure(self, dims: dict[str, int], runs: int = 10, warmup: int = 2) -> float:
        """The median seconds of one step at a path group's dims, after `warmup` untimed ones (time_steps)."""
        return statistics.median(self.time_steps(dims, warmup + runs)[warmup:])
