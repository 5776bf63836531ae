"""The provenance map of a torch package (softsyn.runtime.torch_provenance): every kernel call of the compiled step
named with the source modules it computes, and a profiled run's kernels attributed to those calls."""
import json
import zipfile
from types import SimpleNamespace

from softsyn.runtime.torch_macros import call_instance
from softsyn.runtime.torch_provenance import (KERNELS_FILE, KernelCall, attribute, kernel_calls, module_kind,
                                              read_calls)


def test_the_compile_maps_every_projection_call_to_its_module(tiny_torch_artifact):
    """zoo:qwen3-tiny on cpu-torch: the map is written beside the package, in call order; each layer's packed QKV,
    o_proj, packed gate/up and down_proj matmul and the lm_head is one extern call naming exactly that module; the
    norms' kernels name the layer norms."""
    calls = read_calls(tiny_torch_artifact)
    settings = json.loads((tiny_torch_artifact / "runtime" / "torch.json").read_text())
    assert settings["kernels"] == KERNELS_FILE and calls
    matmuls = [c.modules for c in calls if c.extern and "mm" in c.kernel]
    per_layer = ("self_attn.packed_q_k_v.linear", "self_attn.o_proj", "mlp.packed_gate_up.linear", "mlp.down_proj")
    assert matmuls == [(f"model.layers.{i}.{m}",) for i in range(2) for m in per_layer] + [("lm_head",)]
    kinds = {c.kind for c in calls}
    assert {"self_attn", "mlp", "lm_head"} <= kinds
    assert {"input_layernorm", "post_attention_layernorm", "norm"} <= kinds  # fused norms: the kind of most nodes
    assert all(len(c.nodes) == len(c.modules) and min(c.nodes, default=1) >= 1 for c in calls)


def test_module_kinds_drop_the_layer_index_as_the_netlist_scopes_read():
    assert module_kind("model.layers.3.self_attn.o_proj") == "self_attn"
    assert module_kind("model.layers.12.mlp.down_proj/MatMul_4") == "mlp"
    assert module_kind("model.layers.3") == "layer"
    assert module_kind("lm_head") == "lm_head" and module_kind("model.norm") == "norm"
    # a kernel fusing a layer's residual add into the next norm reads as that norm; the add alone as the layer's
    fused = KernelCall("triton_0", ("model.layers.0", "model.layers.1.input_layernorm", "model.layers.0.mlp.down_proj"))
    assert fused.kind == "input_layernorm+mlp" and KernelCall("triton_1", ("model.layers.2",)).kind == "layer"


def _graph_node(name, target, module):
    return SimpleNamespace(name=name, target=target, meta={"nn_module_stack": {"m": ("m", "StaticStep"), module:
                                                                                (f"m.{module}", "Module")}})


