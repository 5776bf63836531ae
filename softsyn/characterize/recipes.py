"""Cell kinds for characterisation: one small ONNX graph builder per op x precision, and its size grids.

A `CellKind` names a library cell (op, precision, implementation variant), the size axes its delay
table is indexed by (exactly the keys `softsyn.timing.cost.node_work(...).sizes` gives that op), one grid
per axis and per plan (cpu, cpu-quick, cuda, cuda-quick), and a `build(sizes, copies, ctx)` that
returns a graph holding `copies` independent instances of the op (each with its own weights),
all fed from the same graph inputs and each writing its own graph output. Characterisation times
that graph at `copies` = N and 1 and takes the difference / (N - 1) as the per-node delay, so the
fixed cost of a session run never enters a cell (the `Run` cell measures it separately).

Conventions that the size axes rely on (they are what cost.py computes for real nodes):
- `elements`: output elements for element-wise / data-movement ops, input elements for reductions
  and normalisations. Row-wise ops (Softmax, Reduce*, *LayerNorm*, TopK) are measured on rows of
  `min(elements, ROW)` columns (ROW = 256 on CPU, 1024 on CUDA): the row length is folded into the
  element count (documented approximation; real rows are the hidden size or the KV length).
- MatMul with a weight initializer: m (rows = product of the output's leading dims), n, k.
- MatMul of two activations (attention scores, attn x V): batch (product of the leading dims), m, n, k.
- MatMulNBits: m, n, k, block (block_size); precision int4 / int8 by the `bits` attribute.
- GroupQueryAttention / MultiHeadAttention: q_tokens, kv_len, heads, measured at batch 1 and a
  fixed head_dim (and kv_heads = heads / GQA_GROUP); batch and head_dim enter through the cell's
  `scale` rule (see softsyn.library.model).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

IR_VERSION = 10  # onnx 1.23 writes IR 14 by default; ORT 1.31 reads at most 13
OPSET = 17

FLOAT, UINT8, INT8, INT32, INT64, BOOL, FP16, DOUBLE, BF16, FP8 = 1, 2, 3, 6, 7, 9, 10, 11, 16, 17
ELEM = {"fp32": FLOAT, "fp16": FP16, "bf16": BF16, "fp64": DOUBLE}
NP = {FLOAT: np.float32, FP16: np.float16, DOUBLE: np.float64, INT64: np.int64, INT32: np.int32, BOOL: np.bool_,
      UINT8: np.uint8, INT8: np.int8}
GQA_GROUP = 2  # heads per KV head in the attention cells (tiny zoo: 4/2, Qwen3-1.7B: 16/8)


@dataclass
class Ctx:
    provider: str  # "cpu" | "cuda"
    row: int  # row length of row-wise ops
    head_dim: int  # head_dim of the attention / rotary cells
    act: str  # activation precision of weight-only cells (fp32 on CPU, fp16 on CUDA)
    precision: str = "fp32"  # the precision of the cell being built
    form: str = "copies"  # "chain" (the CPU plan): copy i consumes copy i-1's output where the op allows it


def _elem(ctx: "Ctx") -> int:
    """The data type of a float cell: the cell's own precision."""
    return ELEM.get(ctx.precision, FLOAT)


@dataclass
class Graph:
    nodes: list
    inputs: dict  # name -> (elem, np.ndarray | shape); a shape means "any contents" (e.g. bf16)
    outputs: list  # [(name, elem)]
    inits: list = field(default_factory=list)  # TensorProtos, and Blobs (random weights drawn by make_model)
    ms_domain: bool = False
    cpu_inputs: tuple = ()  # inputs a CUDA kernel reads from host memory (bound as CPU OrtValues)
    opset: int = OPSET
    optimize: bool = True  # False: session without graph rewrites (chains ORT would fold: Reshape pairs, ...)
    form: str = "copies"  # independent "copies", or the "chain" / "intermediates" form chained() / intermediates() make


@dataclass
class CellKind:
    op: str
    precision: str
    axes: list[str]
    grids: dict  # plan ("cpu", "cpu-quick", "cuda", "cuda-quick") -> [grid per axis]
    build: Callable[[dict, int, Ctx], Graph]
    variant: str = ""  # implementation suffix: "batched", ...
    providers: tuple = ("cpu", "cuda")
    scale: dict | None = None  # size -> reference value (folded into the table by a scaling rule)
    bytes_per_weight: float | None = None
    notes: str = ""
    discrete: tuple = ()  # axes with only legal values (no hold-out midpoints along them), e.g. block

    @property
    def key(self) -> str:
        return f"{self.op}.{self.precision}" + (f".{self.variant}" if self.variant else "")

    def implementation(self, provider: str) -> str:
        return f"ort-{provider}" + (f"-{self.variant}" if self.variant else "")


# ------------------------------------------------------------------------------------------ helpers

def _rng(seed=0):
    return np.random.default_rng(seed)


TILE = 1 << 20  # big random arrays repeat a random block of this many values: timing does not care, and
# drawing GBs of weights (MatMulNBits at n = 151936, k = 12288) would dominate a cell's time


def _tiled(draw: Callable[[int], np.ndarray], shape) -> np.ndarray:
    """An independent draw up to TILE values, a tiled random block beyond."""
    n = math.prod(shape)
    return np.resize(draw(min(n, TILE)), n).reshape(shape)


def _uniform(shape, seed=0) -> np.ndarray:
    """float32 in [0, 1)."""
    return _tiled(lambda k: _rng(seed).random(k, dtype=np.float32), shape)


def _bytes(shape, seed=0) -> np.ndarray:
    return _tiled(lambda k: _rng(seed).integers(0, 256, k, dtype=np.uint8), shape)


