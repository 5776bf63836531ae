"""Cell recipes: one small ONNX graph builder per op family, `build(sizes, copies, ctx) -> Graph`.

Each builder makes `copies` instances of its op at the sizes of one grid point (softsyn.characterize.catalogue
says which builder serves which cell and on which grid), in the form the plan asks for (`ctx.form`: independent
copies, or a chain where the op's output can feed its input; softsyn.characterize.cellgraph).
"""
from __future__ import annotations

import numpy as np
from onnx import helper

from softsyn.characterize.cellgraph import (
    BOOL, ELEM, FLOAT, FP8, INT8, INT32, INT64, NP, UINT8, Blob, Ctx, Graph, chained, data, tensor, uniform)
from softsyn.runtime.kv_quant import BITS, QUANT_TYPE
from softsyn.runtime.moe_op import MOE_SWIGLU

GQA_GROUP = 2  # heads per KV head in the attention cells (tiny zoo: 4/2, Qwen3-1.7B: 16/8)


def _elem(ctx: "Ctx") -> int:
    """The data type of a float cell: the cell's own precision."""
    return ELEM.get(ctx.precision, FLOAT)


def _rows_cols(e: int, row: int) -> tuple[int, int]:
    e = max(1, int(e))
    if e <= row:
        return 1, e
    return max(1, round(e / row)), row


def _node(op, ins, outs, i, domain="", **attrs):
    return helper.make_node(op, ins, outs, name=f"{op.lower()}{i}", domain=domain or None, **attrs)


def _maybe_chain(g: Graph, src: str, ctx: "Ctx") -> Graph:
    return chained(g, src) if ctx.form == "chain" else g


# ------------------------------------------------------------------------------------------ builders

def unary(op, in_elem=None, out_elem=None, domain="", row_wise=False, **attrs):
    """op(x) on [rows, cols]; out dtype out_elem (default: the input's)."""
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = in_elem or _elem(ctx)
        r, c = _rows_cols(s["elements"], ctx.row if row_wise else 256 if ctx.provider == "cpu" else 1024)
        nodes = [_node(op, ["x"], [f"y{i}"], i, domain, **attrs) for i in range(copies)]
        g = Graph(nodes, {"x": (elem, data((r, c), elem))}, [(f"y{i}", out_elem or elem) for i in range(copies)],
                  ms_domain=bool(domain))
        return _maybe_chain(g, "x", ctx) if (out_elem or elem) == elem else g
    return build


def binary(op, in_elem=None, out_elem=None, domain=""):
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = in_elem or _elem(ctx)
        r, c = _rows_cols(s["elements"], 256 if ctx.provider == "cpu" else 1024)
        x = data((r, c), elem, 1)
        if op == "Pow":  # exponent 2 as in RMSNorm: a broadcast scalar
            inputs = {"a": (elem, x), "b": (elem, np.array(2.0, NP.get(elem, np.float32)))}
        else:
            inputs = {"a": (elem, x), "b": (elem, data((r, c), elem, 2))}
        nodes = [_node(op, ["a", "b"], [f"y{i}"], i, domain) for i in range(copies)]
        g = Graph(nodes, inputs, [(f"y{i}", out_elem or elem) for i in range(copies)], ms_domain=bool(domain))
        return _maybe_chain(g, "a", ctx) if (out_elem or elem) == elem else g
    return build


def where(s, copies, ctx: Ctx) -> Graph:
    elem = _elem(ctx)
    r, c = _rows_cols(s["elements"], 256)
    nodes = [_node("Where", ["c", "a", "b"], [f"y{i}"], i) for i in range(copies)]
    return _maybe_chain(Graph(nodes, {"c": (BOOL, data((r, c), BOOL)), "a": (elem, data((r, c), elem)),
                                      "b": (elem, data((r, c), elem, 3))}, [(f"y{i}", elem) for i in range(copies)]),
                        "a", ctx)


def cast(s, copies, ctx: Ctx) -> Graph:
    r, c = _rows_cols(s["elements"], 256)
    nodes = [_node("Cast", ["x"], [f"y{i}"], i, to=FLOAT) for i in range(copies)]
    return Graph(nodes, {"x": (INT64, data((r, c), INT64))}, [(f"y{i}", FLOAT) for i in range(copies)])


