"""Serving under load, predicted against measured (issue 30, item 3): a compiled decoder's batched decode steps and
mixed step beside softsyn's step table, and the serving simulation's TTFT/TPOT beside a continuous-batching run of
the artifact under the same arrival trace.

    python bench/serving_validate.py        # CPU: zoo:qwen3-tiny, constraints/serving-tiny.yaml, ~2 min
    python3 bench/serving_validate.py --provider cuda --model zoo:qwen3-1.7b \\
        --constraints constraints/serving-h200.yaml --work /tmp/serving --seconds 300 -o OUT.md   # an H200

1. Artifact. `softsyn compile MODEL -c CONSTRAINTS --target T --effort low -o WORK/NAME-PROVIDER` (T: cpu-ort on
   cpu, h200-ort-cuda on cuda, or --target), reused while the model, the constraints file's text, the target, its
   library file and the effort are the same (WORK/.../serving-validate.json); --artifact DIR takes one compiled before. The
   constraints need a `serving:` block: the compile then simulates its final design and keeps the step table it
   simulated on in analysis.json (serving.steps); that table (softsyn.timing.serving.StepTable.from_points) is the
   prediction everywhere below, the numbers the simulation uses. The session is opened as `softsyn run` opens it
   (runtime/session.json's provider options and session options, softsyn.runtime.session.open_model; CUDA graphs
   when the artifact asks for them).
2. Batched decode. The artifact's KV cache is one shared max_length buffer per layer (kv_layout): here one buffer
   of max(--batches, max_batch) rows, each row a sequence slot, held as torch tensors and bound to the session by
   address (a batch of N is rows 0..N-1; a prefill is one row). A decode step at batch N runs N sequences at
   different pasts (evenly spread over [past/2, 3 past/2], mean --past): per-row attention_mask and position_ids,
   so GroupQueryAttention's seqlens_k (the mask's row sums - 1) gives each row its own length. The mixed step is a
   prefill of --prompt tokens into row N-1, then the decode of rows 0..N-2: the simulation's model of it, since one
   [batch, seq] call cannot hold both (GQA derives every row's past as seqlens_k + 1 - seq, so a decode row padded
   to the prompt's seq would write its token at the wrong positions). --warmup untimed rounds, then rounds in
   which each configuration in turn runs once untimed and up to BURST times timed, back to back, until --runs
   samples each; medians. `run` = the run_with_iobinding call(s) (what the STA times); `iteration` = the engine
   iteration around them (inputs updated on the device, the calls, logits' argmax, the token ids to the host).
3. Trace. One seeded Poisson trace from the serving block (softsyn.timing.serving.requests: arrival_rate, the
   lognormal prompt/gen lengths, seed), cut to the first requests whose arrivals fit --trace-share of --seconds
   (and --requests). softsyn.timing.serving.simulate runs on it with the compile's step table and scheduler (max_batch,
   batch_timeout, the KV budget and per-sequence length from analysis.json); the harness runs the artifact on the
   wall clock under the same scheduler rules: an idle engine waits up to batch_timeout after the first arrival (or
   until max_batch wait); each iteration admits waiting requests first come, first served within max_batch and the
   KV budget (prompt + gen reserved), runs each admitted prompt's prefill, then one decode step of the sequences
   running before it; a request's first token is stamped at the iteration's end (as the simulation stamps it);
   finished sequences leave, and a row one freed below the new batch size takes the sequence of a top row (the
   artifact's batch is rows 0..N-1; softsyn.timing.serving.simulate.Queue.place, at most one move per finished
   sequence): an iteration's moves are one copy of their cached positions, every layer's key and value at once.
   TTFT, TPOT, e2e, queue and throughput have the simulation's definitions (softsyn.timing.serving.checks).
   Before the trace, a first-shape probe runs prefills at a few prompt lengths the session has not met (first run
   vs repeats), beside the compile's model of that cost; the simulation starts from the lengths this engine ran.

Everything printed is measured on this machine or labelled as softsyn's estimate (est). The trace is simulated twice:
over the run calls alone (the step table) and with the engine's host work per iteration the compile modelled from
its library's measured serving_host block (softsyn.timing.serving.host: inputs, argmax, a prompt's binding and
logits, KV row moves; analysis.json serving.host); the measured run sits beside both, and the host seconds of each. Exit 2: bad arguments or constraints (one line naming what).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from softsyn.timing.serving.simulate import Queue  # noqa: E402  (the scheduler rules the harness shares)
from softsyn.runtime.greedy import greedy_token, greedy_tokens  # noqa: E402  (argmax as softsyn run samples)
from softsyn.runtime.binding import KeptInputs  # noqa: E402  (an engine's kept device inputs, as softsyn run keeps them)

TARGETS = {"cpu": "cpu-ort", "cuda": "h200-ort-cuda"}
BURST = 5  # timed runs of one step configuration back to back, per round
LOGITS = {"tensor(float)": "float32", "tensor(float16)": "float16"}  # logits the harness binds (numpy has no bf16)
STAMP = "serving-validate.json"  # beside the artifact: what it was compiled from


class UserError(Exception):
    """Bad input: printed as one line, exit 2."""


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--provider", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--model", default="zoo:qwen3-tiny", help="what softsyn compile takes (zoo:qwen3-tiny, zoo:qwen3-1.7b)")
    ap.add_argument("--constraints", default=str(ROOT / "constraints" / "serving-tiny.yaml"),
                    help="a constraints file with a serving: block (default constraints/serving-tiny.yaml)")
    ap.add_argument("--target", help="library for the compile (default: cpu-ort on cpu, h200-ort-cuda on cuda)")
    ap.add_argument("--effort", default="low")
    ap.add_argument("--work", default="/tmp/serving-validate", help="the compiled artifact goes under it")
    ap.add_argument("--artifact", help="a `softsyn compile` output compiled before (with a serving: block): no compile")
    ap.add_argument("--eager", action="store_true",
                    help="no CUDA graphs, though the artifact's session.json asks for them (decode runs eagerly)")
    ap.add_argument("--compile-only", action="store_true", help="compile (or find) the artifact, print its folder, stop")
    ap.add_argument("--seconds", type=float, default=120.0, help="time budget of the measurements (compile excluded)")
    ap.add_argument("--trace-share", type=float, default=0.4,
                    help="the trace's arrivals span at most this share of --seconds (default 0.4)")
    ap.add_argument("--requests", type=int, help="at most this many requests of the trace (default: the serving block's)")
    ap.add_argument("--batches", default="1,4,8,16", help="decode batch sizes to measure (default 1,4,8,16)")
    ap.add_argument("--past", help="mean pasts of the decode rows, comma-separated (default prompt p50 + gen p50 / 2); "
                    "the mixed step uses the first")
    ap.add_argument("--prompt", type=int, help="the mixed step's prompt (default the serving block's prompt p50)")
    ap.add_argument("--runs", type=int, default=50, help="timed runs per step configuration (default 50)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed rounds of every configuration first (default 5)")
    ap.add_argument("-o", "--output", help="markdown result (also printed)")
    args = ap.parse_args(argv)
    try:
        args.batch_list = sorted({int(b) for b in args.batches.split(",")})
    except ValueError:
        ap.error(f"--batches {args.batches!r}: valid: comma-separated positive integers")
    if min(args.batch_list) < 1 or args.runs < 1 or args.warmup < 0 or args.seconds <= 0:
        ap.error("--batches, --runs and --seconds must be positive, --warmup at least 0")
    if not 0 < args.trace_share <= 1:
        ap.error("--trace-share must be in (0, 1]")
    try:
        args.past_list = [int(p) for p in args.past.split(",")] if args.past else None
    except ValueError:
        ap.error(f"--past {args.past!r}: valid: comma-separated positive integers")
    if args.past_list is not None and min(args.past_list) < 1 or args.prompt is not None and args.prompt < 1:
        ap.error("--past and --prompt must be positive")
    return args


def log(msg: str) -> None:
    print(f"[serving {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ the artifact

def compile_artifact(args) -> Path:
    """WORK/NAME-PROVIDER compiled by `softsyn compile` (or reused: same model, constraints text, target, effort)."""
    cons = Path(args.constraints)
    if not cons.is_file():
        raise UserError(f"--constraints {cons}: no such file")
    target = args.target or TARGETS[args.provider]
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in args.model.split(":")[-1])
    out = Path(args.work) / f"{name}-{args.provider}"
    stamp = {"model": args.model, "constraints": hashlib.sha256(cons.read_bytes()).hexdigest(), "target": target,
             "library": library_digest(target), "effort": args.effort}
    done = out / STAMP
    if done.is_file() and json.loads(done.read_text()) == stamp and (out / "runtime" / "session.json").is_file():
        log(f"reusing {out} (compiled from the same model, constraints, target and effort)")
        return out
    cmd = [sys.executable, "-m", "softsyn", "compile", args.model, "-c", str(cons), "--target", target,
           "--effort", args.effort, "-o", str(out), "-q"]
    log("compiling: " + " ".join(shlex.quote(c) for c in cmd))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    # exit 1 is a violated check: the artifact is written all the same
    if proc.returncode not in (0, 1) or not (out / "runtime" / "session.json").is_file():
        tail = " | ".join(line for line in (proc.stderr + proc.stdout).splitlines()[-3:] if line.strip())
        if proc.returncode == 2:
            raise UserError(f"softsyn compile refused the input: {tail}")
        raise subprocess.SubprocessError(f"softsyn compile exit {proc.returncode}: {tail}")
    done.write_text(json.dumps(stamp))
    log(f"compiled {out} in {time.perf_counter() - t0:.0f} s")
    return out


def library_digest(target: str) -> str:
    """The target library file's sha256: a library measured again (its serving_host block) means a new compile."""
    from softsyn.library.load import load_library

    try:
        return hashlib.sha256(load_library(target).path.read_bytes()).hexdigest()
    except Exception as exc:  # an unknown target: softsyn compile names it, with the valid ones
        return f"unreadable: {exc}"