def _data(shape, elem, seed=0):
    """Random input data (read-only by convention: the same array is handed out again for the same arguments, so
    a point's one-copy and N-copy graphs share their inputs; on the H200 a batched MatMul point's 2 GiB inputs were
    drawn and uploaded four times, and host-side data dominated the cell: 73-83 s vs 10.6 s for bf16)."""
    return _data_memo(tuple(int(d) for d in shape), elem, seed)


@functools.lru_cache(maxsize=8)  # GroupQueryAttention draws five inputs: four thrashed between a point's two graphs
def _data_memo(shape, elem, seed):
    if elem == BF16:
        return tuple(shape)  # numpy has no bf16: allocated on the device, contents do not matter
    if elem == BOOL:
        return _rng(seed).random(shape) > 0.5
    if elem in (INT64, INT32):
        return _rng(seed).integers(0, 2, size=shape).astype(NP[elem])
    return (_uniform(shape, seed) - 0.5).astype(NP[elem])


@dataclass(frozen=True)
class Blob:
    """An initializer whose contents do not matter to timing (random weights), drawn only when a model is made.

    make_model draws each Blob (random bytes for 8-bit types, uniform [0, scale) for numpy's float types, fp8 the
    bit pattern of 1.0) into the protobuf; with `external` (the CUDA plan's shared_weights) every Blob of one type,
    shape and scale reads the same host array through ORT's external initializers instead: no protobuf of hundreds
    of MiB to build, serialise and parse (MatMulNBits on the H200 spent ~1.3 s per point on that, 170 s a cell).
    ORT still copies the array into each initializer, so every copy keeps its own weight buffer on the device."""

    name: str
    elem: int
    shape: tuple
    seed: int = 0
    scale: float = 1.0

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(NP.get(self.elem, np.uint8)).itemsize


@functools.lru_cache(maxsize=8)
def blob_array(elem: int, shape: tuple, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    """A Blob's contents (read-only: handed out again for the same arguments). FP8: the e4m3fn bit pattern of 1.0."""
    if elem == FP8:
        return np.full(shape, 0x38, np.uint8)
    if elem in (UINT8, INT8):
        return _bytes(shape, seed).view(NP[elem])
    return (_uniform(shape, seed) * scale).astype(NP[elem])


def _blob_tensor(b: Blob, external: dict | None):
    from onnx import TensorProto, helper
    if external is None:
        arr = blob_array(b.elem, b.shape, b.seed, b.scale)
        if b.elem in NP:
            return _init(b.name, arr, b.elem)
        return helper.make_tensor(b.name, b.elem, b.shape, arr.tobytes(), raw=True)
    external[b.name] = (b.elem, blob_array(b.elem, b.shape, 0, b.scale))  # one array for every copy
    t = TensorProto(name=b.name, data_type=b.elem, dims=b.shape)
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "shared-weights"), ("offset", "0"), ("length", str(b.nbytes))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t


