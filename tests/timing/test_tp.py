"""Tensor parallelism (issue 16): the Megatron partition, collective cells, per-device timing and area, the plan
per degree, bad degrees, and the vLLM / TensorRT-LLM settings compile writes (their keys checked against the
engines' documented option names, tests/timing/data/engine_options.json)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from helpers import cli
from softsyn.constraints import parse_constraints
from softsyn.design import Design
from softsyn.emit import compiled_precision
from softsyn.frontends import read_design
from softsyn.library.collectives import load_collectives, parse_collectives
from reports import from_json, report_area, report_qor, to_json
from softsyn.emit.engines import engine_files
from softsyn.timing.tp import TPError, partition

OPTIONS = json.loads((Path(__file__).parent / "data" / "engine_options.json").read_text())


def constraints(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def tiny(cache_dir):
    return read_design("zoo:qwen3-tiny", cache_dir=cache_dir, progress=False)


@pytest.fixture(scope="module")
def tiny_tp2(cache_dir, tmp_path_factory):
    """qwen3-tiny analysed at TP=2 on the H200 library (one device of two), 64 MB per device."""
    path = tmp_path_factory.mktemp("tp") / "c.yaml"
    path.write_text("target: h200-ort-cuda\narea_constraint: 8MB\nworkload: {context_len: 256, prompt_len: 32}\n"
                    "parallel: {tensor: 2, devices: 4}\n")
    design = Design.load("zoo:qwen3-tiny", path, cache_dir=cache_dir, progress=False)
    return design, design.analyze()


def test_partition_splits_like_megatron(tiny):
    """Per layer q/k/v/gate/up column-parallel, o/down row-parallel, embedding and lm_head vocab-parallel; one
    AllReduce after each row-parallel pair and the embedding, an AllGather of the logits; KV heads replicated
    when there are fewer than devices."""
    dims = {"batch": 1, "seq": 4, "past": 8}
    p = partition(tiny, 2, tiny.bind(dims))
    roles = {tiny.hierarchy(n).split(".")[-1]: r for n, r in p.role.items()}
    assert {k: roles[k] for k in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")} == dict.fromkeys(
        ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"), "column")
    assert roles["o_proj"] == roles["down_proj"] == "row" and roles["embed_tokens"] == roles["lm_head"] == "vocab"
    assert p.counts() == {"vocab": 2, "column": 10, "row": 4, "AllReduce": 5, "AllGather": 1}
    reduced = sorted(tiny.hierarchy(n).split(".")[-1] for n, moves in p.collectives.items() for op, _ in moves
                     if op == "AllReduce")
    assert reduced == ["down_proj", "down_proj", "embed_tokens", "o_proj", "o_proj"]
    assert p.kv_per_device == 1 and p.share["past_key_values.0.key"] == 0.5
    four = partition(tiny, 4, tiny.bind(dims))  # 2 KV heads over 4 devices: each holds one, replicated twice
    assert four.kv_per_device == 1 and four.share["past_key_values.0.key"] == 0.5
    k_weight = next(n for n in four.role if tiny.hierarchy(n).endswith("k_proj")).inputs[1].name
    q_weight = next(n for n in four.role if tiny.hierarchy(n).endswith("q_proj")).inputs[1].name
    assert four.share[k_weight] == 0.5 and four.share[q_weight] == 0.25
    with pytest.raises(TPError, match="does not divide the 4 attention heads.*valid: 1, 2, 4"):
        partition(tiny, 3, tiny.bind(dims))


def test_moe_is_expert_parallel(cache_dir):
    nl = read_design("zoo:qwen3-moe-tiny", cache_dir=cache_dir, progress=False)
    p = partition(nl, 2, nl.bind({"batch": 1, "seq": 4, "past": 8}))
    expert_weights = [v for v in nl.model.graph.initializers.values() if v.shape is not None and len(v.shape) == 3
                      and v.shape[0] == 4]
    assert expert_weights and all(p.share[v.name] == 0.5 for v in expert_weights)
    assert p.counts()["expert"] == 4 and p.counts()["AllReduce"] == 5 and "router" in p.role.values()
    assert "2 of 4 experts per device" in p.describe()


def test_per_device_area_and_timing(tiny, tiny_tp2):
    """Split weights and the KV cache halve on each device, replicated ones (norms) do not; every layer's two
    AllReduce cells are on the decode path, est, and the plan lists each degree that divides the heads."""
    design, analysis = tiny_tp2
    weights = {v.name: v.const_value is not None and v.dtype.itemsize * math.prod(v.shape.numpy())
               for v in tiny.model.graph.initializers.values() if v.dtype.is_floating_point()}
    split = {name for name, share in design.partition.share.items() if name in weights and share < 1}
    expected = sum(b / 2 if n in split else b for n, b in weights.items())
    got = sum(k.bytes for k in analysis.area.by_kind if k.name.startswith("weights "))
    assert got == pytest.approx(expected)
    assert {n for n in weights if "norm" in n} and not split & {n for n in weights if "norm" in n}
    one, two = (r for r in analysis.tp.rows if r.n in (1, 2))
    assert two.kv_cache == one.kv_cache / 2 and two.weights < one.weights
    decode = analysis.group("decode").critical
    moves = [p for p in decode.points if p.op_type == "AllReduce"]
    assert len(moves) == 5 and all(p.source == "est" and p.incr > 0 for p in moves)
    assert two.collective_time["decode"] == pytest.approx(sum(p.incr for p in moves + [
        p for p in decode.points if p.op_type == "AllGather"]))
    assert one.collective_time["decode"] == 0 and one.collectives == 0
    assert [r.n for r in analysis.tp.rows] == [1, 2, 4] and analysis.tp.smallest_fit == 1
    assert from_json(to_json(analysis)).tp == analysis.tp
    for text in (report_area(analysis), report_qor(analysis)):
        assert "Tensor parallelism (this analysis is one of 2 devices; area_constraint 8.000 MB per device)" in text
        assert "Smallest degree that fits: TP=1" in text and "alpha-beta estimate (est)" in text


def test_collective_alpha_beta():
    """nccl-tests' bus bandwidth: AllReduce moves 2(n-1)/n of the buffer per rank, AllGather (n-1)/n."""
    lib = load_collectives()
    ar, ag = lib.models["AllReduce"], lib.models["AllGather"]
    assert lib.delay("AllReduce", 1e9, 2) == (pytest.approx(ar.alpha + 1e9 / ar.busbw), "est")
    assert lib.delay("AllGather", 8e9, 8)[0] == pytest.approx(ag.alpha + 8e9 * 7 / 8 / ag.busbw)
    assert lib.delay("AllReduce", 1e9, 1) == (0.0, "table")
    measured = parse_collectives(
        "library: x\nkind: collectives\nruntime: r\ndevice: d\ndate: '2026-12-01'\ncollectives: {}\ncells:\n"
        "  - {op: AllReduce, precision: fp16, axes: [ranks, bytes], points: [[2, 8], [1000, 1000000]],\n"
        "     delays: [[1.0e-05, 2.0e-05], [1.5e-05, 4.0e-05]]}\n", Path("x.yaml"))
    assert measured.delay("AllReduce", 1000, 2) == (pytest.approx(1e-5), "table")
    with pytest.raises(Exception, match="x.yaml:6: collectives.Broadcast: unknown collective"):
        parse_collectives("library: x\nkind: collectives\nruntime: r\ndevice: d\ndate: '2026-12-01'\n"
                          "collectives: {Broadcast: {alpha: 1}}\n", Path("x.yaml"))


