"""Read an ONNX file as a netlist. External data stays lazy: nothing is read to time a model."""
from __future__ import annotations

from pathlib import Path

import onnx_ir as ir

from softsyn.errors import SoftsynError
from softsyn.frontends import roles
from softsyn.netlist import NETLIST_META_KEY, Netlist, annotate_hierarchy


def _guess_kind(model: ir.Model) -> str:
    names = [v.name for v in model.graph.inputs]
    tokens = any("input_ids" in n or "inputs_embeds" in n for n in names)
    if any(roles.is_past_port(n) for n in names) and tokens:
        return "decoder"
    if tokens and roles.is_causal(model):
        return "causal"  # a decoder exported without a KV cache: one prefill group
    if any(n in ("input_ids", "pixel_values", "input_features") for n in names):
        return "encoder"
    return "generic"


def load_onnx(path: Path) -> Netlist:
    try:
        model = ir.load(str(path))
    except Exception as e:
        raise SoftsynError(f"{path}: cannot load ONNX model: {type(e).__name__}: {e}") from None
    found = roles.find_roles(model)
    roles.apply_roles(model, found.renames)
    if NETLIST_META_KEY not in model.metadata_props:
        annotate_hierarchy(model, prefix="")  # a plain export's scopes start at the model itself (no softsyn wrapper)
    nl = Netlist.from_model(model)
    stored = bool(nl.provenance)
    for role, expr in found.derived.items():
        nl.derived_dims.setdefault(role, expr)
    if not stored:
        nl.name = path.stem
        nl.kind = _guess_kind(model)
        nl.provenance = {"exporter": "onnx file", "weights": "from file"}
        producer = " ".join(x for x in (model.producer_name, model.producer_version) if x)
        if producer:
            nl.provenance["producer"] = producer
    if found.renames:
        nl.provenance["dims"] = dict(found.renames)  # exporter's name -> role
    nl.provenance["source"] = str(path)
    nl.provenance.setdefault("exporter", "onnx file")
    nl.provenance["file"] = str(path.resolve())
    return nl
