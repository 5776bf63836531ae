"""Vision-language composites (Qwen3-VL): three ONNX blocks in onnxruntime-genai's layout, read as one netlist.

The blocks are exported separately, as onnxruntime-genai runs them: `vision` (pixel_values -> image_features),
`embedding` (input_ids + image_features -> inputs_embeds) and `decoder` (inputs_embeds + mask + 3-row mrope
position_ids + KV -> logits + present KV). They are then joined into one graph in which a block's output feeds the
next block's input by name, every node's hierarchy starting with its block's name, and the blocks' boundaries
recorded in the provenance (`blocks`), so timing crosses them and `emit` can cut them apart again.

The vision tower's data-dependent parts (patch positions, the learned position table resampled to the grid,
attention segments) depend only on the grid, so each export fixes one grid: its positions are constants, and the
attention of each image is a batched attention over a dynamic `images` dim (segments of equal length, the form
transformers' own exporter rewrites the per-segment loop into). The torch modules and their export are in
softsyn.frontends.vlm_export.
"""
from __future__ import annotations

import copy
import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnx_ir as ir

from softsyn.errors import SoftsynError
from softsyn.frontends import cache as _cache, export as _export, replicate as _replicate
from softsyn.netlist import HIERARCHY_KEY, Netlist
from softsyn.frontends.hf import MATERIALISE_LIMIT, config_summary
from softsyn.frontends.hf_common import brief
from softsyn.frontends.materialize import FILLED, materialize

BLOCKS = ("vision", "embedding", "decoder")
BLOCK_FILES = {"vision": "vision.onnx", "embedding": "embedding.onnx", "decoder": "model.onnx"}
DEFAULT_IMAGE = (448, 448)  # width, height
_SIZE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*$")


@dataclass(frozen=True)
class ImageGrid:
    """The patch grid an image of width x height becomes (Qwen2-VL's smart_resize to multiples of patch*merge)."""

    width: int
    height: int
    patch: int
    merge: int
    temporal: int = 1  # a still image is one temporal patch (its frame repeated temporal_patch_size times)

    @property
    def resized(self) -> tuple[int, int]:
        factor = self.patch * self.merge
        return (max(factor, round(self.width / factor) * factor), max(factor, round(self.height / factor) * factor))

    @property
    def thw(self) -> tuple[int, int, int]:
        w, h = self.resized
        return (self.temporal, h // self.patch, w // self.patch)

    @property
    def patches(self) -> int:
        return math.prod(self.thw)

    @property
    def tokens(self) -> int:
        """LLM tokens one image adds: its patches after the merger folds merge x merge of them into one."""
        return self.patches // (self.merge * self.merge)

    def describe(self) -> str:
        t, h, w = self.thw
        rw, rh = self.resized
        return (f"{self.width}x{self.height} image -> {rw}x{rh} -> grid {t}x{h}x{w} = {self.patches} patches "
                f"-> {self.tokens} tokens")


def parse_image_size(text: str, where: str = "image") -> tuple[int, int]:
    """'448x448' -> (448, 448); width first, as the guides write it."""
    m = _SIZE.match(str(text))
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise SoftsynError(f"{where}: {text!r} is not an image size; write WIDTHxHEIGHT, e.g. 448x448 or 1280x720")
    return int(m.group(1)), int(m.group(2))


def grid_for(cfg, size: tuple[int, int]) -> ImageGrid:
    v = cfg.vision_config
    return ImageGrid(size[0], size[1], v.patch_size, v.spatial_merge_size)


def is_vlm(cfg) -> bool:
    return getattr(cfg, "model_type", "") == "qwen3_vl"


def _prefix(p: onnx.ModelProto, block: str, boundary: set[str]) -> None:
    """Every internal name and every node's hierarchy of block `block` prefixed with the block's name (its ports,
    the names in `boundary`, kept): the blocks' names cannot collide once joined."""
    def local(n: str) -> str:
        return n if not n or n in boundary else f"{block}.{n}"

    for init in p.graph.initializer:
        init.name = local(init.name)
    for vi in p.graph.value_info:
        vi.name = local(vi.name)
    for node in p.graph.node:
        node.name = local(node.name)
        node.input[:] = [local(n) for n in node.input]
        node.output[:] = [local(n) for n in node.output]
        scope = next((e.value for e in node.metadata_props if e.key == HIERARCHY_KEY), None)
        if scope is None:  # a node of the block's own module (no submodule scope) is still the block's
            node.metadata_props.add(key=HIERARCHY_KEY, value=block)
        for e in node.metadata_props:
            if e.key == HIERARCHY_KEY:
                e.value = f"{block}.{scope}" if scope else block


def _merge(protos: dict[str, onnx.ModelProto], name: str) -> tuple[onnx.ModelProto, list[dict]]:
    """One graph of the blocks (in the order given, names already distinct), joined by port name: a block's
    outputs are the next blocks' inputs; the last block's outputs are the graph's."""
    graph = onnx.GraphProto(name=name)
    produced: set[str] = set()
    opsets: dict[str, int] = {}
    info = []
    last = list(protos)[-1]
    for block, p in protos.items():
        for op in p.opset_import:
            opsets[op.domain] = max(opsets.get(op.domain, 0), op.version)
        graph.input.extend(i for i in p.graph.input if i.name not in produced)
        graph.initializer.extend(p.graph.initializer)
        graph.value_info.extend(p.graph.value_info)
        graph.node.extend(p.graph.node)
        outputs = [o.name for o in p.graph.output]
        produced |= set(outputs)
        (graph.output if block == last else graph.value_info).extend(p.graph.output)
        info.append({"name": block, "file": BLOCK_FILES[block], "inputs": [i.name for i in p.graph.input],
                     "outputs": outputs})
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()])
    model.ir_version = protos[last].ir_version
    return model, info


