"""One source of seeded weights: the materialised netlist and the HF folder peers build from compute the same function."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from softsyn.frontends import hf
from softsyn.frontends.zoo import ZOO
from softsyn.runtime.inputs import scenario_inputs
from softsyn.runtime.measure import onnx_path


@pytest.fixture(scope="module")
def tied_tiny(tmp_path_factory, cache_dir):
    """A tiny Qwen3 with tied embeddings taken down the real-size path: weightless export, then filled."""
    cfg = AutoConfig.for_model("qwen3", **dict(ZOO["qwen3-tiny"].config, tie_word_embeddings=True))
    meta = hf.load_transformers_design(cfg, "tied-tiny", "test", cache_dir, progress=False, weights="meta",
                                       dtype="float32")
    filled = hf.load_transformers_design(cfg, "tied-tiny", "test", cache_dir, progress=False, weights="filled",
                                         dtype="float32")
    folder = tmp_path_factory.mktemp("hf") / "tied-tiny"
    written = hf.write_seeded_folder(cfg, meta.model, folder, "float32")
    return cfg, filled, folder, written


def test_the_hf_folder_holds_the_materialised_weights(tied_tiny):
    cfg, filled, folder, written = tied_tiny
    assert written == sum(1 for _ in AutoModelForCausalLM.from_config(cfg).parameters())
    feeds = scenario_inputs(filled, {"batch": 1, "seq": 7, "past": 0})
    sess = ort.InferenceSession(str(onnx_path(filled)), providers=["CPUExecutionProvider"])
    logits = sess.run(["logits"], feeds)[0]
    net = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = net(input_ids=torch.from_numpy(feeds["input_ids"]), use_cache=False).logits.numpy()
    rel = np.abs(logits - ref).max() / np.abs(ref).max()
    assert rel < 1e-4, rel
    assert (logits.argmax(-1) == ref.argmax(-1)).mean() == 1.0


def test_a_weight_s_value_depends_on_its_name_alone(tied_tiny):
    """Values are keyed by name, so the writer and the export agree whatever order each walks the weights in."""
    from softsyn.frontends.materialize import seed_pool, seeded_value

    pool = seed_pool(0, 0.02)
    a = seeded_value("model.layers.0.mlp.up_proj.weight", (4, 3), np.float32, None, pool)
    b = seeded_value("model.layers.0.mlp.up_proj.weight", (4, 3), np.float32, None, pool)
    c = seeded_value("model.layers.1.mlp.up_proj.weight", (4, 3), np.float32, None, pool)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, "bfloat16"])
def test_a_weight_s_seeded_value_is_the_fp32_value_in_its_dtype_from_a_cast_pool_too(dtype):
    """Every float dtype gets the fp32 value rounded to it (bf16 too, which numpy does not call floating: its
    weights were zeros); tiling the pool cast once (what seeded_weights does) gives the same bytes."""
    import ml_dtypes

    from softsyn.frontends.materialize import seed_pool, seeded_value

    dtype = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    pool = seed_pool(0, 0.02)
    name, shape = "model.layers.0.mlp.up_proj.weight", (64, 48)
    want = seeded_value(name, shape, np.float32, None, pool).astype(dtype)
    got = seeded_value(name, shape, dtype, None, pool)
    cast = seeded_value(name, shape, dtype, None, pool, typed=pool.astype(dtype))
    assert got.dtype == dtype and np.count_nonzero(got.astype(np.float32)) > 0.99 * got.size
    assert got.tobytes() == want.tobytes() == cast.tobytes()


@pytest.mark.parametrize("length,n", [(1, 10), (5, 3), (7, 7), (3, 1000), (1000, 1), (16, 0), (13, 12345)])
def test_cyclic_is_numpy_s_resize(length, n):
    """The seeded weights' tiling (softsyn.frontends.materialize.cyclic) gives np.resize's values, so weights seeded
    before and after it are the same bytes (the HF folders peers build from included)."""
    from softsyn.frontends.materialize import cyclic

    values = np.random.default_rng(length).standard_normal(length).astype(np.float16)
    got = cyclic(values, n)
    assert got.dtype == values.dtype and np.array_equal(got, np.resize(values, n))