@dataclass
class Artifact:
    directory: Path
    design: str
    session: object
    io: object
    provider: str
    cuda_graph: bool
    table: object  # StepTable: the compile's serving step table
    sched: object  # Scheduler: the compile's serving scheduler
    serving: object  # the constraints' Serving block
    options: dict = field(default_factory=dict)


def open_artifact(directory: Path, constraints: str, provider: str, eager: bool = False) -> Artifact:
    """The artifact's session, opened as `softsyn run` opens it, its decoder IO and the compile's serving model."""
    import onnx_ir as ir

    from softsyn.constraints.model import load_constraints
    from softsyn.flow.cpu_view import cpu_view_session
    from softsyn.flow.run import load_artifact
    from softsyn.results.serving import StepPoint
    from softsyn.runtime.decoder import decoder_io
    from softsyn.runtime.session import PROVIDERS, open_model
    from softsyn.timing.serving import HostWork, Scheduler, StepTable

    serving = load_constraints(constraints).serving
    if serving is None:
        raise UserError(f"{constraints}: no serving: block (docs/serving.md); the bench replays its arrival trace")
    model, session, design = load_artifact(directory)
    analysis = json.loads((directory / "analysis.json").read_text())
    served = analysis.get("serving")
    if not served or not served.get("steps"):
        raise UserError(f"{directory}: analysis.json has no serving step table: compile it with a serving: block")
    graph = ir.load(str(model))
    io = decoder_io(graph)
    if serving.prompt_buckets and not any(n.op_type == "GatherElements" for n in graph.graph):
        raise UserError(f"{model}: serving.prompt_buckets pads prompts, but this artifact takes the last position's "
                        f"logits (a padding one): compile it with the {constraints} it is served under")
    if not io.shares_buffer or io.buffer_length is None:
        raise UserError(f"{model}: its KV cache is not one shared max_length buffer (kv_layout); the harness batches "
                        "sequences as rows of that buffer")
    options = (session.get("provider_options") or {}).get(PROVIDERS[provider]) or {}
    cuda_graph = provider == "cuda" and str(options.get("enable_cuda_graph", "0")) == "1" and not eager
    so = session.get("session_options") or {}
    sess = cpu_view_session(model, so)[0] if provider == "cpu" else open_model(model, provider, so, cuda_graph=cuda_graph)
    kv = analysis["area"].get("kv_budget") or {}
    length = min(b for b in (kv.get("length"), io.buffer_length, io.max_positions) if b)
    host = served.get("host") or {}
    work = None
    if host.get("status") == "measured":  # the compile's host work per iteration (softsyn.timing.serving.host)
        work = HostWork(**{k: host[k] for k in ("iteration", "per_sequence", "prefill", "per_token", "move",
                                                  "per_moved_token")}, source="analysis.json serving.host",
                        first_shape=host.get("first_shape"))
    sched = Scheduler(serving.max_batch, serving.batch_timeout, served.get("kv_tokens"), length, work,
                      bucket=serving.prompt_buckets)
    table = StepTable.from_points([StepPoint(**p) for p in served["steps"]])
    return Artifact(directory, design, sess, io, provider, cuda_graph, table, sched, serving, so)