def test_a_user_kernel_call_is_its_op_s_module_not_its_inputs_producers(tmp_path):
    """Inductor's provenance of a user-defined Triton kernel is its IR node's origins, which hold the nodes that
    computed its inputs: on the H100 (qwen3-1.7b int4, 2026-12-07) the q/k/v GEMV named its op's 1 node beside
    input_layernorm's 8 and read as that norm, the gated GEMV as post_attention_layernorm, the decode attention named
    every layer's self_attn. A call Inductor did not generate keeps its own op's nodes (a custom op; a user kernel's
    wrapper); one without (an ATen extern call) and Inductor's own kernels keep them all."""
    import torch
    from torch._higher_order_ops.triton_kernel_wrap import triton_kernel_wrapper_functional

    from softsyn.emit import triton_attention, triton_weights  # noqa: F401 - registers softsyn's ops

    aten, softsyn = torch.ops.aten, torch.ops.softsyn
    norm = [(f"norm_{i}", op, "model.layers.2.input_layernorm")
            for i, op in enumerate([aten.to.dtype, aten.pow.Tensor_Scalar, aten.mean.dim, aten.add.Tensor,
                                    aten.rsqrt.default, aten.mul.Tensor, aten.to.dtype, aten.mul.Tensor])]
    post = [(f"post_{i}", aten.mul.Tensor, "model.layers.2.post_attention_layernorm") for i in range(8)]
    graph = [("add_1", aten.add.Tensor, "model.layers.1"), *norm, *post,
             ("weight_matmul", softsyn.weight_matmul.default, "model.layers.2.self_attn.packed_q_k_v.linear"),
             ("rope", aten.cos.default, "model.rotary_emb"), ("mask", aten.le.Tensor, "model.layers.0.self_attn"),
             ("decode_attention", softsyn.decode_attention.default, "model.layers.2.self_attn"),
             ("gated", softsyn.gated_weight_matmul.default, "model.layers.2.mlp"),
             ("wrapped", triton_kernel_wrapper_functional, "lm_head"),
             ("linear", aten.linear.default, "model.layers.2.mlp.down_proj"),
             ("sdpa", aten.scaled_dot_product_attention.default, "model.layers.2.self_attn")]
    program = SimpleNamespace(graph=SimpleNamespace(nodes=[_graph_node(*n) for n in graph]))
    names = [n for n, _, _ in norm]
    info = {"triton_red_fused_mean_mul_0:1": names + ["add_1", "weight_matmul"],
            "weight_matmul_kernel_0:2": ["weight_matmul", *names, "add_1"],
            "attend_kernel_1:3": ["decode_attention", "rope", "mask", "norm_0"],
            "weight_matmul_kernel_2:4": ["gated", *[n for n, _, _ in post], "gone_from_the_graph"],
            "weight_matmul_kernel_3:5": ["wrapped", *names],
            "aoti_torch_cuda_mm_out:6": ["linear"],
            "aoti_torch_cuda__scaled_dot_product_flash_attention:7": ["sdpa", "rope", "mask"],
            "user_kernel_4:8": ["norm_0", "add_1"]}
    package = tmp_path / "model.pt2"
    with zipfile.ZipFile(package, "w") as archive:
        archive.writestr("model/data/aotinductor/model/kernel_information.json",
                         json.dumps({k: {"pre_grad_nodes": v, "post_grad_nodes": []} for k, v in info.items()}))
    calls = kernel_calls(package, program)
    assert [(c.modules, c.nodes) for c in calls] == [
        (("model.layers.2.input_layernorm", "model.layers.1", "model.layers.2.self_attn.packed_q_k_v.linear"),
         (8, 1, 1)),
        (("model.layers.2.self_attn.packed_q_k_v.linear",), (1,)),
        (("model.layers.2.self_attn",), (1,)),
        (("model.layers.2.mlp",), (1,)),
        (("lm_head",), (1,)),
        (("model.layers.2.mlp.down_proj",), (1,)),
        (("model.layers.2.self_attn", "model.rotary_emb", "model.layers.0.self_attn"), (1, 1, 1)),
        (("model.layers.2.input_layernorm", "model.layers.1"), (1, 1))]
    assert [c.kind for c in calls] == ["input_layernorm", "self_attn", "self_attn", "mlp", "lm_head", "mlp",
                                       "self_attn", "input_layernorm"]
    # the macro cells read the same map: each GEMV is its op's instance, the norm kernel the norm's
    assert [call_instance(c)[0] for c in calls[:5]] == [
        "model.layers.2.input_layernorm", "model.layers.2.self_attn", "model.layers.2.self_attn", "model.layers.2.mlp",
        "lm_head"]


