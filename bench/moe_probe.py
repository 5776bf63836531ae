"""One com.microsoft.MoE node on ORT CUDA and ORT CPU against a numpy float64 reference of the op's math.

    python3 bench/moe_probe.py --provider cuda -o "$OUT/moe-probe-cuda.md"   # on the H200 (h200_session.sh moeprobe)
    python3 bench/moe_probe.py --provider cpu -o F.md                        # here: the CPU column only

Why: `softsyn verify --locate` on zoo:qwen3-next-tiny compiled for the H200 (2026-12-03, ORT 1.31.1) found the fused
MoE departing from its CPU run by 43 % at prefill (128 tokens) while agreeing at decode (1 token), its inputs within
5e-4; an explicit swiglu_limit=inf did not change it. This probe finds the regime: each case is one MoE node with the
attributes softsyn writes (softsyn.runtime.moe_op.MOE_SWIGLU, k, normalize_routing_weights), fc1 [E, 2I, H] with
gate/up interleaved per row, fc2 [E, H, I], router logits fed (the op does softmax + top-k), run at every token count
of --tokens through one session per case (tokens a dynamic dim). The grid: shapes tiny (E4 k2 H128 I64), 30b (E128 k8
H2048 I768), 80b (E512 k10 H2048 I512); fp16 and fp32; normalize 0 and 1; x given as [T, H] ("2d") and [1, T, H]
("3d"); plus, on tiny fp16, x scaled by AMP so gate/up values pass 7 (the CUDA kernel's default swiglu_limit), once
with MOE_SWIGLU's limit (inf) and once with the limit left unset ("nolimit").

The reference: softmax over the logits, top-k, the k probabilities renormalised to sum 1 when normalize is 1; per
expert h = x @ fc1[e].T, gate = h[..., 0::2], up = h[..., 1::2], (silu(gate) * up) @ fc2[e].T; the k outputs summed
with their weights, all in float64 from the values the session was fed. Router logits are per token a permutation of
E distinct levels exactly representable in fp16, so top-k has no ties. Each error is max|a - b| / max|b| over the
output (b: the reference, or the CPU output for CUDA vs CPU). A row whose error passes FLAG is marked.
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from softsyn.runtime.moe_op import MOE_SWIGLU
from softsyn.runtime.session import IR_VERSION, SessionSettings, device_name, external_initializer, open_session

SHAPES = {"tiny": (4, 2, 128, 64), "30b": (128, 8, 2048, 768), "80b": (512, 10, 2048, 512)}  # E, k, H, I
TOKENS = (1, 2, 4, 7, 8, 16, 128)
DTYPES = {"fp16": (np.float16, TensorProto.FLOAT16), "fp32": (np.float32, TensorProto.FLOAT)}
AMP = 8.0  # x scale of the "amp" cases: gate/up values of std ~8, many past 7 (the CUDA default swiglu_limit)
FLAG = 0.02  # an error past 2 % is a departure (fp16 rounding and TF32 stay near 1e-3; the finding was 43 %)
LOCATION = "moe-probe-weights"  # the external-data name the session's host arrays stand for


@dataclass(frozen=True)
class Case:
    shape: str  # a SHAPES key
    dtype: str  # a DTYPES key
    normalize: int
    rank: int = 2  # x as [T, H] (2) or [1, T, H] (3)
    amp: float = 1.0  # x scale
    limit: bool = True  # MOE_SWIGLU's swiglu_limit (inf) written; False: left unset (the provider's default)

    @property
    def name(self) -> str:
        extra = (f" amp{self.amp:g}" if self.amp != 1.0 else "") + ("" if self.limit else " nolimit")
        return f"{self.shape} {self.dtype} norm{self.normalize} {self.rank}d{extra}"


def cases(shapes=tuple(SHAPES)) -> list[Case]:
    """The grid: every shape x dtype x normalize x rank, then the tiny fp16 large-value cases."""
    out = [Case(s, d, n, r) for s in shapes for d in DTYPES for n in (0, 1) for r in (2, 3)]
    if "tiny" in shapes:
        out += [Case("tiny", "fp16", 1, amp=AMP), Case("tiny", "fp16", 1, amp=AMP, limit=False)]
    return out


def attributes(case: Case) -> dict:
    """The MoE node's attributes as softsyn writes them (passes/fuse/moe.py), the limit dropped for "nolimit"."""
    _, k, _, _ = SHAPES[case.shape]
    attrs = {"k": k, **MOE_SWIGLU, "normalize_routing_weights": case.normalize}
    if not case.limit:
        attrs.pop("swiglu_limit", None)
    return attrs


