"""Vision-language composite (zoo:qwen3-vl-tiny): three blocks read as one netlist, the TTFT path crossing them,
compile + verify of every block, and the task path groups of constraints/vl-tasks.yaml."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from helpers import mlp
from paths import ROOT
from softsyn.cli import main
from softsyn.netlist import HIERARCHY_KEY

TASKS = ROOT / "constraints" / "vl-tasks.yaml"


@pytest.fixture(scope="session")
def vl_artifact(cache_dir, tmp_path_factory):
    """`softsyn compile zoo:qwen3-vl-tiny -c constraints/vl-tasks.yaml --effort low -o DIR`: DIR."""
    out = tmp_path_factory.mktemp("vl") / "out"
    result = CliRunner().invoke(main, ["compile", "zoo:qwen3-vl-tiny", "-c", str(TASKS), "--effort", "low", "-o",
                                       str(out), "--cache-dir", str(cache_dir), "-q"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return out


def test_blocks_compute_what_transformers_computes():
    """vision -> embedding -> decoder, as exported (fixed grid, DeepStack scattered by the embedding), give the
    logits of transformers' own Qwen3-VL forward on a prompt with an image."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    from softsyn.frontends import vlm, vlm_export, zoo

    cfg = zoo.make_config(zoo.ZOO["qwen3-vl-tiny"])
    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration(cfg).eval()
    grid = vlm.grid_for(cfg, (64, 96))
    assert grid.thw == (1, 6, 4) and grid.tokens == 6
    mods = vlm_export.reference_modules(model, grid)
    pixels = torch.randn(grid.patches, 3 * 2 * 16 * 16)
    ids = torch.randint(0, cfg.image_token_id, (1, 12))
    ids[0, 2:2 + grid.tokens] = cfg.image_token_id
    pos = torch.arange(12).view(1, 1, 12).expand(3, 1, 12)
    with torch.no_grad():
        ref = model(input_ids=ids, pixel_values=pixels, image_grid_thw=torch.tensor([grid.thw]), position_ids=pos,
                    use_cache=False).logits
        features, deepstack = mods["vision"](pixels)
        embeds, deepstack_embeds = mods["embedding"](ids, features, deepstack)
        empty = [torch.zeros(1, 2, 0, 32) for _ in range(4)]
        logits = mods["decoder"](embeds, torch.ones(1, 12, dtype=torch.long), pos, deepstack_embeds, *empty)[0]
    assert deepstack.shape == (1, grid.tokens, 128) and deepstack_embeds.shape == (1, 1, 12, 128)
    assert torch.allclose(logits, ref, atol=1e-5)


def test_ttft_path_crosses_the_blocks(vl_artifact):
    analysis = json.loads((vl_artifact / "analysis.json").read_text())
    groups = {g["name"]: g for g in analysis["groups"]}
    assert list(groups) == ["ocr_tasks", "gui_agent", "math_reasoning"]
    ocr = groups["ocr_tasks"]
    assert ocr["scenario"]["dims"] == {"batch": 4, "seq": 64 + 196, "past": 0, "images": 4}
    path = ocr["paths"][0]
    assert path["startpoint"] == "pixel_values" and path["endpoint"] == "logits"
    assert path["input_delay"] == pytest.approx(0.1)  # the image's preprocessing
    tops = [p["hierarchy"].split(".")[0] for p in path["points"] if p["op_type"] != "Run"]
    order = [t for i, t in enumerate(tops) if i == 0 or tops[i - 1] != t]
    assert order == ["vision", "embedding", "decoder"], order
    assert any(p["hierarchy"].startswith("vision.blocks.") for p in path["points"])
    assert any(p["hierarchy"].startswith("vision.merger") for p in path["points"])
    # the text embedding and the decoder's rotary tables ran while the vision encoder did: off the critical path
    assert not any(p["hierarchy"] in ("embedding.embed_tokens", "decoder.model.rotary_emb") for p in path["points"])
    # the text-only group runs no vision: fewer cells, a path from the text ports
    math = groups["math_reasoning"]
    assert math["cell_count"] < ocr["cell_count"]
    assert not any(p["hierarchy"].startswith("vision") for p in math["paths"][0]["points"])
    assert math["paths"][0]["input_delay"] == pytest.approx(0.001)


def test_blocks_emitted_and_verified(vl_artifact):
    for name in ("vision.onnx", "embedding.onnx", "model.onnx"):
        assert (vl_artifact / name).is_file(), name
    session = json.loads((vl_artifact / "runtime" / "session.json").read_text())
    assert [b["name"] for b in session["blocks"]] == ["vision", "embedding", "decoder"]
    assert session["blocks"][1]["inputs"] == ["input_ids", "image_features", "deepstack_features"]
    genai = json.loads((vl_artifact / "genai_config.json").read_text())["model"]
    assert genai["vision"]["filename"] == "vision.onnx" and genai["embedding"]["filename"] == "embedding.onnx"
    assert genai["embedding"]["outputs"] == {"embeddings": "inputs_embeds"}
    assert genai["decoder"]["filename"] == "model.onnx" and genai["decoder"]["inputs"]["embeddings"] == "inputs_embeds"
    assert "input_ids" not in genai["decoder"]["inputs"]
    result = CliRunner().invoke(main, ["verify", str(vl_artifact)])
    assert result.exit_code == 0, result.output
    assert "ocr_tasks  logits" in result.output and "math_reasoning logits" in result.output