def test_a_gemv_that_runs_its_layer_s_norm_covers_the_norm_s_cells(tmp_path):
    """fused norms (softsyn.emit.torch_norms): the q/k/v GEMV runs input_layernorm in its prologue and o_proj's adds
    the residual, so the decode map names the norm and the layer after each GEMV's own module (covered_cells); the
    call stays its op's macro cell, and the netlist's norm and residual-add cells go to it, none left uncovered."""
    import torch

    from softsyn.emit import triton_weights  # noqa: F401 - registers softsyn's ops
    from softsyn.runtime.torch_macros import MacroCell, cover

    graph = [("qkv", torch.ops.softsyn.weight_matmul.default, "model.layers.0.self_attn.packed_q_k_v.linear"),
             ("o", torch.ops.softsyn.weight_matmul.default, "model.layers.0.self_attn.o_proj")]
    program = SimpleNamespace(graph=SimpleNamespace(nodes=[_graph_node(*n) for n in graph]))
    package = tmp_path / "model.pt2"
    with zipfile.ZipFile(package, "w") as archive:
        archive.writestr("model/data/aotinductor/model/kernel_information.json", json.dumps(
            {"weight_matmul_kernel_0:1": {"pre_grad_nodes": ["qkv"]}, "weight_matmul_kernel_1:2": {
                "pre_grad_nodes": ["o"]}}))
    covers = {"model.layers.0.self_attn.packed_q_k_v.linear": ("model.layers.0.input_layernorm",),
              "model.layers.0.self_attn.o_proj": ("model.layers.0",)}
    calls = kernel_calls(package, program, covers)
    assert [(c.modules, c.nodes) for c in calls] == [
        (("model.layers.0.self_attn.packed_q_k_v.linear", "model.layers.0.input_layernorm"), (1, 1)),
        (("model.layers.0.self_attn.o_proj", "model.layers.0"), (1, 1))]
    assert [c.kind for c in calls] == ["self_attn", "self_attn"]
    instance, parts = call_instance(calls[0])
    assert instance == "model.layers.0.self_attn" and "model.layers.0.input_layernorm" in parts
    macro = MacroCell(instance, 1e-6, 1.0, ("weight_matmul_kernel",), parts + call_instance(calls[1])[1])
    cells = [{"name": n, "hierarchy": h} for n, h in (("norm", "model.layers.0.input_layernorm/Mul_1"),
                                                       ("add", "model.layers.0/Add"),
                                                       ("qkv", "model.layers.0.self_attn.q_proj/MatMul"))]
    macros, uncovered = cover((macro,), cells, "decode")
    assert macros[0].cells == ("norm", "add", "qkv") and uncovered == ()
    assert kernel_calls(package, program)[0].modules == ("model.layers.0.self_attn.packed_q_k_v.linear",)


def test_profiled_kernels_go_to_the_calls_they_belong_to():
    """Generated kernels by name (the same name in two layers: each in turn), library kernels to the extern call
    in order (a split-K matmul's two kernels both to it), copies and unknown kernels unattributed; two steps in a
    row wrap around the calls."""
    calls = [KernelCall("triton_norm_0", ("model.layers.0.input_layernorm",)),
             KernelCall("aoti_torch_cuda_mm_out", ("model.layers.0.self_attn.packed_q_k_v.linear",)),
             KernelCall("triton_norm_0", ("model.layers.1.input_layernorm",)),
             KernelCall("aoti_torch_cuda_mm_out", ("lm_head",))]
    step = ["triton_norm_0", "nvjet_gemv_splitK", "splitKreduce_kernel", "triton_norm_0", "nvjet_gemv"]
    got = attribute(["Memcpy HtoD (Pageable -> Device)", *step, *step, "Memset (Device)"], calls)
    want = [None, calls[0], calls[1], calls[1], calls[2], calls[3]]
    assert got[:6] == want and got[6:11] == want[1:] and got[-1] is None
    # a kernel named like no call, with no extern call to fall back on: unattributed
    assert attribute(["triton_other_1"], calls) == [None]
    assert attribute(["triton_norm_0"], []) == [None]


