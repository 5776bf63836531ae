"""Materialise a weightless (meta-device) export: seeded random weights, then the exporter's optimizer.

A real-size model exported on the meta device has exact shapes and dtypes but no data. To run it
(signoff, benchmarks) its initializers get seeded random values, and the graph then goes through
`onnxscript.optimizer.optimize_ir`: the optimisation `torch.onnx.export(optimize=True)` applies to a
materialised export (it folds the weight Transposes, shape arithmetic and redundant Casts), which the
meta export had to skip because it cannot read meta tensors. The result has the graph a
materialised export has, in seconds instead of minutes: no torch model with weights is ever built.

Values: RMSNorm/LayerNorm weights 1 + N(0, initializer_range) (exact ones would be deduplicated across
layers and their Mul folded away by the optimizer, a graph no trained model has), rotary `inv_freq` the real 1 / theta^(2i/d) (so cos/sin are
right), every other float tensor N(0, initializer_range) drawn from one seeded pool (the pool is
sliced at an offset seeded by the tensor's name: tensors are random-looking, not independent draws; timing
does not care, and it keeps 16 GB of fp16 weights a memory-speed fill). `seeded_weights` is the one source of
these values: the HF folder that peers build from (`hf.write_seeded_folder`) holds the same weights.
"""
from __future__ import annotations

import contextlib
import hashlib

import ml_dtypes
import numpy as np
import onnx_ir as ir

from softsyn.netlist.keys import META_WEIGHTS
from softsyn.frontends.export import name_folded_weights

POOL = 1 << 24  # values in the seeded pool every float tensor is sliced from
# A filled export's provenance `weights` (verify reads a design again with materialize when it says so)
FILLED = "random seed 0 (filled into the weightless export, then optimised)"


def seed_pool(seed: int, std: float) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(POOL, dtype=np.float32) * std)


def _inv_freq(cfg, n: int) -> np.ndarray:
    """The rotary embedding's inverse frequencies (default rope): 1 / theta^(2i/d), i < d/2."""
    theta = float(getattr(cfg, "rope_theta", None) or (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta")
                  or 10000.0)
    d = 2 * n
    return 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)