@pytest.mark.parametrize("args, text, words", [
    (["--tp", "3"], None, "softsyn: error: --tp 3: tensor parallel degree 3 does not divide the 4 attention heads "
                          "of qwen3-tiny; valid: 1, 2, 4"),
    (["--tp", "0"], None, "Invalid value for '--tp': '0' is not a tensor-parallel degree; valid: an integer 1..64 or auto"),
    ([], "parallel:\n  tensor: 3\n", "c.yaml:2: parallel.tensor: tensor parallel degree 3 does not divide"),
    ([], "parallel:\n  tensr: 2\n", "c.yaml:2: parallel: unknown key 'tensr'; did you mean 'tensor'?"),
    ([], "parallel: {tensor: 4, devices: 2}\n", "c.yaml:1: parallel.tensor: 4 is more than parallel.devices (2)"),
])
def test_bad_degree_exits_2(capsys, tmp_path, cache_dir, args, text, words):
    extra = ["-c", constraints(tmp_path, text)] if text else []
    code, _, err = cli(capsys, "analyze", "zoo:qwen3-tiny", "--cache-dir", cache_dir, "-q", *extra, *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err


def test_parallel_constraints_read():
    c = parse_constraints("parallel: {tensor: 2, devices: 4, weights: int4}\n", "c.yaml")
    assert (c.parallel.tensor, c.parallel.devices, c.parallel.weights) == (2, 4, "int4")
    assert parse_constraints("clock_period: 1s\n").parallel.tensor is None


def test_engine_settings_use_documented_names(tiny_tp2):
    """vllm.json and trtllm-llm-api.yaml at TP=2: every key one the engines document, values from the design."""
    design, analysis = tiny_tp2
    notes: list[str] = []
    files = engine_files(design, analysis, "zoo:qwen3-8b", compiled_precision(design.netlist), notes)
    vllm = json.loads(files["runtime/vllm.json"])
    docs = OPTIONS["vllm"]
    assert set(vllm) <= set(docs["engine_args"]) and set(vllm["compilation_config"]) <= set(docs["compilation_config"])
    assert vllm["tensor_parallel_size"] == 2 and vllm["model"] == "Qwen/Qwen3-8B"
    assert vllm["kv_cache_dtype"] in docs["kv_cache_dtype"] and vllm["dtype"] in docs["dtype"]
    assert vllm["max_model_len"] == analysis.area.kv_budget.length
    assert vllm["max_num_seqs"] == analysis.area.kv_budget.max_concurrency
    assert vllm["compilation_config"]["cudagraph_capture_sizes"][-1] == vllm["max_num_seqs"]
    serve = files["runtime/vllm-serve.sh"].splitlines()[-1]
    assert serve.startswith("vllm serve Qwen/Qwen3-8B --dtype float32 --tensor-parallel-size 2 ")
    flags = [w[2:].replace("-", "_") for w in serve.split() if w.startswith("--")]
    assert set(flags) <= set(docs["engine_args"])
    trt = yaml.safe_load(files["runtime/trtllm-llm-api.yaml"])
    t = OPTIONS["trtllm"]
    assert set(trt) <= set(t["llm_args"]) and set(trt["kv_cache_config"]) <= set(t["kv_cache_config"])
    assert set(trt["cuda_graph_config"]) <= set(t["cuda_graph_config"]) and trt["kv_cache_config"]["dtype"] in \
        t["kv_cache_dtype"]
    assert trt["tensor_parallel_size"] == 2 and trt["max_seq_len"] == vllm["max_model_len"]
    assert 0 < trt["kv_cache_config"]["free_gpu_memory_fraction"] < 1
    serve = files["runtime/trtllm-serve.sh"].splitlines()[-1]
    assert {w for w in serve.split() if w.startswith("--")} <= set(t["trtllm_serve_flags"])
    assert any("not run here" in n for n in notes)


def test_compile_writes_engine_settings(tiny_cpu_artifact):
    vllm = json.loads((tiny_cpu_artifact / "runtime" / "vllm.json").read_text())
    assert vllm["tensor_parallel_size"] == 1 and set(vllm) <= set(OPTIONS["vllm"]["engine_args"])
    assert (tiny_cpu_artifact / "runtime" / "trtllm-llm-api.yaml").is_file()


def test_collective_cells_pattern(capsys, tmp_path):
    """--cells names collectives by op glob; they are measured alone (their own library, one process per device)."""
    from softsyn.library.collectives import collective_cells

    assert collective_cells("AllReduce*") == ["AllReduce"]
    assert collective_cells("All*,ReduceScatter.fp16") == ["AllReduce", "AllGather", "ReduceScatter"]
    assert collective_cells("MatMul*") == []
    code, _, err = cli(capsys, "characterize", "--cells", "AllReduce*,MatMul*", "-o", tmp_path / "x.yaml")
    assert code == 2 and "collectives (AllReduce) are measured apart from kernel cells" in err


def test_weights_seen_through_load_time_ops():
    """A weightless export feeds MatMul with Transpose(W), its shape left out: still a weight, [k, n] from W's."""
    import numpy as np
    import onnx_ir as ir
    from onnx import TensorProto, helper, numpy_helper

    from softsyn.timing.tp import weight_roots, weight_shape

    w = numpy_helper.from_array(np.ones((32, 16), np.float32), "W")
    nodes = [helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]), helper.make_node("MatMul", ["x", "Wt"], ["y"])]
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], [w])
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    matmul = model.graph.node(1)
    assert [v.name for v in weight_roots(matmul.inputs[1])] == ["W"] and weight_roots(matmul.inputs[0]) == []
    assert weight_shape(matmul.inputs[1]) == (16, 32)
