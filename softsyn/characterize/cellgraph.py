"""The cell graph: what a recipe builds (Graph, under a Ctx), its random data and weights, and its ONNX model.

A `Graph` holds `copies` instances of one op with their graph inputs (numpy arrays, or shapes for device-only
data), outputs and initializers; `chained` and `intermediates` turn a graph of independent copies into the
forms the CPU plan measures. Random inputs (`data`) and weights (`Blob`, drawn only when the model is made)
are memoised, so a point's one-copy and N-copy graphs share their arrays.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
from onnx import helper, numpy_helper

from softsyn.runtime.session import IR_VERSION, OPSET, external_initializer

FLOAT, UINT8, INT8, INT32, INT64, BOOL, FP16, DOUBLE, BF16, FP8 = 1, 2, 3, 6, 7, 9, 10, 11, 16, 17
ELEM = {"fp32": FLOAT, "fp16": FP16, "bf16": BF16, "fp64": DOUBLE}
NP = {FLOAT: np.float32, FP16: np.float16, DOUBLE: np.float64, INT64: np.int64, INT32: np.int32, BOOL: np.bool_,
      UINT8: np.uint8, INT8: np.int8}
BLOB_NP = {**NP, BF16: np.uint16}  # a weight's host array: bf16 as its bits (numpy has no bf16)


@dataclass
class Ctx:
    provider: str  # "cpu" | "cuda"
    row: int  # row length of row-wise ops
    head_dim: int  # head_dim of the attention / rotary cells
    act: str  # activation precision of weight-only cells (fp32 on CPU, fp16 on CUDA)
    precision: str = "fp32"  # the precision of the cell being built
    form: str = "copies"  # "chain" (the CPU plan): copy i consumes copy i-1's output where the op allows it
    cuda_graph: bool = False  # time the cell graphs as CUDA graph replays (kernel time inside a captured graph)


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
    # output -> the input whose buffer it is bound to: a cache the kernel updates in place, as an artifact's shared
    # KV buffer is bound (GroupQueryAttention copies past into present when they are two buffers)
    aliases: dict = field(default_factory=dict)


def _rng(seed=0):
    return np.random.default_rng(seed)


TILE = 1 << 20  # big random arrays repeat a random block of this many values: timing does not care, and
# drawing GBs of weights (MatMulNBits at n = 151936, k = 12288) would dominate a cell's time


def _tiled(draw: Callable[[int], np.ndarray], shape) -> np.ndarray:
    """An independent draw up to TILE values, a tiled random block beyond."""
    n = math.prod(shape)
    return np.resize(draw(min(n, TILE)), n).reshape(shape)


def uniform(shape, seed=0) -> np.ndarray:
    """float32 in [0, 1)."""
    return _tiled(lambda k: _rng(seed).random(k, dtype=np.float32), shape)


def _bytes(shape, seed=0) -> np.ndarray:
    return _tiled(lambda k: _rng(seed).integers(0, 256, k, dtype=np.uint8), shape)


def data(shape, elem, seed=0):
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
    return (uniform(shape, seed) - 0.5).astype(NP[elem])


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
        return math.prod(self.shape) * np.dtype(BLOB_NP.get(self.elem, np.uint8)).itemsize


@functools.lru_cache(maxsize=8)
def blob_array(elem: int, shape: tuple, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    """A Blob's contents (read-only: handed out again for the same arguments). FP8: the e4m3fn bit pattern of 1.0;
    bf16: the top 16 bits of the fp32 draw, as uint16 (what a bf16 initializer's raw data and
    ortvalue_from_numpy_with_onnx_type take; numpy has no bf16, and the MoE.bf16 recipe's experts failed on it)."""
    if elem == FP8:
        return np.full(shape, 0x38, np.uint8)
    if elem == BF16:
        return ((uniform(shape, seed) * scale).view(np.uint32) >> 16).astype(np.uint16)
    if elem in (UINT8, INT8):
        return _bytes(shape, seed).view(NP[elem])
    return (uniform(shape, seed) * scale).astype(NP[elem])


def _blob_tensor(b: Blob, external: dict | None):
    if external is None:
        arr = blob_array(b.elem, b.shape, b.seed, b.scale)
        if b.elem in NP:
            return tensor(b.name, arr, b.elem)
        return helper.make_tensor(b.name, b.elem, b.shape, arr.tobytes(), raw=True)
    external[b.name] = (b.elem, blob_array(b.elem, b.shape, 0, b.scale))  # one array for every copy
    return external_initializer(b.name, b.elem, b.shape, b.nbytes, "shared-weights")


def tensor(name, array, elem):
    """An initializer `name` holding `array` as element type `elem` (bf16: the top 16 bits of fp32; numpy has none)."""
    if elem == BF16:
        bits = (np.asarray(array, np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return helper.make_tensor(name, BF16, array.shape, bits.tobytes(), raw=True)
    return numpy_helper.from_array(np.asarray(array).astype(NP[elem]), name)


def make_model(g: Graph, external: dict | None = None):
    """The graph's ONNX model. `external`: a dict that receives name -> (elem, array) for every Blob, which the model
    then references as external data (the session adds the arrays: softsyn.runtime.session.open_session)."""
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
    return replace(g, nodes=nodes, outputs=outs, optimize=optimize, form="chain",
                   aliases={o: i for o, i in g.aliases.items() if o == last})


def intermediates(g: Graph) -> Graph:
    """The INTERMEDIATES form of a copies graph (ops whose output cannot feed their input): only the last node's
    outputs stay graph outputs, the others are intermediates ORT's arena allocates and frees on every run, as a
    model's are. Independent copies writing N preallocated bound outputs skip that: on the CPU they read 0.05-0.12
    us/node under the same op in qwen3-moe-tiny (Concat 0.25 vs 0.34 us, Slice 0.23 vs 0.35, Shape 0.10 vs 0.15).
    The session runs without graph rewrites: they would merge the identical copies (common subexpressions)."""
    last = set(g.nodes[-1].output)
    outs = [(n, e) for n, e in g.outputs if n in last]
    return replace(g, outputs=outs, optimize=False, form="intermediates",
                   aliases={o: i for o, i in g.aliases.items() if o in last})