# ------------------------------------------------------------------------------------------------ the engine

class Engine:
    """The artifact's session over one KV buffer of `slots` rows per layer and key/value (torch tensors on the
    provider's device), bound by address: a decode of N sequences binds rows 0..N-1, a prefill one row."""

    def __init__(self, art: Artifact, slots: int):
        import onnx_ir as ir
        import torch

        self.torch, self.art, self.io, self.sess = torch, art, art.io, art.session
        self.device = "cuda" if art.provider == "cuda" else "cpu"
        if self.device == "cuda" and not torch.cuda.is_available():
            raise UserError(f"torch {torch.__version__} sees no CUDA device: the harness keeps the KV rows in torch "
                            "tensors on the GPU (bound to the session by address, moved with torch copies)")
        self.length = art.io.buffer_length
        self.np_kv = ir.DataType(art.io.kv_elem).numpy()
        # one tensor for every layer's key and value: a row move is one copy of all of them (kv[:, :, row])
        shape = (len(art.io.layers), 2, slots, art.io.kv_heads, self.length, art.io.head_size)
        dtype = torch.from_numpy(np.zeros(0, self.np_kv)).dtype
        self.kv = torch.zeros(shape, dtype=dtype, device=self.device)
        self.slots = slots
        self.row_bytes = self.kv[0, 0, 0].numel() * self.kv.element_size()
        self.positions = np.arange(self.length)
        self.decoders: dict[int, tuple] = {}
        self.prompt_inputs = KeptInputs(self.device, 64)  # a prefill's inputs per prompt length, as an engine keeps them
        kind = next(o.type for o in self.sess.get_outputs() if o.name == art.io.logits)
        if kind not in LOGITS:
            raise UserError(f"output {art.io.logits} is {kind}; the harness takes {', '.join(LOGITS)} logits")
        self.np_logits = np.dtype(LOGITS[kind])
        self.sync()

    def sync(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def _bind_kv(self, binding, first: int, count: int) -> None:
        shape = [count, self.io.kv_heads, self.length, self.io.head_size]
        base = self.kv.data_ptr()
        for i, layer in enumerate(self.io.layers):
            for kv, (past, present) in enumerate(((layer.past_key, layer.present_key),
                                                  (layer.past_value, layer.present_value))):
                ptr = base + ((2 * i + kv) * self.slots + first) * self.row_bytes
                binding.bind_input(past, self.device, 0, self.np_kv, shape, ptr)
                binding.bind_output(present, self.device, 0, self.np_kv, shape, ptr)

    def _options(self, graph_id: int):
        if not self.art.cuda_graph:
            return None
        import onnxruntime as ort

        options = ort.RunOptions()
        options.add_run_config_entry("gpu_graph_id", str(graph_id))
        return options

    def _array(self, name: str, values, rows: int) -> np.ndarray:
        return np.asarray(values, dtype=self.io.dtype(name)).reshape(rows, -1)

    def prefill(self, slot: int, ids: np.ndarray, width: int | None = None) -> tuple[int, float]:
        """The prompt `ids` into row `slot` (batch 1): (its first token, the run call's seconds). Its inputs are the
        device values kept for its length (softsyn.runtime.binding.KeptInputs), updated in place. `width`: the
        prompt right-padded to that many positions (serving.prompt_buckets: the mask's zeros mark the padding, the
        compiled model takes the logits at the last real token)."""
        io, real = self.io, len(ids)
        n = max(width or real, real)
        ids = np.concatenate([ids, np.zeros(n - real, dtype=np.asarray(ids).dtype)]) if n > real else ids
        binding = self.sess.io_binding()
        binding.bind_output(io.logits, self.device, 0)  # first: get_outputs() lists outputs in binding order
        feeds = {io.input_ids: ids}
        if io.attention_mask:
            feeds[io.attention_mask] = (np.arange(n) < real).astype(np.int64)
        if io.position_ids:
            feeds[io.position_ids] = np.arange(n)
        for name, value in feeds.items():
            binding.bind_ortvalue_input(name, self.prompt_inputs(name, self._array(name, value, 1)))
        self._bind_kv(binding, slot, 1)
        t = time.perf_counter()
        self.sess.run_with_iobinding(binding, self._options(-1))  # -1: prompts vary in length, never captured
        run = time.perf_counter() - t
        return greedy_token(binding.get_outputs()[0].numpy()[0, -1]), run

    def _decoder(self, n: int) -> tuple:
        """Batch n's binding, made once (a captured CUDA graph replays the addresses it was captured with)."""
        from softsyn.runtime.binding import to_device

        if n not in self.decoders:
            io = self.io
            values = {io.input_ids: to_device(self._array(io.input_ids, np.zeros(n), n), self.device)}
            if io.attention_mask:
                values[io.attention_mask] = to_device(self._array(io.attention_mask, np.zeros((n, self.length)), n),
                                                      self.device)
            if io.position_ids:
                values[io.position_ids] = to_device(self._array(io.position_ids, np.zeros(n), n), self.device)
            logits = self.torch.zeros((n, 1, io.vocab_size), dtype=self.torch.from_numpy(np.zeros(0, self.np_logits)).dtype,
                                      device=self.device)  # torch: the argmax runs where the logits are
            binding = self.sess.io_binding()
            for name, value in values.items():
                binding.bind_ortvalue_input(name, value)
            self._bind_kv(binding, 0, n)
            binding.bind_output(io.logits, self.device, 0, self.np_logits, list(logits.shape), logits.data_ptr())
            self.decoders[n] = (binding, values, logits, self._options(n))
        return self.decoders[n]

    def decode(self, pasts: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, float]:
        """One token for each of rows 0..N-1, row b at pasts[b] cached positions: (next tokens, the run's seconds)."""
        io, n = self.io, len(pasts)
        binding, values, logits, options = self._decoder(n)
        values[io.input_ids].update_inplace(self._array(io.input_ids, tokens, n))
        if io.attention_mask:  # row b: its pasts[b] cached positions and the new one
            values[io.attention_mask].update_inplace(
                self._array(io.attention_mask, self.positions[None, :] <= pasts[:, None], n))
        if io.position_ids:
            values[io.position_ids].update_inplace(self._array(io.position_ids, pasts, n))
        t = time.perf_counter()
        self.sess.run_with_iobinding(binding, options)
        run = time.perf_counter() - t
        if self.device == "cpu":  # numpy: one thread (torch's pool would wait for the cores ORT's pool spins on)
            return greedy_tokens(logits.numpy()[:, -1]), run
        return logits[:, -1].argmax(-1).cpu().numpy(), run  # on the device, as an engine samples: N ids come back

    def move_rows(self, moves: list[tuple[int, int, int]]) -> None:
        """Rows' KV into other rows, (from, to, cached positions) each: one copy of the moved rows' cached positions,
        every layer's key and value at once (the rows read are never the rows written: Queue.place moves top rows
        into freed lower ones). A row's positions past its cached ones are never read (GQA reads seqlens_k + 1)."""
        if not moves:
            return
        src, dst = [m[0] for m in moves], [m[1] for m in moves]
        n = max(m[2] for m in moves)
        if self.device == "cpu":  # numpy views, one thread: torch's OpenMP copy waits for cores ORT's pool spins on
            kv = self.kv.numpy()
            kv[:, :, dst, :, :n] = kv[:, :, src, :, :n]
            return
        index = self.torch.tensor(src, device=self.device), self.torch.tensor(dst, device=self.device)
        self.kv[:, :, index[1], :, :n] = self.kv[:, :, index[0], :, :n]
        self.sync()  # torch's copy runs on its stream; the session's next run must see it done


# ------------------------------------------------------------------------------------------------ the step table

@dataclass
class StepRow:
    kind: str  # "decode": N sequences decode; "mixed": a prefill into row N-1, then rows 0..N-2 decode
    batch: int  # N
    pasts: np.ndarray  # the decode rows' cached positions
    prompt: int  # mixed: the prefill's tokens (0 for decode)
    predicted: float  # s, the compile's step table (est)
    run: list[float] = field(default_factory=list)  # s, the run calls
    step: list[float] = field(default_factory=list)  # s, the iteration around them

    @property
    def mean_past(self) -> float:
        return float(self.pasts.mean()) if len(self.pasts) else 0.0


def spread(n: int, past: int, limit: int) -> np.ndarray:
    """n pasts evenly over [past/2, 3 past/2] (mean `past`), each below `limit` (the buffer's positions)."""
    values = np.array([past]) if n == 1 else np.rint(np.linspace(past / 2, 3 * past / 2, n))
    return np.clip(values, 0, limit - 1).astype(np.int64)


def step_rows(args, art: Artifact, limit: int) -> list[StepRow]:
    rows = []
    for past in args.past_list:
        for n in args.batch_list:
            pasts = spread(n, past, limit)
            rows.append(StepRow("decode", n, pasts, 0, art.table.decode(n, float(pasts.mean()))))
    for n in args.batch_list:
        pasts = spread(n - 1, args.past_list[0], limit) if n > 1 else np.zeros(0, np.int64)
        decode = art.table.decode(n - 1, float(pasts.mean())) if n > 1 else 0.0
        rows.append(StepRow("mixed", n, pasts, args.prompt_len, art.table.prefill(args.prompt_len) + decode))
    return rows


def time_row(eng: Engine, row: StepRow, prompt: np.ndarray) -> tuple[float, float]:
    """(run calls' seconds, the iteration's seconds) of one step of `row`."""
    t0 = time.perf_counter()
    run = 0.0
    if row.kind == "mixed":
        run += eng.prefill(row.batch - 1, prompt)[1]
    if len(row.pasts):
        run += eng.decode(row.pasts, np.arange(len(row.pasts)) % eng.io.vocab_size)[1]
    return run, time.perf_counter() - t0


def measure_steps(eng: Engine, rows: list[StepRow], args, deadline: float) -> int:
    """Warm-up rounds, then timed rounds until --runs samples per row or the deadline: in each round every row in
    turn (round-robin, so drift hits all alike) runs once untimed, then BURST times back to back (as a serving engine
    repeats one batch's step); returns the timed samples per row."""
    prompt = np.arange(args.prompt_len) % eng.io.vocab_size
    for _ in range(args.warmup):
        for row in rows:
            time_row(eng, row, prompt)
    done = 0
    while done < args.runs and (done < BURST or time.perf_counter() < deadline):
        burst = min(BURST, args.runs - done)
        for row in rows:
            time_row(eng, row, prompt)
            for _ in range(burst):
                run, step = time_row(eng, row, prompt)
                row.run.append(run)
                row.step.append(step)
        done += burst
    return done


# ------------------------------------------------------------------------------------------------ the trace

class WallClock:
    """Seconds since start(), and sleeping on the wall clock: what the harness runs on (a test gives it a virtual
    clock its fake engine advances, to check the harness schedules exactly as the simulation does)."""

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class Harness(Queue):
    """The artifact served under a trace on the wall clock, with the simulation's scheduler rules
    (softsyn.timing.serving.simulate.Queue: arrivals, idle start, admission between steps), prefills then one decode
    step per iteration."""

    def __init__(self, eng: Engine, reqs, sched, clock=None):
        super().__init__(reqs, sched)  # running rows here: [request, cached tokens, tokens left, next token]
        self.eng = eng
        self.timer = clock or WallClock()
        self.ids = [np.random.default_rng(r).integers(0, eng.io.vocab_size, int(p)) for r, p in enumerate(reqs.prompt)]
        # per iteration: decodes, their mean past, admitted prompts, seconds, run calls' seconds, start (s after t0)
        self.steps: list[tuple[int, float, tuple[int, ...], float, float, float]] = []
        self.gaps: list[float] = []  # s between an iteration's end and the next one's start while sequences run
        self.ended = None  # when the last iteration ended, if sequences still run
        self.moves, self.move_batches, self.move_seconds, self.cut = 0, 0, 0.0, False
        self.tokens: dict[int, list[int]] = {}  # request -> its generated tokens (greedy), first one from the prefill
        # per prefill call: (prompt tokens, run seconds, whether the session had run a prefill of that length before:
        # a length ORT's CUDA provider meets first may cost it kernel selection on the trace's clock)
        self.prefills: list[tuple[int, float, bool]] = []
        self.lengths_seen: set[int] = set()

    def clock(self) -> float:
        return self.timer.now()

    def step(self, admitted: list[int]) -> None:
        start, run = self.clock(), 0.0
        if self.ended is not None:
            self.gaps.append(start - self.ended)
        firsts = []
        self.seat(admitted)
        lengths = [self.sched.prefill_len(int(self.reqs.prompt[r])) for r in admitted]  # padded to a bucket, if asked
        for r, length in zip(admitted, lengths):
            token, seconds = self.eng.prefill(self.rows[r], self.ids[r], length)
            self.tokens[r] = [token]
            self.prefills.append((length, seconds, length in self.lengths_seen))
            self.lengths_seen.add(length)
            firsts.append(token)
            run += seconds
        pasts = np.array([s[1] for s in self.running], np.int64)
        if self.running:
            tokens, seconds = self.eng.decode(pasts, np.array([s[3] for s in self.running], np.int64))
            run += seconds
        end = self.clock()
        self.steps.append((len(self.running), float(pasts.mean()) if len(pasts) else 0.0,
                           tuple(lengths), end - start, run, start))
        still = []
        for s, token in zip(self.running, tokens if self.running else []):
            s[1], s[2], s[3] = s[1] + 1, s[2] - 1, int(token)
            self.tokens[s[0]].append(int(token))
            if s[2] > 0:
                still.append(s)
            else:
                self.finish(s[0], end)
        for r, token in zip(admitted, firsts):
            self.admitted[r], self.first[r] = start, end
            if self.reqs.gen[r] > 1:
                still.append([r, int(self.reqs.prompt[r]), int(self.reqs.gen[r]) - 1, token])
            else:
                self.finish(r, end)
        self.compact(still)
        self.ended = self.clock() if self.running else None

    def compact(self, still: list[list[int]]) -> None:
        """Rows 0..len(still)-1 hold the running sequences: a row a finished sequence freed below that count takes a
        top row's sequence (Queue.place: at most one move per finished sequence), all of an iteration's moves in one
        copy."""
        t = self.clock()
        moves = self.place(still)
        self.eng.move_rows(moves)
        self.moves += len(moves)
        self.move_batches += bool(moves)
        self.move_seconds += self.clock() - t
        self.running = still

    def finish(self, r: int, end: float) -> None:
        self.last[r] = end
        self.kv_used -= self.need(r)
        self.done += 1

    def run(self, deadline: float) -> None:
        """Serve every request (or stop at `deadline`, seconds after the start, and mark the run cut)."""
        n = len(self.reqs.arrival)
        self.timer.start()
        while self.done < n:
            now = self.clock()
            if now > deadline:
                self.cut = True
                return
            self.arrive(now)
            if not self.running:
                wake = (self.reqs.arrival[self.next] if not self.waiting else self.idle_start(now))
                if wake > now:
                    self.timer.sleep(min(wake - now, max(deadline - now, 0.0)))
                    continue
            admitted = self.admit()
            if admitted or self.running:
                self.step(admitted)

    def outcome(self):
        """The measured run as the simulation's Outcome (its definitions of TTFT, TPOT, e2e, queue, throughput)."""
        from softsyn.timing.serving.simulate import Outcome

        ok = ~np.isnan(self.last)
        arrival, gen, first, last = self.reqs.arrival[ok], self.reqs.gen[ok], self.first[ok], self.last[ok]
        multi = gen > 1
        span = float(last.max() - self.reqs.arrival[0]) if ok.any() else 0.0
        return Outcome(ttft=first - arrival, tpot=(last[multi] - first[multi]) / (gen[multi] - 1), e2e=last - arrival,
                       queue=self.admitted[ok] - arrival, completed=int(ok.sum()), rejected=self.rejected,
                       throughput=float(gen.sum()) / span if span > 0 else 0.0, too_long=self.too_long,
                       decode_batches=tuple(sorted({s[0] for s in self.steps if s[0]})))


def trace(art: Artifact, args, span: float):
    """The serving block's seeded trace (softsyn.timing.serving.requests), its first requests arriving within `span`
    seconds (and at most --requests): (the cut trace, requests in the full one)."""
    from softsyn.timing.serving import requests
    from softsyn.timing.serving.workload import Requests

    serving = art.serving if args.requests is None else replace(art.serving, requests=max(args.requests, 1))
    full = requests(serving)
    k = max(int(np.searchsorted(full.arrival, span, side="right")), 1)
    return Requests(full.arrival[:k], full.prompt[:k], full.gen[:k]), len(full.arrival)


def warm(eng: Engine, art: Artifact, slots: int) -> set[int]:
    """Every decode batch size the trace can form (CUDA graphs captured here, not on the trace's clock), and prefills
    at the prompt lengths the step table spans; returns those lengths."""
    for n in range(1, slots + 1):
        for _ in range(4):  # ORT's CUDA provider runs a graph id plainly twice before it captures it
            eng.decode(np.ones(n, np.int64), np.zeros(n, np.int64))
    return prefill_lengths(eng, art.table.prompts)


def prefill_lengths(eng: Engine, lengths) -> set[int]:
    """A prompt of each length the KV buffer holds prefilled once into row 0 (a warm-up, untimed); the lengths run."""
    ran = set()
    for n in sorted(set(int(n) for n in lengths)):
        if n < eng.length:
            eng.prefill(0, np.arange(n) % eng.io.vocab_size)
            ran.add(n)
    return ran


FIRST_PROBE = 6  # fresh prompt lengths the first-shape probe runs
FIRST_REPEATS = 2  # runs at each after the first


def first_probe(eng: Engine, art: Artifact, seen: set[int]) -> list[tuple[int, float, float]]:
    """The first-shape cost on the artifact itself: at FIRST_PROBE prompt lengths the session has not run (spread
    over the serving block's p50..p99), the first prefill run call and the fastest of FIRST_REPEATS repeats:
    (length, first s, repeat s). The trace's prefills at a first-met length pay what this measures, if anything."""
    low, high = art.serving.prompt_len.p50, min(art.serving.prompt_len.p99, eng.length - 1)
    lengths, candidate = [], low
    for k in range(FIRST_PROBE):
        candidate = int(low + (high - low) * k / max(FIRST_PROBE - 1, 1))
        while candidate in seen or candidate in lengths:
            candidate += 1
        lengths.append(candidate)
    out = []
    for n in lengths:
        ids = np.arange(n) % eng.io.vocab_size
        first = eng.prefill(0, ids)[1]
        out.append((n, first, min(eng.prefill(0, ids)[1] for _ in range(FIRST_REPEATS))))
    return out


def first_probe_line(probe: list[tuple[int, float, float]], work) -> str:
    extra = statistics.median(f - r for _, f, r in probe)
    model = ("not modelled (no serving_host block)" if work is None else "not modelled (the library's block has no "
             "first_shape figures)" if work.first_shape is None else
             f"{work.first_shape * 1e3:.3f} ms (est: the library's first_shape figures x this design's nodes)")
    return (f"First-shape probe (before the trace): {len(probe)} prompt lengths the session had not run "
            f"({', '.join(str(p[0]) for p in probe)}): first run call median {ms(statistics.median(p[1] for p in probe))}"
            f" ms, fastest of {FIRST_REPEATS} repeats {ms(statistics.median(p[2] for p in probe))} ms: {extra * 1e3:.3f} "
            f"ms more the first time (measured) vs the simulation's {model}.")


# ------------------------------------------------------------------------------------------------ the report

def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def pct(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def step_table_md(rows: list[StepRow]) -> list[str]:
    out = ["| step | N | mean past | prompt | predicted ms (est) | run ms median (p10–p90) | run / predicted "
           "| within 10 % | iteration ms median | iteration / predicted |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        what = (f"decode of {r.batch}" if r.kind == "decode"
                else f"prefill {r.prompt} + decode of {r.batch - 1}")
        run, step = statistics.median(r.run), statistics.median(r.step)
        out.append(f"| {what} | {r.batch} | {r.mean_past:.0f} | {r.prompt or '-'} | {ms(r.predicted)} | {ms(run)} "
                   f"({ms(pct(r.run, 10))}–{ms(pct(r.run, 90))}) | {run / r.predicted:.2f} "
                   f"| {'yes' if abs(run / r.predicted - 1) <= 0.10 else 'no'} | {ms(step)} "
                   f"| {step / r.predicted:.2f} |")
    return out


def trace_rows(sim, hosted, measured) -> list[tuple[str, float, float | None, float, str]]:
    """(metric, simulated, simulated with host work (None: not modelled), measured, unit) rows: the simulation's
    distributions (softsyn.timing.serving.checks)."""
    from softsyn.timing.serving.checks import distributions

    rows = []
    with_host = distributions(hosted) if hosted is not None else [None] * 4
    for s, h, m in zip(distributions(sim), with_host, distributions(measured)):
        for p in ("p50", "p99"):
            rows.append((f"{s.metric} {p}", getattr(s, p), getattr(h, p) if h else None, getattr(m, p), "ms"))
    for name, unit in (("throughput", "tok/s"), ("completed", "requests"), ("rejected", "requests")):
        rows.append((name, getattr(sim, name), getattr(hosted, name) if hosted else None, getattr(measured, name),
                     unit))
    return rows


def trace_md(rows) -> list[str]:
    out = ["| metric | simulated, run calls (est) | + host work (measured per iteration) | measured "
           "| measured / simulated | measured / with host |", "|---|---|---|---|---|---|"]
    for metric, s, h, m, unit in rows:
        fmt = ((lambda v: f"{v * 1e3:.3f} ms") if unit == "ms" else (lambda v: f"{v:,.0f} {unit}") if unit == "requests"
               else (lambda v: f"{v:,.1f} {unit}"))
        out.append(f"| {metric} | {fmt(s)} | {fmt(h) if h is not None else '-'} | {fmt(m)} "
                   f"| {f'{m / s:.2f}' if s else '-'} | {f'{m / h:.2f}' if h else '-'} |")
    return out


def in_trace(h: Harness, table) -> dict:
    """The harness's iterations against the step table at their own shapes (decodes, mean past, prompts)."""
    def predicted(step):
        n, past, prompts = step[:3]
        return sum(table.prefill(p) for p in prompts) + (table.decode(n, past) if n else 0.0)

    decode = [(s[3] / predicted(s), s[4] / predicted(s)) for s in h.steps if not s[2]]
    mixed = [(s[3] / predicted(s), s[4] / predicted(s)) for s in h.steps if s[2]]
    busy = sum(s[3] for s in h.steps)
    return {"iterations": len(h.steps), "decode_steps": len(decode), "mixed_steps": len(mixed),
            "decode_iteration_ratio": statistics.median(d[0] for d in decode) if decode else None,
            "decode_run_ratio": statistics.median(d[1] for d in decode) if decode else None,
            "mixed_iteration_ratio": statistics.median(d[0] for d in mixed) if mixed else None,
            "mixed_run_ratio": statistics.median(d[1] for d in mixed) if mixed else None,
            "busy_measured": busy, "busy_predicted": sum(predicted(s) for s in h.steps),
            "run_seconds": sum(s[4] for s in h.steps),
            "mean_decode_batch": float(np.mean([s[0] for s in h.steps if s[0]] or [0])),
            "decode_iteration": [pct([s[3] for s in h.steps if not s[2]], q) for q in (50, 99)]
            + [float(np.mean([s[3] for s in h.steps if not s[2]] or [np.nan]))],
            "gaps": sum(h.gaps), "gap_median": pct(h.gaps, 50),
            "moves": h.moves, "move_batches": h.move_batches, "move_seconds": h.move_seconds, **prefill_split(h, table)}


PROMPT_BANDS = (0, 128, 256, 512, 1024)  # prompt-length bands of the prefill split (a first-met length is more
# often a long one: the split per band keeps length and novelty apart)


def prefill_split(h: Harness, table) -> dict:
    """The trace's prefill calls at a prompt length the session had run before vs at one it met first: count, median
    run seconds and median run / table prediction of each, in all and per PROMPT_BANDS band."""
    out = {}

    def split(calls):
        return (len(calls), pct([c[0] for c in calls], 50), pct([c[1] for c in calls], 50)) if calls else (0,)
    bands = list(zip(PROMPT_BANDS, PROMPT_BANDS[1:] + (None,)))
    for key, seen in (("prefill_repeat", True), ("prefill_first", False)):
        calls = [(t, t / table.prefill(p), p) for p, t, again in h.prefills if again == seen]
        out[key] = split(calls)
        out[key + "_bands"] = [(lo, hi, split([c for c in calls if c[2] >= lo and (hi is None or c[2] < hi)]))
                               for lo, hi in bands]
    return out


def prefill_bands_md(it: dict) -> list[str]:
    """The prefill split per prompt-length band: seen before vs met first, median run / table."""
    def cell(split):
        return f"{split[0]}: {split[2]:.2f}x" if split[0] else "-"
    rows = ["| prompt tokens | at a length run before (calls: median run / table) | at a length met first |",
            "|---|---|---|"]
    for (lo, hi, seen), (_, _, fresh) in zip(it["prefill_repeat_bands"], it["prefill_first_bands"]):
        rows.append(f"| {lo}–{hi - 1 if hi else ''} | {cell(seen)} | {cell(fresh)} |")
    return rows


def prefill_line(split: tuple) -> str:
    if not split[0]:
        return "none"
    return f"{split[0]}, median {ms(split[1])} ms ({split[2]:.2f}x the table)"


def versions() -> str:
    import onnxruntime
    import torch

    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return (f"onnxruntime {onnxruntime.__version__}, torch {torch.__version__}, numpy {np.__version__}, "
            f"softsyn {rev.stdout.strip() or '?'}")


def header(args, art: Artifact, argv) -> list[str]:
    from softsyn.runtime.session import describe_device

    analysis = json.loads((art.directory / "analysis.json").read_text())
    cmd = " ".join(shlex.quote(a) for a in ["python", "bench/serving_validate.py", *argv])
    return [f"# Serving validation, {args.provider}: {art.design} ({args.model}), predicted (est) vs measured", "",
            f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; command: `{cmd}`",
            f"- device: {describe_device(args.provider)}; {platform.node() or 'host'}; {versions()}; load average "
            f"{os.getloadavg()[0]:.2f} at the end (this run's threads included; the machine may be shared)",
            f"- artifact: {art.directory} (library {analysis.get('library')}, {art.session.get_providers()[0]}, "
            f"CUDA graphs {'on: a graph per decode batch size' if art.cuda_graph else 'off'}, "
            f"KV buffer {art.io.buffer_length} positions x {len(art.io.layers)} layers, session options {art.options})",
            "- prediction: the step table the compile simulated on (analysis.json serving.steps: the STA's critical "
            "arrival from the library, interpolated as softsyn.timing.serving.steps does): an estimate",
            ""]


def run_all(args, argv) -> dict:
    directory = Path(args.artifact) if args.artifact else compile_artifact(args)
    art = open_artifact(directory, args.constraints, args.provider, args.eager)
    serving = art.serving
    args.past_list = args.past_list or [serving.prompt_len.p50 + serving.gen_len.p50 // 2]
    args.prompt_len = args.prompt or serving.prompt_len.p50
    limit = art.io.buffer_length
    if max(args.past_list) * 3 // 2 >= limit or args.prompt_len > limit:
        raise UserError(f"--past {max(args.past_list)} (its rows reach 3/2 of it) or --prompt {args.prompt_len} "
                        f"does not fit the artifact's KV buffer of {limit} positions")
    slots = max(serving.max_batch, max(args.batch_list))
    eng = Engine(art, slots)
    start = time.perf_counter()
    rows = step_rows(args, art, limit)
    log(f"step table: {len(rows)} configurations, {args.warmup} warm-up rounds + up to {args.runs} timed runs each")
    result = {"steps": rows, "rounds": measure_steps(eng, rows, args, start + 0.3 * args.seconds)}
    partial = "\n".join(header(args, art, argv) + steps_section(args, result)) + "\n(the trace has not run yet)\n"
    print(partial, file=sys.stderr, flush=True)  # kept should the trace fail or the call end
    if args.output:
        Path(args.output).write_text(partial)
    warmed = warm(eng, art, serving.max_batch) | {int(args.prompt_len)}  # the step table's prefills ran it too
    probe = first_probe(eng, art, warmed)
    warmed |= {p[0] for p in probe}
    reqs, offered = trace(art, args, args.trace_share * args.seconds)
    if serving.warm_prompts:  # as the engine the compile modelled: every length the trace has, prefilled once
        t = time.perf_counter()
        lengths = {art.sched.prefill_len(n) for n in range(1, int(reqs.prompt.max()) + 1)}
        warmed |= prefill_lengths(eng, lengths - warmed)
        log(f"serving.warm_prompts: prompt lengths 1..{int(reqs.prompt.max())} prefilled in "
            f"{time.perf_counter() - t:.1f} s")
    from softsyn.timing.serving import simulate

    sched = replace(art.sched, warm=frozenset(warmed))  # the simulated engine has run what this one ran
    sim = simulate(reqs, art.table, replace(sched, host=None))
    hosted = simulate(reqs, art.table, sched) if sched.host is not None else None
    left = args.seconds - (time.perf_counter() - start)
    log(f"trace: {len(reqs.arrival)} requests over {reqs.arrival[-1]:.1f} s; serving them (deadline {left:.0f} s)")
    harness = Harness(eng, reqs, art.sched)
    harness.lengths_seen |= warmed
    harness.run(max(left, float(reqs.arrival[-1]) + 1.0))
    measured = harness.outcome()
    result.update({"trace": trace_rows(sim, hosted, measured), "hosted": hosted, "first_probe": probe,
                   "in_trace": in_trace(harness, art.table),
                   "requests": len(reqs.arrival), "offered": offered, "span": float(reqs.arrival[-1]),
                   "cut": harness.cut, "wall": harness.clock(), "simulated_batches": sim.decode_batches,
                   "measured_batches": measured.decode_batches})
    result["markdown"] = "\n".join(header(args, art, argv) + steps_section(args, result)
                                   + trace_section(art, result)) + "\n"
    return result


def steps_section(args, res: dict) -> list[str]:
    lines = ["## Batched decode and the mixed step", "",
             f"{res['rounds']} timed runs per configuration after {args.warmup} warm-up rounds, in rounds of one "
             f"untimed and up to {BURST} timed runs back to back per configuration, round-robin; decode rows at "
             f"pasts spread evenly over [past/2, 3 past/2] (per-row seqlens_k in the shared buffer); `run` = the "
             f"run_with_iobinding call(s), `iteration` = with the inputs updated, logits to the host and argmax. "
             f"The mixed step is the prefill call then the decode call (one [batch, seq] call cannot hold both).", ""]
    return lines + step_table_md(res["steps"]) + [""]


def trace_section(art: Artifact, res: dict) -> list[str]:
    s, it = art.serving, res["in_trace"]
    lines = ["## One arrival trace: simulated (est) vs measured", "",
              f"Trace: the first {res['requests']} of {res['offered']} requests of the serving block (Poisson "
              f"{s.arrival_rate:g}/s, seed {s.seed}; prompt p50/p99 {s.prompt_len.p50}/{s.prompt_len.p99}, gen "
              f"{s.gen_len.p50}/{s.gen_len.p99} tokens), arrivals over {res['span']:.1f} s; max_batch {s.max_batch}, "
              f"batch_timeout {s.batch_timeout * 1e3:g} ms, KV budget "
              f"{'unlimited' if art.sched.kv_tokens is None else f'{art.sched.kv_tokens:,.0f} tokens'}, "
              f"{art.sched.max_len} positions per sequence. The harness served it in {res['wall']:.1f} s"
              f"{' and was CUT at its deadline: measured figures cover the completed requests only' if res['cut'] else ''}.",
              ""]
    lines += trace_md(res["trace"]) + [""]
    work, hosted, it = art.sched.host, res["hosted"], res["in_trace"]
    measured_host = it["busy_measured"] - it["run_seconds"]
    if work is None:
        lines += ["Host work: not modelled (the compile's library has no serving_host block: bench/host_probe.py).", ""]
    else:
        host_line = (json.loads((art.directory / "analysis.json").read_text())["serving"].get("host") or {}).get("line")
        lines += [f"Host work per iteration, the compile's model: {host_line}. Simulated: {hosted.host:.2f} s "
                  f"of {hosted.busy:.2f} s busy ({hosted.host / hosted.busy:.0%}); measured: {measured_host:.2f} s "
                  f"of the iterations' {it['busy_measured']:.2f} s beside the run calls, + {it['move_seconds']:.2f} s "
                  "of KV row moves.", ""]

    def ratio(key):
        return f"{it[key]:.2f}" if it[key] is not None else "-"

    lines += ["In the trace, each iteration against the step table at its own shape (decodes, their mean past, the "
              "admitted prompts):", "",
              f"- {it['iterations']} iterations ({it['decode_steps']} decode only, {it['mixed_steps']} with prefills); "
              f"mean decode batch {it['mean_decode_batch']:.1f}; decode batch sizes measured "
              f"{list(res['measured_batches'])}, simulated {list(res['simulated_batches'])}",
              f"- median measured / predicted: decode-only iteration {ratio('decode_iteration_ratio')} (run calls "
              f"{ratio('decode_run_ratio')}), mixed iteration {ratio('mixed_iteration_ratio')} (run calls "
              f"{ratio('mixed_run_ratio')})",
              f"- decode-only iterations: median {ms(it['decode_iteration'][0])} ms, p99 "
              f"{ms(it['decode_iteration'][1])} ms, mean {ms(it['decode_iteration'][2])} ms (a TPOT is a mean of "
              f"iterations: the tail counts in it); between iterations, while sequences ran, "
              f"{it['gaps'] * 1e3:.1f} ms in all (median {ms(it['gap_median'])} ms: the harness's scheduling and moves)",
              f"- engine busy {it['busy_measured']:.2f} s measured vs {it['busy_predicted']:.2f} s the table predicts for "
              f"the same iterations; KV row moves (a top row's sequence into a row a finished one freed) {it['moves']}, in "
              f"{it['move_batches']} copies, {it['move_seconds'] * 1e3:.1f} ms in all",
              f"- prefill calls: {prefill_line(it['prefill_repeat'])} at a prompt length the session had run before; "
              f"{prefill_line(it['prefill_first'])} at a length it met first (the simulation charges the first-shape "
              f"cost, {(work.first_shape or 0.0) * 1e3 if work else 0.0:.3f} ms est, once per length met first), per "
              "band:", ""]
    lines += prefill_bands_md(it) + ["", first_probe_line(res["first_probe"], work), ""]
    return lines


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    try:
        if args.compile_only:
            print(compile_artifact(args))
            return 0
        result = run_all(args, argv)
    except UserError as exc:
        print(f"serving_validate: {exc}", file=sys.stderr)
        return 2
    except subprocess.SubprocessError as exc:  # softsyn compile failed on valid input: softsyn's defect
        print(f"serving_validate: {exc}", file=sys.stderr)
        return 3
    print(result["markdown"])
    if args.output:
        Path(args.output).write_text(result["markdown"])
        log(f"wrote {args.output}")
    main.result = result  # for the test: the tables as data
    return 0


if __name__ == "__main__":
    sys.exit(main())
