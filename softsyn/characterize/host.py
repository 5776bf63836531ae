"""The host work of a continuous-batching iteration, measured on the target (a library's `serving_host:` block).

An ONNX Runtime engine that batches sequences (bench/serving_validate.py's harness) does work on the host around
each iteration's run calls that the STA's step times do not hold: it updates the inputs in place (token ids, each
row's attention_mask over the KV buffer, position ids), takes the logits' argmax (on the device on a GPU, ids back
to the host) and, for a prompt, makes a binding (every layer's past and present key and value bound by address)
and copies the prompt's logits to the host; a finished sequence's row may be refilled by a KV copy. The probe
times those operations, as the harness runs them, at tiny shapes and at a few larger ones, and derives:

- iteration: the fixed cost (1 row, a 16-position mask, 64 logits), s;
- input_bandwidth: the mask's bytes over the extra time at 16 rows x 4096 positions, B/s;
- sample_bandwidth: the logits' bytes over the extra time of an argmax over 16 x 65536 fp32, B/s;
- readback_bandwidth: a 4 MiB output copied to the host (OrtValue.numpy()), B/s;
- bind: one io_binding bind call by address, s;
- move: one KV row-move copy of a few bytes (index, copy, device sync), s; its bytes cost
  ceilings.memory_bandwidth;
- first_shape_gemm, first_shape_node: what the first run at a row count a session has not met costs beyond a
  repeat at that count, per distinct MatMul shape and per elementwise node, s (a serving engine meets a prompt
  length for the first time on the trace's clock). On the H100 (2026-12-06) a chain of 8 MatMuls of one weight
  shape paid ~0.02 ms at a new row count and 8 of distinct shapes ~1.7 ms: the cost is per GEMM shape (cuBLAS
  picks an algorithm per problem size), so the MatMul chain's weights differ in width. Each session is run once
  at the largest count first, so what is timed is the new shape, not the memory arena growing.

Each figure is the median of `repeats` timings; the whole probe takes well under a second on the CPU.
"""
from __future__ import annotations

import datetime
import statistics
import time

import numpy as np
from onnx import TensorProto, helper

from softsyn.runtime.binding import device_of, to_device
from softsyn.runtime.session import IR_VERSION, SessionSettings, describe_device, open_session

SMALL = (1, 16, 64)  # rows, mask positions, vocab: the fixed cost
MASK = (16, 4096, 64)  # the mask's bytes grow
LOGITS = (16, 16, 65536)  # the argmax's bytes grow
READBACK = 1 << 20  # fp32 elements copied to the host (4 MiB)
BINDS = 64  # bind calls per timing
FIRST_NODES = 8  # nodes in a first-shape probe graph (a chain)
FIRST_WIDTH = 512  # their width
FIRST_ROWS = tuple(range(33, 33 + 7 * 24, 7))  # fresh row counts, each met once (prompt lengths a trace meets first)


def _torch():
    """torch, for a GPU probe's device tensors (the harness keeps logits and KV in torch tensors on the GPU)."""
    # deferred: torch is seconds to import; only a GPU probe needs it
    import torch
    return torch


