"""Transformers-backed designs: zoo entries, HF model folders and config.json files."""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx_ir as ir

from softsyn.errors import SoftsynError
from softsyn.frontends import cache as _cache
from softsyn.frontends import export as _export
from softsyn.frontends import replicate as _replicate
from softsyn.frontends.hf_common import EXPERTS_IMPL, brief
from softsyn.frontends.materialize import FILLED, materialize
from softsyn.frontends.weights import LOADABLE, checked_weights
from softsyn.netlist import Netlist
from softsyn.progress import step

# How a hybrid decoder (Qwen3-Next) is exported: softsyn.frontends.hybrid_export
HYBRID_EXPORT = ("hybrid cache as ports (past.N.conv, past.N.recurrent beside past_key_values.N.key/value), delta rule as one "
                 "scan over the sequence")
# Above this many bytes of weights a model is built on the meta device (not materialised).
MATERIALISE_LIMIT = int(os.environ.get("SOFTSYN_MATERIALISE_LIMIT", 2 * 1024**3))


@contextlib.contextmanager
def _quiet_torch_export():
    """torch.export logs its own error lines before it raises, and softsyn prints the one line of the failure.
    A filter, not a level: torch's logging setup resets the levels of its loggers while it exports."""
    logger = logging.getLogger("torch.export._trace")
    drop = logging.Filter("-")  # matches no logger name: drops every record
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def is_decoder(cfg) -> bool:
    archs = getattr(cfg, "architectures", None) or []
    if any(a.endswith("ForCausalLM") for a in archs):
        return True
    if archs:
        return False
    return _torch_side().causal_lm_type(cfg.model_type) and not getattr(cfg, "is_encoder_decoder", False)


def is_hybrid(cfg) -> bool:
    """A decoder whose layers mix linear attention (Gated DeltaNet) with full attention: Qwen3-Next."""
    return "linear_attention" in (getattr(cfg, "layer_types", None) or ())


def is_moe(cfg) -> bool:
    return bool(getattr(cfg, "num_experts", 0) or getattr(cfg, "num_local_experts", 0))


def config_summary(cfg, parameters: int) -> dict:
    heads = getattr(cfg, "num_attention_heads", None)
    hidden = getattr(cfg, "hidden_size", None)
    out = {
        "model_type": cfg.model_type,
        "num_layers": getattr(cfg, "num_hidden_layers", None),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": getattr(cfg, "num_key_value_heads", None) or heads,
        "head_dim": getattr(cfg, "head_dim", None) or (hidden // heads if hidden and heads else None),
        "vocab_size": getattr(cfg, "vocab_size", None),
        "intermediate_size": getattr(cfg, "intermediate_size", None),
        "num_experts": getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None) or 0,
        "parameters": int(parameters),
        "max_position_embeddings": getattr(cfg, "max_position_embeddings", None),
        "tie_word_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
    }
    if out["num_experts"]:
        out["num_experts_per_tok"] = getattr(cfg, "num_experts_per_tok", None)
        out["moe_intermediate_size"] = getattr(cfg, "moe_intermediate_size", None)
    return out


def _fingerprint(path: Path | None) -> str | None:
    if path is None:
        return None
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{int(st.st_mtime)}"


def seeded_weight_bytes(cfg, weights: str | None, dtype: str | None, folder: Path | None = None,
                        source: str = "the config") -> int | None:
    """Bytes of the seeded weights a materialised read of this model makes (None: it brings its own weights or
    is small enough to build in torch, at fp32). Counted on the meta device: nothing is allocated."""
    if weights not in (None, "meta") or (weights is None and checked_weights(folder) is not None):
        return None
    n_params = count_meta_params(cfg, is_decoder(cfg), source)
    if weights is None and n_params * 4 <= MATERIALISE_LIMIT:
        return None
    return n_params * np.dtype(dtype or _dtype_name(cfg, "meta")).itemsize


def _dtype_name(cfg, weights: str) -> str:
    if weights not in ("meta", "filled"):
        return "float32"
    d = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
    d = str(d).replace("torch.", "") if d is not None else ""
    return d if d in ("float16", "bfloat16") else "float16"


