"""Dim roles: name an ONNX file's symbolic dims by what they are (batch, seq, past, height, ...).

Exporters name dims as they please: torch's dynamo exporter writes `s72`, `s70`; optimum and
onnxruntime-genai write `batch_size`, `sequence_length`, `past_sequence_length`. The workload
(`batch`, `prompt_len`, `context_len`) and the default path groups bind dims by role, so a file is
read with its dims renamed to their roles, found from the ports they appear in: dim 0 of a token or
image input is the batch, dim 1 of the token ids the sequence, the cached-token dim of a past KV input
the past, and a mask dim that is neither the attention total (past + seq); the mask's dims take these roles
even where the exporter named them apart from the token ids' (one name per role). What cannot be placed keeps
its name and is reported by the design, which then names the dim and the roles it needs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import onnx_ir as ir

TOKEN_PORTS = ("input_ids", "inputs_embeds", "token_type_ids", "position_ids", "attention_mask")
IMAGE_PORTS = ("pixel_values",)
AUDIO_PORTS = ("input_features", "input_values")
ROLES = ("batch", "seq", "past", "total", "height", "width", "frames")


@dataclass
class Roles:
    renames: dict[str, str] = field(default_factory=dict)  # exporter's dim name -> role
    derived: dict[str, str] = field(default_factory=dict)  # role -> expression of other roles
    unplaced: list[str] = field(default_factory=list)  # symbolic input dims no port explains


def _sym(d) -> str | None:
    return d.value if isinstance(d, ir.SymbolicDim) and d.value is not None else None


def is_past_port(name: str) -> bool:
    n = name.lower()
    return n.startswith("past") or ".past" in n or "past_key" in n or "past_value" in n or n.startswith("cache")


def find_roles(model: ir.Model) -> Roles:
    """The role of each symbolic dim of the graph inputs (names already roles stay as they are)."""
    roles = Roles()
    found: dict[str, str] = {}  # dim name -> role

    def place(dim: str | None, role: str) -> None:
        if dim is not None and dim not in found and role not in found.values():
            found[dim] = role

    inputs = list(model.graph.inputs)
    by_name = {v.name: v for v in inputs}
    for v in inputs:  # names that already say their role win
        for d in v.shape or ():
            s = _sym(d)
            if s in ROLES:
                found[s] = s
    for name in ("input_ids", "inputs_embeds", "position_ids", "token_type_ids"):
        v = by_name.get(name)
        if v is not None and v.shape is not None and len(v.shape) >= 2:
            place(_sym(v.shape[0]), "batch")
            place(_sym(v.shape[1]), "seq")
    for v in inputs:
        if v.shape is None:
            continue
        dims = [_sym(d) for d in v.shape]
        if is_past_port(v.name) and len(dims) == 4:
            place(dims[0], "batch")
            # [batch, kv_heads, past, head_dim] (HF, genai) or [batch, past, kv_heads, head_dim]
            for i in (2, 1):
                if dims[i] is not None and dims[i] != found.get("batch"):
                    place(dims[i], "past")
                    break
        elif v.name in IMAGE_PORTS and len(dims) == 4:
            place(dims[0], "batch")
            place(dims[2], "height")
            place(dims[3], "width")
        elif v.name in AUDIO_PORTS and len(dims) == 3:
            place(dims[0], "batch")
            place(dims[2], "frames")
    mask = by_name.get("attention_mask")
    if mask is not None and mask.shape is not None and len(mask.shape) >= 2:
        # the mask's rows are the batch and, without a cache, its keys the new tokens, even where the exporter gave
        # them names of their own (dynamic_shapes with Dim.DYNAMIC per input): one name, or probes feed mismatches
        b = _sym(mask.shape[0])
        if b is not None and b not in found:
            found[b] = "batch"
        m = _sym(mask.shape[-1])
        if m is not None and m not in found:
            if "past" in found.values():
                found[m] = "total"
                roles.derived["total"] = "past + seq"
            else:
                found[m] = "seq"
    roles.renames = {k: r for k, r in found.items() if k != r}
    for v in inputs:
        for d in v.shape or ():
            s = _sym(d)
            if s is not None and s not in found and s not in roles.unplaced and re.fullmatch(r"\w+", s):
                roles.unplaced.append(s)
    return roles


def _rename_expr(expr: str, renames: dict[str, str]) -> str:
    return re.sub(r"\b\w+\b", lambda m: renames.get(m.group(0), m.group(0)), expr)


def apply_roles(model: ir.Model, renames: dict[str, str]) -> int:
    """Rename symbolic dims in every value's shape (inputs, outputs, node outputs); returns values changed."""
    if not renames:
        return 0
    changed = 0
    seen: set[int] = set()

    def fix(v: ir.Value | None) -> None:
        nonlocal changed
        if v is None or id(v) in seen or v.shape is None:
            return
        seen.add(id(v))
        dims = []
        hit = False
        for d in v.shape:
            s = _sym(d)
            if s is not None:
                new = _rename_expr(s, renames)
                if new != s:
                    d, hit = ir.SymbolicDim(new), True
            dims.append(d)
        if hit:
            v.shape = ir.Shape(dims)
            changed += 1

    for v in model.graph.inputs:
        fix(v)
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for v in node.outputs:
            fix(v)
    for v in model.graph.outputs:
        fix(v)
    return changed


CAUSAL_COMPARE = {"Less", "LessOrEqual", "Greater", "GreaterOrEqual"}


def is_causal(model: ir.Model) -> bool:
    """A causal (decoder) self-attention mask in the graph: a Trilu, a comparison of two position indices that
    both derive from Ranges (how torch exports `kv_idx <= q_idx`, also through transformers' vmapped mask
    functions), or an attention op's causal attribute. A padding mask compares a Range with a constant."""
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.op_type == "Trilu":
            return True
        if node.op_type in ("Attention", "MultiHeadAttention") and node.attributes.get("is_causal") is not None:
            if node.attributes["is_causal"].value:
                return True
        if node.op_type in CAUSAL_COMPARE and all(_from_range(x) for x in node.inputs):
            return True
    return False


def _from_range(v: ir.Value | None, depth: int = 8, budget: int = 64) -> bool:
    """Whether `v` derives from a Range (a position index) within `depth` producers (at most `budget` visited)."""
    frontier = [(v, 0)]
    seen: set[int] = set()
    while frontier and len(seen) < budget:
        x, d = frontier.pop()
        p = x.producer() if x is not None else None
        if p is None or id(p) in seen:
            continue
        seen.add(id(p))
        if p.op_type == "Range":
            return True
        if d < depth:
            frontier.extend((i, d + 1) for i in p.inputs if i is not None)
    return False
