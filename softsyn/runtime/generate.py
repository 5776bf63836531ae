"""Greedy generation on one ONNX Runtime session: a prefill, then one decode step per token, KV cache as emitted.

`Generator(session, io, ...)` drives a decoder artifact (its IO from softsyn.runtime.decoder). The KV cache is
fed the way the graph declares it (`DecoderIO.shares_buffer`):

- grown: the first past is empty, each step binds the previous step's present outputs as its past inputs and
  the runtime allocates the new presents (past + 1 positions); the attention mask grows by one per step;
- shared: one buffer of `max_length` positions per layer and key/value, bound as both past input and present
  output, which GroupQueryAttention updates in place. Every decode step then runs with the same bindings (the
  token, position and a `max_length` attention mask updated in place, the logits preallocated): static shapes
  and addresses, what the CUDA provider's graph capture needs; with `cuda_graph` the prefill runs outside any
  captured graph (run option gpu_graph_id -1) and the decode steps are captured once, then replayed.

A hybrid decoder's conv and recurrent states (`DecoderIO.states`, fixed size) live in two buffers per state,
zeroed before each prompt: a step reads one and writes the other, the next step the reverse (a state is no
in-place update: its next value is computed from the whole of it). The prompt runs as one step over all its
tokens, like any decoder's prefill; a shared-buffer decode keeps one binding per parity (and, with CUDA graphs,
one captured graph per parity), so addresses stay fixed.

What a step's time covers (host wall clock, time.perf_counter): putting its inputs on the device (the grown
loop binds new OrtValues, the shared one updates them in place), one run_with_iobinding (the CUDA provider
synchronises at its end), the logits copied to the host and their argmax. TTFT is the prefill step: all of
the prompt's logits are copied ([batch, seq, vocab]) unless the artifact emits the last position's only. Not
covered: tokenisation, the session's creation, allocating the shared buffers (once, before the first prefill).
Each step is timed as three contiguous phases (PHASES: inputs, run, readback) that sum to it, so a step reads
against softsyn signoff's, which times the run phase alone; `Generator.runs` counts the run calls per step shape,
so a generation says whether its prefill was the first run of its prompt length on the session (`cold`).
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from softsyn.errors import SoftsynError
from softsyn.runtime.binding import KeptInputs, device_of, empty, to_device
from softsyn.runtime.decoder import DecoderIO
from softsyn.runtime.greedy import greedy_token

INPUT_SHAPES = 4  # device inputs kept per input name, one per recent shape (prompt lengths; a grown cache's steps)
STEP_INTERVAL = ("host wall clock per step: its inputs put on the device, one run_with_iobinding, the logits "
                 "copied to the host and their argmax (greedy); TTFT = the prefill step (the logits the artifact "
                 "emits copied: the last position's, or every prompt position's when compiled --all-logits), "
                 "TPOT = one decode step; no tokenisation, session creation or buffer allocation")
# The three contiguous phases each step is timed as (they sum to the step): name -> what it covers
PHASES = {"inputs": "the step's ids, mask and positions put on the device and bound (updated in place: a "
                    "prefill's where its prompt length ran before, else new OrtValues)",
          "run": "one run_with_iobinding call: the interval softsyn signoff measures as a path group's step",
          "readback": "the logits copied to the host and their argmax"}


@dataclass(frozen=True)
class Generation:
    tokens: tuple[int, ...]  # the generated ids, the prefill's first
    ttft: float  # s, the prefill step
    tpot: tuple[float, ...]  # s, each decode step (len(tokens) - 1 of them)
    kv: str  # "shared" | "grown"
    ttft_phases: tuple[float, ...] = ()  # s, the prefill's PHASES in order (they sum to ttft); () where not timed so
    tpot_phases: tuple[tuple[float, ...], ...] = ()  # s, each decode step's PHASES
    cold: bool = False  # its prefill was the first run of this prompt length on the session


def prompt_ids(vocab_size: int, length: int, seed: int = 0) -> np.ndarray:
    """A seeded random prompt of `length` token ids below `vocab_size`."""
    return np.random.default_rng(seed).integers(0, vocab_size, size=length, dtype=np.int64)


class Generator:
    """Greedy decoding of one sequence (batch 1) on `session`, KV cache as `io` declares it.

    `share_buffer`: None follows the graph (io.shares_buffer); True runs GroupQueryAttention in place on a
    `max_length` buffer also where the graph declares a growing cache (GQA accepts both). `max_length`: the
    shared buffer's positions where the graph's dim is symbolic."""

    def __init__(self, session, io: DecoderIO, provider: str = "cpu", share_buffer: bool | None = None,
                 max_length: int | None = None, cuda_graph: bool = False):
        self.session, self.io, self.device = session, io, device_of(provider)
        self.shared = io.shares_buffer if share_buffer is None else share_buffer
        self.max_length = (io.buffer_length or max_length) if self.shared else None
        if self.shared and not self.max_length:
            raise SoftsynError("a shared past/present buffer needs its length: the graph's KV sequence dim is "
                               "symbolic and no max_length was given (runtime/session.json kv_cache.max_length)")
        if cuda_graph and not self.shared:
            raise SoftsynError("CUDA graphs replay fixed buffers, and this graph grows its KV cache (present is "
                               "past + seq long): enable_cuda_graph needs a shared past/present buffer")
        self.cuda_graph = cuda_graph
        self.buffers = None  # the shared KV buffers, allocated on first use and reused by every generation
        self.decode_io = None  # the shared-buffer decode step's binding and its input values (_static_decode)
        self.states = None  # a hybrid decoder's two buffers per state (_states)
        self.inputs = KeptInputs(self.device, INPUT_SHAPES)  # a prefill's device inputs, per prompt length
        # run calls per step shape: ("prefill", prompt length), ("step", 1) a grown decode, ("decode", parity) a shared one
        self.runs: Counter = Counter()

    @property
    def limit(self) -> int | None:
        """Positions a generation may fill: the shared buffer, the rotary caches (None: no limit known)."""
        bounds = [b for b in (self.max_length, self.io.max_positions) if b]
        return min(bounds) if bounds else None

    def check_room(self, n: int, gen: int) -> None:
        """A SoftsynError unless a prompt of `n` tokens and `gen` generated ones fit the artifact (before any
        of it is allocated)."""
        if n < 1 or gen < 1:
            raise SoftsynError(f"a generation needs a prompt and at least one token (prompt {n}, gen {gen})")
        if self.limit is not None and n + gen - 1 > self.limit:
            raise SoftsynError(f"prompt {n} + {gen} generated tokens need {n + gen - 1} positions; the artifact "
                               f"holds {self.limit} ({'its KV buffer' if self.limit == self.max_length else 'its rotary caches'})"
                               f"; valid: prompt + gen - 1 <= {self.limit}")

    def generate(self, prompt: np.ndarray, gen: int, on_token=None) -> Generation:
        """`gen` greedy tokens after `prompt` (1-D ids); `on_token(done, gen)` is called between steps, untimed."""
        prompt = np.asarray(prompt).reshape(-1)
        n = len(prompt)
        self.check_room(n, gen)
        kv = self._kv()
        self._states()
        cold = self.runs[("prefill", n)] == 0
        token, kv, prefill = self._step(prompt, 0, kv, 0)
        tokens, phases = [token], []
        if on_token:
            on_token(1, gen)
        decode = self._static_decode(n) if self.shared else None
        for i in range(1, gen):
            if decode is not None:
                token, step = decode(token, n + i - 1, i % 2)
            else:
                token, kv, step = self._step(np.array([token]), n + i - 1, kv, i % 2)
            phases.append(step)
            tokens.append(token)
            if on_token:
                on_token(i + 1, gen)
        return Generation(tuple(tokens), sum(prefill), tuple(sum(p) for p in phases), "shared" if self.shared else "grown",
                          ttft_phases=prefill, tpot_phases=tuple(phases), cold=cold)

    # ------------------------------------------------------------------------------------ the steps

    def _kv(self) -> list:
        """Per layer (key, value): the shared buffers, or an empty past for a grown cache."""
        shape = [1, self.io.kv_heads, self.max_length if self.shared else 0, self.io.head_size]
        if not self.shared:
            return [(empty(shape, self.io.kv_elem, self.device), empty(shape, self.io.kv_elem, self.device))
                    for _ in self.io.layers]
        if self.buffers is None:  # zeros: positions past the sequence are masked, and masked zeros are never NaN
            dtype = ir.DataType(self.io.kv_elem).numpy()  # one array each: a CPU OrtValue shares its array's memory
            self.buffers = [(to_device(np.zeros(shape, dtype), self.device), to_device(np.zeros(shape, dtype), self.device))
                            for _ in self.io.layers]
        return self.buffers

    def _states(self) -> list:
        """Per state port, its two buffers (allocated once, zeroed here: no state before the prompt)."""
        zeros = [np.zeros((1, *port.shape), ir.DataType(port.elem).numpy()) for port in self.io.states]
        if self.states is None:
            self.states = [(to_device(z, self.device), to_device(z.copy(), self.device)) for z in zeros]
        for (first, _), z in zip(self.states, zeros):
            first.update_inplace(z)
        return self.states

    def _bind_states(self, binding, parity: int) -> None:
        """A step of `parity` reads each state from buffer `parity` and writes it to the other."""
        for port, pair in zip(self.io.states, self.states or ()):
            binding.bind_ortvalue_input(port.past, pair[parity])
            binding.bind_ortvalue_output(port.present, pair[1 - parity])

    def _array(self, name: str, values) -> np.ndarray:
        return np.asarray(values, dtype=self.io.dtype(name)).reshape(1, -1)

    def _bind_kv(self, binding, kv) -> None:
        for layer, (key, value) in zip(self.io.layers, kv):
            binding.bind_ortvalue_input(layer.past_key, key)
            binding.bind_ortvalue_input(layer.past_value, value)
            if self.shared:
                binding.bind_ortvalue_output(layer.present_key, key)
                binding.bind_ortvalue_output(layer.present_value, value)
            else:
                binding.bind_output(layer.present_key, self.device, 0)
                binding.bind_output(layer.present_value, self.device, 0)

    def _run_options(self, graph_id: str | None):
        if not self.cuda_graph:
            return None

        options = ort.RunOptions()
        options.add_run_config_entry("gpu_graph_id", graph_id)
        return options

    def _step(self, tokens: np.ndarray, start: int, kv, parity: int) -> tuple[int, list, tuple[float, ...]]:
        """One run on `tokens` after `start` cached positions, states read from buffer `parity`: (the greedy next
        token, the next step's past, the step's PHASES in s)."""
        io, n = self.io, len(tokens)
        t0 = time.perf_counter()
        binding = self.session.io_binding()
        binding.bind_output(io.logits, self.device, 0)  # bound first: get_outputs() lists outputs in binding order
        binding.bind_ortvalue_input(io.input_ids, self.inputs(io.input_ids, self._array(io.input_ids, tokens)))
        if io.attention_mask:
            binding.bind_ortvalue_input(io.attention_mask,
                                        self.inputs(io.attention_mask, np.ones((1, start + n), io.dtype(io.attention_mask))))
        if io.position_ids:
            binding.bind_ortvalue_input(io.position_ids,
                                        self.inputs(io.position_ids, self._array(io.position_ids, np.arange(start, start + n))))
        self._bind_kv(binding, kv)
        self._bind_states(binding, parity)
        options = self._run_options("-1")  # -1: never captured (prefill)
        t1 = time.perf_counter()
        self.session.run_with_iobinding(binding, options)
        t2 = time.perf_counter()
        out = binding.get_outputs()
        token = greedy_token(out[0].numpy()[0, -1])
        if not self.shared:  # the presents the runtime allocated: the next step's past
            kv = [(out[1 + 2 * i], out[2 + 2 * i]) for i in range(len(io.layers))]
        t3 = time.perf_counter()
        self.runs[("prefill", n) if start == 0 else ("step", n)] += 1
        return token, kv, (t1 - t0, t2 - t1, t3 - t2)

    def _static_decode(self, prompt_len: int):
        """The decode step of a shared buffer: its bindings made once per Generator and reused by every generation
        (a captured CUDA graph replays the addresses it was captured with), inputs updated in place."""
        io = self.io
        if self.decode_io is None:
            mask_host = np.zeros((1, self.max_length), io.dtype(io.attention_mask)) if io.attention_mask else None
            values = {io.input_ids: to_device(self._array(io.input_ids, [0]), self.device)}
            if mask_host is not None:
                values[io.attention_mask] = to_device(mask_host, self.device)
            if io.position_ids:
                values[io.position_ids] = to_device(self._array(io.position_ids, [0]), self.device)
            logits = empty([1, 1, io.vocab_size], self._logits_elem(), self.device)
            bindings = []
            for parity in range(2 if io.states else 1):  # a hybrid decoder's states alternate between two buffers
                binding = self.session.io_binding()
                for name, value in values.items():
                    binding.bind_ortvalue_input(name, value)
                self._bind_kv(binding, self.buffers)
                self._bind_states(binding, parity)
                binding.bind_ortvalue_output(io.logits, logits)
                bindings.append((binding, self._run_options(str(parity + 1))))
            self.decode_io = (bindings, values, mask_host, logits)
        bindings, values, mask_host, logits = self.decode_io
        if mask_host is not None:  # this generation's prompt, nothing after it
            mask_host[:] = 0
            mask_host[0, :prompt_len] = 1

        def step(previous: int, start: int, parity: int) -> tuple[int, tuple[float, ...]]:
            t0 = time.perf_counter()
            values[io.input_ids].update_inplace(self._array(io.input_ids, [previous]))
            if mask_host is not None:
                mask_host[0, start] = 1  # the positions before it are set already
                values[io.attention_mask].update_inplace(mask_host)
            if io.position_ids:
                values[io.position_ids].update_inplace(self._array(io.position_ids, [start]))
            binding, options = bindings[parity % len(bindings)]
            t1 = time.perf_counter()
            self.session.run_with_iobinding(binding, options)
            t2 = time.perf_counter()
            token = greedy_token(logits.numpy()[0, -1])
            t3 = time.perf_counter()
            self.runs[("decode", parity % len(bindings))] += 1
            return token, (t1 - t0, t2 - t1, t3 - t2)

        return step

    def _logits_elem(self) -> int:
        kind = next(o.type for o in self.session.get_outputs() if o.name == self.io.logits)
        elem = {"tensor(float)": ir.DataType.FLOAT, "tensor(float16)": ir.DataType.FLOAT16,
                "tensor(bfloat16)": ir.DataType.BFLOAT16, "tensor(double)": ir.DataType.DOUBLE}.get(kind)
        if elem is None or self.io.vocab_size is None:
            raise SoftsynError(f"output {self.io.logits}: {kind} of a vocabulary {self.io.vocab_size}; a shared-buffer "
                               "decode preallocates float logits [1, 1, vocab]")
        return int(elem)
