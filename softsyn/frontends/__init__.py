"""Frontends: read a design (ONNX file, HF folder/config, zoo name) into a Netlist.

    read_design("model.onnx")           # external data stays lazy
    read_design("path/to/hf-folder")    # or ".../config.json": weights if present, else random (seed 0)
    read_design("zoo:qwen3-tiny")       # or a bare zoo name
"""
from __future__ import annotations

import difflib
from pathlib import Path

from softsyn.errors import SoftsynError
from softsyn.frontends import hf, onnx_file, vlm, zoo as _zoo
from softsyn.frontends.cache import default_cache_dir
from softsyn.frontends.weights import checked_weights
from softsyn.netlist import Netlist

__all__ = ["read_design", "default_cache_dir", "zoo_names", "source_torch_model"]


def zoo_names() -> list[str]:
    return _zoo.names()


def _bad_spec(spec: str, why: str) -> SoftsynError:
    return SoftsynError(
        f"cannot read design {spec!r}: {why}. Valid forms: a path to an .onnx file; a Hugging Face model "
        f"folder or its config.json; zoo:NAME or a bare zoo name. Zoo: {', '.join(_zoo.names())}"
    )


def read_design(spec: str, cache_dir: str | Path | None = None, progress: bool = True,
                materialize: bool = False, image_size: tuple[int, int] | None = None) -> Netlist:
    """Read ``spec`` into a Netlist (exports are cached on disk under ``cache_dir``).

    ``materialize=True``: a real-size model (a zoo entry, or an HF folder/config without weights, exported
    weightless by default) gets seeded random weights in its dtype (fp16) filled into the weightless export,
    then the exporter's optimizer (softsyn.frontends.materialize), so it can run (compile, signoff,
    benchmarks); needs RAM for them (`seeded_weight_bytes` says how much before anything is exported).
    ``image_size``: (width, height) a vision-language composite's vision block is exported at (its grid is fixed
    per export; softsyn.frontends.vlm)."""
    spec = str(spec).strip()
    if not spec:
        raise _bad_spec(spec, "empty spec")
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()

    zoo_name = None
    if spec.startswith("zoo:"):
        zoo_name = spec[4:]
        if zoo_name not in _zoo.ZOO:
            close = difflib.get_close_matches(zoo_name, _zoo.names(), n=1, cutoff=0.5)
            raise _bad_spec(spec, f"no zoo model {zoo_name!r}" + (f" (did you mean zoo:{close[0]}?)" if close else ""))
    path = Path(spec).expanduser()
    if zoo_name is None and not path.exists() and spec in _zoo.ZOO:
        zoo_name = spec

    if zoo_name is not None:
        entry = _zoo.ZOO[zoo_name]
        if zoo_name == "minilm":
            folder = _zoo.minilm_folder()
            cfg, _ = hf.read_config(folder)
            nl = hf.load_transformers_design(
                cfg, zoo_name, f"zoo:{zoo_name} ({folder})", cache, progress, folder=folder, weights="pretrained"
            )
        elif entry.model_type == "qwen3_vl":
            nl = vlm.load_vlm_design(_zoo.make_config(entry), zoo_name, f"zoo:{zoo_name}", cache, progress,
                                     weights=entry.weights, dtype=entry.dtype, image_size=image_size,
                                     materialize=materialize)
        else:
            cfg = _zoo.make_config(entry)
            weights = "filled" if materialize and entry.weights == "meta" else entry.weights
            nl = hf.load_transformers_design(
                cfg, zoo_name, f"zoo:{zoo_name}", cache, progress, weights=weights, dtype=entry.dtype
            )
        return nl

    if path.is_file() and path.suffix.lower() == ".onnx":
        return onnx_file.load_onnx(path)
    if path.is_dir() and (path / "config.json").is_file():
        cfg, folder = hf.read_config(path)
        if vlm.is_vlm(cfg):
            checked_weights(folder)  # its weights are not read (a composite exports from its config), but never cut
            return vlm.load_vlm_design(cfg, path.resolve().name, str(path), cache, progress, image_size=image_size,
                                       materialize=materialize)
        return hf.load_transformers_design(cfg, path.resolve().name, str(path), cache, progress, folder=folder,
                                           materialize=materialize)
    if path.is_file() and path.suffix.lower() == ".json":
        cfg, folder = hf.read_config(path)
        name = path.resolve().parent.name if path.name == "config.json" else path.stem
        if vlm.is_vlm(cfg):
            return vlm.load_vlm_design(cfg, name, str(path), cache, progress, image_size=image_size,
                                       materialize=materialize)
        return hf.load_transformers_design(cfg, name, str(path), cache, progress, folder=folder,
                                           materialize=materialize)
    if path.is_dir():
        raise _bad_spec(spec, "folder has no config.json")
    if path.exists():
        raise _bad_spec(spec, "not an .onnx file, a config.json or a model folder")
    raise _bad_spec(spec, "no such file, folder or zoo model")


def seeded_weight_bytes(spec: str) -> int | None:
    """Bytes of seeded weights `read_design(spec, materialize=True)` would make, found before any export
    (None: the model brings its weights, or is built in torch at fp32: a tiny zoo model, an ONNX file)."""
    spec = str(spec).strip()
    name = spec[4:] if spec.startswith("zoo:") else spec
    path = Path(spec).expanduser()
    if name in _zoo.ZOO and (spec.startswith("zoo:") or not path.exists()):
        entry = _zoo.ZOO[name]
        if entry.weights != "meta":
            return None
        return hf.seeded_weight_bytes(_zoo.make_config(entry), "meta", entry.dtype)
    if path.is_dir() and (path / "config.json").is_file() or path.is_file() and path.suffix.lower() == ".json":
        cfg, folder = hf.read_config(path)
        return hf.seeded_weight_bytes(cfg, None, None, folder, source=str(path))
    return None


def source_torch_model(spec: str, cache_dir: str | Path | None = None, hybrid: bool = False):
    """The torch model `read_design(spec, materialize=True)` exports (same config, seeded or pretrained weights), for
    a torch target (softsyn.library.torch_targets) to lower: a zoo decoder or a Hugging Face folder/config of one.
    `hybrid`: a hybrid decoder (Qwen3-Next) too, as a reference (the torch targets do not lower one)."""
    spec = str(spec).strip()
    name = spec[4:] if spec.startswith("zoo:") else spec
    path = Path(spec).expanduser()
    cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if name in _zoo.ZOO and (spec.startswith("zoo:") or not path.exists()):
        entry = _zoo.ZOO[name]
        if name == "minilm" or entry.model_type == "qwen3_vl":
            raise _bad_spec(spec, "the torch targets lower one causal decoder (not an encoder or a composite)")
        return hf.source_model(_zoo.make_config(entry), name, f"zoo:{name}", weights=entry.weights, dtype=entry.dtype,
                               cache_dir=cache_dir, hybrid=hybrid)
    if path.is_dir() and (path / "config.json").is_file() or path.is_file() and path.suffix.lower() == ".json":
        cfg, folder = hf.read_config(path)
        if vlm.is_vlm(cfg):
            raise _bad_spec(spec, "the torch targets lower one causal decoder (not a vision-language composite)")
        name = path.resolve().name if path.is_dir() else path.resolve().parent.name
        return hf.source_model(cfg, name, str(path), folder=folder, cache_dir=cache_dir, hybrid=hybrid)
    raise _bad_spec(spec, "the torch targets lower the source model: a zoo name, a Hugging Face folder or config.json")