def test_qor_blocks_and_limiting_group(vl_artifact):
    result = CliRunner().invoke(main, ["report", "qor", str(vl_artifact)])
    assert result.exit_code == 0, result.output
    for group in ("ocr_tasks", "gui_agent", "math_reasoning"):
        assert f"Timing Path Group '{group}'" in result.output
    analysis = json.loads((vl_artifact / "analysis.json").read_text())
    weighted = {g["name"]: (g["paths"][0]["slack"] / g["weight"] if g["paths"][0]["slack"] >= 0
                            else g["paths"][0]["slack"] * g["weight"]) for g in analysis["groups"]}
    assert f"Limiting group: {min(weighted, key=weighted.get)} (weighted slack" in result.output


def test_task_group_batch_on_a_gpu_target_compiles_checker_clean(cache_dir, tmp_path):
    """vl-tasks.yaml (ocr_tasks at batch 4) on h200-ort-cuda, where the vision blocks' residual + LayerNorm fuse into
    SkipLayerNormalization whose sum DeepStack's merger reads: the fused node once went after that reader, and
    compile exited 2 with "fails onnx.checker: Nodes in a graph must be topologically sorted"."""
    import onnx

    constraints = tmp_path / "vl-tasks-h200.yaml"
    constraints.write_text(TASKS.read_text().replace("target: cpu-ort", "target: h200-ort-cuda"))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["compile", "zoo:qwen3-vl-tiny", "-c", str(constraints), "--effort", "low",
                                       "-o", str(out), "--cache-dir", str(cache_dir), "-q"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    vision = onnx.load(str(out / "vision.onnx"), load_external_data=False)
    skips = [n for n in vision.graph.node if n.op_type == "SkipLayerNormalization"]
    onnx.checker.check_model(str(out / "vision.onnx"))
    merger = [n for n in vision.graph.node
              if "deepstack" in next((e.value for e in n.metadata_props if e.key == HIERARCHY_KEY), "")]
    assert skips and any(set(s.output[3:]) & {i for m in merger for i in m.input} for s in skips)
    assert json.loads((out / "analysis.json").read_text())["groups"][0]["scenario"]["dims"]["batch"] == 4


@pytest.mark.parametrize("text, why", [
    ("path_groups:\n  a: {image: 448by448}\n", "path_groups.a.image: '448by448' is not an image size"),
    ("path_groups:\n  a: {image: 448x448}\n  b: {image: 1280x720}\n", "one image size per constraints file"),
])
def test_bad_image_groups(tmp_path, cache_dir, capsys, text, why, model="zoo:qwen3-vl-tiny"):
    from softsyn.cli import run

    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exc:
        run(["analyze", model, "-c", str(path), "--cache-dir", str(cache_dir), "-o", str(tmp_path / "o"), "-q"])
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert why in err and len(err.strip().splitlines()) == 1, err


def test_run_refuses_a_composite(vl_artifact, capsys):
    from softsyn.cli import run

    with pytest.raises(SystemExit) as exc:
        run(["run", str(vl_artifact), "--prompt-len", "4", "--gen", "2"])
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert "vision-language composite" in err and len(err.strip().splitlines()) == 1, err


def test_signoff_times_each_group_on_its_blocks(vl_artifact, capsys):
    """signoff of the composite: an image task timed as one call of vision, embedding and decoder, a text-only task
    as embedding and decoder, each compared with the cells of those blocks only (the joined netlist's names)."""
    from softsyn.cli import run

    with pytest.raises(SystemExit) as exc:  # 1 where this machine misses a clock: the report is written either way
        run(["signoff", str(vl_artifact), "--runs", "1", "--warmup", "1", "--profile-runs", "1", "--group",
             "gui_agent", "--group", "math_reasoning", "-q", "--json"])
    out = capsys.readouterr().out
    assert exc.value.code in (0, 1), out
    result = json.loads(out)
    groups = {g["name"]: g for g in result["groups"]}

    def blocks(group):
        return {c["instance"].split("/")[0].split(".")[0] for c in group["cells"] if c["op_type"] != "Run"}

    assert blocks(groups["gui_agent"]) == {"vision", "embedding", "decoder"}
    assert blocks(groups["math_reasoning"]) == {"embedding", "decoder"}
    for g in groups.values():
        assert g["predicted"] > 0 and g["measured_median"] > 0 and g["counts"]["exact"] > 0
    assert groups["math_reasoning"]["measured_median"] < groups["gui_agent"]["measured_median"]  # no vision run
    assert any(n.startswith("a composite: each group's step is one call of each block") for n in result["notes"])


def test_image_group_on_a_text_model(tmp_path, cache_dir, capsys):

    model = mlp(tmp_path / "mlp.onnx")
    test_bad_image_groups(tmp_path, cache_dir, capsys, "path_groups:\n  a: {image: 448x448}\n",
                          "path_groups.a.image: design mlp has no vision block", model=str(model))
