"""The torch and transformers side of reading a Hugging Face model: its config read and checked, the model built
(on the meta device, seeded random or from its folder's weights), its parameters counted, a seeded folder written.

softsyn.frontends.hf imports this module only when it reads a model (torch and transformers take seconds to import),
so the command line starts without them.
"""
from __future__ import annotations

import copy
import difflib
import json
from pathlib import Path

import torch
import transformers
from transformers import CONFIG_MAPPING, AutoConfig, AutoModel, AutoModelForCausalLM
from transformers.initialization import no_init_weights
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.utils import logging as hf_logging

from softsyn.constraints.reader import read_text
from softsyn.errors import SoftsynError
from softsyn.frontends import replicate as _replicate
from softsyn.frontends.hf_common import EXPERTS_IMPL, brief, building
from softsyn.frontends.hybrid_export import export_hybrid_decoder
from softsyn.frontends.materialize import seeded_weights


def causal_lm_type(model_type: str) -> bool:
    """Whether transformers builds `model_type` as a causal LM."""
    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def auto_class(decoder: bool):
    return AutoModelForCausalLM if decoder else AutoModel


def count_meta_params(cfg, decoder: bool, source: str = "the config") -> int:
    """Parameters of the model ``cfg`` describes, counted on the meta device (no weights allocated)."""
    with building(source), torch.device("meta"):
        m = auto_class(decoder).from_config(cfg)
    n = sum(p.numel() for p in m.parameters())
    del m
    return int(n)


PLAIN = (bool, int, float, str, type(None))
PER_INDEX = ("layer_idx", "layer_id", "idx")  # attributes that name the layer's place, not what it computes


def layer_signature(layer: torch.nn.Module) -> dict[str, tuple]:
    """What a decoder layer computes, as far as its modules tell: per submodule, its class, its plain attributes (a
    sliding window, a RoPE switch, an attention type; not its index) and its own parameters' and buffers' shapes and
    dtypes."""
    def plain(value) -> bool:
        return isinstance(value, PLAIN) or (isinstance(value, (tuple, list))
                                            and all(isinstance(v, PLAIN) for v in value))

    signature = {}
    for name, module in layer.named_modules():
        attributes = tuple(sorted((k, repr(v)) for k, v in vars(module).items()
                                  if not k.startswith("_") and k not in PER_INDEX and k != "training" and plain(v)))
        tensors = tuple((n, tuple(t.shape), str(t.dtype)) for n, t in
                        [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)])
        signature[name] = (type(module).__name__, attributes, tensors)
    return signature


def layer_difference(ex) -> str | None:
    """Why the decoder layers of `ex`'s weightless model may not be copied from its template layer
    (model.layers.{EXPORTED - 1}, softsyn.frontends.replicate): the first later layer whose modules, plain attributes
    or tensor shapes are not the template's, named with what differs; None where every later layer is the template's
    module (so a copy of it computes what tracing it would). Built on the meta device: no weights allocated."""
    kwargs = {"experts_implementation": EXPERTS_IMPL} if ex.moe else {}
    with building(ex.source), torch.device("meta"):
        model = auto_class(ex.decoder).from_config(copy.deepcopy(ex.cfg), **kwargs)
    layers = next((m for n, m in model.named_modules() if n.endswith("layers") and isinstance(m, torch.nn.ModuleList)
                   and len(m) == ex.layers), None)
    if layers is None:
        return f"no module list of its {ex.layers} decoder layers"
    first = _replicate.EXPORTED - 1
    template = layer_signature(layers[first])
    for i in range(_replicate.EXPORTED, len(layers)):
        signature = layer_signature(layers[i])
        if signature != template:
            where = next(k for k in {**template, **signature} if template.get(k) != signature.get(k))
            part = f".{where}" if where else ""
            what = _difference(signature.get(where), template.get(where))
            return f"model.layers.{i}{part} differs from model.layers.{first}{part} ({what})"
    return None


def _difference(got: tuple | None, want: tuple | None) -> str:
    """What differs between two layer_signature entries, briefly: the module missing, its class, the attributes
    (`use_rope` 0, not 1) or the tensors."""
    if got is None or want is None:
        return "no such module" if got is None else "a module the template lacks"
    if got[0] != want[0]:
        return f"{got[0]}, not {want[0]}"
    if got[1] != want[1]:
        theirs = dict(want[1])
        return ", ".join(f"{k} {v}, not {theirs.get(k, 'unset')}" for k, v in got[1] if theirs.get(k) != v)
    return f"tensors {got[2]}, not {want[2]}"


