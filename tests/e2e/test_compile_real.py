"""The real-size path from the CLI, at a size CI can run: a model with no weights of its own (an HF config.json,
forced past the size at which softsyn builds models in torch) is compiled with seeded weights filled into its
weightless export, or, with --plan, compiled weightless: same fusion, no model.onnx."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from softsyn.frontends.zoo import ZOO

CONFIG = dict(ZOO["qwen3-tiny"].config, model_type="qwen3", architectures=["Qwen3ForCausalLM"])
CPU = "target: cpu-ort\nworkload: {batch: 1, prompt_len: 16, context_len: 32}\n"


def cli(*args, env_extra=None, cache_dir=None):
    import os

    env = dict(os.environ, SOFTSYN_MATERIALISE_LIMIT="0", **(env_extra or {}))  # every config counts as real-size
    if cache_dir is not None:
        env["SOFTSYN_CACHE"] = str(cache_dir)
    return subprocess.run([sys.executable, "-m", "softsyn.cli", *args], capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def config_json(tmp_path_factory):
    root = tmp_path_factory.mktemp("real")
    (root / "config.json").write_text(json.dumps(CONFIG))
    (root / "cpu.yaml").write_text(CPU)
    return root


@pytest.fixture(scope="module")
def compiled(config_json, cache_dir):
    out = config_json / "out"
    proc = cli("compile", str(config_json / "config.json"), "-c", str(config_json / "cpu.yaml"), "-o", str(out),
               cache_dir=cache_dir)
    return proc, out


@pytest.fixture(scope="module")
def planned(config_json, cache_dir):
    out = config_json / "plan"
    proc = cli("compile", str(config_json / "config.json"), "-c", str(config_json / "cpu.yaml"), "--plan",
               "-o", str(out), cache_dir=cache_dir)
    return proc, out


def coverage(out):
    text = (out / "reports" / "fusion.rpt").read_text()
    return [line for line in text.splitlines() if line.endswith(("Split", "Normalization", "Embedding")) or "Attention" in line]


def test_a_model_without_weights_compiles_with_seeded_weights_and_verifies(compiled, cache_dir):
    proc, out = compiled
    assert proc.returncode in (0, 1), proc.stderr
    assert "has no weights of its own: compiling it with seeded random weights" in proc.stderr
    assert (out / "model.onnx").is_file() and (out / "model.onnx.data").is_file()
    verify = cli("verify", str(out), cache_dir=cache_dir)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_plan_writes_the_fused_design_without_a_model(planned, compiled, cache_dir):
    proc, out = planned
    assert proc.returncode in (0, 1), proc.stderr
    assert not (out / "model.onnx").exists() and not (out / "model.onnx.data").exists()
    session = json.loads((out / "runtime" / "session.json").read_text())
    assert session["plan"] is True and session["model"] is None
    assert (out / "netlist.json").is_file() and (out / "reports" / "timing.rpt").is_file()
    assert coverage(out) == coverage(compiled[1])  # the plan fuses what the materialised compile fuses
    cells = {c["op"] for c in json.loads((out / "netlist.json").read_text())["cells"]}
    assert {"RotaryEmbedding", "SimplifiedLayerNormalization"} <= cells or "GroupQueryAttention" in cells
    verify = cli("verify", str(out), cache_dir=cache_dir)
    assert verify.returncode == 2 and "weightless plan" in verify.stderr
    # constant folding cannot read a plan's weights: expected, so not one warning line per weight
    assert "Evaluation failed" not in proc.stderr and "External data for value" not in proc.stderr, proc.stderr[:400]


def test_a_cuda_artifact_with_absorbed_qk_norms_verifies_on_the_cpu(tmp_path, cache_dir):
    """GQA with Qwen3's q/k norms absorbed runs on CUDA only; verify checks it here through its CPU view."""
    (tmp_path / "gpu.yaml").write_text("target: h200-ort-cuda\nworkload: {batch: 1, prompt_len: 16, context_len: 32}\n"
                                       "accuracy: {max_rel_error: 2%}\n")
    out = tmp_path / "out"
    # effort low: fuse absorbs the norms; medium's precision map (its CPU-view sensitivities: test_sensitivity.py) adds
    # nothing this test reads
    proc = cli("compile", "zoo:qwen3-tiny", "-c", str(tmp_path / "gpu.yaml"), "--effort", "low", "-o", str(out),
               cache_dir=cache_dir)
    assert proc.returncode in (0, 1), proc.stderr
    import onnx

    gqa = [n for n in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node
           if n.op_type == "GroupQueryAttention"]
    assert gqa and all(len(n.input) > 15 and n.input[14] for n in gqa)  # q/k norms absorbed
    verify = cli("verify", str(out), cache_dir=cache_dir)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert f"CPU view: q/k norms run outside {len(gqa)} GroupQueryAttention nodes" in verify.stdout
    assert not list(out.glob(".cpu-view-*"))
