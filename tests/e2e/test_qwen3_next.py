"""zoo:qwen3-next-tiny decodes: the hybrid decoder (Gated DeltaNet linear attention + gated full attention + MoE)
exported with its whole cache as ports generates transformers' greedy tokens on ONNX Runtime's CPU provider, from
the export and from the compiled artifact (softsyn's loop and onnxruntime-genai's), and compile, verify and run
work on it with their documented exit codes."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
import torch
from click.testing import CliRunner

from helpers import cli
from paths import ROOT
from softsyn.cli import main
from softsyn.frontends import read_design, source_torch_model
from softsyn.runtime.decoder import decoder_io
from softsyn.runtime.generate import Generator, prompt_ids
from softsyn.runtime.session import open_model

NAME = "qwen3-next-tiny"
PROMPT, GEN = 8, 32


@pytest.fixture(scope="module")
def artifact(cache_dir, tmp_path_factory) -> Path:
    """`softsyn compile zoo:qwen3-next-tiny -c constraints/cpu-tiny.yaml -o DIR`: DIR, compiled once."""
    out = tmp_path_factory.mktemp("qwen3-next") / "out"
    result = CliRunner().invoke(main, ["compile", f"zoo:{NAME}", "-c", str(ROOT / "constraints" / "cpu-tiny.yaml"),
                                       "-o", str(out), "--cache-dir", str(cache_dir), "-q"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return out


@pytest.fixture(scope="module")
def prompt() -> np.ndarray:
    return prompt_ids(1024, PROMPT, seed=1)


@pytest.fixture(scope="module")
def reference_tokens(prompt) -> list[int]:
    """transformers' own greedy generation (its chunked delta rule for the prompt, the recurrent one per token)."""
    model = source_torch_model(f"zoo:{NAME}", hybrid=True)
    with torch.no_grad():
        out = model.generate(torch.from_numpy(prompt)[None], max_new_tokens=GEN, min_new_tokens=GEN, do_sample=False)
    return out[0, PROMPT:].tolist()


def test_the_export_declares_the_hybrid_cache(cache_dir):
    nl = read_design(f"zoo:{NAME}", cache_dir=cache_dir, progress=False)
    io = decoder_io(nl.model)
    assert [layer.index for layer in io.layers] == [1, 3]  # full attention: the model's layers 1 and 3
    assert [(p.layer, p.kind, p.shape) for p in io.states] == [
        (0, "conv", (256, 3)), (0, "recurrent", (4, 32, 32)), (2, "conv", (256, 3)), (2, "recurrent", (4, 32, 32))]
    assert io.states[0].past == "past.0.conv" and io.states[1].present == "present.0.recurrent"
    assert "delta rule as one scan" in nl.provenance["exporter"]


def test_ort_generates_transformers_greedy_tokens(cache_dir, artifact, prompt, reference_tokens):
    """The export (its KV grown step by step) and the compiled artifact (one shared KV buffer) both decode exactly
    transformers' 32 greedy tokens, the states fed back by softsyn's loop."""
    exported = Path(read_design(f"zoo:{NAME}", cache_dir=cache_dir, progress=False).provenance["cache"]["path"])
    for path in (exported / "model.onnx", artifact / "model.onnx"):
        io = decoder_io(ir.load(str(path)))
        generation = Generator(open_model(path), io).generate(prompt, GEN)
        assert list(generation.tokens) == reference_tokens, path
    assert len(set(reference_tokens)) > 4  # a sequence, not one token repeated


def test_genai_generates_transformers_greedy_tokens(artifact, prompt, reference_tokens):
    """onnxruntime-genai 0.18 drives the conv and recurrent states its genai_config names."""
    pytest.importorskip("onnxruntime_genai", reason="the genai extra (onnxruntime-genai 0.18)")
    from genai_tokens import genai_tokens

    decoder = json.loads((artifact / "genai_config.json").read_text())["model"]["decoder"]
    assert decoder["inputs"]["past_recurrent_names"] == "past.%d.recurrent"
    assert decoder["outputs"]["present_conv_names"] == "present.%d.conv" and decoder["num_hidden_layers"] == 4
    assert 0 not in reference_tokens  # eos_token_id 0 (the zoo model names none) would end genai early
    assert genai_tokens(artifact, prompt, GEN) == reference_tokens


