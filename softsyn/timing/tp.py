"""Tensor parallelism: the Megatron partition of a decoder netlist over N devices, timed and sized per device.

`partition(netlist, n, shapes)` walks the cells in execution order and gives every tensor the share of it
one device holds (1: replicated) and every cell the share of its work one device does:

* a weight MatMul/Gemm/MatMulNBits fed a replicated activation is **column**-parallel (its output columns
  split: q/gate/up 1/N; k/v at ceil(kv_heads/N) heads of kv_heads, KV heads replicated when kv_heads < N;
  a packed QKV by its parts); fed a split one it is **row**-parallel (its input rows split, its output a
  partial sum); a MoE router (n = experts) stays replicated;
* expert weights ([experts, ...]) are split by expert (expert parallel): the cells that read them do 1/N;
* the embedding table and the lm_head are **vocab**-parallel (V/N rows each);
* attention runs heads/N query heads and ceil(kv_heads/N) KV heads per device, the past KV likewise;
* any other cell takes the share of its largest activation input.

Collectives are where Megatron puts them: an **AllReduce** where a split or partial value meets the residual
stream (two per layer: after attention's o_proj and after the MLP / experts) and after the vocab-parallel
embedding, an **AllGather** of the split logits at the output. Their delays come from a collective library
(softsyn.library.collectives; alpha-beta estimates until measured). N must divide the query heads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import onnx_ir as ir

from softsyn.errors import SoftsynError
from softsyn.netlist import Netlist
from softsyn.timing.area import WEIGHT_BYTES, kv_cache_inputs
from softsyn.timing.cost import ATTENTION_OPS, FP8_MATMUL, MOE_OPS, Work, numel, shape_of

WEIGHT_MATMULS = ("MatMul", "Gemm", "MatMulNBits", "FusedMatMul", FP8_MATMUL)
RESIDUAL_JOINS = ("Add", "SkipSimplifiedLayerNormalization", "SkipLayerNormalization")
SKIP_SUM_OUTPUT = 3  # Skip*LayerNormalization's input + skip output: the residual stream after the join
LOAD_TIME_OPS = ("Transpose", "Cast", "Reshape", "Identity", "DequantizeLinear", "Unsqueeze", "Squeeze")
KV_OUTPUT_PREFIXES = ("present",)  # decoder outputs that stay on their device (the per-device KV cache)


class TPError(SoftsynError):
    """An invalid tensor-parallel degree for this netlist (exit 2)."""


@dataclass
class Partition:
    """One device's part of the netlist under tensor parallelism of degree `n`."""

    n: int
    heads: int
    kv_heads: int
    kv_per_device: int  # ceil(kv_heads / n): a KV head is replicated on n / kv_heads devices when kv_heads < n
    experts: int
    share: dict[str, float] = field(default_factory=dict)  # tensor name -> the part one device holds
    cell: dict = field(default_factory=dict)  # node -> the part of its work one device does
    role: dict = field(default_factory=dict)  # node -> column | row | vocab | expert | router | attention
    collectives: dict = field(default_factory=dict)  # node -> [(op, value moved)] right after it
    partial: set = field(default_factory=set)  # tensor names that are partial sums (after a row-parallel cell)
    weights: str | None = None  # what-if: weight matmuls timed and sized as MatMulNBits at this precision (est)
    weight_elems: dict = field(default_factory=dict)  # weight matmul node -> (its weight's elements, itemsize)
    recast: dict = field(default_factory=dict)  # weight tensor name -> `weights` (softsyn.timing.area.weight_items)

    @property
    def kv_share(self) -> float:
        return self.kv_per_device / self.kv_heads

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for role in self.role.values():
            out[role] = out.get(role, 0) + 1
        for moves in self.collectives.values():
            for op, _ in moves:
                out[op] = out.get(op, 0) + 1
        return out

    def describe(self) -> str:
        if self.n == 1:
            return f"TP=1: one device holds all {self.heads} query heads, {self.kv_heads} KV heads" + (
                f" and {self.experts} experts" if self.experts else "") + "; no collectives"
        c = self.counts()
        kv = (f"{self.kv_per_device} of {self.kv_heads} KV heads per device"
              + (f" (each replicated on {self.n // self.kv_heads} devices)" if self.kv_heads < self.n else ""))
        parts = [f"TP={self.n}: {self.heads // self.n} of {self.heads} query heads and {kv}",
                 f"{c.get('column', 0)} column-parallel and {c.get('row', 0)} row-parallel weight cells",
                 f"{c.get('vocab', 0)} vocab-parallel (embedding, lm_head)"]
        if self.experts:
            parts.append(f"{c.get('expert', 0)} expert-parallel cells ({math.ceil(self.experts / self.n)} of "
                         f"{self.experts} experts per device)")
        parts.append(f"{c.get('AllReduce', 0)} AllReduce and {c.get('AllGather', 0)} AllGather per step")
        return "; ".join(parts)

    def kind(self, node: ir.Node, precision: str) -> tuple[str, str]:
        """The (op, precision) a cell is looked up as: a weight matmul as MatMulNBits under the `weights` what-if."""
        if self.weights and node in self.weight_elems:
            return "MatMulNBits", self.weights
        return node.op_type, precision

    def shard(self, node: ir.Node, work: Work) -> Work:
        """`work` of the whole cell -> one device's: FLOPs and bytes by the cell's share, its table sizes at the
        per-device shape (heads/N, intermediate/N ...); under the `weights` what-if a weight matmul reads its
        weight at MatMulNBits' bytes per parameter (block 32)."""
        part = self.cell.get(node, 1.0)
        if self.weights and node in self.weight_elems:
            elems, itemsize = self.weight_elems[node]
            work = Work(work.flops, work.bytes - elems * (itemsize - WEIGHT_BYTES[self.weights]),
                        {**work.sizes, "block": 32})
        if part == 1.0:
            return work
        sizes = dict(work.sizes)
        role = self.role.get(node)
        if role in ("column", "vocab") and "n" in sizes:
            sizes["n"] = max(1, round(sizes["n"] * part))
        elif role == "row" and "k" in sizes:
            sizes["k"] = max(1, round(sizes["k"] * part))
        elif role == "attention":
            sizes["heads"] = max(1, sizes.get("heads", self.heads) // self.n)
            sizes["kv_heads"] = self.kv_per_device
        elif node.op_type in MOE_OPS and "experts" in sizes:
            sizes["experts"] = max(1, math.ceil(sizes["experts"] / self.n))
        else:
            for key in ("elements", "batch", "tokens"):
                if key in sizes:
                    sizes[key] = max(1, round(sizes[key] * part))
                    break
        return Work(work.flops * part, work.bytes * part, sizes)


def head_counts(netlist: Netlist) -> tuple[int, int, int]:
    """(query heads, KV heads, experts): from GroupQueryAttention's attributes, else the model's config."""
    for node in netlist.nodes():
        if node.op_type == "GroupQueryAttention":
            heads = node.attributes.get_int("num_heads", 0)
            return heads, node.attributes.get_int("kv_num_heads", heads), int((netlist.config or {}).get("num_experts") or 0)
    cfg = netlist.config or {}
    heads = cfg.get("num_attention_heads")
    if not heads:
        raise TPError(f"{netlist.name}: tensor parallelism needs the attention head count, and this netlist has no "
                      "GroupQueryAttention node and no model config (num_attention_heads); give a Hugging Face "
                      "model, config.json or zoo name, or a fused ONNX file")
    return int(heads), int(cfg.get("num_kv_heads") or heads), int(cfg.get("num_experts") or 0)


def valid_degrees(heads: int, devices: int) -> list[int]:
    return [n for n in range(1, devices + 1) if heads % n == 0]


def check_degree(netlist: Netlist, n: int, devices: int) -> tuple[int, int, int]:
    heads, kv_heads, experts = head_counts(netlist)
    if n < 1 or heads % n:
        raise TPError(f"tensor parallel degree {n} does not divide the {heads} attention heads of {netlist.name}; "
                      f"valid: {', '.join(map(str, valid_degrees(heads, max(devices, n))))}")
    return heads, kv_heads, experts


def weight_roots(value: ir.Value | None) -> list[ir.Value]:
    """The initializers a value is computed from when only load-time ops (a weight's Transpose, Cast, ...) lie
    between (the runtime folds those when it loads); [] when an activation is among them."""
    if value is None:
        return []
    if value.is_initializer():
        return [value]
    producer = value.producer()
    if producer is None or producer.op_type not in LOAD_TIME_OPS:
        return []
    roots = [r for v in producer.inputs if v is not None for r in (weight_roots(v) or [None])]
    return [] if not roots or None in roots else roots


def weight_shape(value: ir.Value) -> tuple | None:
    """A weight's shape; where the exporter left a load-time Transpose's out, its input's, permuted."""
    if value.shape is not None:
        return tuple(value.shape)
    producer = value.producer()
    if producer is not None and producer.op_type == "Transpose" and producer.inputs[0] is not None:
        inner = weight_shape(producer.inputs[0])
        perm = producer.attributes.get_ints("perm", None)
        if inner is not None:
            return tuple(inner[i] for i in perm) if perm else tuple(reversed(inner))
    if producer is not None and producer.op_type in ("Cast", "Identity") and producer.inputs[0] is not None:
        return weight_shape(producer.inputs[0])
    return None


def _weight(node: ir.Node) -> tuple | None:
    """The shape of a weight matmul's weight (an initializer, or one through load-time ops), else None."""
    if node.op_type not in WEIGHT_MATMULS or len(node.inputs) < 2 or node.inputs[1] is None:
        return None
    w = node.inputs[1]
    shape = weight_shape(w) if weight_roots(w) else None
    if shape is None or (node.op_type != "MatMulNBits" and len(shape) != 2):
        return None
    return shape


def _is_embedding(node: ir.Node, vocab: int | None) -> bool:
    """A token-embedding lookup: a 2-D table (of the config's vocab rows where it gives one) gathered by ids
    that come from a graph input."""
    table, ids = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    if table is None or ids is None or not table.is_initializer() or len(table.shape or ()) != 2:
        return False
    if vocab:
        return table.shape[0] == vocab
    return ids.is_graph_input() or (ids.producer() is not None and any(
        v is not None and v.is_graph_input() for v in ids.producer().inputs))


def _share_weights(node: ir.Node, part: float, share: dict[str, float]) -> None:
    """A weight matmul's weights (and the load-time values between them and it) are held `part` per device."""
    for x in node.inputs[1:]:
        for root in weight_roots(x):
            share[root.name] = part
        if x is not None and not x.is_initializer() and weight_roots(x):
            share[x.name] = part


def _out_width(node: ir.Node, shape: tuple) -> int:
    if node.op_type == "MatMulNBits":
        return node.attributes.get_int("N", 0)
    if (node.op_type == "Gemm" and node.attributes.get_int("transB", 0)) or node.op_type == FP8_MATMUL:
        return int(shape[0])  # B laid out [N, K]
    return int(shape[-1])


def _column_share(width: int, p: Partition, head_dim: int | None) -> float:
    """The part of a column-parallel output one device computes: KV projections keep ceil(kv/N) heads."""
    if head_dim:
        h, kv = p.heads * head_dim, p.kv_heads * head_dim
        if width == kv and kv != h:
            return p.kv_share
        if width == h + 2 * kv and kv != h:
            return (h / p.n + 2 * p.kv_per_device * head_dim) / width
    return 1.0 / p.n


def partition(netlist: Netlist, n: int, shapes: dict, devices: int = 8, weights: str | None = None) -> Partition:
    """The Megatron partition of `netlist` over `n` devices (module docstring); `shapes`: one scenario's bound
    shapes, to tell a cell's largest input; `weights`: the int8/int4 what-if (Partition.weights)."""
    heads, kv_heads, experts = check_degree(netlist, n, devices)
    p = Partition(n, heads, kv_heads, math.ceil(kv_heads / n), experts, weights=weights)
    if n == 1 and not weights:
        return p
    config = netlist.config or {}
    walk = _Walk(p=p, shapes=shapes, head_dim=config.get("head_dim"), vocab=config.get("vocab_size"))
    for v in kv_cache_inputs(netlist):
        p.share[v.name] = p.kv_share
    for node in netlist.nodes():
        _place(walk, node)
    inputs = {v.name for v in netlist.model.graph.inputs}
    for port in netlist.model.graph.outputs:
        if port.name.startswith(KV_OUTPUT_PREFIXES) or port.name in inputs:
            continue
        producer = port.producer()
        if n > 1 and producer is not None and p.share.get(port.name, 1.0) < 1.0:
            p.collectives.setdefault(producer, []).append(("AllGather", port))
    return p


@dataclass
class _Walk:
    """partition's walk over the cells in execution order: the partition it fills, and the residual stream's values
    (the embedding's output and what the residual joins make: where a split value is reduced)."""

    p: Partition
    shapes: dict
    head_dim: int | None
    vocab: int | None
    residual: set = field(default_factory=set)


def _place(walk: _Walk, node: ir.Node) -> None:
    """The first of the placements below that takes the cell places it."""
    # activations: float (or untyped: exporters leave some dtypes out) values not computed from weights alone
    acts = [v for v in node.inputs if v is not None and not v.is_initializer()
            and (v.dtype is None or v.dtype.is_floating_point()) and not weight_roots(v)]
    split = [v for v in acts if walk.p.share.get(v.name, 1.0) < 1.0 or v.name in walk.p.partial]
    if not (_embedding(walk, node) or _residual_join(walk, node, acts, split) or _weighted(walk, node, acts)
            or _expert_cell(walk, node) or _attention_cell(walk, node, split)):
        _follower(walk, node, acts, split)


def _embedding(walk: _Walk, node: ir.Node) -> bool:
    """The token embedding: vocab-parallel, then summed."""
    p = walk.p
    if node.op_type != "Gather" or not _is_embedding(node, walk.vocab):
        return False
    p.share[node.inputs[0].name] = 1.0 / p.n
    p.role[node] = "vocab"
    if p.n > 1:
        p.collectives[node] = [("AllReduce", node.outputs[0])]
    walk.residual.add(node.outputs[0].name)
    return True


def _residual_join(walk: _Walk, node: ir.Node, acts: list, split: list) -> bool:
    """A residual join a split value reaches: the value is all-reduced after its producer."""
    op = node.op_type
    if op not in RESIDUAL_JOINS or not split or not any(v.name in walk.residual for v in acts):
        return False
    for v in split:
        producer = v.producer()
        if producer is not None:
            walk.p.collectives.setdefault(producer, []).append(("AllReduce", v))
    outs = [node.outputs[0]] if op == "Add" else [o for i, o in enumerate(node.outputs) if i == SKIP_SUM_OUTPUT]
    walk.residual.update(o.name for o in outs if o is not None)
    return True


def _weighted(walk: _Walk, node: ir.Node, acts: list) -> bool:
    """A cell with a weight: row-parallel on split rows, else the router, or column-parallel (vocab: the logits)."""
    p, share = walk.p, walk.p.share
    w = _weight(node)
    if w is None or not acts:
        return False
    a = acts[0]
    roots = weight_roots(node.inputs[1])
    if p.weights and node.op_type in ("MatMul", "Gemm") and all(r.dtype.is_floating_point() for r in roots):
        p.weight_elems[node] = (numel(w), roots[0].dtype.itemsize)
        p.recast.update((r.name, p.weights) for r in roots)
    if a.name in p.partial or share.get(a.name, 1.0) < 1.0:  # row-parallel: input rows split
        part = share.get(a.name, 1.0)
        p.role[node], p.cell[node] = "row", part
        _share_weights(node, part, share)
        p.partial.add(node.outputs[0].name)
        return True
    width = _out_width(node, w)
    if p.experts and width == p.experts:
        p.role[node] = "router"
        return True
    part = _column_share(width, p, walk.head_dim)
    is_logits = any(o.is_graph_output() for o in node.outputs)
    p.role[node], p.cell[node] = ("vocab" if is_logits else "column"), part
    _share_weights(node, part, share)
    share[node.outputs[0].name] = part
    return True


def _expert_cell(walk: _Walk, node: ir.Node) -> bool:
    """A cell of stacked expert weights (or an MoE op): expert-parallel, 1/n of the experts each."""
    p, share, experts = walk.p, walk.p.share, walk.p.experts
    expert_weights = [v for v in node.inputs if v is not None and experts and weight_roots(v)
                      and len(weight_shape(v) or ()) >= 3 and weight_shape(v)[0] == experts]
    if not ((expert_weights and node.op_type not in LOAD_TIME_OPS) or node.op_type in MOE_OPS):
        return False
    for v in expert_weights:
        share[v.name] = 1.0 / p.n
        share.update((r.name, 1.0 / p.n) for r in weight_roots(v))
        if p.weights:  # sized at the what-if precision; expert cells keep their kernels' timing
            p.recast.update((r.name, p.weights) for r in weight_roots(v) if r.dtype.is_floating_point())
    p.role[node], p.cell[node] = "expert", 1.0 / p.n
    for o in node.outputs:
        if o is not None:
            share[o.name] = 1.0 / p.n
    return True


def _attention_cell(walk: _Walk, node: ir.Node, split: list) -> bool:
    """An attention op on split heads: 1/n of the heads, its present KV at the KV share."""
    p = walk.p
    if node.op_type not in ATTENTION_OPS or not split:
        return False
    p.role[node], p.cell[node] = "attention", 1.0 / p.n
    for i, o in enumerate(node.outputs):
        if o is not None:
            p.share[o.name] = 1.0 / p.n if i == 0 else p.kv_share
    return True


def _follower(walk: _Walk, node: ir.Node, acts: list, split: list) -> None:
    """Any other cell: at the share of its largest split input (none: whole; a partial sum's layout ops stay
    partial)."""
    p, share = walk.p, walk.p.share
    if not split:
        if any(v.name in walk.residual for v in acts) and node.op_type in ("Cast", "Identity"):
            walk.residual.update(o.name for o in node.outputs if o is not None)
        return
    big = max(split, key=lambda v: (numel(shape_of(v, walk.shapes)), -share.get(v.name, 1.0)))
    if big.name in p.partial:  # layout ops between a row-parallel cell and its reduction
        p.partial.update(o.name for o in node.outputs if o is not None)
        return
    part = share.get(big.name, 1.0)
    p.cell[node] = part
    for o in node.outputs:
        if o is not None:
            share[o.name] = part


def collective_bytes(value: ir.Value, shapes: dict) -> float:
    """The whole buffer a collective moves: the value at its full (unsplit) bound shape."""
    size = numel(shape_of(value, shapes))
    return float(size * (value.dtype.itemsize if value.dtype is not None else 2))


@dataclass
class TPSettings:
    """Tensor parallelism asked for: the degree (None: a plan over every valid degree, analysed at N=1) and
    the most devices the plan may use."""

    tensor: int | None = None
    devices: int = 8
    collectives: str = "h200-nccl"

    def with_tensor(self, n: int) -> "TPSettings":
        return replace(self, tensor=n)