def norm(op, skip=False, bias=False, domain=""):
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = _elem(ctx)
        r, c = _rows_cols(s["elements"], ctx.row)
        inputs = {"x": (elem, data((r, c), elem))}
        if skip:
            inputs["skip"] = (elem, data((r, c), elem, 4))
        nodes, inits = [], []
        for i in range(copies):
            inits.append(tensor(f"g{i}", np.ones(c), elem))
            ins = ["x"] + (["skip"] if skip else []) + [f"g{i}"]
            if bias:
                inits.append(tensor(f"b{i}", np.zeros(c), elem))
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
            inits.append(tensor(f"b{i}", np.zeros(c), elem))
            nodes.append(_node(op, ["x", f"b{i}"], [f"y{i}"], i, "com.microsoft"))
        return _maybe_chain(Graph(nodes, {"x": (elem, data((r, c), elem))}, [(f"y{i}", elem) for i in range(copies)],
                                  inits, ms_domain=True), "x", ctx)
    return build


def softmax(s, copies, ctx):
    return unary("Softmax", row_wise=True, axis=-1)(s, copies, ctx)


def reduce(op):
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = _elem(ctx)
        r, c = _rows_cols(s["elements"], ctx.row)
        axes = tensor("axes", np.array([-1]), INT64)
        nodes = [_node(op, ["x", "axes"], [f"y{i}"], i, keepdims=1) for i in range(copies)]
        g = Graph(nodes, {"x": (elem, data((r, c), elem))}, [(f"y{i}", elem) for i in range(copies)], [axes],
                  opset=18)
        return g
    return build


def topk(s, copies, ctx: Ctx) -> Graph:
    elem = _elem(ctx)
    r, c = _rows_cols(s["elements"], 64)
    k = tensor("k", np.array([min(2, c)]), INT64)
    nodes = [_node("TopK", ["x", "k"], [f"v{i}", f"i{i}"], i, axis=-1) for i in range(copies)]
    outs = [o for i in range(copies) for o in ((f"v{i}", elem), (f"i{i}", INT64))]
    return Graph(nodes, {"x": (elem, data((r, c), elem))}, outs, [k])