def join_blocks(blocks: dict[str, ir.Model], name: str) -> tuple[ir.Model, list[dict]]:
    """One graph of the blocks, joined by port name; every internal name and every node's hierarchy starts with
    its block's name. Returns the model and the blocks' boundaries (name, file, inputs, outputs)."""
    protos = {b: ir.serde.serialize_model(blocks[b]) for b in BLOCKS}
    boundary = set().union(*({i.name for i in p.graph.input} | {o.name for o in p.graph.output}
                             for p in protos.values()))
    for block, p in protos.items():
        _prefix(p, block, boundary)
    model, info = _merge(protos, name)
    _name_image_dims(model.graph)
    return ir.serde.deserialize_model(model), info


def rejoin(folder: Path, blocks: list[dict]) -> Netlist:
    """A compiled composite's block files (`blocks`: runtime/session.json's) joined back into the netlist compile
    timed: emit cut them out with the joined graph's names and its softsyn description, so nothing is renamed;
    the weights stay in the block files' data (read lazily)."""
    protos = {}
    for b in blocks:
        path = Path(folder) / b["file"]
        try:
            protos[b["name"]] = onnx.load(str(path), load_external_data=False)
        except Exception as exc:  # protobuf and onnx raise many types for a file that is not a valid model
            raise SoftsynError(f"{path}: block {b['name']} is not a readable ONNX model ({type(exc).__name__}: "
                               f"{' '.join(str(exc).split())[:200]}); re-run softsyn compile") from None
    last = protos[blocks[-1]["name"]]
    model, _ = _merge(protos, last.graph.name.rsplit(".", 1)[0])
    model.metadata_props.extend(last.metadata_props)  # the netlist's description (blocks, image, config)
    joined = ir.serde.deserialize_model(model)
    ir.external_data.set_base_dir(joined.graph, Path(folder))
    return Netlist.from_model(joined)


def _name_image_dims(graph) -> None:
    """The exporter's own symbol for the image count (`196*s92` on image_features) becomes `images` everywhere."""
    feats = next(v for v in graph.value_info if v.name == "image_features")
    expr = feats.type.tensor_type.shape.dim[0].dim_param
    symbols = set(re.findall(r"[A-Za-z_]\w*", expr)) - {"images"}
    if not symbols:
        return
    pattern = re.compile(r"\b(" + "|".join(sorted(symbols)) + r")\b")
    for v in list(graph.input) + list(graph.output) + list(graph.value_info):
        for d in v.type.tensor_type.shape.dim:
            if d.dim_param:
                d.dim_param = pattern.sub("images", d.dim_param)


def traced_layers(cfg) -> int | None:
    """Decoder layers to trace for a weightless export that copies the last of them to the config's depth, or None
    when every layer is traced: the first len(deepstack) layers add DeepStack features after them (their successor
    reads that sum, not a layer's output), so the template is the second plain layer after them."""
    text = cfg.text_config
    traced = len(cfg.vision_config.deepstack_visual_indexes or []) + _replicate.EXPORTED
    if text.num_hidden_layers <= traced or not _replicate.homogeneous(text):
        return None
    return traced


