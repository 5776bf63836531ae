"""Read an ONNX file as a netlist. External data stays lazy: nothing is read to time a model."""
from __future__ import annotations

from pathlib import Path

import onnx_ir as ir

from softsyn.errors import SoftsynError
from softsyn.netlist import Netlist


def _guess_kind(model: ir.Model) -> str:
    names = [v.name for v in model.graph.inputs]
    if any("past" in n for n in names) and any("input_ids" in n or "inputs_embeds" in n for n in names):
        return "decoder"
    if any(n in ("input_ids", "pixel_values", "input_features") for n in names):
        return "encoder"
    return "generic"


def load_onnx(path: Path) -> Netlist:
    try:
        model = ir.load(str(path))
    except Exception as e:
        raise SoftsynError(f"{path}: cannot load ONNX model: {type(e).__name__}: {e}") from None
    nl = Netlist.from_model(model)
    stored = bool(nl.provenance)
    if not stored:
        nl.name = path.stem
        nl.kind = _guess_kind(model)
        nl.provenance = {"exporter": "onnx file", "weights": "from file"}
        producer = " ".join(x for x in (model.producer_name, model.producer_version) if x)
        if producer:
            nl.provenance["producer"] = producer
    nl.provenance["source"] = str(path)
    nl.provenance.setdefault("exporter", "onnx file")
    nl.provenance["file"] = str(path.resolve())
    return nl
