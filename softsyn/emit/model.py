"""DIR/model.onnx (+ model.onnx.data): the compiled netlist saved, checked by onnx.checker (path form) and loaded by
ONNX Runtime with the target's providers; a composite writes one model per block.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from softsyn.errors import SoftsynDefect, SoftsynError
from softsyn.flow.cpu_view import cpu_view_session
from softsyn.frontends.cache import design_provenance
from softsyn.frontends.vlm import split_blocks
from softsyn.netlist import NETLIST_META_KEY
from softsyn.runtime.session import IR_VERSION, SessionSettings, open_session, provider_of, provider_opens

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
ORT_DOMAIN = "com.microsoft"


def require_weights(netlist) -> None:
    """A compiled model needs real weights (SoftsynError for a weightless export)."""
    if str(netlist.provenance.get("weights", "")).startswith("meta"):
        raise SoftsynError(f"design {netlist.name}: weights are not materialised ({netlist.provenance['weights']}); "
                           "a compiled model needs real weights: compile an ONNX file or a model folder with weights, "
                           "or ask for the weightless plan (--plan)")


def write_models(design, folder: Path, providers: list[str]) -> list[str]:
    """The compiled model (or each block of a composite) into `folder`, each checked to load on `providers`; the
    files written (model and data), so the output folder can checksum them while they are fresh."""
    netlist = design.netlist
    if not netlist.blocks():
        _write_model(netlist, folder)
        check_loads(folder / MODEL_FILE, providers, netlist.name)
        return [MODEL_FILE, DATA_FILE]
    written = []
    for block, model in split_blocks(netlist.model, netlist.blocks()).items():
        file = next(b["file"] for b in netlist.blocks() if b["name"] == block)
        _write_model(netlist, folder, model, file)
        check_loads(folder / file, providers, f"{netlist.name} block {block}")
        written += [file, f"{file}.data"]
    return written


def _write_model(netlist, folder: Path, model=None, file: str = MODEL_FILE) -> None:
    """The netlist's model (or one block of a composite, `model`) as `file` + `file`.data."""
    model = netlist.model if model is None else model
    model.metadata_props[NETLIST_META_KEY] = json.dumps(
        {**netlist.to_meta(), "provenance": design_provenance(netlist.provenance)}, sort_keys=True, default=str)
    model.ir_version = min(model.ir_version, IR_VERSION)
    path = folder / file
    ir.save(model, str(path), external_data=DATA_FILE if file == MODEL_FILE else f"{file}.data",
            size_threshold_bytes=1024)
    try:
        check(path)
    except onnx.checker.ValidationError as exc:
        first = " ".join(str(exc).split())
        source = netlist.provenance.get("file")  # an ONNX source: the checker may refuse what the user gave
        why = source_fails_checker(Path(source)) if source and str(source).endswith(".onnx") else None
        if why:
            raise SoftsynError(f"{source}: the source model fails onnx.checker: {why}") from None
        raise SoftsynDefect(f"design {netlist.name}: softsyn wrote {file}, which fails onnx.checker (a softsyn "
                            f"defect, not your input): {first}") from None


def source_fails_checker(path: Path) -> str | None:
    """The checker's first complaint about a source ONNX file, or None where it passes (or the file is gone)."""
    if not path.is_file():
        return None
    try:
        check(path)
    except onnx.checker.ValidationError as exc:
        return " ".join(str(exc).split())
    return None


# How ONNX Runtime says a node has no kernel: an op a provider lacks, an unknown ONNX op, an unknown domain op
_NO_KERNEL = [re.compile(r"implementation for (?P<op>[\w.]+)\(\d+\) node with name '(?P<node>[^']*)'"),
              re.compile(r'In Node, \("(?P<node>[^"]*)", (?P<op>[\w.]+), "(?P<domain>[^"]*)"'),
              re.compile(r"(?P<domain>[\w.]*):(?P<op>\w+)\(-?\d+\) is not a registered function/op")]


def check_loads(path: Path, providers: list[str], design: str) -> None:
    """ONNX Runtime creates a session on the emitted model with the target's providers (as
    runtime/session.json says): an artifact the runtime cannot load is refused, naming the node."""
    ort.set_default_logger_severity(4)  # a provider this machine lacks logs an error, then ORT falls back to the CPU
    try:
        open_session(path, SessionSettings(provider=provider_of(providers[0]), require_provider=False))
        return
    except ort_errors() as exc:
        text = re.sub(r"Load model from \S+ failed:", "", " ".join(str(exc).split()))
    if _loads_as_cpu_view(path, providers):
        return
    why = text
    found = next((m for m in (p.search(text) for p in _NO_KERNEL) if m), None)
    if found is not None:
        op, domain = found["op"], found.groupdict().get("domain")
        nodes = [n.name for n in onnx.load(str(path), load_external_data=False).graph.node
                 if n.op_type == op and (domain is None or n.domain == domain)]
        node = found.groupdict().get("node") or (nodes[0] if nodes else "?")
        more = f" (and {len(nodes) - 1} more)" if len(nodes) > 1 else ""
        why = f"node {node} (op {domain + ':' if domain else ''}{op}) has no kernel{more}"
    raise SoftsynError(f"design {design}: ONNX Runtime ({', '.join(providers)}) cannot load the compiled model: "
                       f"{why}; nothing was written")


def _loads_as_cpu_view(path: Path, providers: list[str]) -> bool:
    """On a machine without the target's provider, whether the model's CPU view (what verify runs here) loads: a
    CUDA-only kernel (fp8 weight cells) refuses the CPU fallback check_loads gets there, the view does not."""
    if provider_of(providers[0]) == "cpu" or provider_opens(provider_of(providers[0])):
        return False
    try:
        _, changed = cpu_view_session(path)
    except ort_errors():
        return False
    return any(changed.values())


def check(path: Path) -> None:
    """onnx.checker on the saved model (path form: external data resolved next to it).

    ORT registers a few of its own kernels in the default domain (SimplifiedLayerNormalization), where
    the checker knows only ONNX's ops; those nodes are checked as runtime ops (custom domain) in a
    throwaway view, and everything else as written.
    """
    try:
        onnx.checker.check_model(str(path))
        return
    except onnx.checker.ValidationError as exc:
        first = exc
    proto = onnx.load(str(path), load_external_data=False)
    runtime_ops = [n for n in proto.graph.node if n.domain in ("", "ai.onnx") and not onnx.defs.has(n.op_type)]
    if not runtime_ops:
        raise first
    for node in runtime_ops:
        node.domain = ORT_DOMAIN
    if not any(o.domain == ORT_DOMAIN for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid(ORT_DOMAIN, 1))
    view = path.with_name(f".checker-view-{path.name}")
    try:
        onnx.save(proto, str(view))
        onnx.checker.check_model(str(view))
    finally:
        view.unlink(missing_ok=True)


def ort_errors() -> tuple[type[Exception], ...]:
    """ONNX Runtime's own exception types (a kernel a provider lacks, a graph it cannot load, bad feeds):
    about the model or the machine, not bugs in softsyn."""
    return tuple(v for v in vars(ort_state).values() if isinstance(v, type) and issubclass(v, Exception))