def _with_layers(cfg, layers: int):
    """A copy of the Qwen3-VL config `cfg` whose text decoder has `layers` layers."""
    traced = copy.deepcopy(cfg)
    traced.text_config.num_hidden_layers = layers
    if getattr(traced.text_config, "layer_types", None):
        traced.text_config.layer_types = traced.text_config.layer_types[:layers]
    return traced


def _torch_side():
    """softsyn.frontends.vlm_export (the torch side of a vision-language read), imported on first use."""
    # deferred: torch and transformers take seconds to import; only reading a Hugging Face model needs them
    from softsyn.frontends import vlm_export

    return vlm_export


def _weights(cfg, source: str, weights: str | None, materialize: bool) -> str:
    """random | meta | filled: `weights` None is decided by the parameter count (meta above the frontends'
    materialise limit); `materialize` turns a weightless read into one with seeded weights filled in."""
    if weights is None:
        count = _torch_side().parameter_count(cfg, source)
        weights = "meta" if count * 4 > MATERIALISE_LIMIT else "random"
    return "filled" if materialize and weights == "meta" else weights


def _fill(blocks: dict[str, ir.Model], model, cfg, grid) -> None:
    """Seeded weights in each weightless block (softsyn.frontends.materialize: by initializer name, then the
    exporter's optimizer), block by block so no rewrite crosses a block's ports; the vision tower's grid constants
    (position resampling, rotary cos/sin) get their exact values, not seeded ones."""
    exact = _torch_side().grid_constants(model.model.visual, grid)
    for block in blocks.values():
        for key, value in exact.items():
            init = block.graph.initializers.get(key)
            if init is not None:
                init.const_value = ir.Tensor(value.numpy().astype(init.dtype.numpy()), name=key)
        materialize(block, cfg.text_config)  # the text config: its rope theta is the decoder's inv_freq


def _blocks(cfg, name: str, source: str, grid, plan: dict) -> tuple[dict, int, int | None]:
    """The three blocks of `cfg` (plan: weights, dtype, traced layers or None): (blocks, parameters, layer
    copies or None). A filled read exports weightless, then fills (`_fill`)."""
    weights, traced = plan["weights"], plan["traced"]
    model = _torch_side().build_model(_with_layers(cfg, traced) if traced else cfg, source,
                                      weights="meta" if weights == "filled" else weights, dtype=plan["dtype"])
    parameters = _torch_side().parameter_count(cfg, source) if traced else sum(p.numel() for p in model.parameters())
    try:
        blocks = _torch_side().export_blocks(model, name, grid)
    except Exception as e:  # the exporter's failures are long and wrapped: the innermost cause says what
        raise SoftsynError(f"{source}: exporting {name} with {plan['exporter']} failed: {brief(e)}") from e
    copies = None
    if traced:
        try:
            copies = _replicate.replicate_layers(blocks["decoder"], cfg.text_config.num_hidden_layers)
        except _replicate.NotReplicable as e:
            raise SoftsynError(f"{source}: cannot replicate the decoder layers of {name}: {e}") from None
    if weights == "filled":
        _fill(blocks, model, cfg, grid)
    return blocks, parameters, copies