def _init(name, array, elem):
    from onnx import helper, numpy_helper
    if elem == BF16:
        bits = (np.asarray(array, np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return helper.make_tensor(name, BF16, array.shape, bits.tobytes(), raw=True)
    return numpy_helper.from_array(np.asarray(array).astype(NP[elem]), name)


def _rows_cols(e: int, row: int) -> tuple[int, int]:
    e = max(1, int(e))
    if e <= row:
        return 1, e
    return max(1, round(e / row)), row


def make_model(g: Graph, external: dict | None = None):
    """The graph's ONNX model. `external`: a dict that receives name -> (elem, array) for every Blob, which the model
    then references as external data (the session adds the arrays: softsyn.characterize.ceilings._session)."""
    from onnx import helper
    opsets = [helper.make_opsetid("", g.opset)]
    if g.ms_domain:
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    ins = []
    for name, (elem, arr) in g.inputs.items():
        shape = list(arr) if isinstance(arr, tuple) else list(np.shape(arr))
        ins.append(helper.make_tensor_value_info(name, elem, shape))
    outs = [helper.make_tensor_value_info(name, elem, None) for name, elem in g.outputs]
    inits = [_blob_tensor(t, external) if isinstance(t, Blob) else t for t in g.inits]
    graph = helper.make_graph(g.nodes, "cell", ins, outs, inits)
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def _node(op, ins, outs, i, domain="", **attrs):
    from onnx import helper
    return helper.make_node(op, ins, outs, name=f"{op.lower()}{i}", domain=domain or None, **attrs)


def chained(g: Graph, src: str, optimize: bool = True) -> Graph:
    """The CHAIN form of a copies graph: node i (i >= 1) reads node i-1's first output instead of graph
    input `src`; only the last node's first output stays a graph output. So each node consumes its
    predecessor's output hot in cache and the intermediate tensors live in ORT's arena (reused), as in a
    real model, instead of N bound graph outputs."""
    nodes = list(g.nodes)
    for i in range(1, len(nodes)):
        prev = nodes[i - 1].output[0]
        ins = list(nodes[i].input)
        nodes[i].input[:] = [prev if n == src else n for n in ins]
    last = nodes[-1].output[0]
    outs = [(n, e) for n, e in g.outputs if n == last]
    return Graph(nodes, g.inputs, outs, g.inits, g.ms_domain, g.cpu_inputs, g.opset, optimize, form="chain")


def intermediates(g: Graph) -> Graph:
    """The INTERMEDIATES form of a copies graph (ops whose output cannot feed their input): only the last node's
    outputs stay graph outputs, the others are intermediates ORT's arena allocates and frees on every run, as a
    model's are. Independent copies writing N preallocated bound outputs skip that: on the CPU they read 0.05-0.12
    us/node under the same op in qwen3-moe-tiny (Concat 0.25 vs 0.34 us, Slice 0.23 vs 0.35, Shape 0.10 vs 0.15).
    The session runs without graph rewrites: they would merge the identical copies (common subexpressions)."""
    last = set(g.nodes[-1].output)
    outs = [(n, e) for n, e in g.outputs if n in last]
    return Graph(g.nodes, g.inputs, outs, g.inits, g.ms_domain, g.cpu_inputs, g.opset, optimize=False,
                 form="intermediates")


def _maybe_chain(g: Graph, src: str, ctx: "Ctx") -> Graph:
    return chained(g, src) if ctx.form == "chain" else g


# ------------------------------------------------------------------------------------------ builders

def unary(op, in_elem=None, out_elem=None, domain="", row_wise=False, **attrs):
    """op(x) on [rows, cols]; out dtype out_elem (default: the input's)."""
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = in_elem or _elem(ctx)
        r, c = _rows_cols(s["elements"], ctx.row if row_wise else 256 if ctx.provider == "cpu" else 1024)
        nodes = [_node(op, ["x"], [f"y{i}"], i, domain, **attrs) for i in range(copies)]
        g = Graph(nodes, {"x": (elem, _data((r, c), elem))}, [(f"y{i}", out_elem or elem) for i in range(copies)],
                  ms_domain=bool(domain))
        return _maybe_chain(g, "x", ctx) if (out_elem or elem) == elem else g
    return build


def binary(op, in_elem=None, out_elem=None, domain=""):
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = in_elem or _elem(ctx)
        r, c = _rows_cols(s["elements"], 256 if ctx.provider == "cpu" else 1024)
        x = _data((r, c), elem, 1)
        if op == "Pow":  # exponent 2 as in RMSNorm: a broadcast scalar
            inputs = {"a": (elem, x), "b": (elem, np.array(2.0, NP.get(elem, np.float32)))}
        else:
            inputs = {"a": (elem, x), "b": (elem, _data((r, c), elem, 2))}
        nodes = [_node(op, ["a", "b"], [f"y{i}"], i, domain) for i in range(copies)]
        g = Graph(nodes, inputs, [(f"y{i}", out_elem or elem) for i in range(copies)], ms_domain=bool(domain))
        return _maybe_chain(g, "a", ctx) if (out_elem or elem) == elem else g
    return build


def where(s, copies, ctx: Ctx) -> Graph:
    elem = _elem(ctx)
    r, c = _rows_cols(s["elements"], 256)
    nodes = [_node("Where", ["c", "a", "b"], [f"y{i}"], i) for i in range(copies)]
    return _maybe_chain(Graph(nodes, {"c": (BOOL, _data((r, c), BOOL)), "a": (elem, _data((r, c), elem)),
                                      "b": (elem, _data((r, c), elem, 3))}, [(f"y{i}", elem) for i in range(copies)]),
                        "a", ctx)


def cast(s, copies, ctx: Ctx) -> Graph:
    r, c = _rows_cols(s["elements"], 256)
    nodes = [_node("Cast", ["x"], [f"y{i}"], i, to=FLOAT) for i in range(copies)]
    return Graph(nodes, {"x": (INT64, _data((r, c), INT64))}, [(f"y{i}", FLOAT) for i in range(copies)])


def norm(op, skip=False, bias=False, domain=""):
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = _elem(ctx)
        r, c = _rows_cols(s["elements"], ctx.row)
        inputs = {"x": (elem, _data((r, c), elem))}
        if skip:
            inputs["skip"] = (elem, _data((r, c), elem, 4))
        nodes, inits = [], []
        for i in range(copies):
            inits.append(_init(f"g{i}", np.ones(c), elem))
            ins = ["x"] + (["skip"] if skip else []) + [f"g{i}"]
            if bias:
                inits.append(_init(f"b{i}", np.zeros(c), elem))
                ins.append(f"b{i}")
            attrs = {"epsilon": 1e-6}
            if op in ("LayerNormalization", "SimplifiedLayerNormalization"):
                attrs["axis"] = -1
            nodes.append(_node(op, ins, [f"y{i}"], i, domain, **attrs))
        return _maybe_chain(Graph(nodes, inputs, [(f"y{i}", elem) for i in range(copies)], inits,
                                  ms_domain=bool(domain)), "x", ctx)
    return build


def bias_gelu(op):
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = _elem(ctx)
        r, c = _rows_cols(s["elements"], 256 if ctx.provider == "cpu" else 1024)
        nodes, inits = [], []
        for i in range(copies):
            if op == "QuickGelu":
                nodes.append(_node(op, ["x"], [f"y{i}"], i, "com.microsoft", alpha=1.702))
                continue
            inits.append(_init(f"b{i}", np.zeros(c), elem))
            nodes.append(_node(op, ["x", f"b{i}"], [f"y{i}"], i, "com.microsoft"))
        return _maybe_chain(Graph(nodes, {"x": (elem, _data((r, c), elem))}, [(f"y{i}", elem) for i in range(copies)],
                                  inits, ms_domain=True), "x", ctx)
    return build


def softmax(s, copies, ctx):
    return unary("Softmax", row_wise=True, axis=-1)(s, copies, ctx)


def reduce(op):
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = _elem(ctx)
        r, c = _rows_cols(s["elements"], ctx.row)
        axes = _init("axes", np.array([-1]), INT64)
        nodes = [_node(op, ["x", "axes"], [f"y{i}"], i, keepdims=1) for i in range(copies)]
        g = Graph(nodes, {"x": (elem, _data((r, c), elem))}, [(f"y{i}", elem) for i in range(copies)], [axes],
                  opset=18)
        return g
    return build


def topk(s, copies, ctx: Ctx) -> Graph:
    elem = _elem(ctx)
    r, c = _rows_cols(s["elements"], 64)
    k = _init("k", np.array([min(2, c)]), INT64)
    nodes = [_node("TopK", ["x", "k"], [f"v{i}", f"i{i}"], i, axis=-1) for i in range(copies)]
    outs = [o for i in range(copies) for o in ((f"v{i}", elem), (f"i{i}", INT64))]
    return Graph(nodes, {"x": (elem, _data((r, c), elem))}, outs, [k])


def transpose(s, copies, ctx: Ctx) -> Graph:
    elem = _elem(ctx)
    # [a, b, c] -> [b, a, c] as in the attention head split ([seq, heads, dim] -> [heads, seq, dim])
    e = max(1, int(s["elements"]))
    d = min(e, 32)
    rest = max(1, e // d)
    h = min(rest, 4)
    a = max(1, rest // h)
    nodes = [_node("Transpose", ["x"], [f"y{i}"], i, perm=[1, 0, 2]) for i in range(copies)]
    g = Graph(nodes, {"x": (elem, _data((a, h, d), elem))}, [(f"y{i}", elem) for i in range(copies)])
    return chained(g, "x", optimize=False) if ctx.form == "chain" else g  # ORT cancels Transpose pairs


def reshape_like(op):
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = _elem(ctx)
        r, c = _rows_cols(s["elements"], 256)
        inits, attrs_ins = [], []
        if op == "Reshape":
            inits.append(_init("shape", np.array([r * c]), INT64))
            attrs_ins = ["shape"]
            x = _data((r, c), elem)
            if ctx.form == "chain":  # alternate [r*c] <-> [r, c]
                inits.append(_init("shape_back", np.array([r, c]), INT64))
                nodes = [_node(op, ["x", "shape" if i % 2 == 0 else "shape_back"], [f"y{i}"], i) for i in range(copies)]
                return chained(Graph(nodes, {"x": (elem, x)}, [(f"y{i}", elem) for i in range(copies)], inits), "x",
                               optimize=False)
        elif op == "Unsqueeze":
            inits.append(_init("axes", np.array([0]), INT64))
            attrs_ins = ["axes"]
            x = _data((r, c), elem)
            if ctx.form == "chain":  # Unsqueeze / Squeeze alternating (two views of the same cost)
                nodes = [_node("Unsqueeze" if i % 2 == 0 else "Squeeze", ["x", "axes"], [f"y{i}"], i)
                         for i in range(copies)]
                return chained(Graph(nodes, {"x": (elem, x)}, [(f"y{i}", elem) for i in range(copies)], inits), "x",
                               optimize=False)
        elif op == "Squeeze":
            inits.append(_init("axes", np.array([0]), INT64))
            attrs_ins = ["axes"]
            x = _data((1, r, c), elem)
            if ctx.form == "chain":
                nodes = [_node("Squeeze" if i % 2 == 0 else "Unsqueeze", ["x", "axes"], [f"y{i}"], i)
                         for i in range(copies)]
                return chained(Graph(nodes, {"x": (elem, x)}, [(f"y{i}", elem) for i in range(copies)], inits), "x",
                               optimize=False)
        elif op == "Identity":
            x = _data((r, c), elem)
        nodes = [_node(op, ["x"] + attrs_ins, [f"y{i}"], i) for i in range(copies)]
        g = Graph(nodes, {"x": (elem, x)}, [(f"y{i}", elem) for i in range(copies)], inits)
        return chained(g, "x", optimize=False) if ctx.form == "chain" else g
    return build


def shape_op(s, copies, ctx: Ctx) -> Graph:
    rank = max(1, min(int(s["elements"]), 6))
    nodes = [_node("Shape", ["x"], [f"y{i}"], i) for i in range(copies)]
    return Graph(nodes, {"x": (FLOAT, _data((1,) * (rank - 1) + (4,), FLOAT))}, [(f"y{i}", INT64) for i in range(copies)])


def concat(s, copies, ctx: Ctx) -> Graph:
    elem = _elem(ctx)
    r, c = _rows_cols(s["elements"], 256)
    if c >= 2:
        ins = {"a": (elem, _data((r, c // 2), elem)), "b": (elem, _data((r, c - c // 2), elem, 1))}
    else:
        ins = {"a": (elem, _data((r, c), elem))}
    nodes = [_node("Concat", list(ins), [f"y{i}"], i, axis=-1) for i in range(copies)]
    return Graph(nodes, ins, [(f"y{i}", elem) for i in range(copies)])


def slice_op(s, copies, ctx: Ctx) -> Graph:
    elem = _elem(ctx)
    r, c = _rows_cols(s["elements"], 256)
    inits = [_init("st", np.array([0]), INT64), _init("en", np.array([c]), INT64), _init("ax", np.array([-1]), INT64)]
    nodes = [_node("Slice", ["x", "st", "en", "ax"], [f"y{i}"], i) for i in range(copies)]
    return Graph(nodes, {"x": (elem, _data((r, 2 * c), elem))}, [(f"y{i}", elem) for i in range(copies)], inits)


def split(s, copies, ctx: Ctx) -> Graph:
    elem = _elem(ctx)
    r, c = _rows_cols(s["elements"], 256)
    c = max(2, c - c % 2)
    nodes = [_node("Split", ["x"], [f"y{i}a", f"y{i}b"], i, axis=-1, num_outputs=2) for i in range(copies)]
    outs = [o for i in range(copies) for o in ((f"y{i}a", elem), (f"y{i}b", elem))]
    return Graph(nodes, {"x": (elem, _data((r, c), elem))}, outs, opset=18)


def expand(s, copies, ctx: Ctx) -> Graph:
    elem = _elem(ctx)
    r, c = _rows_cols(s["elements"], 256)
    inits = [_init("shape", np.array([r, c]), INT64)]
    nodes = [_node("Expand", ["x", "shape"], [f"y{i}"], i) for i in range(copies)]
    return Graph(nodes, {"x": (elem, _data((1, c), elem))}, [(f"y{i}", elem) for i in range(copies)], inits)


def gather(s, copies, ctx: Ctx) -> Graph:
    """Embedding lookup: rows of a [V, H] table (own table per copy), H = min(elements, 1024)."""
    elem = _elem(ctx)
    e = max(1, int(s["elements"]))
    h = min(e, 1024)
    t = max(1, e // h)
    vocab = 4096
    idx = _rng(5).integers(0, vocab, size=(1, t)).astype(np.int64)
    inits, nodes = [], []
    for i in range(copies):
        inits.append(Blob(f"E{i}", elem, (vocab, h), i))
        nodes.append(_node("Gather", [f"E{i}", "idx"], [f"y{i}"], i, axis=0))
    return Graph(nodes, {"idx": (INT64, idx)}, [(f"y{i}", elem) for i in range(copies)], inits)


def gather_nd(s, copies, ctx: Ctx) -> Graph:
    """`elements` outputs gathered as slices of up to 16 Ki elements (64 KiB fp32: one expert's 128 x 128 weight)
    from at most 256 source slices, cycled: the MoE pattern of per-token expert weights picked from a small
    expert table (the reads stay in cache; each slice is one memcpy, so the slice size sets the per-slice
    overhead: 1 KiB rows read 2x slower than the model's 64 KiB slices). CHAIN form: the source
    is the previous copy's output (its first rows; the output keeps the shape), so the output lands in a buffer
    the arena reuses, hot while it fits the caches, as a model's does (independent copies write N fresh
    outputs: qwen3-moe prefill's 2 MiB gathers read 2.5x slower that way)."""
    elem = _elem(ctx)
    r, c = _rows_cols(s["elements"], 16384)
    src = r if ctx.form == "chain" else min(r, 256)  # chain: the source is the previous output, of the output's shape
    idx = (np.arange(r, dtype=np.int64) % min(r, 256)).reshape(r, 1)
    nodes = [_node("GatherND", ["x", "idx"], [f"y{i}"], i) for i in range(copies)]
    return _maybe_chain(Graph(nodes, {"x": (elem, _data((src, c), elem)), "idx": (INT64, idx)},
                              [(f"y{i}", elem) for i in range(copies)]), "x", ctx)


def range_op(s, copies, ctx: Ctx) -> Graph:
    e = max(1, int(s["elements"]))
    ins = {"start": (INT64, np.array(0, np.int64)), "limit": (INT64, np.array(e, np.int64)),
           "delta": (INT64, np.array(1, np.int64))}
    nodes = [_node("Range", ["start", "limit", "delta"], [f"y{i}"], i) for i in range(copies)]
    return Graph(nodes, ins, [(f"y{i}", INT64) for i in range(copies)], cpu_inputs=("start", "limit", "delta"))


def matmul(s, copies, ctx: Ctx, precision: str) -> Graph:
    """a [m, k] @ W [k, n], W an initializer per copy (prepacked, as in a real model)."""
    elem = ELEM[precision]
    m, n, k = int(s["m"]), int(s["n"]), int(s["k"])
    inits, nodes, ins = [], [], {"a": (elem, _data((m, k), elem))}
    chain = ctx.form == "chain"
    for i in range(copies):
        kk, nn = (n, k) if chain and i % 2 else (k, n)  # chain: alternate W[k, n] and W[n, k]
        if ctx.provider == "cuda":  # no prepacking on CUDA: weights bound on the device (no 2 GB protobuf limit)
            ins[f"W{i}"] = (elem, (kk, nn))
        else:
            inits.append(_init(f"W{i}", (_uniform((kk, nn), i) - 0.5) * 0.05, elem))
        nodes.append(_node("MatMul", ["a", f"W{i}"], [f"y{i}"], i))
    return _maybe_chain(Graph(nodes, ins, [(f"y{i}", elem) for i in range(copies)], inits), "a", ctx)


def gemm(s, copies, ctx: Ctx, precision: str) -> Graph:
    elem = ELEM[precision]
    m, n, k = int(s["m"]), int(s["n"]), int(s["k"])
    inits, nodes = [], []
    chain = ctx.form == "chain"
    ins = {"a": (elem, _data((m, k), elem))}
    for i in range(copies):
        kk, nn = (n, k) if chain and i % 2 else (k, n)  # chain: alternate W[n, k] and W[k, n]
        if ctx.provider == "cuda":  # as MatMul: weights bound on the device (one [151936, 12288] fp16 W is 3.7 GB,
            ins[f"W{i}"] = (elem, (nn, kk))  # past the 2 GiB protobuf limit: "Failed to serialize proto")
            ins[f"c{i}"] = (elem, (nn,))
        else:
            inits.append(_init(f"W{i}", (_uniform((nn, kk), i) - 0.5) * 0.05, elem))
            inits.append(_init(f"c{i}", np.zeros(nn), elem))
        nodes.append(_node("Gemm", ["a", f"W{i}", f"c{i}"], [f"y{i}"], i, transB=1))
    return _maybe_chain(Graph(nodes, ins, [(f"y{i}", elem) for i in range(copies)], inits), "a", ctx)


def batched_matmul(s, copies, ctx: Ctx, precision: str, chain: bool = True) -> Graph:
    """[batch, m, k] @ [batch, k, n], both graph inputs; `chain=False`: independent copies on every provider.
    The copies share A: in the model A is the expert weights GatherND has just written, in cache while it fits
    (a private A per copy read 2-3x slower than the model below 8 MiB); above the last-level cache (32 MiB and
    up) the model's A comes from memory and the shared one under-reads it (296 vs 835 us at 1024 x 128 x 64)."""
    elem = ELEM[precision]
    b, m, n, k = int(s["batch"]), int(s["m"]), int(s["n"]), int(s["k"])
    ins = {"a": (elem, _data((b, m, k), elem)), "b": (elem, _data((b, k, n), elem, 1))}
    if ctx.form != "chain" or not chain:
        nodes = [_node("MatMul", ["a", "b"], [f"y{i}"], i) for i in range(copies)]
        return Graph(nodes, ins, [(f"y{i}", elem) for i in range(copies)])
    ins["b2"] = (elem, _data((b, n, k), elem, 2))  # chain: alternate B[k, n] and B[n, k]
    nodes = [_node("MatMul", ["a", "b" if i % 2 == 0 else "b2"], [f"y{i}"], i) for i in range(copies)]
    return chained(Graph(nodes, ins, [(f"y{i}", elem) for i in range(copies)]), "a")


def matmul_nbits(bits: int):
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = ELEM[ctx.act]
        m, n, k, block = int(s["m"]), int(s["n"]), int(s["k"]), int(s["block"])
        kb = (k + block - 1) // block
        blob = block * bits // 8
        inits, nodes = [], []
        for i in range(copies):
            inits.append(Blob(f"B{i}", UINT8, (n, kb, blob), i))
            inits.append(Blob(f"S{i}", elem, (n * kb,), i, 0.01))
            nodes.append(_node("MatMulNBits", ["a", f"B{i}", f"S{i}"], [f"y{i}"], i, "com.microsoft",
                               K=k, N=n, bits=bits, block_size=block))
        return Graph(nodes, {"a": (elem, _data((m, k), elem))}, [(f"y{i}", elem) for i in range(copies)], inits,
                     ms_domain=True)
    return build


def dequantize(qelem: int, precision: str):
    """DequantizeLinear of a weight initializer (per-tensor scale) to the activation type."""
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = ELEM[ctx.act]
        r, c = _rows_cols(s["elements"], 1024)
        inits, nodes = [], []
        for i in range(copies):
            inits.append(Blob(f"q{i}", qelem, (r, c), i))
            inits.append(_init(f"s{i}", np.array(0.01), elem))
            nodes.append(_node("DequantizeLinear", [f"q{i}", f"s{i}"], [f"y{i}"], i))
        # a dummy data input keeps the graph's inputs non-empty (IO binding needs one)
        nodes_in = {"x": (elem, _data((1, 1), elem))}
        nodes.append(_node("Identity", ["x"], ["xid"], 0))
        # opset 19: fp8 inputs and fp16 scales (opset 13's DequantizeLinear takes fp32 scales only: the CUDA session
        # refused the int8 cell with its fp16 scale on the H200, 2026-11-30)
        return Graph(nodes, nodes_in, [(f"y{i}", elem) for i in range(copies)] + [("xid", elem)], inits, opset=19)
    return build


def rotary(s, copies, ctx: Ctx) -> Graph:
    """com.microsoft RotaryEmbedding on [1, tokens, heads * head_dim] (non-interleaved)."""
    elem = _elem(ctx)
    d = ctx.head_dim
    e = max(d, int(s["elements"]))
    heads = max(1, min(e // d, 16))
    t = max(1, e // (heads * d))
    max_pos = max(4096, t)  # the cache must cover every position (32 Mi elements = 16384 tokens on CUDA)
    cos = _init("cos", _rng(1).random((max_pos, d // 2), dtype=np.float32), elem)
    sin = _init("sin", _rng(2).random((max_pos, d // 2), dtype=np.float32), elem)
    pos = np.arange(t, dtype=np.int64).reshape(1, t)
    nodes = [_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], [f"y{i}"], i, "com.microsoft", num_heads=heads)
             for i in range(copies)]
    return _maybe_chain(Graph(nodes, {"x": (elem, _data((1, t, heads * d), elem)), "pos": (INT64, pos)},
                              [(f"y{i}", elem) for i in range(copies)], [cos, sin], ms_domain=True), "x", ctx)


def gqa(precision: str):
    """GroupQueryAttention: q_tokens new tokens attending kv_len cached + new tokens, batch 1."""
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = ELEM[precision]
        d = ctx.head_dim
        h = int(s["heads"])
        kvh = max(1, h // GQA_GROUP)
        q = int(s["q_tokens"])
        total = max(int(s["kv_len"]), q)
        # shared past/present buffer of `total` positions (the genai builder's layout): present = past shape
        ins = {"query": (elem, _data((1, q, h * d), elem)), "key": (elem, _data((1, q, kvh * d), elem, 1)),
               "value": (elem, _data((1, q, kvh * d), elem, 2)),
               "past_key": (elem, _data((1, kvh, total, d), elem, 3)),
               "past_value": (elem, _data((1, kvh, total, d), elem, 4))}
        names = ["query", "key", "value", "past_key", "past_value"]
        ins["seqlens_k"] = (INT32, np.array([total - 1], np.int32))
        ins["total_sequence_length"] = (INT32, np.array(total, np.int32))
        names += ["seqlens_k", "total_sequence_length"]
        nodes, outs = [], []
        for i in range(copies):
            nodes.append(_node("GroupQueryAttention", names, [f"y{i}", f"pk{i}", f"pv{i}"], i, "com.microsoft",
                               num_heads=h, kv_num_heads=kvh))
            outs += [(f"y{i}", elem), (f"pk{i}", elem), (f"pv{i}", elem)]
        return Graph(nodes, ins, outs, ms_domain=True, cpu_inputs=("total_sequence_length",))
    return build


def mha(precision: str):
    """MultiHeadAttention: q_tokens queries over kv_len keys/values (BSNH 3-D inputs), batch 1."""
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = ELEM[precision]
        d = ctx.head_dim
        h = int(s["heads"])
        q, kv = int(s["q_tokens"]), int(s["kv_len"])
        ins = {"query": (elem, _data((1, q, h * d), elem)), "key": (elem, _data((1, kv, h * d), elem, 1)),
               "value": (elem, _data((1, kv, h * d), elem, 2))}
        nodes = [_node("MultiHeadAttention", ["query", "key", "value"], [f"y{i}"], i, "com.microsoft", num_heads=h)
                 for i in range(copies)]
        return Graph(nodes, ins, [(f"y{i}", elem) for i in range(copies)], ms_domain=True)
    return build


# ------------------------------------------------------------------------------------------ grids

def _e(*points):
    return [list(points)]


E_CPU = _e(1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1 << 20)
E_CPU_Q = _e(1, 64, 4096, 262144)
E_GPU = _e(1, 1024, 16384, 262144, 1 << 22, 1 << 25)
E_GPU_Q = _e(1, 16384, 1 << 22)
# moves/views: the big end matters less on the tiny zoo, smaller grid on CPU
E_SMALL_CPU = _e(1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)
E_SMALL_CPU_Q = _e(1, 256, 65536)
# GatherND also gathers MoE expert weights per token: outputs of tens of MiB, far beyond the caches
E_GATHER_CPU = _e(1, 16, 256, 4096, 65536, 1 << 20, 1 << 22, 1 << 24)
EL = {"cpu": E_CPU, "cpu-quick": E_CPU_Q, "cuda": E_GPU, "cuda-quick": E_GPU_Q}
ES = {"cpu": E_SMALL_CPU, "cpu-quick": E_SMALL_CPU_Q, "cuda": E_GPU, "cuda-quick": E_GPU_Q}

# Gemm on the CPU (no zoo model uses it; imported ONNX files do): a coarse grid, but not corners only (a 2 x 2 x 2 grid
# read 33-81 % off at its hold-out midpoints, where the weights move between cache and memory)
GEMM_CPU = [[1, 16, 128], [32, 256, 2048], [32, 256, 2048]]
MM = {  # m, n, k: tokens x hidden sizes (CPU zoo: hidden 128-384, intermediate 256-1536, vocab 1024-30522)
    # CPU: points on the zoo's own sizes (tokens 1/4/16/128/512, widths 128/256/384/1024/1536): ORT's CPU GEMM
    # is not a power law between far-apart points ([16, 384] @ [384, 384]: 25 us measured, 17 us interpolated
    # from the m {8, 64} x n, k {256, 2048} grid)
    "cpu": [[1, 4, 16, 128, 512], [32, 128, 256, 384, 1024, 1536, 16384], [32, 128, 256, 384, 1536]],
    "cpu-quick": [[1, 128], [64, 1024], [64, 1024]],
    # real models: hidden 1024-4096, intermediate up to 12288, vocab 151936, tokens 1..512(+)
    "cuda": [[1, 16, 128, 512, 2048], [256, 1024, 4096, 12288, 151936], [256, 1024, 4096, 12288]],
    "cuda-quick": [[1, 512], [1024, 12288], [1024, 4096]],
}
BMM = {  # batch (heads x batch), m (q tokens), n, k (head_dim or kv length)
    "cpu": [[1, 4, 16], [1, 16, 128, 512], [1, 32, 128, 512], [32, 128, 512]],  # n = 1: MoE batched_mm experts
    "cpu-quick": [[1, 16], [1, 128], [32, 512], [32, 512]],
    "cuda": [[1, 8, 32], [1, 128, 512, 2048], [64, 512, 4096], [64, 512, 4096]],
    "cuda-quick": [[1, 32], [1, 512], [64, 4096], [64, 4096]],
}
BMM_EXPERT = {  # batch (tokens x top-k), m, n = 1, k (expert width / hidden): MoE batched_mm experts
    # transformers' batched_mm exports W_gathered [batch, m, k] @ x [batch, k, 1]: A is the per-token expert weight
    # GatherND just wrote (batch x m x k, 64 MiB fp32 at the grid's top, beyond the caches), ORT's CPU MatMul loops
    # one GEMV per batch item over it, so the general BMM grid (batch <= 16, A in cache) cannot speak for it.
    "cpu": [[16, 128, 1024], [32, 64, 128], [1], [32, 64, 128]],
    "cpu-quick": [[16, 1024], [32, 128], [1], [32, 128]],
}
NB = {  # m, n, k, block
    "cpu": [[1, 16, 128], [256, 2048, 16384], [256, 2048], [32, 64, 128]],
    "cpu-quick": [[1, 128], [256, 2048], [256, 1024], [32, 128]],
    # n stops at 12288 on CUDA: a vocab-size int4 weight (151936 x 12288) is a 0.9 GB initializer per point, and
    # building, serialising and loading those dominated the H200 run; above the grid the edge slope continues
    "cuda": [[1, 16, 128, 512], [1024, 4096, 12288], [1024, 4096, 12288], [32, 64, 128]],
    "cuda-quick": [[1, 512], [1024, 12288], [1024, 4096], [32, 128]],
}
ATT = {  # q_tokens, kv_len, heads
    "cpu": [[1, 16, 128, 512], [16, 128, 512, 2048], [4, 16]],
    "cpu-quick": [[1, 128], [128, 1024], [4, 16]],
    "cuda": [[1, 16, 128, 512, 2048], [128, 512, 2048, 4096, 8192], [8, 16, 32]],
    "cuda-quick": [[1, 512], [512, 4096], [16, 32]],
}


def _mm(prec):
    return lambda s, c, ctx: matmul(s, c, ctx, prec)


def _gemm(prec):
    return lambda s, c, ctx: gemm(s, c, ctx, prec)


def _bmm(prec, chain: bool = True):
    return lambda s, c, ctx: batched_matmul(s, c, ctx, prec, chain)


def cell_kinds() -> list[CellKind]:
    """Every cell kind, in library order (more specific cells of an op before less specific ones)."""
    ks: list[CellKind] = []
    A = ["elements"]
    # dense matmuls at every float precision (recorded only where the provider computes in it)
    for p in ("fp32", "fp16", "bf16"):
        if p == "fp32":  # listed before the general batched cell; Library.cell_for picks the cell covering the sizes
            ks.append(CellKind("MatMul", p, ["batch", "m", "n", "k"], BMM_EXPERT, _bmm(p, chain=False),
                               variant="batched-expert", providers=("cpu",),
                               notes="MoE per-token experts: gathered weights [batch, m, k] @ x [batch, k, 1], batch = "
                                     "tokens x top-k; independent copies (A streamed from memory, as in the model)"))
        ks.append(CellKind("MatMul", p, ["batch", "m", "n", "k"], BMM, _bmm(p), variant="batched",
                           notes="two activations [batch, m, k] @ [batch, k, n] (attention scores, attn x V)"))
        ks.append(CellKind("MatMul", p, ["m", "n", "k"], MM, _mm(p), bytes_per_weight={"fp32": 4}.get(p, 2),
                           notes="[m, k] @ W[k, n], W an initializer"))
        ks.append(CellKind("Gemm", p, ["m", "n", "k"], {**MM, "cpu": GEMM_CPU} if p == "fp32" else MM,
                           _gemm(p), notes="a @ W^T + c (transB=1)"))
    for bits, p in ((4, "int4"), (8, "int8")):
        ks.append(CellKind("MatMulNBits", p, ["m", "n", "k", "block"], NB, matmul_nbits(bits),
                           bytes_per_weight=bits / 8, discrete=("block",), notes=f"weight-only {bits}-bit, per-block scales, no zero "
                           "point, activations fp32 (CPU) / fp16 (CUDA)"))
    ks.append(CellKind("DequantizeLinear", "fp8", A, EL, dequantize(FP8, "fp8"), bytes_per_weight=1,
                       notes="fp8 e4m3fn weight -> activation type (the Q/DQ form of an fp8 weight)"))
    ks.append(CellKind("DequantizeLinear", "int8", A, EL, dequantize(INT8, "int8"), bytes_per_weight=1))
    # attention
    for p in ("fp32", "fp16", "bf16"):
        ks.append(CellKind("GroupQueryAttention", p, ["q_tokens", "kv_len", "heads"], ATT, gqa(p),
                           scale={"batch": 1, "head_dim": None}, discrete=("heads",),  # heads % kv_heads == 0
                           notes=f"batch 1, kv_heads = heads / {GQA_GROUP}, shared past/present buffer of kv_len positions"))
        ks.append(CellKind("MultiHeadAttention", p, ["q_tokens", "kv_len", "heads"], ATT, mha(p),
                           scale={"batch": 1, "head_dim": None}, notes="batch 1, BSNH query/key/value, no mask"))
    # normalisations and fused element-wise
    for op, kw in (("SimplifiedLayerNormalization", {}), ("LayerNormalization", {"bias": True}),
                   ("SkipSimplifiedLayerNormalization", {"skip": True, "domain": "com.microsoft"}),
                   ("SkipLayerNormalization", {"skip": True, "bias": True, "domain": "com.microsoft"})):
        ks.append(CellKind(op, "fp32", A, EL, norm(op, **kw), notes="rows of min(elements, ROW) columns"))
        ks.append(CellKind(op, "fp16", A, EL, norm(op, **kw), providers=("cuda",)))
    ks.append(CellKind("RotaryEmbedding", "fp32", A, EL, rotary, notes="com.microsoft, fixed head_dim"))
    ks.append(CellKind("RotaryEmbedding", "fp16", A, EL, rotary, providers=("cuda",)))
    for op in ("BiasGelu", "FastGelu", "QuickGelu"):
        ks.append(CellKind(op, "fp32", A, EL, bias_gelu(op)))
        ks.append(CellKind(op, "fp16", A, EL, bias_gelu(op), providers=("cuda",)))
    # plain ONNX ops of a dynamo export (CPU zoo) - fp32; the CUDA plan also records them in fp16
    fam = []
    for op in ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"):
        fam.append((op, EL, binary(op)))
    for op in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"):
        fam.append((op, ES, binary(op, out_elem=BOOL)))
    fam.append(("And", ES, binary("And", in_elem=BOOL)))
    fam.append(("Or", ES, binary("Or", in_elem=BOOL)))
    fam.append(("Where", ES, where))
    for op in ("Neg", "Sqrt", "Reciprocal", "Sigmoid", "Cos", "Sin", "Erf", "Exp", "Tanh", "Relu", "Abs", "Log"):
        fam.append((op, EL, unary(op)))
    fam.append(("IsNaN", ES, unary("IsNaN", out_elem=BOOL)))
    fam.append(("Not", ES, unary("Not", in_elem=BOOL)))
    fam.append(("Cast", ES, cast))
    fam.append(("Softmax", EL, softmax))
    for op in ("ReduceMean", "ReduceSum", "ReduceMax"):
        fam.append((op, EL, reduce(op)))
    fam.append(("TopK", ES, topk))
    fam.append(("Transpose", EL, transpose))
    for op in ("Reshape", "Unsqueeze", "Squeeze", "Identity"):
        fam.append((op, ES, reshape_like(op)))
    fam.append(("Shape", {k: [[1, 2, 4]] for k in EL}, shape_op))
    fam.append(("Concat", ES, concat))
    fam.append(("Slice", ES, slice_op))
    fam.append(("Split", ES, split))
    fam.append(("Expand", ES, expand))
    fam.append(("Gather", EL, gather))
    fam.append(("GatherND", {**ES, "cpu": E_GATHER_CPU}, gather_nd))
    fam.append(("Range", {k: ([[1, 16, 256, 4096]] if k.startswith("cpu") else [[1, 4096]]) for k in EL}, range_op))
    int_ops = {"Cast", "Range", "Shape", "And", "Or", "Not"}
    for op, grid, build in fam:
        ks.append(CellKind(op, "fp32", A, grid, build))
        if op not in int_ops:
            ks.append(CellKind(op, "fp16", A, grid, build, providers=("cuda",)))
    return ks


def run_cell_grid(plan: str) -> list[list[int]]:
    return [[2, 4, 8, 16, 32]] if not plan.endswith("quick") else [[2, 8, 32]]


def geometric_mid(a: float, b: float) -> int:
    return int(round(math.sqrt(a * b)))