def torch_model(ex):
    """The torch model to export: on the meta device (weightless; the traced layers only when replicating),
    seeded random, or from the folder's pretrained weights. `ex`: softsyn.frontends.hf's export plan (its cfg,
    source, folder, weights, dtype, decoder, moe, replicate)."""
    torch_dtype = getattr(torch, ex.dtype)
    cls = auto_class(ex.decoder)
    kwargs = {"experts_implementation": EXPERTS_IMPL} if ex.moe else {}
    if ex.weights == "meta":
        traced = ex.cfg
        if ex.replicate:
            traced = copy.deepcopy(ex.cfg)
            traced.num_hidden_layers = _replicate.EXPORTED
        with building(ex.source), torch.device("meta"):
            return cls.from_config(traced, dtype=torch_dtype, **kwargs)
    if ex.weights == "random":
        torch.manual_seed(0)
        with building(ex.source):
            return cls.from_config(ex.cfg, dtype=torch_dtype, **kwargs)
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with building(ex.source):
            return cls.from_pretrained(str(ex.folder), dtype=torch_dtype, **kwargs)
    finally:
        if bar:
            hf_logging.enable_progress_bar()


def export_hybrid(model, name: str):
    """A hybrid decoder (Qwen3-Next) exported with its conv, recurrent and KV caches as ports."""
    return export_hybrid_decoder(model, name)


def read_config(path: Path):
    """AutoConfig from a folder or a config.json path, with a clear error."""
    folder = path if path.is_dir() else path.parent
    cfg_file = folder / "config.json" if path.is_dir() else path
    text = read_text(cfg_file, "transformers config.json")  # a regular file of bounded size (a FIFO would hang)
    try:
        data = json.loads(text)
    except ValueError as e:
        raise SoftsynError(f"{path}: cannot read {cfg_file.name}: {e}") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise SoftsynError(f"{cfg_file}: not a transformers config (no model_type)")
    model_type = data["model_type"]
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        close = difflib.get_close_matches(str(model_type), list(CONFIG_MAPPING.keys()), n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise SoftsynError(f"{cfg_file}: model_type {model_type!r} is not an architecture transformers "
                           f"{transformers.__version__} knows{hint}")
    try:
        if path.is_dir() or path.name == "config.json":
            return AutoConfig.from_pretrained(str(folder)), folder
        return AutoConfig.for_model(**data), folder
    except Exception as e:  # noqa: BLE001 -- transformers validates configs with many exception types
        raise SoftsynError(f"{cfg_file}: transformers cannot build config: {brief(e)}") from None


def seeded_torch_model(cfg, meta_model, *, decoder: bool, dtype: str = "float16", seed: int = 0, source: str = ""):
    """(the torch model with the seeded weights softsyn materialises for `meta_model` (the model's weightless
    export): the same values, parameter by parameter (softsyn.frontends.materialize.seeded_weights), so it computes
    the function the materialised netlist does; the number of parameters set). Tied parameters (lm_head =
    embed_tokens) take the value of the name the export kept."""
    cfg = copy.deepcopy(cfg)
    values = seeded_weights(meta_model, cfg, seed)
    # no_init_weights: every parameter is overwritten below, so transformers' random init (96 s for a 1.7B model on
    # the H200's host, 2026-12-03) is skipped; buffers (rotary's inv_freq) are still computed by the modules
    with building(source), no_init_weights():
        net = auto_class(decoder).from_config(cfg, dtype=getattr(torch, dtype))
    net.tie_weights()  # init_weights, skipped above, is where transformers ties lm_head to the embedding
    names_by_storage: dict[int, list[str]] = {}
    for name, p in net.named_parameters(remove_duplicate=False):
        names_by_storage.setdefault(p.data_ptr(), []).append(name)
    written = 0
    with torch.no_grad():
        for names in names_by_storage.values():
            known = [n for n in names if n in values]
            if not known:
                raise SoftsynError(f"{source or cfg.model_type}: parameter {names[0]} has no initializer in the "
                                   f"export ({len(values)} weights there); cannot build the same weights")
            param = net.get_parameter(names[0])
            param.copy_(torch.from_numpy(values[known[-1]]).to(param.dtype))
            written += 1
    return net.eval(), written


def write_seeded_folder(cfg, meta_model, folder: Path, *, decoder: bool, dtype: str = "float16", seed: int = 0) -> int:
    """Save a Hugging Face model folder holding the seeded weights softsyn materialises for `meta_model`
    (seeded_torch_model), so a peer built from the folder computes the same function as softsyn's materialised
    netlist. Returns the number of parameters written."""
    net, written = seeded_torch_model(cfg, meta_model, decoder=decoder, dtype=dtype, seed=seed, source=str(folder))
    net.save_pretrained(str(folder))
    return written