def test_user_triton_kernels_go_by_their_function_s_name_not_to_the_next_extern_call():
    """softsyn's weight kernel through torch.library.triton_op: the map names its launches weight_matmul_kernel_0,
    _1 (one per distinct launch), the profiler the function's weight_matmul_kernel. Each goes to the next call of
    that kernel in order, never to an extern call: on the H100 (2026-12-06) the int4 package's 113 GEMVs were taken
    for library kernels of the attention's bmm calls, and the decode macro cells gave each MLP 2 kernels, 2 us."""
    calls = [KernelCall("weight_matmul_kernel_0", ("model.layers.0.self_attn.packed_q_k_v.linear",)),
             KernelCall("aoti_torch_cuda_bmm_out", ("model.layers.0.self_attn",)),
             KernelCall("triton_red_fused_softmax_0", ("model.layers.0.self_attn",)),
             KernelCall("aoti_torch_cuda_bmm_out", ("model.layers.0.self_attn",)),
             KernelCall("weight_matmul_kernel_1", ("model.layers.0.self_attn.o_proj",)),
             KernelCall("weight_matmul_kernel_0", ("model.layers.0.mlp.packed_gate_up.linear",)),
             KernelCall("triton_poi_fused_mul_silu_1", ("model.layers.0.mlp",)),
             KernelCall("weight_matmul_kernel_2", ("model.layers.0.mlp.down_proj",))]
    step = ["weight_matmul_kernel", "nvjet_bmm", "triton_red_fused_softmax_0", "nvjet_bmm", "weight_matmul_kernel",
            "weight_matmul_kernel", "triton_poi_fused_mul_silu_1", "weight_matmul_kernel"]
    assert attribute(step + step, calls) == calls + calls


def test_signoff_sums_kernel_time_per_module_kind_beside_the_ort_estimate():
    """The profiled kernels of a step (5 steps, as signoff profiles them) summed per kind and per step, each kind
    beside the ORT library's cells of that kind on the critical path; a kernel of two kinds has no estimate; the
    report renders the table."""
    from types import SimpleNamespace

    from reports.signoff import module_table
    from softsyn.flow.torch_signoff import PROFILED_STEPS, kernels_by_module

    calls = [KernelCall("triton_norm_0", ("model.layers.0.input_layernorm", "model.layers.0.self_attn")),
             KernelCall("aoti_torch_cuda_mm_out", ("model.layers.0.self_attn.packed_q_k_v.linear",)),
             KernelCall("triton_norm_1", ("model.norm",)), KernelCall("aoti_torch_cuda_mm_out", ("lm_head",))]
    step = [("triton_norm_0", 2e-6), ("nvjet_gemv", 10e-6), ("triton_norm_1", 1e-6), ("nvjet_gemv", 100e-6),
            ("Memcpy HtoD", 1e-6)]
    points = [SimpleNamespace(hierarchy="model.layers.0.self_attn.q_proj", incr=6e-6),
              SimpleNamespace(hierarchy="model.layers.0.self_attn", incr=3e-6),
              SimpleNamespace(hierarchy="lm_head", incr=90e-6), SimpleNamespace(hierarchy="", incr=17e-6)]
    group = SimpleNamespace(critical=SimpleNamespace(points=points))
    rows = kernels_by_module(group, step * PROFILED_STEPS, calls)
    assert list(rows) == ["lm_head", "self_attn", "input_layernorm+self_attn", "norm", "(unattributed)"]
    assert abs(rows["lm_head"]["seconds"] - 100e-6) < 1e-12 and abs(rows["lm_head"]["predicted"] - 90e-6) < 1e-12
    assert abs(rows["self_attn"]["count"] - 1) < 1e-9 and abs(rows["self_attn"]["predicted"] - 9e-6) < 1e-12
    assert rows["input_layernorm+self_attn"]["predicted"] is None and rows["norm"]["predicted"] is None
    assert kernels_by_module(group, step, []) == {}
    table = module_table(SimpleNamespace(modules=rows, measured_median=200e-6))
    text = "\n".join(table.lines())
    assert "lm_head" in text and "(unattributed)" in text and "50.0%" in text