def _median(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class _Iteration:
    """A decode iteration's host work at (rows, positions, vocab), as the harness's Engine.decode does it."""

    def __init__(self, provider: str, rows: int, length: int, vocab: int):
        self.device, self.n = device_of(provider), rows
        self.positions, self.pasts = np.arange(length), np.arange(rows) % length
        self.values = [to_device(np.zeros((rows, w), np.int64), self.device) for w in (1, length, 1)]
        logits = np.random.default_rng(0).random((rows, 1, vocab), dtype=np.float32)
        if self.device == "cuda":
            torch = _torch()
            self.torch, self.logits = torch, torch.from_numpy(logits).cuda()
        else:
            self.torch, self.logits = None, logits

    def __call__(self) -> np.ndarray:
        ids, mask, pos = self.values
        ids.update_inplace(np.asarray(self.pasts, np.int64).reshape(self.n, -1))
        mask.update_inplace(np.asarray(self.positions[None, :] <= self.pasts[:, None], np.int64).reshape(self.n, -1))
        pos.update_inplace(np.asarray(self.pasts, np.int64).reshape(self.n, -1))
        if self.torch is None:
            return self.logits[:, -1].argmax(-1)
        return self.logits[:, -1].argmax(-1).cpu().numpy()


def _move(provider: str):
    """One KV row move as the harness makes it (rows of a [layers, 2, rows, heads, positions, head] buffer)."""
    kv = np.zeros((2, 2, 4, 1, 16, 8), np.float32)
    if device_of(provider) == "cpu":
        def move():
            kv[:, :, [1], :, :8] = kv[:, :, [3], :, :8]
        return move
    torch = _torch()
    t = torch.from_numpy(kv).cuda()

    def move_cuda():
        src, dst = torch.tensor([3], device="cuda"), torch.tensor([1], device="cuda")
        t[:, :, dst, :, :8] = t[:, :, src, :, :8]
        torch.cuda.synchronize()
    return move_cuda


def _bind(provider: str):
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "bind",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION)
    sess = open_session(model, SessionSettings(provider=provider, log_severity=3))
    value = to_device(np.zeros((1, 8), np.float32), device_of(provider))
    binding = sess.io_binding()

    def bind():
        for _ in range(BINDS):
            binding.bind_input("x", value.device_name(), 0, np.float32, [1, 8], value.data_ptr())
    return bind


def chain_session(provider: str, op: str, widths: list[int]):
    """rows -> one run of a session chaining len(widths) `op` nodes over [rows, FIRST_WIDTH] (rows symbolic), fp16 on
    a GPU: a MatMul node i maps the width before it to widths[i] (distinct widths: distinct GEMM shapes), an Add keeps
    FIRST_WIDTH."""
    dtype, np_dtype = (TensorProto.FLOAT16, np.float16) if device_of(provider) != "cpu" else (TensorProto.FLOAT,
                                                                                             np.float32)
    rng = np.random.default_rng(0)
    sizes = [FIRST_WIDTH] + (list(widths) if op == "MatMul" else [FIRST_WIDTH] * len(widths))
    shapes = [[sizes[i], sizes[i + 1]] if op == "MatMul" else [FIRST_WIDTH] for i in range(len(widths))]
    weights = [helper.make_tensor(f"w{i}", dtype, shape,
                                  (rng.standard_normal(shape) * 0.04).astype(np_dtype).tobytes(), raw=True)
               for i, shape in enumerate(shapes)]
    nodes = [helper.make_node(op, [f"x{i}", f"w{i}"], [f"x{i + 1}"]) for i in range(len(widths))]
    graph = helper.make_graph(nodes, f"first_{op}", [helper.make_tensor_value_info("x0", dtype, ["rows", sizes[0]])],
                              [helper.make_tensor_value_info(f"x{len(widths)}", dtype, ["rows", sizes[-1]])],
                              weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION)
    sess = open_session(model, SessionSettings(provider=provider, log_severity=3))
    return lambda rows: sess.run(None, {"x0": np.ones((rows, FIRST_WIDTH), np_dtype)})


def first_run_extra(run, counts=FIRST_ROWS) -> float:
    """s: the median, over row `counts` each met once, of the first run at a count minus the fastest of three
    repeats at it; the session is run at a larger count first (the arena sized for every later shape, the session's
    own first-run work done). Noise may make it negative."""
    for _ in range(3):
        run(counts[-1] + 1)
    extra = []
    for rows in counts:
        times = []
        for _ in range(4):
            t = time.perf_counter()
            run(rows)
            times.append(time.perf_counter() - t)
        extra.append(times[0] - min(times[1:]))  # the fastest repeat: a busy host's stalls hit repeats less often
    return statistics.median(extra)