@dataclass(frozen=True)
class _Export:
    """How a transformers model is read, decided from its config and load_transformers_design's arguments."""

    cfg: object  # a private copy: building a model sets attributes on its config
    name: str
    source: str
    folder: Path | None
    weights: str  # random | pretrained | meta | filled
    dtype: str
    weight_file: Path | None
    decoder: bool
    moe: bool
    exporter: str  # the exporter, as provenance and the cache key name it
    replicate: bool  # a weightless decoder whose config names one kind of layer: trace two, copy the second where
    # the built layers are one module too (frontends.replicate)

    @property
    def layers(self):
        return getattr(self.cfg, "num_hidden_layers", None)


def _plan_export(cfg, name: str, source: str, *, folder: Path | None, weights: str | None, dtype: str | None,
                 materialize: bool) -> _Export:
    """The weights (unless given: random, pretrained from `folder`, or for a model too large to build in torch meta,
    filled with `materialize`), their dtype and the exporter a read of `cfg` uses."""
    decoder = is_decoder(cfg)
    moe = is_moe(cfg)
    weight_file = checked_weights(folder)  # a folder's weight files load, or this names the one that cannot
    real_size = False
    if weights is None:
        real_size = count_meta_params(cfg, decoder, source) * 4 > MATERIALISE_LIMIT
        if weight_file is not None:  # its own weights (a real-size one weightless unless it is to run)
            weights = "pretrained" if materialize or not real_size else "meta"
        else:
            weights = ("filled" if materialize else "meta") if real_size else "random"
    if weights == "pretrained" and weight_file is None:
        raise SoftsynError(f"{source}: no weights ({', '.join(LOADABLE)}) in {folder}")
    # a real-size model runs in its config's half precision, whoever made its weights
    dtype = dtype or _dtype_name(cfg, "meta" if real_size else weights)
    exporter = _export.DYNAMO + (f", experts_implementation={EXPERTS_IMPL}" if moe else "")
    if decoder and is_hybrid(cfg):
        exporter += f", {HYBRID_EXPORT}"
    layers = getattr(cfg, "num_hidden_layers", None)
    # not in the exporter's name (the cache key): whether the layers are copied is settled at export, where the
    # built layers say whether they are one module (hf_torch.layer_difference), and either way the netlist is the same
    replicate = (weights == "meta" and decoder and isinstance(layers, int) and layers > _replicate.EXPORTED
                 and _replicate.homogeneous(cfg))
    return _Export(cfg=cfg, name=name, source=source, folder=folder, weights=weights, dtype=dtype,
                   weight_file=weight_file, decoder=decoder, moe=moe, exporter=exporter, replicate=replicate)


def _key_material(ex: _Export) -> dict:
    """What the cached netlist depends on."""
    return {
        "config": ex.cfg.to_dict(),
        "kind": "decoder" if ex.decoder else "encoder",
        "exporter": ex.exporter,
        "opset": _export.OPSET,
        "weights": ex.weights,
        "dtype": ex.dtype,
        "weights_file": _fingerprint(ex.weight_file) if ex.weights == "pretrained" else None,
        "frontend": _cache.FRONTEND_VERSION,
        "versions": _cache.versions(),
    }


WEIGHTS_DESC = {"random": "random seed 0", "pretrained": "pretrained", "meta": "meta (not materialised)"}


def load_transformers_design(
    cfg,
    name: str,
    source: str,
    cache_dir: Path,
    progress: bool = True,
    folder: Path | None = None,
    weights: str | None = None,
    dtype: str | None = None,
    materialize: bool = False,
) -> Netlist:
    """Build (or load from cache) the netlist of a transformers model described by ``cfg``.

    ``materialize``: a model too large to build in torch (exported weightless, "meta") gets seeded random
    weights filled into that export instead ("filled"), so it runs."""
    ex = _plan_export(copy.deepcopy(cfg), name, source, folder=folder, weights=weights, dtype=dtype,
                      materialize=materialize)
    key = _cache.content_key(_key_material(ex))
    entry = _cache.entry_dir(cache_dir, name, key)
    with _cache.exporting(entry):  # another process exporting this entry: wait, then read it
        return _read_or_export(ex, cache_dir, progress, entry, key)


