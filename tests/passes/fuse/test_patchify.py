"""passes.fuse.patchify: a patch embedding's Conv (kernel = stride = its input, Qwen-VL's Conv3d over patches the
processor cut) becomes Reshape -> MatMul (-> Add) -> Reshape, computing the same values; a Conv that slides over a
larger input, or pads, or groups, is a miss with its reason."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import helper as oh
from onnx import numpy_helper as nh

from passes.fuse import fuse
from softsyn.netlist import Netlist

C, T, P, HIDDEN = 3, 2, 4, 24  # Qwen3-VL's form at small sizes: patches [N, C*T*P*P] viewed as [N, C, T, P, P]


def _patch_embed(dtype=np.float32, bias: bool = True, spatial=(T, P, P), **conv_attrs) -> Netlist:
    """pixel_values [patches, C*prod(spatial)] -> Reshape [-1, C, *spatial] -> Conv(kernel (T, P, P)) -> Reshape
    [-1, HIDDEN] (what the Qwen-VL export writes), seeded weights of `dtype`."""
    rng = np.random.default_rng(0)
    elem = oh.np_dtype_to_tensor_dtype(np.dtype(dtype))
    w = (rng.standard_normal((HIDDEN, C, T, P, P)) * 0.1).astype(dtype)
    init = [nh.from_array(w, "w"), nh.from_array(np.array([-1, C, *spatial], np.int64), "view"),
            nh.from_array(np.array([-1, HIDDEN], np.int64), "flat")]
    conv_in = ["x5", "w"]
    if bias:
        init.append(nh.from_array((rng.standard_normal(HIDDEN) * 0.1).astype(dtype), "b"))
        conv_in.append("b")
    attrs = {"kernel_shape": [T, P, P], "strides": [T, P, P], **conv_attrs}
    nodes = [oh.make_node("Reshape", ["x", "view"], ["x5"]), oh.make_node("Conv", conv_in, ["c"], **attrs),
             oh.make_node("Reshape", ["c", "flat"], ["y"])]
    vi = oh.make_tensor_value_info
    k = C * int(np.prod(spatial))
    graph = oh.make_graph(nodes, "patch", [vi("x", elem, ["patches", k])], [vi("y", elem, None)], initializer=init)
    model = onnx.shape_inference.infer_shapes(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10),
                                              data_prop=True)
    return Netlist(ir.serde.deserialize_model(model), "patch-embed", kind="generic")


def _run(nl: Netlist, x: np.ndarray) -> np.ndarray:
    proto = ir.serde.serialize_model(nl.model)
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("dtype, bias", [(np.float32, True), (np.float32, False), (np.float16, True)])
def test_a_patch_embedding_conv_becomes_one_gemm_with_the_same_values(dtype, bias):
    nl = _patch_embed(dtype, bias)
    x = np.random.default_rng(1).standard_normal((37, C * T * P * P)).astype(dtype)
    ref = _run(nl, x)
    (cov,) = fuse(nl, "cuda", kinds=["patch_embed"])
    assert (cov.candidates, cov.fused) == (1, 1), cov.misses
    ops = [n.op_type for n in nl.nodes()]
    assert "Conv" not in ops and ops.count("MatMul") == 1 and ops.count("Add") == int(bias)
    mm = next(n for n in nl.nodes() if n.op_type == "MatMul")
    w = mm.inputs[1].const_value.numpy()
    assert w.shape == (C * T * P * P, HIDDEN) and w.dtype == dtype  # the filters as a [C*T*P*P, HIDDEN] GEMM weight
    got = _run(nl, x)
    assert got.shape == ref.shape == (37, HIDDEN)
    tol = 2e-3 if dtype == np.float16 else 1e-5
    assert np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max() < tol


@pytest.mark.parametrize("spatial, attrs, reason", [
    ((T, 2 * P, 2 * P), {}, "slides over a larger input"),
    ((T, P, P), {"pads": [0, 1, 1, 0, 1, 1]}, "padded"),
    ((T, P, P), {"dilations": [1, 2, 2]}, "dilations"),
])
def test_a_conv_that_is_not_a_patch_embedding_is_a_miss_with_its_reason(spatial, attrs, reason):
    nl = _patch_embed(spatial=spatial, **attrs)
    (cov,) = fuse(nl, "cuda", kinds=["patch_embed"])
    assert (cov.candidates, cov.fused) == (1, 0)
    assert reason in cov.misses[0].reason, cov.misses[0].reason
    assert "Conv" in [n.op_type for n in nl.nodes()]