def _offset(seed: int, name: str) -> int:
    """Where `name`'s values start in the pool: a function of the name alone, so a tensor's values do not depend
    on which other tensors the graph has or in which order (the HF-folder writer draws by parameter name too)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % POOL


def floating(dtype) -> bool:
    """Whether `dtype` is a float: numpy's and ml_dtypes' (bfloat16, the float8s), which numpy's issubdtype does not
    count as floating (a bf16 export's seeded weights were all zeros until 2026-12-07)."""
    try:
        ml_dtypes.finfo(dtype)
    except ValueError:
        return False
    return True


def cyclic(values: np.ndarray, n: int) -> np.ndarray:
    """np.resize(values, n) for a non-empty 1-D `values`: its values repeated to length n, by copies that double the
    filled prefix. np.resize concatenates ceil(n / len) references to `values`, which for the short pool tails some
    weights start at (an offset near the pool's end) took 12.4 of qwen3-1.7b's 57 s materialise (2-core VM,
    2026-12-07)."""
    out = np.empty(n, dtype=values.dtype)
    filled = min(len(values), n)
    out[:filled] = values[:filled]
    while filled < n:
        more = min(filled, n - filled)
        out[filled:filled + more] = out[:more]
        filled += more
    return out


def seeded_value(name: str, shape: tuple[int, ...], dtype, cfg, pool: np.ndarray, seed: int = 0,
                 typed: np.ndarray | None = None) -> np.ndarray:
    """The seeded random value of one weight, by its name (a torch parameter's fully qualified name). `typed`: the
    pool already cast to `dtype` (seeded_weights casts it once a dtype), the same values: casting commutes with
    tiling, and a weight is then one copy of its own bytes, not an fp32 copy cast again (qwen3-1.7b: 14.2 s of a
    58 s materialise on 2 cores, 2026-12-07)."""
    n = int(np.prod(shape, dtype=np.int64))
    if name.endswith("inv_freq") and len(shape) == 1:
        data = _inv_freq(cfg, n)
    elif "norm" in name and len(shape) == 1:  # 1 + noise: all-ones norms would be deduplicated and
        data = 1.0 + cyclic(pool[_offset(seed, name):], n)  # their Mul dropped by the optimizer, unlike a trained model's
    elif floating(dtype):
        source = typed if typed is not None and typed.dtype == np.dtype(dtype) else pool
        data = cyclic(source[_offset(seed, name):], n)  # cyclic past the pool's end
    else:
        data = np.zeros(n)
    return np.ascontiguousarray(data, dtype=dtype).reshape(shape)


def seeded_weights(model: ir.Model, cfg, seed: int = 0) -> dict[str, np.ndarray]:
    """The one source of seeded random weights: a value for every weightless (meta) initializer of an export,
    keyed by its name. `fill_random` puts them into the ONNX model; `softsyn.frontends.hf.write_seeded_folder`
    puts the same values into a Hugging Face folder (what peers such as onnxruntime-genai's builder read)."""
    pool = seed_pool(seed, float(getattr(cfg, "initializer_range", 0.02) or 0.02))
    typed: dict[np.dtype, np.ndarray] = {}  # the pool cast to each float dtype the weights have
    out = {}
    for v in model.graph.initializers.values():
        t = v.const_value
        if isinstance(t, ir.ExternalTensor) and t.location == META_WEIGHTS:
            dtype = np.dtype(v.dtype.numpy())
            if floating(dtype) and dtype not in typed:
                typed[dtype] = pool.astype(dtype)
            out[v.name] = seeded_value(v.name, tuple(int(d) for d in v.shape), dtype, cfg, pool, seed,
                                       typed=typed.get(dtype))
    return out


def fill_random(model: ir.Model, cfg, seed: int = 0) -> int:
    """Give every initializer without data (ExternalTensor of a meta export) its seeded value. Returns how many."""
    values = seeded_weights(model, cfg, seed)
    for name, data in values.items():
        model.graph.initializers[name].const_value = ir.Tensor(data, name=name)
    return len(values)


@contextlib.contextmanager
def anchored_multi_output_matching():
    """onnxscript's rewriter with multi-output patterns anchored before the graph scan; the same rewrites.

    onnxscript 0.7's SimplePatternMatcher.match, for a pattern with several output nodes, indexes every node of
    the graph by op type for each node it is asked about, before checking that the node could be the pattern's
    first output node at all. The default rules' one such pattern (SlicesSplit) made optimize_ir quadratic in the
    graph: 15.8 of its 18.3 s on qwen3-0.6b's 7,708-node export, 61 M node visits, for 0 rewrites. Every
    candidate combination the original tries starts with that node and fails on its op type or domain, so
    checking them first changes no result (qwen3-0.6b: byte-identical graph and weights, 3.8 s).
    Without the matcher internals (another onnxscript version) the rewriter runs unchanged."""
    try:
        # deferred: onnxscript's optimizer is slow to import; only materialising weights needs it
        from onnxscript.rewriter import _basics, _matcher
    except ImportError:
        _basics = _matcher = None
    original = getattr(getattr(_matcher, "SimplePatternMatcher", None), "match", None)
    if original is None or not hasattr(_basics, "MatchResult"):
        yield
        return

    def match(self, model, graph_or_function, node, **kwargs):
        pattern = self.pattern
        if not pattern.has_single_output_node:
            first = pattern.output_nodes[0]
            if not (first.op.matches(node.op_type) and first.domain.matches(node.domain)):
                return _basics.MatchResult().fail("node is not the pattern's first output node (op or domain)")
        return original(self, model, graph_or_function, node, **kwargs)

    _matcher.SimplePatternMatcher.match = match
    try:
        yield
    finally:
        _matcher.SimplePatternMatcher.match = original


def materialize(model: ir.Model, cfg, seed: int = 0) -> ir.Model:
    """fill_random + the exporter's optimizer, in place; weights the optimizer folded get their module names."""
    # deferred: onnxscript's optimizer is slow to import; only materialising weights needs it
    import onnxscript.optimizer

    fill_random(model, cfg, seed)
    with anchored_multi_output_matching():
        onnxscript.optimizer.optimize_ir(model)
    name_folded_weights(model)
    return model


# Peak resident memory of a materialised compile over the bytes of its weights: the filled export, the optimizer's
# folded copies, the serialised data file and the ONNX Runtime session that checks it loads. An estimate (measured
# 3.1 on qwen3-1.7b: docs/decisions/2026-12-01-real-size-compile.md).
MATERIALISE_FACTOR = 3.5


def available_memory() -> int | None:
    """Bytes of RAM this process can still take (Linux MemAvailable), None where it cannot be read."""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