def _read_or_export(ex: _Export, cache_dir: Path, progress: bool, entry: Path, key: str) -> Netlist:
    """The cache entry's netlist, or (a miss) the export saved there."""
    name = ex.name
    with step(f"reading {name} from the export cache", enabled=progress and entry.is_dir(),
              done=f"read {name} from the export cache"):
        cached = _cache.load_entry(entry)
    if cached is not None:
        cached.provenance["cache"] = {"key": key, "path": str(entry), "hit": True}
        return cached
    if ex.weights == "filled":
        return _materialised(ex, cache_dir, progress, entry=entry, key=key)

    t0 = time.perf_counter()
    with step(f"exporting {name} with {ex.exporter} ({WEIGHTS_DESC[ex.weights]}, {ex.dtype})", enabled=progress,
              done=f"exported {name}"):
        ir_model, parameters, layers = _export_model(ex)
    elapsed = time.perf_counter() - t0
    nl = Netlist(
        ir_model,
        name=name,
        kind="decoder" if ex.decoder else "encoder",
        provenance=_provenance(ex, elapsed, layers),
        config=config_summary(ex.cfg, parameters),
        derived_dims={"total": "past + seq"} if ex.decoder else {},
    )
    nl = _cache.save_entry(nl, entry)
    nl.provenance["cache"] = {"key": key, "path": str(entry), "hit": False}
    return nl


def source_model(cfg, name: str, source: str, *, folder: Path | None = None, weights: str | None = None,
                 dtype: str | None = None, cache_dir: Path | None = None, hybrid: bool = False):
    """The torch model (eval mode) a materialised read of `cfg` exports, built the same way (config, weights, seed
    0), for a torch target to lower: it computes the function the exported netlist does. A decoder; a real-size one
    without weights of its own gets the seeded weights softsyn fills into its weightless export (read through the
    export cache), as the ONNX artifact of the same compile does. A hybrid decoder (Qwen3-Next) only with `hybrid`
    (a reference to compare with: the torch targets do not lower it)."""
    weights = "filled" if weights == "meta" else weights  # a zoo entry's real-size model, materialised
    ex = _plan_export(copy.deepcopy(cfg), name, source, folder=folder, weights=weights, dtype=dtype, materialize=True)
    if not ex.decoder:
        raise SoftsynError(f"{source}: the torch targets lower causal decoders; {name} is not one")
    if is_hybrid(ex.cfg) and not hybrid:
        raise SoftsynError(f"{source}: {name} is a hybrid decoder (linear-attention layers with conv and recurrent "
                           "states beside the KV cache), which the torch targets do not lower yet; compile it for an "
                           "ONNX Runtime target (e.g. cpu-ort)")
    if ex.weights == "filled":
        base = load_transformers_design(ex.cfg, name, source, cache_dir, False, folder=folder, weights="meta",
                                        dtype=ex.dtype)
        return _torch_side().seeded_torch_model(ex.cfg, base.model, decoder=True, dtype=ex.dtype, source=source)[0]
    return _torch_side().torch_model(ex).eval()


def _export_model(ex: _Export) -> tuple:
    """(the exported onnx-ir model, its parameter count, how its layers were had: a Layers). A decoder planned for
    replication traces EXPORTED layers and copies the last where its built layers are one module; else, or where
    the traced graph cannot be copied, every layer is traced, and the Layers says why."""
    _export.torch_num_threads()
    why = _torch_side().layer_difference(ex) if ex.replicate else None
    if not ex.replicate or why:
        return (*_traced(replace(ex, replicate=False)), Layers(None, why))
    ir_model, _ = _traced(ex)
    try:
        copies = _replicate.replicate_layers(ir_model, ex.layers)
    except _replicate.NotReplicable as e:
        return (*_traced(replace(ex, replicate=False)), Layers(None, f"the traced layers could not be copied: {e}"))
    return ir_model, count_meta_params(ex.cfg, ex.decoder, ex.source), Layers(copies, None)


class Layers(NamedTuple):
    """How an export had its decoder layers: `copies` of the template made (None: every layer traced), `why` not
    (None where no copy was planned or the copies were made)."""
    copies: int | None
    why: str | None


