"""serving.prompt_buckets: kv_layout takes each row's logits at its last real token (passes.padded_logits), so a
prompt right-padded to a bucket length prefills to the same logits and the same KV as the prompt alone, and the
decode after it is the same; rows of different lengths padded together each get their own. Proven on ORT CPU
against the artifact compiled without buckets (tiny_cpu_artifact), and the structure the pass left."""
from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir
import pytest

from paths import ROOT
from softsyn.runtime.session import open_model

from test_kv_layout import MAX_LENGTH, compile_tiny

BUCKET = 16
SERVING = f"""
serving:
  arrival_rate: 2/s
  prompt_len: {{p50: 8, p99: 24}}
  gen_len: 4
  ttft: {{p99: 1s}}
  requests: 20
  prompt_buckets: {BUCKET}
"""


@pytest.fixture(scope="module")
def padded_artifact(cache_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("padded") / "c.yaml"
    path.write_text((ROOT / "constraints" / "cpu-tiny.yaml").read_text() + SERVING)
    return compile_tiny(path.parent / "out", path, cache_dir)


def _prefill(session, rows: list[np.ndarray], width: int):
    """Right-padded prefill of `rows` at `width` positions: (logits [rows, 1, vocab], the present KV buffers)."""
    ids = np.zeros((len(rows), width), np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = r, 1
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": np.tile(np.arange(width), (len(rows), 1))}
    buffer = np.zeros((len(rows), 2, MAX_LENGTH, 32), np.float32)
    pasts = [i.name for i in session.get_inputs() if i.name.startswith("past")]
    out = session.run(None, {**feeds, **{p: buffer for p in pasts}})
    return out[0], dict(zip(pasts, out[1:]))


def _decode(session, token: int, length: int, kv: dict, over_buffer: bool = False) -> np.ndarray:
    """One decode step after a prompt of `length` real tokens: the mask's total is length + 1, or with
    `over_buffer` the whole KV buffer, ones on the row's positions (as a batching engine binds it)."""
    mask = np.ones((1, length + 1), np.int64)
    if over_buffer:
        mask = (np.arange(MAX_LENGTH) <= length).astype(np.int64)[None]
    feeds = {"input_ids": np.array([[token]]), "attention_mask": mask, "position_ids": np.array([[length]])}
    return session.run(["logits"], {**feeds, **kv})[0]


def test_a_padded_prompt_prefills_and_decodes_as_the_prompt_alone(padded_artifact, tiny_cpu_artifact):
    padded, plain = open_model(padded_artifact / "model.onnx"), open_model(tiny_cpu_artifact / "model.onnx")
    prompt = np.random.default_rng(1).integers(0, 1024, 11)
    alone, kv_alone = _prefill(plain, [prompt], len(prompt))
    bucketed, kv_padded = _prefill(padded, [prompt], BUCKET)
    np.testing.assert_allclose(bucketed, alone, rtol=1e-5, atol=1e-5)
    for name, value in kv_alone.items():  # the real positions' keys and values; the padding's lie beyond seqlens_k
        np.testing.assert_allclose(kv_padded[name][:, :, :len(prompt)], value[:, :, :len(prompt)], atol=1e-6)
    token = int(alone[0, -1].argmax())
    expected = _decode(plain, token, len(prompt), kv_alone)
    for over_buffer in (False, True):
        np.testing.assert_allclose(_decode(padded, token, len(prompt), kv_padded, over_buffer), expected,
                                   rtol=1e-5, atol=1e-5)
    # the unbucketed artifact read the padding's logits: the reason for the pass
    assert not np.allclose(_prefill(plain, [prompt], BUCKET)[0], alone, atol=1e-3)


def test_rows_of_different_lengths_each_get_their_last_real_token(padded_artifact, tiny_cpu_artifact):
    padded, plain = open_model(padded_artifact / "model.onnx"), open_model(tiny_cpu_artifact / "model.onnx")
    rng = np.random.default_rng(2)
    rows = [rng.integers(0, 1024, n) for n in (5, 16, 9)]
    together, _ = _prefill(padded, rows, BUCKET)
    for i, row in enumerate(rows):
        np.testing.assert_allclose(together[i], _prefill(plain, [row], len(row))[0][0], rtol=1e-5, atol=1e-5)


def test_the_lm_head_reads_a_gather_at_the_rows_lengths(padded_artifact):
    model = ir.load(str(padded_artifact / "model.onnx"))
    ops = [n.op_type for n in model.graph]
    assert "GatherElements" in ops and not any(n.name == "last_position_slice" for n in model.graph)
    gather = next(n for n in model.graph if n.op_type == "GatherElements")
    assert gather.outputs[0].consumers()[0].op_type in ("MatMul", "Gemm", "MatMulNBits")
    session = json.loads((padded_artifact / "runtime" / "session.json").read_text())
    assert session["prompts"]["pad_to_multiple_of"] == BUCKET and "last real token" in session["prompts"]["padding"]
    log = (padded_artifact / "compile.log").read_text()
    assert "each row's last real position" in log and "serving.prompt_buckets" in log
