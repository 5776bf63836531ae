"""Sliding-window and soft-capped attention (issue 25): zoo:gemma2-tiny and zoo:gemma3-tiny (a 64-token window,
Gemma 2's attention soft cap, Gemma 3's per-layer pattern and local rope base) compile with every attention site
one GroupQueryAttention (local_window_size, softcap) over one shared KV buffer layout, verify at a past past the
window, and generate transformers' greedy tokens for 80 new tokens after a 72-token prompt, under softsyn run
and under onnxruntime-genai."""
from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir
import pytest
from click.testing import CliRunner

from helpers import fusion_report
from passes.fuse.window import read_window
from paths import ROOT
from softsyn.cli import main, run
from softsyn.frontends import zoo
from softsyn.runtime.generate import prompt_ids

MODELS = ("gemma2-tiny", "gemma3-tiny")
PROMPT, NEW = 72, 80  # the prompt already fills the 64-token window; every new token is past it
_ARTIFACTS: dict = {}


@pytest.fixture(scope="session")
def artifact(cache_dir, tmp_path_factory):
    """`softsyn compile zoo:NAME -c constraints/cpu-tiny.yaml --effort low -o DIR`, once per model per session."""
    def build(name: str):
        if name not in _ARTIFACTS:
            out = tmp_path_factory.mktemp(name) / "out"
            result = CliRunner().invoke(main, ["compile", f"zoo:{name}", "-c", str(ROOT / "constraints" / "cpu-tiny.yaml"),
                                               "--effort", "low", "-o", str(out), "--cache-dir", str(cache_dir), "-q"])
            assert result.exit_code == 0, result.output + repr(result.exception)
            _ARTIFACTS[name] = out
        return _ARTIFACTS[name]
    return build


def _config(name: str, **changes):
    cfg = zoo.make_config(zoo.ZOO[name])
    for key, value in changes.items():
        setattr(cfg, key, value)
    return cfg