def _traced(ex: _Export) -> tuple[ir.Model, int]:
    """torch.export + the ONNX exporter on `ex`'s torch model (its traced layers only where it replicates), and the
    parameters of the model traced."""
    model = _torch_side().torch_model(ex)
    model.eval()
    if ex.moe and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(EXPERTS_IMPL)
    parameters = sum(p.numel() for p in model.parameters())
    try:
        with _quiet_torch_export():
            if ex.decoder and is_hybrid(ex.cfg):
                return _torch_side().export_hybrid(model, ex.name), parameters
            return (_export.export_decoder if ex.decoder else _export.export_encoder)(model, ex.name), parameters
    except SoftsynError:
        raise
    except Exception as e:  # the exporter's failures are long and wrapped: the innermost cause says what
        raise SoftsynError(f"{ex.source}: exporting {ex.name} with {ex.exporter} failed: {brief(e)}") from e


def _provenance(ex: _Export, elapsed: float, layers: Layers) -> dict:
    provenance = {
        "source": ex.source,
        "exporter": ex.exporter,
        "weights": WEIGHTS_DESC[ex.weights],
        "dtype": ex.dtype,
        "versions": _cache.versions(),
        "export_seconds": round(elapsed, 2),
        "scope_prefix": _export.SCOPE_PREFIX,
    }
    if layers.copies is not None:
        provenance["layers"] = (f"{_replicate.EXPORTED} traced by torch.export, model.layers.{_replicate.EXPORTED - 1} "
                                f"copied {layers.copies} times to {ex.layers} (softsyn.frontends.replicate)")
    elif layers.why:
        provenance["layers"] = f"all {ex.layers} traced by torch.export, none copied: {layers.why}"
    if ex.weights == "meta":
        provenance["weights_location"] = _export.META_WEIGHTS + " (never written: shapes and dtypes only)"
    if ex.weights == "pretrained":
        provenance["weights_file"] = str(ex.weight_file)
    return provenance


def _materialised(ex: _Export, cache_dir: Path, progress: bool, *, entry: Path, key: str) -> Netlist:
    """The weightless export (cached) with seeded random weights and the exporter's optimizer applied
    (softsyn.frontends.materialize): a runnable real-size model without building it in torch."""
    name, dtype = ex.name, ex.dtype
    base = load_transformers_design(ex.cfg, name, ex.source, cache_dir, progress, folder=ex.folder, weights="meta",
                                    dtype=dtype)
    t0 = time.perf_counter()
    with step(f"materialising {name}: seeded random {dtype} weights + onnxscript optimizer", enabled=progress,
              done=f"materialised {name}'s weights"):
        model = materialize(base.model, ex.cfg)
        provenance = dict(base.provenance, weights=FILLED)
        provenance.pop("weights_location", None)
        provenance.pop("cache", None)
        provenance["materialise_seconds"] = round(time.perf_counter() - t0, 2)
        nl = Netlist(model, name=name, kind=base.kind, provenance=provenance, config=base.config,
                     derived_dims=dict(base.derived_dims))
        nl = _cache.save_entry(nl, entry)  # the weights written to the cache: part of the wait
    nl.provenance["cache"] = {"key": key, "path": str(entry), "hit": False}
    return nl


def _torch_side():
    """softsyn.frontends.hf_torch, imported on first use."""
    # deferred: torch and transformers take seconds to import; only reading a Hugging Face model needs them
    from softsyn.frontends import hf_torch

    return hf_torch


def count_meta_params(cfg, decoder: bool, source: str = "the config") -> int:
    """Parameters of the model ``cfg`` describes, counted on the meta device (no weights allocated)."""
    return _torch_side().count_meta_params(cfg, decoder, source)


def read_config(path: Path):
    """AutoConfig from a folder or a config.json path, with a clear error: (config, folder)."""
    return _torch_side().read_config(path)


def write_seeded_folder(cfg, meta_model, folder: Path, dtype: str = "float16", seed: int = 0) -> int:
    """A Hugging Face model folder holding the seeded weights softsyn materialises for `meta_model` (see
    softsyn.frontends.hf_torch.write_seeded_folder); the number of parameters written."""
    return _torch_side().write_seeded_folder(cfg, meta_model, folder, decoder=is_decoder(cfg), dtype=dtype, seed=seed)
