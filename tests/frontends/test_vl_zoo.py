"""Qwen3-VL at real size (zoo:qwen3-vl-2b/4b/8b): the published shapes on the meta device, the weightless composite
whose decoder layers are replicated from a traced few, and image-task path groups (images by default, per-group
batch, images per sequence, the vision encoder alone)."""
from __future__ import annotations

import collections
import json

import pytest

from softsyn.constraints import parse_constraints
from softsyn.constraints.model import ConstraintsError
from softsyn.design import Design
from softsyn.errors import SoftsynError
from softsyn.frontends import read_design, vlm, zoo
from softsyn.library import load_library
from softsyn.netlist import HIERARCHY_KEY
from softsyn.netlist.keys import META_WEIGHTS
from softsyn.runtime.inputs import scenario_inputs

# Parameters of the published checkpoints: Qwen3-VL-8B-Instruct's 8.77B (LM Studio's card, quoted in
# EduardoNicacio/LLMBenchmark qwen3-VL-8b/readme.md) within 0.5 %; for the 2B and 4B no exact count was found in a
# source, so only the size their names give (rounded to whole billions)
PUBLISHED = {"qwen3-vl-2b": (2e9, 0.25), "qwen3-vl-4b": (4e9, 0.125), "qwen3-vl-8b": (8.77e9, 0.005)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_real_size_entries_build_on_the_meta_device(name):
    """Each entry builds transformers' Qwen3VLForConditionalGeneration on the meta device with as many parameters
    as the published checkpoint, and is planned weightless with its decoder replicated from 5 traced layers."""
    from softsyn.frontends.vlm_export import parameter_count

    entry = zoo.ZOO[name]
    assert entry.weights == "meta" and entry.dtype == "float16" and entry.model_type == "qwen3_vl"
    cfg = zoo.make_config(entry)
    size, rel = PUBLISHED[name]
    assert parameter_count(cfg, name) == pytest.approx(size, rel=rel)
    assert cfg.text_config.rope_scaling["mrope_section"] == [24, 20, 20]
    assert sum(cfg.text_config.rope_scaling["mrope_section"]) == cfg.text_config.head_dim // 2
    assert cfg.vision_config.out_hidden_size == cfg.text_config.hidden_size
    assert vlm.traced_layers(cfg) == len(cfg.vision_config.deepstack_visual_indexes) + 2 == 5


def test_reduced_entry_keeps_the_2b_widths():
    """zoo:qwen3-vl-2b-reduced: the 2B's config with 4 text layers and 4 vision blocks, its 3 DeepStack taps moved
    in order into the shorter tower; a reduction that cannot keep them apart is refused."""
    full, reduced = zoo.ZOO["qwen3-vl-2b"], zoo.ZOO["qwen3-vl-2b-reduced"]
    text, vision = dict(reduced.config["text_config"]), dict(reduced.config["vision_config"])
    assert (text.pop("num_hidden_layers"), vision.pop("depth"), vision.pop("deepstack_visual_indexes")) == (4, 4,
                                                                                                           [0, 1, 2])
    assert {k: v for k, v in full.config["text_config"].items() if k != "num_hidden_layers"} == text
    assert {k: v for k, v in full.config["vision_config"].items()
            if k not in ("depth", "deepstack_visual_indexes")} == vision
    assert (reduced.weights, reduced.dtype, reduced.model_type) == (full.weights, full.dtype, full.model_type)
    assert "4 of its 28 layers x 2048" in reduced.description and "4 of its 24 blocks x 1024" in reduced.description
    with pytest.raises(ValueError, match="cannot keep its 3 DeepStack taps apart"):
        zoo.reduced(full, text_layers=4, vision_blocks=2)


def _layer_ops(netlist) -> dict[int, collections.Counter]:
    ops: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for node in netlist.model.graph:
        parts = node.metadata_props.get(HIERARCHY_KEY, "").split(".")
        if parts[:3] == ["decoder", "model", "layers"]:
            ops[int(parts[3])][node.op_type] += 1
    return ops


@pytest.fixture(scope="module")
def replicated(tmp_path_factory, cache_dir):
    """A tiny Qwen3-VL (DeepStack after vision block 0, 4 text layers) exported weightless, as a real-size config
    is: 3 decoder layers traced, the last copied once; then given seeded weights, as a compile does (materialize)."""
    entry = zoo.ZOO["qwen3-vl-tiny"]
    config = json.loads(json.dumps(entry.config))
    config["text_config"]["num_hidden_layers"] = 4
    folder = tmp_path_factory.mktemp("vl4")
    cfg = zoo.make_config(zoo.ZooEntry("vl4", "", "qwen3_vl", config))
    (folder / "config.json").write_text(cfg.to_json_string())
    nl = vlm.load_vlm_design(cfg, "vl4", str(folder), cache_dir, progress=False, weights="meta", dtype="float16",
                             image_size=(64, 64), materialize=True)
    return nl


def test_filled_composite_has_seeded_weights_and_exact_grid_constants(replicated):
    """Every weight of the filled composite has data (none left on the meta device), and the vision tower's grid
    constants are the ones transformers computes for the grid, not seeded noise."""
    import numpy as np
    import onnx_ir as ir

    from softsyn.frontends import vlm_export
    from softsyn.frontends.materialize import FILLED

    assert replicated.provenance["weights"] == FILLED and "weights_location" not in replicated.provenance
    inits = replicated.model.graph.initializers
    assert not [v.name for v in inits.values() if isinstance(v.const_value, ir.ExternalTensor)
                and v.const_value.location == META_WEIGHTS]
    cfg = zoo.make_config(zoo.ZOO["qwen3-vl-tiny"])
    model = vlm_export.build_model(cfg, "t", weights="meta", dtype="float16")
    exact = vlm_export.grid_constants(model.model.visual, vlm.grid_for(cfg, (64, 64)))
    # the optimizer folds them into what reads them (the rotary tables into their broadcast views): found by value
    folded = [v.const_value.numpy() for v in inits.values() if v.name.startswith("vision.")]
    for key in ("rope_cos", "rope_sin"):
        want = exact[key].numpy()
        assert any(a.size == want.size and np.allclose(a.reshape(want.shape), want) for a in folded), key


def test_replicated_decoder_has_every_layer(replicated):
    prov = replicated.provenance
    assert "decoder layers 3 exported then replicated to 4" in prov["exporter"]
    assert "copied 1 times to 4" in prov["layers"]
    ops = _layer_ops(replicated)
    assert sorted(ops) == [0, 1, 2, 3]
    assert ops[3] == ops[2] and ops[2] == ops[1]  # the copy is its template; layer 1 (after DeepStack's) is plain
    names = {v.name for v in replicated.model.graph.inputs} | {v.name for v in replicated.model.graph.outputs}
    assert {f"past_key_values.{i}.key" for i in range(4)} <= names and {f"present.{i}.value" for i in range(4)} <= names
    assert replicated.config["parameters"] > 0 and replicated.config["vision"]["depth"] == 2


GROUPS = """
target: h200-ort-cuda
workload: {batch: 1, prompt_len: 32, context_len: 64}
path_groups:
  ocr: {batch: 4, image_size: 64x64}
  gui_agent: {}
  math: {images: 2}
  chat: {images: 0}
  vision_encoder: {kind: encoder}
  decode: {kind: decode}
"""


def _design(netlist, text: str) -> Design:
    cons = parse_constraints(text, source="groups.yaml")
    return Design(netlist, cons, load_library(cons.target), progress=False)


def test_image_task_groups_carry_images_by_default(replicated):
    design = _design(replicated, GROUPS)
    groups = {g.name: g for g in design.groups}
    tokens = replicated.provenance["image"]["tokens"]  # 64x64 -> grid 1x4x4 -> 4 tokens
    dims = {name: g.scenario.dims for name, g in groups.items()}
    assert dims["ocr"]["batch"] == 4 and dims["ocr"]["images"] == 4 and dims["ocr"]["seq"] == 32 + tokens
    assert dims["gui_agent"]["images"] == 1 and dims["gui_agent"]["seq"] == 32 + tokens
    assert dims["math"]["images"] == 2 and dims["math"]["seq"] == 32 + 2 * tokens
    assert dims["chat"]["images"] == 0 and dims["chat"]["seq"] == 32
    assert dims["decode"]["images"] == 0 and dims["decode"]["seq"] == 1
    assert groups["ocr"].blocks == ["vision", "embedding", "decoder"] and groups["chat"].blocks == ["embedding",
                                                                                                       "decoder"]
    assert groups["vision_encoder"].blocks == ["vision"] and "pixel_values" in groups["vision_encoder"].inputs
    assert "input_ids" not in groups["vision_encoder"].inputs
    assert "(vision encoder only)" in groups["vision_encoder"].scenario.description
    ids = scenario_inputs(replicated, dims["math"])["input_ids"]
    assert int((ids == replicated.provenance["image"]["image_token_id"]).sum()) == 2 * tokens
    timings = {t.name: t for t in design.time()}
    assert timings["vision_encoder"].cell_count < timings["chat"].cell_count < timings["ocr"].cell_count
    assert timings["vision_encoder"].paths[0].startpoint == "pixel_values"
    assert timings["vision_encoder"].paths[0].input_delay == 0.0  # no image delay given in GROUPS


@pytest.mark.parametrize("text, why", [
    ("path_groups:\n  d: {kind: decode, images: 1}\n", "path_groups.d.images: 1: a decode step reads no image"),
    ("path_groups:\n  e: {kind: encoder, images: 0}\n", "path_groups.e.images: 0: an encoder group times the vision"),
])
def test_image_counts_a_group_cannot_have(replicated, text, why):
    with pytest.raises(SoftsynError, match=why):
        _design(replicated, "target: h200-ort-cuda\n" + text).groups


@pytest.mark.parametrize("text, why", [
    ("path_groups:\n  a: {images: 0, image_size: 448x448}\n", "path_groups.a.images: 0 with image_size given"),
    ("path_groups:\n  a: {image: 448x448, image_size: 448x448}\n", "give image_size or image"),
    ("path_groups:\n  a: {images: -1}\n", "path_groups.a.images: must be an integer >= 0"),
    ("path_groups:\n  a: {image_size: 448by448}\n", "path_groups.a.image_size: '448by448' is not an image size"),
])
def test_bad_image_keys(text, why):
    with pytest.raises(ConstraintsError, match=why):
        parse_constraints(text, source="c.yaml")


def test_image_keys_on_a_text_model(tmp_path):
    from helpers import mlp

    nl = read_design(str(mlp(tmp_path / "mlp.onnx")), progress=False)
    with pytest.raises(SoftsynError, match="path_groups.a.images: design mlp has no vision block"):
        _design(nl, "target: cpu-ort\npath_groups:\n  a: {images: 1}\n").groups


MIXED = """
target: cpu-ort
input_delay: {image: 100ms, text: 1ms}
workload: {batch: 1, prompt_len: 32, context_len: 64}
path_groups:
  enc: {kind: encoder, clock_period: 200ms}
  ocr: {batch: 3, images: 2, clock_period: 300ms, image_size: 256x256}
  chat: {images: 0, clock_period: 50ms}
  decode: {kind: decode, clock_period: 50ms}
"""


def test_groups_with_their_own_batch_and_images_compile_and_verify(tmp_path, cache_dir):
    """zoo:qwen3-vl-tiny with a vision-encoder group, an OCR group of batch 3 with 2 images per sequence, a text
    group and a decode step: compiled, its block files verified on every group's inputs (the OCR group's 6 images
    through vision.onnx, 2 x 64 placeholders per prompt); at 256x256, not the default 448x448, so verify reads its
    reference at the compile's image size."""
    from click.testing import CliRunner

    from softsyn.cli import main

    constraints = tmp_path / "mixed.yaml"
    constraints.write_text(MIXED)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["compile", "zoo:qwen3-vl-tiny", "-c", str(constraints), "--effort", "low",
                                       "-o", str(out), "--cache-dir", str(cache_dir), "-q"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    groups = {g["name"]: g for g in json.loads((out / "analysis.json").read_text())["groups"]}
    assert groups["ocr"]["scenario"]["dims"] == {"batch": 3, "seq": 32 + 2 * 64, "past": 0, "images": 6}
    assert "2 images per sequence, each 256x256" in groups["ocr"]["scenario"]["description"]
    assert groups["enc"]["paths"][0]["endpoint"] in ("image_features", "deepstack_features")
    assert groups["enc"]["paths"][0]["input_delay"] == pytest.approx(0.1)
    assert groups["chat"]["scenario"]["dims"]["images"] == 0
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 0, result.output
    assert "ocr        logits" in result.output and "all 20 outputs within the accuracy budget" in result.output
