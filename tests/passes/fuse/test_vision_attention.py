"""A ViT's attention with the rotary applied per head (Qwen3-VL's vision blocks, zoo:qwen3-vl-tiny): K and V reach
the scores as [images, heads, patches, head_dim] (BNSH), never as a [B, T, N*H] projection, and still fuse into one
com.microsoft.MultiHeadAttention per block, K and V passed as they are (the op's 4-D key/value form), Q brought
to [B, S, N*H]; the vision block gives what it gave unfused on ORT CPU, two images per call (one batch row each).
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from passes.fuse import fuse
from softsyn.frontends import read_design
from softsyn.frontends.vlm import split_blocks

SHARPEN = 12.0  # the seeded weights give near-uniform scores: scaled q/k make the attention pattern matter


def _run(model: ir.Model, path, feeds):
    ir.save(model, str(path), external_data=path.name + ".data")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.fixture(scope="module")
def vision(cache_dir, tmp_path_factory):
    nl = read_design("zoo:qwen3-vl-tiny", cache_dir=cache_dir, progress=False)
    for node in nl.nodes():  # the same sharper weights on both sides
        if node.op_type == "MatMul" and nl.hierarchy(node).endswith("attn.qkv"):
            w = node.inputs[1]
            w.const_value = ir.tensor(w.const_value.numpy() * SHARPEN, name=w.name)
    blocks = nl.provenance["blocks"]
    ref = split_blocks(nl.model, blocks)["vision"]
    cov = {c.kind: c for c in fuse(nl, "cpu", kinds=["attention"])}
    got = split_blocks(nl.model, blocks)["vision"]
    patches = nl.provenance["image"]["patches"]
    pixels = ref.graph.inputs[0]
    x = np.random.default_rng(0).standard_normal((2 * patches, pixels.shape[1])).astype(np.float32)
    d, feeds = tmp_path_factory.mktemp("vision-mha"), {pixels.name: x}
    return dict(cov=cov["attention"], model=got, depth=nl.config["vision"]["depth"],
                heads=nl.config["vision"]["num_heads"], feeds=feeds, ref=_run(ref, d / "ref.onnx", feeds),
                got=_run(got, d / "fused.onnx", feeds), dir=d)


def test_vision_sites_become_mha_with_bnsh_key_value(vision):
    cov, g = vision["cov"], vision["model"].graph
    assert cov.fused == cov.candidates and not cov.misses, [m.reason for m in cov.misses]
    mha = [n for n in g if n.op_type == "MultiHeadAttention"]
    assert len(mha) == vision["depth"] and not [n for n in g if n.op_type == "Softmax"]
    heads = vision["heads"]
    for n in mha:
        q, k, v = n.inputs[:3]
        head = k.shape[3]
        assert n.attributes["num_heads"].value == heads
        assert n.attributes["scale"].value == pytest.approx(head ** -0.5)
        assert len(k.shape) == len(v.shape) == 4 and k.shape[1] == v.shape[1] == heads  # BNSH, as the rotary left K
        assert k.producer().op_type == "Add"  # the rotary's k * cos + rotate_half(k) * sin, not a re-layout
        assert q.producer().op_type == "Reshape" and q.producer().inputs[0].producer().op_type == "Transpose"


def test_vision_block_equals_unfused_on_ort_cpu(vision):
    for a, b in zip(vision["ref"], vision["got"]):
        assert a.shape == b.shape
        rel = np.abs(a - b).max() / np.abs(a).max()
        assert rel < 1e-5, rel
    # the comparison sees the attention: a 4% change of every fused node's scale moves the features far past that
    g = vision["model"].graph
    for n in g:
        if n.op_type == "MultiHeadAttention":
            n.attributes["scale"] = ir.AttrFloat32("scale", n.attributes["scale"].value * 1.04)
    moved = _run(vision["model"], vision["dir"] / "moved.onnx", vision["feeds"])
    assert max(np.abs(a - b).max() / np.abs(a).max() for a, b in zip(vision["ref"], moved)) > 1e-3