def test_reports_count_the_states_and_the_deltanet_fuses(artifact):
    """report_area counts the conv and recurrent states; both Gated DeltaNet layers' delta rules fuse into
    com.microsoft.LinearAttention (ORT 1.31's CPU and CUDA kernel), as the rest of the model fuses."""
    area = (artifact / "reports" / "area.rpt").read_text()
    assert "kv_cache states" in area and "4 tensors (conv 2, recurrent 2)" in area
    # per sequence: 2 layers x (conv 256 x 3 + recurrent 4 x 32 x 32) x 4 B, in the KV budget's answers too
    assert "States:        38.912 KB per sequence" in area
    analysis = json.loads((artifact / "analysis.json").read_text())
    budget = analysis["area"]["kv_budget"]
    assert budget["state_bytes"] == 2 * (256 * 3 + 4 * 32 * 32) * 4
    per_sequence = budget["bytes_per_token"] * budget["length"] + budget["state_bytes"]
    assert budget["max_concurrency"] == int(budget["available"] // per_sequence)
    rows = {r["kind"]: r for r in json.loads((artifact / "reports" / "fusion.json").read_text())["kinds"]["rows"]}
    # the delta rule's Scan into com.microsoft.LinearAttention; with the cache the gated attention is
    # GroupQueryAttention's form, and the optimised export's shape arithmetic lets the MoE check run each expert block
    assert [(rows[k]["candidates"], rows[k]["fused"]) for k in ("linear_attention", "attention", "rotary", "moe")] == \
        [(2, 2), (2, 2), (4, 4), (4, 4)]
    ops = [n.op_type for n in ir.load(str(artifact / "model.onnx")).graph]
    assert ops.count("LinearAttention") == 2 and "Scan" not in ops


def test_verify_and_run_exit_zero(artifact, capsys):
    code, out, _ = cli(capsys, "verify", artifact)
    assert code == 0, out
    assert "present.2.recurrent" in out and "present.0.conv" in out and "all 18 outputs within" in out
    code, out, _ = cli(capsys, "run", artifact, "--prompt-len", PROMPT, "--gen", 4, "--runs", 1, "--warmup", 0)
    assert code == 0, out
    assert "TPOT" in out and "prefill of 8 tokens" in out and "States: 4 conv/recurrent state ports" in out


def test_the_torch_targets_refuse_it_in_one_line(artifact, cache_dir, capsys, tmp_path):
    """cpu-torch lowers decoders with a KV cache only: a hybrid decoder is bad input (exit 2), named."""
    code, _, err = cli(capsys, "compile", f"zoo:{NAME}", "-c", ROOT / "constraints" / "cpu-torch-tiny.yaml", "-o",
                       tmp_path / "out", "--cache-dir", cache_dir, "-q")
    assert code == 2 and "hybrid decoder" in err and "cpu-ort" in err and len(err.strip().splitlines()) == 1, err



def test_an_fp16_gpu_compile_loads_and_verifies_on_the_cpu(artifact, cache_dir, capsys, tmp_path):
    """For the H200 (fp16) the delta rule fuses into LinearAttention, converted to fp16 with the rest; tiny-h200's
    budgets may be violated (exit 1): the artifact is written either way."""
    out = tmp_path / "h200"
    code, _, err = cli(capsys, "compile", f"zoo:{NAME}", "-c", ROOT / "constraints" / "tiny-h200.yaml", "-o", out,
                       "--cache-dir", cache_dir, "-q")
    assert code in (0, 1), err
    assert "LinearAttention" in [n.op_type for n in ir.load(str(out / "model.onnx")).graph]
    code, out_text, _ = cli(capsys, "verify", out, "--cpu")
    assert code == 0 and "present.0.recurrent" in out_text, out_text


def test_a_scan_that_is_not_the_delta_rule_stays(cache_dir):
    """The linear_attention check is by meaning: a Scan whose body takes its decay and beta the other way round (the
    same shapes) computes something else than LinearAttention on those inputs, so it is a miss saying so and stays."""
    from passes.fuse import fuse

    nl = read_design(f"zoo:{NAME}", cache_dir=cache_dir, progress=False)
    scan = next(n for n in nl.model.graph if n.op_type == "Scan")
    body = scan.attributes["body"].value
    g, beta = body.inputs[4], body.inputs[5]
    body.inputs[4], body.inputs[5] = beta, g
    nl.invalidate()
    (cov,) = fuse(nl, "cpu", kinds=["linear_attention"])
    assert (cov.candidates, cov.fused) == (2, 1)
    (miss,) = cov.misses
    assert "is not the gated delta rule" in miss.reason and "model.layers.0.linear_attn" in miss.site, miss
    assert sum(n.op_type == "Scan" for n in nl.model.graph) == 1