def load_vlm_design(cfg, name: str, source: str, cache_dir, progress: bool = True, weights: str | None = None,
                    dtype: str | None = None, image_size: tuple[int, int] | None = None, materialize: bool = False):
    """The composite netlist of a Qwen3-VL config at one image size (cached by content key, like every export).
    `weights` None: seeded random fp32 weights for a small model, a weightless fp16 export ("meta") above the
    frontends' materialise limit (a real-size config is planned, not run). `materialize`: a weightless read gets
    seeded weights filled into its export instead ("filled", as a real-size decoder does: runnable)."""
    weights = _weights(cfg, source, weights, materialize)
    dtype = dtype or ("float32" if weights == "random" else "float16")

    size = tuple(image_size or DEFAULT_IMAGE)
    grid = grid_for(cfg, size)
    exporter = f"{_export.DYNAMO}, blocks vision/embedding/decoder, fixed grid {'x'.join(map(str, grid.thw))}"
    traced = traced_layers(cfg) if weights != "random" else None
    layers = cfg.text_config.num_hidden_layers
    if traced:
        exporter += f", decoder layers {traced} exported then replicated to {layers}"
    key = _cache.content_key({"config": cfg.to_dict(), "kind": "vlm", "exporter": exporter, "opset": _export.OPSET,
                              "weights": weights, "dtype": dtype, "frontend": _cache.FRONTEND_VERSION,
                              "versions": _cache.versions()})
    entry = _cache.entry_dir(cache_dir, f"{name}-{size[0]}x{size[1]}", key)
    with _cache.exporting(entry):  # another process exporting this entry: wait, then read it
        cached = _cache.load_entry(entry)
        if cached is not None:
            cached.provenance["cache"] = {"key": key, "path": str(entry), "hit": True}
            return cached
        t0 = time.perf_counter()
        if progress:
            seeded = " + seeded weights" * (weights == "filled")
            print(f"exporting {name} ({grid.describe()}) with {exporter}{seeded}...", end="", file=sys.stderr,
                  flush=True)
        _export.torch_num_threads()
        blocks, parameters, copies = _blocks(cfg, name, source, grid, {"weights": weights, "dtype": dtype,
                                                                       "traced": traced, "exporter": exporter})
        joined, info = join_blocks(blocks, name)
        del blocks
        t, h, w = grid.thw
        provenance = {
            "source": source, "exporter": exporter, "dtype": dtype, "versions": _cache.versions(),
            "weights": {"random": "random seed 0", "meta": "meta (not materialised)", "filled": FILLED}[weights],
            "export_seconds": round(time.perf_counter() - t0, 2), "scope_prefix": _export.SCOPE_PREFIX,
            "blocks": info,
            "image": {"size": list(size), "resized": list(grid.resized), "grid_thw": [t, h, w], "patches": grid.patches,
                      "tokens": grid.tokens, "patch_size": grid.patch, "spatial_merge_size": grid.merge,
                      "image_token_id": cfg.image_token_id,
                      "positions": "fixed per export: the grid's patch positions, rotary angles and resampled position "
                                   "table are constants; `images` (a dynamic dim) images of that grid per call"},
        }
        if traced:
            provenance["layers"] = (f"decoder: {traced} traced by torch.export (the first {traced - 2} add DeepStack "
                                    f"features), model.layers.{traced - 1} copied {copies} times to {layers} "
                                    "(softsyn.frontends.replicate); vision: every block traced")
        if weights == "meta":
            provenance["weights_location"] = _export.META_WEIGHTS + " (never written: shapes and dtypes only)"
        summary = config_summary(cfg.text_config, parameters)
        summary["vision"] = {k: getattr(cfg.vision_config, k) for k in ("depth", "hidden_size", "num_heads",
                                                                         "intermediate_size", "out_hidden_size")}
        nl = Netlist(joined, name=name, kind="vlm", provenance=provenance, config=summary,
                     derived_dims={"total": "past + seq", "image_tokens": f"{grid.tokens}*images"})
        nl = _cache.save_entry(nl, entry, progress)
        nl.provenance["cache"] = {"key": key, "path": str(entry), "hit": False}
        if progress:
            print(f" {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        return nl


def split_blocks(model: ir.Model, blocks: list[dict]) -> dict[str, ir.Model]:
    """The joined graph cut back into its blocks (after compile's passes): each block a clone of the graph (its
    weights shared, not copied: the 2B-wide composite's 2.7 GB took 72 s to serialise and copy) keeping the block's
    nodes (by hierarchy) and the initializers they read, its boundary ports typed as in the joined graph."""
    out = {}
    for b in blocks:
        clone = model.clone(deep_copy=True)
        g = clone.graph
        values = {v.name: v for v in g.inputs} | {v.name: v for n in g for v in n.outputs}
        missing = [p for p in b["inputs"] + b["outputs"] if p not in values or values[p].type is None]
        if missing:
            raise SoftsynError(f"design {model.graph.name}: block {b['name']}: port {', '.join(missing)} lost its "
                               "type in compile; cannot cut the block out")
        ports = {}
        for p in b["inputs"]:  # a port another block makes: a fresh input value in its place
            v = values[p]
            ports[p] = v if v.producer() is None else ir.Value(name=p, shape=v.shape, type=v.type)
            if ports[p] is not v:
                ir.convenience.replace_all_uses_with(v, ports[p])
        outputs = [values[p] for p in b["outputs"]]
        g.outputs.clear()
        for node in reversed(list(g)):
            if HIERARCHY_KEY not in node.metadata_props or \
                    node.metadata_props[HIERARCHY_KEY].split(".", 1)[0] != b["name"]:
                g.remove(node, safe=False)
        g.inputs.clear()
        g.inputs.extend(ports[p] for p in b["inputs"])
        g.outputs.extend(outputs)
        read = {id(v) for n in g for v in n.inputs}
        for name in [k for k, v in g.initializers.items() if id(v) not in read]:
            g.initializers.pop(name)
        g.name = f"{model.graph.name}.{b['name']}"
        out[b["name"]] = clone
    return out
