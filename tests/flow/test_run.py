"""`softsyn run` on the CPU artifact of qwen3-tiny: the printed and JSON numbers, the tokens, bad directories; the
decode loop's two KV feeds (grown, shared buffer) give the same tokens."""
from __future__ import annotations

import json
import shutil

import onnx_ir as ir
import pytest

from softsyn.cli import run
from softsyn.runtime.decoder import decoder_io
from softsyn.runtime.generate import Generator, prompt_ids
from softsyn.runtime.session import open_model

JSON_KEYS = {"schema", "directory", "design", "date", "provider", "device", "prompt_len", "gen", "runs", "warmup",
             "seed", "batch", "decoding", "kv_cache", "max_length", "cuda_graph", "cpu_view_nodes", "states", "units", "interval", "ttft", "tpot",
             "tokens_per_s", "decode_tokens_per_s", "tokens", "tokens_same_every_run", "ttft_runs", "cold_ttft",
             "phases", "breakdown", "warmups", "signed_off"}


def cli(capsys, *args) -> tuple[int, str, str]:
    """`softsyn ARGS` in this process: (exit status, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        run([str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_run_prints_ttft_tpot_and_tokens_per_s(tiny_cpu_artifact, capsys):
    code, out, err = cli(capsys, "run", tiny_cpu_artifact, "--prompt-len", 16, "--gen", 6, "--runs", 2)
    assert code == 0, err
    assert "on CPUExecutionProvider" in out and "host wall clock per step" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip().startswith(("TTFT", "TPOT"))}
    assert set(rows) == {"TTFT", "TPOT"}
    assert rows["TTFT"][4] == "2" and rows["TPOT"][4] == "10"  # samples: one prefill per run, 5 decode steps per run
    assert all(float(v) > 0 for row in rows.values() for v in row[1:4])
    assert "tokens/s:" in out and "decode tokens/s:" in out and "KV cache: one max_length buffer per layer" in out
    assert "generated 6 tokens after a 16-token prompt" in err  # the progress line


def test_run_json_has_the_same_numbers_and_gen_tokens(tiny_cpu_artifact, capsys):
    code, out, err = cli(capsys, "run", tiny_cpu_artifact, "--prompt-len", 16, "--gen", 6, "--runs", 2, "--json", "-q")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert set(data) == JSON_KEYS
    assert data["units"]["ttft"] == "s" and data["kv_cache"] == "shared" and data["provider"] == "CPUExecutionProvider"
    assert data["ttft"]["samples"] == 2 and data["tpot"]["samples"] == 10
    assert 0 < data["tpot"]["min"] <= data["tpot"]["median"] <= data["tpot"]["p90"]
    assert len(data["tokens"]) == 6 and all(0 <= t < 1024 for t in data["tokens"]) and data["tokens_same_every_run"]
    io = decoder_io(ir.load(str(tiny_cpu_artifact / "model.onnx")))
    greedy = Generator(open_model(tiny_cpu_artifact / "model.onnx"), io).generate(prompt_ids(1024, 16, 0), 6)
    assert data["tokens"] == list(greedy.tokens)


def test_run_refuses_what_is_not_a_compiled_decoder(tiny_cpu_artifact, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    plan = tmp_path / "plan"
    shutil.copytree(tiny_cpu_artifact, plan)
    settings = json.loads((plan / "runtime" / "session.json").read_text())
    (plan / "runtime" / "session.json").write_text(json.dumps(dict(settings, plan=True, model=None)))
    for directory, says in ((tmp_path / "missing", "no such directory"),
                            (tmp_path / "empty", "not a softsyn output directory (no softsyn-manifest.json)"),
                            (plan, "a weightless plan (softsyn compile --plan) has no model.onnx to run")):
        code, out, err = cli(capsys, "run", directory)
        assert code == 2 and out == ""
        assert err.startswith(f"softsyn: error: {directory}: {says}") and err.count("\n") == 1, err


def test_the_shared_buffer_loop_reuses_its_bindings(tiny_cpu_artifact):
    """kv_layout declares one max_length buffer GQA updates in place: the static-shape decode (what CUDA graphs
    need) gives the same tokens on every generation that reuses its buffers and bindings, as a fresh loop's
    (the grown loop's tokens: tests/passes/test_kv_layout.py, against the artifact compiled without kv_layout)."""
    io = decoder_io(ir.load(str(tiny_cpu_artifact / "model.onnx")))
    assert io.shares_buffer and io.buffer_length == 512 and io.template("past_key_names") == "past_key_values.%d.key"
    assert (io.kv_heads, io.head_size, io.vocab_size, io.max_positions) == (2, 32, 1024, 4096)
    sess = open_model(tiny_cpu_artifact / "model.onnx")
    prompt = prompt_ids(1024, 24, 3)
    shared = Generator(sess, io)
    first = shared.generate(prompt, 12)
    assert first.kv == "shared" and len(first.tpot) == 11 and first.tokens == shared.generate(prompt, 12).tokens
    shorter = prompt[:10]  # the reused bindings start from this prompt's mask, not the last generation's
    assert shared.generate(shorter, 12).tokens == Generator(sess, io).generate(shorter, 12).tokens
    kept = shared.inputs.values[("input_ids", (1, 24))][0]  # a prompt length seen before: its device inputs updated in place
    other = prompt_ids(1024, 24, 4)
    assert shared.generate(other, 12).tokens == Generator(sess, io).generate(other, 12).tokens
    assert shared.inputs.values[("input_ids", (1, 24))][0] is kept and shared.generate(prompt, 12).tokens == first.tokens
    assert sorted(shape for name, shape in shared.inputs.values if name == "input_ids") == [(1, 10), (1, 24)]
    shared = Generator(sess, io, share_buffer=True, max_length=64)  # the graph's static 512 wins over 64
    assert shared.max_length == 512
    with pytest.raises(Exception, match="need 560 positions; the artifact holds 512"):
        shared.generate(prompt, 537)