def _hf_model(cfg):
    """The zoo model in transformers (torch.manual_seed(0) + from_config, as softsyn builds it)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def _hf_greedy(cfg, prompt: np.ndarray, n: int) -> list[int]:
    """transformers' greedy tokens (generate, do_sample=False) after `prompt`."""
    import torch

    with torch.no_grad():
        out = _hf_model(cfg).generate(torch.tensor(prompt[None]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


def _hf_next_tokens(cfg, tokens: list[int], n: int) -> list[int]:
    """The argmax after each of the last `n` positions of `tokens` in one forward (teacher forced)."""
    import torch

    with torch.no_grad():
        logits = _hf_model(cfg)(torch.tensor([tokens])).logits[0, -n:]
    return logits.argmax(-1).tolist()


@pytest.mark.parametrize("name", MODELS)
def test_every_attention_site_is_one_windowed_soft_capped_gqa_over_one_kv_layout(name, artifact):
    out = artifact(name)
    cfg = _config(name)
    kinds, misses = fusion_report(out / "reports" / "fusion.rpt")
    layers = cfg.num_hidden_layers
    assert kinds["attention"] == (layers, layers), [m for m in misses if m[0] == "attention"]
    model = ir.load(str(out / "model.onnx"))
    nodes = list(model.graph)
    gqa = [n for n in nodes if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == layers and not any(n.op_type == "Softmax" for n in nodes)
    for layer, node in enumerate(gqa):  # in layer order: each layer's kind from the config
        attrs = {k: a.value for k, a in node.attributes.items()}
        sliding = cfg.layer_types[layer] == "sliding_attention"
        assert attrs.get("local_window_size", -1) == (cfg.sliding_window if sliding else -1), (layer, attrs)
        assert attrs.get("softcap", 0.0) == pytest.approx(cfg.attn_logit_softcapping or 0.0), (layer, attrs)
        assert attrs["scale"] == pytest.approx(cfg.query_pre_attn_scalar ** -0.5)
    # one KV layout: every present is a GQA output updating its max_length past in place (no Concat-grown cache)
    presents = [o for o in model.graph.outputs if o.name.startswith("present.")]
    assert len(presents) == 2 * layers and all(o.producer().op_type == "GroupQueryAttention" for o in presents)
    pasts = [i for i in model.graph.inputs if i.name.startswith("past_key_values.")]
    assert {i.shape[2] for i in pasts} == {512}  # cpu-tiny.yaml's kv_cache.max_length, on every layer
    genai = json.loads((out / "genai_config.json").read_text())
    assert genai["search"]["past_present_share_buffer"] is True and genai["model"]["type"] == cfg.model_type
    if name == "gemma2-tiny":  # the final logit soft cap stays in the graph (no fused op covers it), after the
        assert sum(n.op_type == "Tanh" for n in nodes) == 1  # lm_head, which reads the last position only
        logits = next(o for o in model.graph.outputs if o.name == "logits")
        assert logits.shape[1] == 1 and "last_token_logits: the lm_head reads" in (out / "compile.log").read_text()
    else:  # Gemma 3: the sliding layers rotate by the local base (10000), the full layer by 1e6: two caches
        caches = {layer: {i.name for i in n.inputs if i is not None and "cos" in i.name}
                  for layer, n in enumerate(n for n in nodes if n.op_type == "RotaryEmbedding" and n.inputs[0] is not None)}
        assert len({frozenset(c) for c in caches.values()}) == 2, caches


@pytest.mark.parametrize("name", MODELS)
def test_verify_meets_the_budget_at_a_past_beyond_the_window(name, artifact):
    """cpu-tiny.yaml times decode at past 256 and prefill at 128 tokens, both past the 64-token window: the
    fp32 reference export runs there (its sliding mask indexed out of range before) and the artifact matches it."""
    result = CliRunner().invoke(main, ["verify", str(artifact(name))])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines() if line.strip().startswith(("prefill", "decode"))]
    assert {r[0] for r in rows} == {"prefill", "decode"} and all(r[-1] == "MET" for r in rows)


@pytest.mark.parametrize("name", MODELS)
def test_softsyn_run_and_genai_generate_transformers_tokens_past_the_window(name, artifact, capsys):
    pytest.importorskip("onnxruntime_genai")
    from genai_tokens import genai_tokens

    out = artifact(name)
    cfg = _config(name)
    prompt = prompt_ids(cfg.vocab_size, PROMPT, 0)  # what `softsyn run --seed 0` prefills
    want = _hf_greedy(cfg, prompt, NEW)
    assert cfg.eos_token_id not in want  # genai would stop there
    # the window binds: on the same sequence, the same weights without it (a window longer than every sequence
    # here) would pick other tokens
    sequence = prompt.tolist() + want[:-1]
    assert _hf_next_tokens(cfg, sequence, NEW) == want
    assert _hf_next_tokens(_config(name, sliding_window=4096), sequence, NEW) != want
    with pytest.raises(SystemExit) as exc:
        run(["run", str(out), "--prompt-len", str(PROMPT), "--gen", str(NEW), "--runs", "1", "--warmup", "0", "--json",
             "-q"])
    printed, err = capsys.readouterr()
    assert exc.value.code == 0, err
    assert json.loads(printed)["tokens"] == want
    assert genai_tokens(out, prompt, NEW) == want


def test_the_window_is_read_from_which_keys_each_query_sees():
    past, s, t = 10, 3, 13
    q, k = past + np.arange(s)[:, None], np.arange(t)[None, :]
    causal = np.where(k <= q, 0.0, -1e9)[None, None]
    assert read_window(causal, past) == -1
    window = np.where((k <= q) & (k > q - 4), 0.0, -np.inf)[None, None]
    assert read_window(window, past) == 4
    broken = window.copy()
    broken[0, 0, 0, 5] = 0.0  # a key outside the window left open for the first query
    reason = read_window(broken, past)
    assert isinstance(reason, str) and "[q 0, k 5]" in reason and "a window of 4 keys expects -inf" in reason
    prefill = np.where((k[:, :s] <= q - past) & (k[:, :s] > q - past - 2), 0.0, -np.inf)[None, None]
    assert read_window(prefill, 0) == 2  # no past: the first query sees one key, the last the window


def test_the_cuda_artifact_keeps_window_and_cap_where_gqa_takes_the_rotary(cache_dir, tmp_path):
    """On cuda GroupQueryAttention also takes the rotary (do_rotary=1): the window and the cap stay its own (they
    were reset there before), and its CPU view verifies at decode past 256 and a 128-token prefill."""
    out = tmp_path / "cuda"
    result = CliRunner().invoke(main, ["compile", "zoo:gemma2-tiny", "-c", str(ROOT / "constraints" / "tiny-h200.yaml"),
                                       "--effort", "low", "-o", str(out), "--cache-dir", str(cache_dir), "-q"])
    assert result.exit_code == 0, result.output
    cfg = _config("gemma2-tiny")
    gqa = [n for n in ir.load(str(out / "model.onnx")).graph if n.op_type == "GroupQueryAttention"]
    attrs = [{k: a.value for k, a in n.attributes.items()} for n in gqa]
    assert [a["do_rotary"] for a in attrs] == [1, 1]
    assert [a["local_window_size"] for a in attrs] == [cfg.sliding_window, -1]
    assert [a["softcap"] for a in attrs] == [pytest.approx(cfg.attn_logit_softcapping)] * 2
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 0, result.output
