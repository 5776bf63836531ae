"""DIR/genai_config.json: onnxruntime-genai 0.18 loads the CPU artifact of qwen3-tiny and its Generator decodes
the tokens softsyn's own greedy loop decodes; the config says what the graph is (names, heads, KV sharing)."""
from __future__ import annotations

import json

import onnx_ir as ir
import pytest

from genai_tokens import genai_tokens
from softsyn.frontends.zoo import minilm_folder
from softsyn.runtime.decoder import decoder_io
from softsyn.emit.genai import save_tokenizer, source_tokens
from softsyn.runtime.generate import Generator, prompt_ids
from softsyn.runtime.session import open_model

pytest.importorskip("onnxruntime_genai", reason="make install puts it in .venv: the genai extra, "
                                                     "onnxruntime-genai-cuda==0.18.0 (it declares onnxruntime-gpu)")


def test_genai_config_describes_the_graph(tiny_cpu_artifact):
    config = json.loads((tiny_cpu_artifact / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert config["model"]["type"] == "qwen3" and config["model"]["vocab_size"] == 1024
    assert (decoder["num_hidden_layers"], decoder["num_key_value_heads"], decoder["head_size"]) == (2, 2, 32)
    assert decoder["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert decoder["outputs"]["present_value_names"] == "present.%d.value"
    assert decoder["session_options"]["provider_options"] == []  # the CPU target
    # kv_layout declares past and present one max_length buffer (cpu-tiny.yaml's kv_cache.max_length)
    assert config["search"]["past_present_share_buffer"] is True and config["search"]["max_length"] == 512
    log = (tiny_cpu_artifact / "compile.log").read_text()
    assert "note: tokenizer: zoo:qwen3-tiny has no tokenizer files" in log and "eos_token_id 0 written" in log
    assert not (tiny_cpu_artifact / "tokenizer.json").exists()


def test_genai_generates_the_greedy_tokens_of_softsyns_loop(tiny_cpu_artifact):
    prompt, n = prompt_ids(1024, 20, 1), 12
    tokens = genai_tokens(tiny_cpu_artifact, prompt, n)
    io = decoder_io(ir.load(str(tiny_cpu_artifact / "model.onnx")))
    greedy = list(Generator(open_model(tiny_cpu_artifact / "model.onnx"), io).generate(prompt, n).tokens)
    assert 0 not in greedy  # eos_token_id 0 (the zoo model names none) would end genai's generation early
    assert tokens == greedy and len(tokens) == n


def test_a_source_tokenizer_is_saved_with_an_integer_max_length(tmp_path):
    tokens = source_tokens(str(minilm_folder()))
    notes: list[str] = []
    assert save_tokenizer(tokens, tmp_path, 512, notes) is not None and notes == []
    assert (tmp_path / "tokenizer.json").is_file()
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["model_max_length"] == 512