def moe_model(case: Case, fc1: np.ndarray, fc2: np.ndarray) -> onnx.ModelProto:
    """One MoE node: x [T, H] or [1, T, H] (T the dynamic dim "tokens"), router logits [T, E], fc1/fc2 external."""
    e, _, h, _ = SHAPES[case.shape]
    elem = DTYPES[case.dtype][1]
    lead = ["tokens"] if case.rank == 2 else [1, "tokens"]
    ins = [helper.make_tensor_value_info("x", elem, lead + [h]), helper.make_tensor_value_info("router", elem, ["tokens", e])]
    out = helper.make_tensor_value_info("y", elem, lead + [h])
    node = helper.make_node("MoE", ["x", "router", "fc1", "", "fc2"], ["y"], domain="com.microsoft", **attributes(case))
    # the experts' bytes reach the session as host arrays (open_session's `external`): the 80b ones are 3-6 GB, past
    # protobuf's 2 GB
    inits = [external_initializer(n, elem, a.shape, a.nbytes, LOCATION) for n, a in (("fc1", fc1), ("fc2", fc2))]
    graph = helper.make_graph([node], "moe_probe", ins, [out], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


BITS = {np.float16: (np.uint16, 10, 15), np.float32: (np.uint32, 23, 127)}  # the bits type, mantissa bits, bias


def signed_levels(rng, shape: tuple, np_type, std: float) -> np.ndarray:
    """Random values of np_type with magnitudes uniform in [s, 2s) (s the power of two giving about `std`) and random
    signs, written as bit patterns: numpy's float16 casts and float draws took 23 s for the 30b experts here."""
    uint, mant, bias = BITS[np_type]
    exp = int(np.floor(np.log2(std * np.sqrt(3 / 7))))  # E[w^2] = 7 s^2 / 3 for |w| uniform in [s, 2s)
    n = int(np.prod(shape))
    bits = rng.bit_generator.random_raw(-(-n * np.dtype(uint).itemsize // 8)).view(uint)[:n]
    bits &= uint((1 << (8 * np.dtype(uint).itemsize - 1)) | ((1 << mant) - 1))  # the sign and the mantissa
    bits |= uint((bias + exp) << mant)
    return bits.view(np_type).reshape(shape)


def weights(shape: str, dtype: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """fc1 [E, 2I, H] and fc2 [E, H, I] with products of about unit variance (h and y of std ~1 for x of std 1)."""
    e, _, h, i = SHAPES[shape]
    rng = np.random.default_rng(seed)
    np_type = DTYPES[dtype][0]
    return (signed_levels(rng, (e, 2 * i, h), np_type, 1 / np.sqrt(h)),
            signed_levels(rng, (e, h, i), np_type, 1 / np.sqrt(i)))


def feeds(shape: str, dtype: str, tokens: int, amp: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """x [tokens, H] (standard normal times amp) and router logits [tokens, E]: per token a permutation of E levels
    spaced min(1, 8/E) apart (exact in fp16: no top-k ties); row t is the same at every token count."""
    e, _, h, _ = SHAPES[shape]
    rng = np.random.default_rng(1)
    np_type = DTYPES[dtype][0]
    x = (rng.standard_normal((tokens, h), dtype=np.float32) * np.float32(amp)).astype(np_type)
    step = min(1.0, 8.0 / e)
    levels = (np.arange(e) - e // 2) * step
    logits = np.stack([levels[rng.permutation(e)] for _ in range(tokens)]).astype(np_type)
    return x, logits


def reference(x, logits, fc1, fc2, k: int) -> dict[int, np.ndarray]:
    """The op's math in float64 from the fed values: {normalize: y [T, H]} for normalize 0 and 1."""
    x64, z = x.astype(np.float64), logits.astype(np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    top = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, top, -1)
    slots = np.zeros((x.shape[0], k, fc2.shape[1]))
    for e in np.unique(top):
        rows, ks = np.nonzero(top == e)
        hh = x64[rows] @ fc1[e].astype(np.float64).T
        gate, up = hh[:, 0::2], hh[:, 1::2]
        slots[rows, ks] = (gate / (1 + np.exp(-gate)) * up) @ fc2[e].astype(np.float64).T
    return {0: np.einsum("tk,tkh->th", w, slots), 1: np.einsum("tk,tkh->th", w / w.sum(-1, keepdims=True), slots)}


def rel(got: np.ndarray | None, want: np.ndarray | None) -> float | None:
    """max|got - want| / max|want| (None when either is missing)."""
    if got is None or want is None:
        return None
    got, want = np.asarray(got, np.float64).reshape(want.shape), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / (np.abs(want).max() + 1e-30))


def open_case(case: Case, provider: str, fc1: np.ndarray, fc2: np.ndarray):
    """A session on the case's model through softsyn's factory, on `provider` only (no CPU fallback on CUDA)."""
    elem = DTYPES[case.dtype][1]
    settings = SessionSettings(provider=provider, cpu_fallback=provider == "cpu", log_severity=3)
    return open_session(moe_model(case, fc1, fc2), settings, external={"fc1": (elem, fc1), "fc2": (elem, fc2)})


def run_tokens(session, case: Case, x: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """The session's output for the first len(x) tokens, as [T, H]."""
    xin = x if case.rank == 2 else x[None]
    (y,) = session.run(["y"], {"x": xin, "router": logits})
    return y.reshape(x.shape)


@dataclass
class Row:
    case: str
    tokens: int
    cuda: float | str | None = None  # rel error vs the reference, or the error text
    cpu: float | str | None = None
    cuda_cpu: float | None = None


def _outputs(case: Case, providers: tuple[str, ...], fcs: tuple, x: np.ndarray, logits: np.ndarray,
             tokens: tuple[int, ...]) -> dict:
    """{provider: {tokens: y [T, H]} or the error text} for one case: one session per provider, every token count."""
    out = {}
    for p in providers:
        try:
            sess = open_case(case, p, *fcs)
            out[p] = {t: run_tokens(sess, case, x[:t], logits[:t]) for t in tokens}
        except Exception as exc:  # noqa: BLE001 - a kernel the provider refuses is a finding, not a crash
            out[p] = f"error: {' '.join(str(exc).split())[:160]}"
    return out


def probe_shape(shape: str, dtype: str, group: list[Case], providers: tuple[str, ...], tokens: tuple[int, ...]):
    """Rows for the cases of one shape and dtype: one weight draw, one reference per amp (sliced per token count)."""
    fc1, fc2 = weights(shape, dtype)
    _, k, _, _ = SHAPES[shape]
    rows, refs = [], {}
    for case in group:
        x, logits = feeds(shape, dtype, max(tokens), case.amp)
        if case.amp not in refs:
            refs[case.amp] = reference(x, logits, fc1, fc2, k)
        want = refs[case.amp][case.normalize]
        got = _outputs(case, providers, (fc1, fc2), x, logits, tokens)
        for t in tokens:
            row = Row(case.name, t)
            for p in providers:
                y = got[p] if isinstance(got[p], str) else got[p][t]
                setattr(row, p, y if isinstance(y, str) else rel(y, want[:t]))
            if all(isinstance(got.get(p), dict) for p in ("cuda", "cpu")):
                row.cuda_cpu = rel(got["cuda"][t], got["cpu"][t].astype(np.float64))
            rows.append(row)
    return rows


def probe(providers: tuple[str, ...], shapes=tuple(SHAPES), tokens=TOKENS, log=sys.stderr) -> list[Row]:
    """Every case of the grid for `shapes` at every token count, on `providers`."""
    rows = []
    grid = cases(shapes)
    for shape in shapes:
        for dtype in DTYPES:
            start = time.perf_counter()
            group = [c for c in grid if c.shape == shape and c.dtype == dtype]
            rows += probe_shape(shape, dtype, group, providers, tokens)
            print(f"moe_probe: {shape} {dtype}: {len(group)} cases in {time.perf_counter() - start:.1f} s", file=log)
    return rows


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return f"{v:.2e}" + (" **off**" if v > FLAG else "")


def table(rows: list[Row]) -> str:
    lines = ["| case | tokens | CUDA vs ref | CPU vs ref | CUDA vs CPU |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r.case} | {r.tokens} | {_cell(r.cuda)} | {_cell(r.cpu)} | {_cell(r.cuda_cpu)} |" for r in rows]
    return "\n".join(lines)


def header(provider: str, seconds: float) -> str:
    dev = device_name(provider) + ("" if provider == "cpu" else f"; CPU provider on {device_name('cpu')}")
    return (f"# com.microsoft.MoE probe, {datetime.date.today()}\n\n"
            f"onnxruntime {ort.__version__}; device: {dev}; measured in {seconds:.1f} s.\n"
            f"Attributes: k, normalize_routing_weights and {MOE_SWIGLU} (\"nolimit\": swiglu_limit unset). "
            f"Error: max|a - b| / max|b|, b the float64 reference (or the CPU output); **off**: above {FLAG:g}.\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--provider", choices=("cuda", "cpu"), default="cuda",
                    help="cuda: CUDA and CPU against the reference; cpu: the CPU only")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="comma list of token counts")
    ap.add_argument("-o", "--output", help="also write the markdown here")
    args = ap.parse_args(argv)
    shapes = tuple(s for s in args.shapes.split(",") if s)
    bad = [s for s in shapes if s not in SHAPES]
    try:
        tokens = tuple(sorted({int(t) for t in args.tokens.split(",") if t}))
    except ValueError:
        tokens = ()
    if bad or not shapes or not tokens or tokens[0] < 1:
        print(f"moe_probe: --shapes takes {', '.join(SHAPES)} (got {args.shapes!r}); --tokens positive integers "
              f"(got {args.tokens!r})", file=sys.stderr)
        return 2
    providers = ("cuda", "cpu") if args.provider == "cuda" else ("cpu",)
    start = time.perf_counter()
    rows = probe(providers, shapes, tokens)
    text = header(args.provider, time.perf_counter() - start) + "\n" + table(rows) + "\n"
    print(text)
    if args.output:
        Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