def first_shape(provider: str, op: str) -> float:
    """s per `op` node: first_run_extra of a chain of FIRST_NODES of them (MatMuls each 64 wider: no two share a GEMM
    shape) over FIRST_NODES; 0 when the first run is no slower."""
    widths = [FIRST_WIDTH + 64 * (i + 1) for i in range(FIRST_NODES)] if op == "MatMul" else [FIRST_WIDTH] * FIRST_NODES
    return max(first_run_extra(chain_session(provider, op, widths)), 0.0) / FIRST_NODES


def measure_host(provider: str = "cpu", repeats: int = 200) -> dict:
    """The `serving_host:` block's figures on this machine for `provider` ("cpu" | "cuda"), with where and when."""
    small = _median(_Iteration(provider, *SMALL), repeats)
    mask = _median(_Iteration(provider, *MASK), repeats)
    sample = _median(_Iteration(provider, *LOGITS), repeats)
    out = to_device(np.zeros(READBACK, np.float32), device_of(provider))
    readback = _median(out.numpy, repeats)
    mask_bytes = MASK[0] * (MASK[1] - SMALL[1]) * 8
    logit_bytes = LOGITS[0] * (LOGITS[2] - SMALL[2]) * 4
    return {"iteration": small,
            "input_bandwidth": mask_bytes / max(mask - small, 1e-9),
            "sample_bandwidth": logit_bytes / max(sample - small, 1e-9),
            "readback_bandwidth": READBACK * 4 / readback,
            "bind": _median(_bind(provider), repeats) / BINDS,
            "move": _median(_move(provider), repeats),
            "first_shape_gemm": first_shape(provider, "MatMul"),
            "first_shape_node": first_shape(provider, "Add"),
            "device": describe_device(provider),
            "date": datetime.date.today().isoformat(),
            "command": f"softsyn.characterize.host.measure_host({provider!r}, repeats={repeats}): medians"}


def yaml_number(v) -> str:
    """3 significant digits, always with a dot and a signed exponent (PyYAML reads "1e10" and "6e-05" as strings)."""
    if v is None:
        return "null"
    mant, exp = f"{v:.2e}".split("e")
    mant = mant.rstrip("0")
    mant = mant + "0" if mant.endswith(".") else mant
    return f"{mant}e{int(exp):+03d}"


def host_yaml(figures: dict) -> str:
    """The `serving_host:` block as a library file holds it, each figure with its unit."""
    units = {"iteration": "s", "input_bandwidth": "B/s", "sample_bandwidth": "B/s", "readback_bandwidth": "B/s",
             "bind": "s per call", "move": "s per copy (+ bytes at ceilings.memory_bandwidth)",
             "first_shape_gemm": "s per distinct GEMM shape, first run at a new row count", "first_shape_node":
             "s per other node, first run at a new shape"}
    lines = ["serving_host:   # host work of a batching iteration (softsyn.characterize.host; docs/serving.md)"]
    for key, unit in units.items():
        if key in figures:  # a block probed before first_shape_* existed has none: "not measured"
            lines.append(f"  {key}: {yaml_number(figures[key])}   # {unit}")  # "6e-05" would read as a string
    for key in ("device", "date", "command"):
        if key in figures:
            lines.append(f"  {key}: '{str(figures[key]).replace(chr(39), chr(39) * 2)}'")
    return "\n".join(lines) + "\n"


def with_host_block(text: str, block: str) -> str:
    """A library file's text with its `serving_host:` block replaced by `block` (appended when it has none)."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.startswith("serving_host:")), None)
    if start is None:
        return text + ("" if text.endswith("\n") else "\n") + block
    end = next((i for i in range(start + 1, len(lines)) if lines[i].strip() and not lines[i][0].isspace()), len(lines))
    return "".join(lines[:start]) + block + "".join(lines[end:])