def transpose(s, copies, ctx: Ctx) -> Graph:
    elem = _elem(ctx)
    # [a, b, c] -> [b, a, c] as in the attention head split ([seq, heads, dim] -> [heads, seq, dim])
    e = max(1, int(s["elements"]))
    d = min(e, 32)
    rest = max(1, e // d)
    h = min(rest, 4)
    a = max(1, rest // h)
    nodes = [_node("Transpose", ["x"], [f"y{i}"], i, perm=[1, 0, 2]) for i in range(copies)]
    g = Graph(nodes, {"x": (elem, data((a, h, d), elem))}, [(f"y{i}", elem) for i in range(copies)])
    return chained(g, "x", optimize=False) if ctx.form == "chain" else g  # ORT cancels Transpose pairs


def reshape_like(op):
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = _elem(ctx)
        r, c = _rows_cols(s["elements"], 256)
        inits, attrs_ins = [], []
        if op == "Reshape":
            inits.append(tensor("shape", np.array([r * c]), INT64))
            attrs_ins = ["shape"]
            x = data((r, c), elem)
            if ctx.form == "chain":  # alternate [r*c] <-> [r, c]
                inits.append(tensor("shape_back", np.array([r, c]), INT64))
                nodes = [_node(op, ["x", "shape" if i % 2 == 0 else "shape_back"], [f"y{i}"], i) for i in range(copies)]
                return chained(Graph(nodes, {"x": (elem, x)}, [(f"y{i}", elem) for i in range(copies)], inits), "x",
                               optimize=False)
        elif op == "Unsqueeze":
            inits.append(tensor("axes", np.array([0]), INT64))
            attrs_ins = ["axes"]
            x = data((r, c), elem)
            if ctx.form == "chain":  # Unsqueeze / Squeeze alternating (two views of the same cost)
                nodes = [_node("Unsqueeze" if i % 2 == 0 else "Squeeze", ["x", "axes"], [f"y{i}"], i)
                         for i in range(copies)]
                return chained(Graph(nodes, {"x": (elem, x)}, [(f"y{i}", elem) for i in range(copies)], inits), "x",
                               optimize=False)
        elif op == "Squeeze":
            inits.append(tensor("axes", np.array([0]), INT64))
            attrs_ins = ["axes"]
            x = data((1, r, c), elem)
            if ctx.form == "chain":
                nodes = [_node("Squeeze" if i % 2 == 0 else "Unsqueeze", ["x", "axes"], [f"y{i}"], i)
                         for i in range(copies)]
                return chained(Graph(nodes, {"x": (elem, x)}, [(f"y{i}", elem) for i in range(copies)], inits), "x",
                               optimize=False)
        elif op == "Identity":
            x = data((r, c), elem)
        nodes = [_node(op, ["x"] + attrs_ins, [f"y{i}"], i) for i in range(copies)]
        g = Graph(nodes, {"x": (elem, x)}, [(f"y{i}", elem) for i in range(copies)], inits)
        return chained(g, "x", optimize=False) if ctx.form == "chain" else g
    return build


def shape_op(s, copies, ctx: Ctx) -> Graph:
    rank = max(1, min(int(s["elements"]), 6))
    nodes = [_node("Shape", ["x"], [f"y{i}"], i) for i in range(copies)]
    return Graph(nodes, {"x": (FLOAT, data((1,) * (rank - 1) + (4,), FLOAT))}, [(f"y{i}", INT64) for i in range(copies)])


def concat(s, copies, ctx: Ctx) -> Graph:
    elem = _elem(ctx)
    r, c = _rows_cols(s["elements"], 256)
    if c >= 2:
        ins = {"a": (elem, data((r, c // 2), elem)), "b": (elem, data((r, c - c // 2), elem, 1))}
    else:
        ins = {"a": (elem, data((r, c), elem))}
    nodes = [_node("Concat", list(ins), [f"y{i}"], i, axis=-1) for i in range(copies)]
    return Graph(nodes, ins, [(f"y{i}", elem) for i in range(copies)])


def slice_op(s, copies, ctx: Ctx) -> Graph:
    elem = _elem(ctx)
    r, c = _rows_cols(s["elements"], 256)
    inits = [tensor("st", np.array([0]), INT64), tensor("en", np.array([c]), INT64), tensor("ax", np.array([-1]), INT64)]
    nodes = [_node("Slice", ["x", "st", "en", "ax"], [f"y{i}"], i) for i in range(copies)]
    return Graph(nodes, {"x": (elem, data((r, 2 * c), elem))}, [(f"y{i}", elem) for i in range(copies)], inits)


def split(s, copies, ctx: Ctx) -> Graph:
    elem = _elem(ctx)
    r, c = _rows_cols(s["elements"], 256)
    c = max(2, c - c % 2)
    nodes = [_node("Split", ["x"], [f"y{i}a", f"y{i}b"], i, axis=-1, num_outputs=2) for i in range(copies)]
    outs = [o for i in range(copies) for o in ((f"y{i}a", elem), (f"y{i}b", elem))]
    return Graph(nodes, {"x": (elem, data((r, c), elem))}, outs, opset=18)


def expand(s, copies, ctx: Ctx) -> Graph:
    elem = _elem(ctx)
    r, c = _rows_cols(s["elements"], 256)
    inits = [tensor("shape", np.array([r, c]), INT64)]
    nodes = [_node("Expand", ["x", "shape"], [f"y{i}"], i) for i in range(copies)]
    return Graph(nodes, {"x": (elem, data((1, c), elem))}, [(f"y{i}", elem) for i in range(copies)], inits)


def gather(s, copies, ctx: Ctx) -> Graph:
    """Embedding lookup: rows of a [V, H] table (own table per copy), H = min(elements, 1024)."""
    elem = _elem(ctx)
    e = max(1, int(s["elements"]))
    h = min(e, 1024)
    t = max(1, e // h)
    vocab = 4096
    idx = np.random.default_rng(5).integers(0, vocab, size=(1, t)).astype(np.int64)
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
    return _maybe_chain(Graph(nodes, {"x": (elem, data((src, c), elem)), "idx": (INT64, idx)},
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
    inits, nodes, ins = [], [], {"a": (elem, data((m, k), elem))}
    chain = ctx.form == "chain"
    for i in range(copies):
        kk, nn = (n, k) if chain and i % 2 else (k, n)  # chain: alternate W[k, n] and W[n, k]
        if ctx.provider == "cuda":  # no prepacking on CUDA: weights bound on the device (no 2 GB protobuf limit)
            ins[f"W{i}"] = (elem, (kk, nn))
        else:
            inits.append(tensor(f"W{i}", (uniform((kk, nn), i) - 0.5) * 0.05, elem))
        nodes.append(_node("MatMul", ["a", f"W{i}"], [f"y{i}"], i))
    return _maybe_chain(Graph(nodes, ins, [(f"y{i}", elem) for i in range(copies)], inits), "a", ctx)


def gemm(s, copies, ctx: Ctx, precision: str) -> Graph:
    elem = ELEM[precision]
    m, n, k = int(s["m"]), int(s["n"]), int(s["k"])
    inits, nodes = [], []
    chain = ctx.form == "chain"
    ins = {"a": (elem, data((m, k), elem))}
    for i in range(copies):
        kk, nn = (n, k) if chain and i % 2 else (k, n)  # chain: alternate W[n, k] and W[k, n]
        if ctx.provider == "cuda":  # as MatMul: weights bound on the device (one [151936, 12288] fp16 W is 3.7 GB,
            ins[f"W{i}"] = (elem, (nn, kk))  # past the 2 GiB protobuf limit: "Failed to serialize proto")
            ins[f"c{i}"] = (elem, (nn,))
        else:
            inits.append(tensor(f"W{i}", (uniform((nn, kk), i) - 0.5) * 0.05, elem))
            inits.append(tensor(f"c{i}", np.zeros(nn), elem))
        nodes.append(_node("Gemm", ["a", f"W{i}", f"c{i}"], [f"y{i}"], i, transB=1))
    return _maybe_chain(Graph(nodes, ins, [(f"y{i}", elem) for i in range(copies)], inits), "a", ctx)


def batched_matmul(s, copies, ctx: Ctx, precision: str, chain: bool = True) -> Graph:
    """[batch, m, k] @ [batch, k, n], both graph inputs; `chain=False`: independent copies on every provider.
    The copies share A: in the model A is the expert weights GatherND has just written, in cache while it fits
    (a private A per copy read 2-3x slower than the model below 8 MiB); above the last-level cache (32 MiB and
    up) the model's A comes from memory and the shared one under-reads it (296 vs 835 us at 1024 x 128 x 64)."""
    elem = ELEM[precision]
    b, m, n, k = int(s["batch"]), int(s["m"]), int(s["n"]), int(s["k"])
    ins = {"a": (elem, data((b, m, k), elem)), "b": (elem, data((b, k, n), elem, 1))}
    if ctx.form != "chain" or not chain:
        nodes = [_node("MatMul", ["a", "b"], [f"y{i}"], i) for i in range(copies)]
        return Graph(nodes, ins, [(f"y{i}", elem) for i in range(copies)])
    ins["b2"] = (elem, data((b, n, k), elem, 2))  # chain: alternate B[k, n] and B[n, k]
    nodes = [_node("MatMul", ["a", "b" if i % 2 == 0 else "b2"], [f"y{i}"], i) for i in range(copies)]
    return chained(Graph(nodes, ins, [(f"y{i}", elem) for i in range(copies)]), "a")


# MatMulNBits on ORT's CPU provider at accuracy_level 4: MLAS quantises the activations to int8 per block and runs an
# int8 dot product. 2048 -> 6144 at one row on this 2-core EPYC (2026-12-06, medians of 200): fp32 MatMul 957 us,
# int4 1 = 523 us at level 0 vs 127 at 4, int8 34.9 ms at level 0 (no fast kernel) vs 112 us at 4. The builder's CPU
# int4 models use level 4 too. The CUDA provider ignores the attribute.
NBITS_CPU_ATTRIBUTES = {"accuracy_level": 4}


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
                               K=k, N=n, bits=bits, block_size=block,
                               **(NBITS_CPU_ATTRIBUTES if ctx.provider == "cpu" else {})))
        return Graph(nodes, {"a": (elem, data((m, k), elem))}, [(f"y{i}", elem) for i in range(copies)], inits,
                     ms_domain=True)
    return build


def matmul_fp8(s, copies, ctx: Ctx) -> Graph:
    """com.microsoft.MatMulBlockQuantizedFp8Weight, weight-only (no a_scale, no bias): a [m, k] in the activation
    type @ B [n, k]^T, B float8e4m3fn and b_scale fp32 [n, ceil(k / block)], initializers per copy (as MatMulNBits)."""
    elem = ELEM[ctx.act]
    m, n, k, block = int(s["m"]), int(s["n"]), int(s["k"]), int(s["block"])
    kb = (k + block - 1) // block
    inits, nodes = [], []
    for i in range(copies):
        inits.append(Blob(f"B{i}", FP8, (n, k), i))
        inits.append(Blob(f"S{i}", FLOAT, (n, kb), i, 0.01))
        nodes.append(_node("MatMulBlockQuantizedFp8Weight", ["a", f"B{i}", f"S{i}"], [f"y{i}"], i, "com.microsoft",
                           block_size=block))
    return Graph(nodes, {"a": (elem, data((m, k), elem))}, [(f"y{i}", elem) for i in range(copies)], inits,
                 ms_domain=True)


def dequantize(qelem: int, precision: str):
    """DequantizeLinear of a weight initializer (per-tensor scale) to the activation type."""
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = ELEM[ctx.act]
        r, c = _rows_cols(s["elements"], 1024)
        inits, nodes = [], []
        for i in range(copies):
            inits.append(Blob(f"q{i}", qelem, (r, c), i))
            inits.append(tensor(f"s{i}", np.array(0.01), elem))
            nodes.append(_node("DequantizeLinear", [f"q{i}", f"s{i}"], [f"y{i}"], i))
        # a dummy data input keeps the graph's inputs non-empty (IO binding needs one)
        nodes_in = {"x": (elem, data((1, 1), elem))}
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
    cos = tensor("cos", np.random.default_rng(1).random((max_pos, d // 2), dtype=np.float32), elem)
    sin = tensor("sin", np.random.default_rng(2).random((max_pos, d // 2), dtype=np.float32), elem)
    pos = np.arange(t, dtype=np.int64).reshape(1, t)
    nodes = [_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], [f"y{i}"], i, "com.microsoft", num_heads=heads)
             for i in range(copies)]
    return _maybe_chain(Graph(nodes, {"x": (elem, data((1, t, heads * d), elem)), "pos": (INT64, pos)},
                              [(f"y{i}", elem) for i in range(copies)], [cos, sin], ms_domain=True), "x", ctx)


def gqa(precision: str, cache: str | None = None):
    """GroupQueryAttention: q_tokens new tokens attending kv_len cached + new tokens, batch 1; `cache` "int8": the
    quantised cache passes.kv_layout emits (int8 past/present, PER_CHANNEL fp32 scales [kv_heads, head_dim])."""
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = ELEM[precision]
        kv_elem = INT8 if cache == "int8" else elem
        d = ctx.head_dim
        h = int(s["heads"])
        kvh = max(1, h // GQA_GROUP)
        q = int(s["q_tokens"])
        total = max(int(s["kv_len"]), q)
        # shared past/present buffer of `total` positions (the genai builder's layout): present = past shape
        ins = {"query": (elem, data((1, q, h * d), elem)), "key": (elem, data((1, q, kvh * d), elem, 1)),
               "value": (elem, data((1, q, kvh * d), elem, 2)),
               "past_key": (kv_elem, data((1, kvh, total, d), kv_elem, 3)),
               "past_value": (kv_elem, data((1, kvh, total, d), kv_elem, 4))}
        names = ["query", "key", "value", "past_key", "past_value"]
        ins["seqlens_k"] = (INT32, np.array([total - 1], np.int32))
        ins["total_sequence_length"] = (INT32, np.array(total, np.int32))
        names += ["seqlens_k", "total_sequence_length"]
        attrs, inits = {}, []
        if cache:
            scale = np.full((kvh, d), 0.02, np.float32)  # the data's range / 127 (timing does not depend on it)
            inits = [tensor("k_scale", scale, FLOAT), tensor("v_scale", scale, FLOAT)]
            names += [""] * 5 + ["k_scale", "v_scale"]
            attrs = dict(k_quant_type=QUANT_TYPE, v_quant_type=QUANT_TYPE, kv_cache_bit_width=BITS[cache])
        nodes, outs, aliases = [], [], {}
        for i in range(copies):
            nodes.append(_node("GroupQueryAttention", names, [f"y{i}", f"pk{i}", f"pv{i}"], i, "com.microsoft",
                               num_heads=h, kv_num_heads=kvh, **attrs))
            outs += [(f"y{i}", elem), (f"pk{i}", kv_elem), (f"pv{i}", kv_elem)]
            # present bound to past, as a compiled artifact binds its shared buffer (kv_aliases): updated in place; two
            # buffers would time a copy of the whole cache too (2x at decode, 4096 positions, on the H200)
            aliases.update({f"pk{i}": "past_key", f"pv{i}": "past_value"})
        return Graph(nodes, ins, outs, inits, ms_domain=True, cpu_inputs=("total_sequence_length",), aliases=aliases)
    return build


def mha(precision: str):
    """MultiHeadAttention: q_tokens queries over kv_len keys/values (BSNH 3-D inputs), batch 1."""
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = ELEM[precision]
        d = ctx.head_dim
        h = int(s["heads"])
        q, kv = int(s["q_tokens"]), int(s["kv_len"])
        ins = {"query": (elem, data((1, q, h * d), elem)), "key": (elem, data((1, kv, h * d), elem, 1)),
               "value": (elem, data((1, kv, h * d), elem, 2))}
        nodes = [_node("MultiHeadAttention", ["query", "key", "value"], [f"y{i}"], i, "com.microsoft", num_heads=h)
                 for i in range(copies)]
        return Graph(nodes, ins, [(f"y{i}", elem) for i in range(copies)], ms_domain=True)
    return build


def _moe_widths(s) -> tuple[int, int, int, int, int]:
    """(tokens, experts, k, hidden, expert width I) of a MoE grid point; the `inter` axis is the summed width of
    one expert's matrices (timing.cost: fc1 2I + fc2 I for SwiGLU), so I = inter / 3."""
    t, e, k, h = int(s["tokens"]), int(s["experts"]), int(s["k"]), int(s["hidden"])
    return t, e, min(k, e), h, max(16, int(s["inter"]) // 3)


def moe(precision: str):
    """com.microsoft.MoE, SwiGLU experts interleaved (swiglu_fusion=1) as the fuse pass emits them: x [tokens,
    hidden] and random router logits [tokens, experts] (uniform routing: T tokens touch E(1-(1-k/E)^T) experts),
    each copy its own fc1 [E, 2I, H] and fc2 [E, H, I]."""
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = ELEM[precision]
        t, e, k, h, i_w = _moe_widths(s)
        inits, nodes = [], []
        for c in range(copies):
            inits += [Blob(f"fc1_{c}", elem, (e, 2 * i_w, h), c, 0.02), Blob(f"fc2_{c}", elem, (e, h, i_w), c, 0.02)]
            nodes.append(_node("MoE", ["x", "router", f"fc1_{c}", "", f"fc2_{c}"], [f"y{c}"], c, "com.microsoft",
                               k=k, **MOE_SWIGLU, normalize_routing_weights=1))
        ins = {"x": (elem, data((t, h), elem)), "router": (elem, data((t, e), elem, 1))}
        return Graph(nodes, ins, [(f"y{c}", elem) for c in range(copies)], inits, ms_domain=True)
    return build


def qmoe(bits: int, block: int = 128):
    """com.microsoft.QMoE (quant_type int): fc1/fc2 packed [E, N, K * bits / 8] uint8, block-wise scales
    [E, N, K / block] in the activation type, no zero points (the op's default 2^(bits-1)), raw layout
    (weights_prepacked=0, as quantize_matmul_{4,8}bits writes them); fp16 activations."""
    def build(s, copies, ctx: Ctx) -> Graph:
        elem = ELEM[ctx.act]
        t, e, k, h, i_w = _moe_widths(s)
        b = min(block, h, i_w)
        inits, nodes = [], []
        for c in range(copies):
            inits += [Blob(f"fc1_{c}", UINT8, (e, 2 * i_w, h * bits // 8), c),
                      Blob(f"s1_{c}", elem, (e, 2 * i_w, h // b), c, 0.01),
                      Blob(f"fc2_{c}", UINT8, (e, h, i_w * bits // 8), c),
                      Blob(f"s2_{c}", elem, (e, h, i_w // b), c, 0.01)]
            nodes.append(_node("QMoE", ["x", "router", f"fc1_{c}", f"s1_{c}", "", f"fc2_{c}", f"s2_{c}"], [f"y{c}"],
                               c, "com.microsoft", k=k, **MOE_SWIGLU, normalize_routing_weights=1,
                               expert_weight_bits=bits, block_size=b, weights_prepacked=0))
        ins = {"x": (elem, data((t, h), elem)), "router": (elem, data((t, e), elem, 1))}
        return Graph(nodes, ins, [(f"y{c}", elem) for c in range(copies)], inits, ms_domain=True)
    return build
