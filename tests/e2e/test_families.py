"""Plain ONNX files of other architectures (tests/families.py) analyse with a guide-style constraints file:
the exporter's dims are bound by role, and a decoder exported without a KV cache gets a prefill group."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from families import DECODERS, FAMILIES, export_family
from helpers import fusion_report
from softsyn.cli import main

GUIDE = """\
clock_period: 2000ms
input_delay:
  image: 100ms
  text: 10ms
output_delay: 50ms
area_constraint: 80GB
workload:
  batch: 2
  prompt_len: 24
"""


@pytest.fixture(scope="session")
def family_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("families")


@pytest.fixture(scope="session")
def guide(tmp_path_factory):
    path = tmp_path_factory.mktemp("guide") / "guide.yaml"
    path.write_text(GUIDE)
    return path


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_plain_export_analyses_with_guide_constraints(family, family_dir, guide, tmp_path):
    model = export_family(family, family_dir)
    out = tmp_path / "an"
    result = CliRunner().invoke(main, ["analyze", str(model), "-c", str(guide), "-o", str(out)])
    assert result.exit_code == 0, result.output
    analysis = json.loads((out / "analysis.json").read_text())
    groups = {g["name"]: g for g in analysis["groups"]}
    expected = "prefill" if family in DECODERS else "encoder"
    assert list(groups) == [expected]
    dims = groups[expected]["scenario"]["dims"]
    assert dims["batch"] == 2
    if FAMILIES[family][3] == "tokens":
        assert dims["seq"] == 24  # the workload's prompt_len reached the exporter's s70
    renamed = analysis["provenance"]["dims"]
    assert set(renamed.values()) <= {"batch", "seq"} and "batch" in renamed.values()


def test_a_dim_no_port_explains_is_named_with_the_roles(tmp_path):
    """Dims of a port softsyn does not know keep their names (no guess), and the error names them with the roles."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("features", TensorProto.FLOAT, ["n", "k"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "k"])
    g = helper.make_graph([helper.make_node("Relu", ["features"], ["y"])], "g", [x], [y])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    proc = subprocess.run([sys.executable, "-m", "softsyn.cli", "analyze", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and "dims k, n have no role" in line and "roles: batch, seq, past" in line


def test_seeded_token_ids_stay_inside_a_plain_file_s_embedding(family_dir):
    """A plain file records no vocab size: ids are drawn below the embedding table they index (through views)."""
    from softsyn.frontends import read_design
    from softsyn.runtime.inputs import scenario_inputs

    nl = read_design(str(export_family("gpt2", family_dir)), progress=False)
    ids = scenario_inputs(nl, {"batch": 2, "seq": 64})["input_ids"]
    assert ids.max() < FAMILIES["gpt2"][1]["vocab_size"] and ids.max() > 256


# ---------------------------------------------------------------- CI guards: the families compile fused and verify
LAYERS = 2  # every family in tests/families.py
NORMS = ("rms_norm", "skip_rms_norm", "layer_norm", "skip_layer_norm")
GELU = {"gpt2": 2, "bert": 2, "vit": 2, "gemma2": 2}  # MLP GELUs (tanh form in GPT-2 and Gemma, ONNX
# Gelu in BERT/ViT); the others are SiLU


SLIDING = "the Conv slides over a larger input"  # ViT's patch Conv2d over the whole image: patchify leaves it, said so


def check_coverage(kinds, misses, family):
    """Attention and GELU fused at every site; every norm site fused or kept by the library's delays; ViT's patch
    Conv (over the whole image, not one patch) a patch_embed miss with its reason."""
    assert kinds["attention"] == (LAYERS, LAYERS), misses
    assert kinds["gelu"] == (GELU.get(family, 0),) * 2, misses
    assert sum(kinds[k][0] for k in NORMS) > 0
    assert kinds["patch_embed"] == ((1, 0) if family == "vit" else (0, 0)), misses
    for kind, site, reason in [m for m in misses if m[0] != "patch_embed" or SLIDING not in m[2]]:
        assert kind in NORMS + ("packed_qkv", "gate_up") and reason.startswith("kept: ") and " tabled " in reason, \
            (kind, site, reason)
    for k in NORMS:
        kept = sum(1 for kind, _, _ in misses if kind == k)
        assert kinds[k][1] + kept == kinds[k][0], (k, kinds[k], misses)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_plain_export_compiles_fused_for_the_cpu_and_verifies(family, family_dir, guide, tmp_path):
    model = export_family(family, family_dir)
    out = tmp_path / "compiled"
    result = CliRunner().invoke(main, ["compile", str(model), "-c", str(guide), "--effort", "low", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    kinds, misses = fusion_report(out / "reports" / "fusion.rpt")
    check_coverage(kinds, misses, family)
    # cpu-ort times SkipLayerNormalization slower than the LayerNormalization + Add it would replace: kept, said so
    if family in ("gpt2", "bert", "vit"):
        assert {kind for kind, _, _ in misses} == {"skip_layer_norm"} | ({"patch_embed"} if family == "vit" else set())
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines() if line.strip().startswith(("prefill", "encoder"))]
    assert rows and all(r[-1] == "MET" for r in rows)
    if family in DECODERS:  # the LM head's output is named `linear` in a plain export (Gemma 2: `mul_N`, after its
        # final soft cap): still logits, top-1 checked
        name = "mul" if family == "gemma2" else "linear"
        assert len(rows) == 1 and rows[0][1].startswith(name) and rows[0][-3] == "1.0000", result.output


def _run_ort(path, feeds):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_plain_export_fused_for_cuda_runs_on_the_cpu_and_matches(family, family_dir, guide, tmp_path):
    """The netlist fused for the H200 library (before the fp16 precision pass): all of it fused, and ORT's CPU
    provider runs it (GQA without a past, MHA, the skip norms, Fast/BiasGelu) equal to the export."""
    import numpy as np
    import onnx_ir as ir

    import passes
    from softsyn.design import Design

    model = export_family(family, family_dir)
    design = Design.load(str(model), guide, target="h200-ort-cuda", progress=False)
    passes.run_pass(design, "flatten")
    passes.run_pass(design, "fuse")
    coverage = design.pass_reports["fuse"]
    kinds = {c.kind: (c.candidates, c.fused) for c in coverage}
    misses = [(c.kind, m.site, m.reason) for c in coverage for m in c.misses]
    check_coverage(kinds, misses, family)
    assert not [m for m in misses if m[0] != "patch_embed"]  # launch-bound on the H200: every fused cell wins
    ops = {n.op_type for n in design.netlist.nodes()}
    assert "Softmax" not in ops and ("GroupQueryAttention" in ops) == (family in DECODERS)
    ir.save(design.netlist.model, str(tmp_path / "fused.onnx"))
    rng = np.random.default_rng(0)
    for batch, seq in ((2, 7), (1, 13)):
        if FAMILIES[family][3] == "image":
            feeds = {"pixel_values": rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)}
        else:
            feeds = {"input_ids": rng.integers(0, 512, (batch, seq)).astype(np.int64)}
        for want, got in zip(_run_ort(model, feeds), _run_ort(tmp_path / "fused.onnx", feeds)):
            rel = np.abs(want - got).max() / (np.abs(want).max() + 1e-12)
            assert rel < 1e-4, (family, batch, seq, rel)
