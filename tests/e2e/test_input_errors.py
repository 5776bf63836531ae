"""Issue 12, round 2: every bad input file (constraints, library, transformers config, ONNX) is refused with
exit 2 and one short line naming the file, line and key; nothing non-JSON or stray is written. Each test
reproduces a reported failure (a traceback, a silent acceptance, a multi-line dump or a file in the cwd)."""
from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers import cli, mlp
from softsyn.library import shipped_libraries


def batch_mlp(path):
    """x[batch, 16] -> MatMul -> Relu -> y: a design with one symbolic dim."""
    w = numpy_helper.from_array(np.ones((16, 16), np.float32), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"], name="r")]
    graph = helper.make_graph(nodes, "bm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    return path


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("softsyn: error: "), err
    return lines[0]


# ------------------------------------------------------------------------------------------ constraints

@pytest.mark.parametrize("text, words", [
    ("clock_period: !mytag 5ms\n", ["c.yaml:1: YAML tag '!mytag' is not supported"]),
    ("clock_period: " + "[" * 5000 + "]" * 5000 + "\n", ["c.yaml:1: ", "nested deeper than 64 levels"]),
    ("path_groups:\n  b:\n    <<: 5\n", ["c.yaml:3: ", "merge key '<<'"]),
    ("area_constraint: 1e400GB\n", ["c.yaml:1: area_constraint: ", "not a finite number"]),
    ("workload: {batch: 99999999999999999999999}\n", ["c.yaml:1: workload.batch: "]),
], ids=["tag", "deep", "merge", "overflow", "int64"])
def test_constraints_that_crashed_exit_2_in_one_line(tmp_path, capsys, text, words):
    (tmp_path / "c.yaml").write_text(text)
    code, _, err = cli(capsys, "analyze", mlp(tmp_path / "m.onnx"), "-q", "-c", tmp_path / "c.yaml")
    line = one_error_line(err)
    assert code == 2 and all(w in line for w in words) and len(line) < 400, err


def test_analysis_json_is_strict_json_and_unconstrained_is_null(tmp_path, capsys):
    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))

    model = mlp(tmp_path / "m.onnx")
    assert cli(capsys, "analyze", model, "-q", "-o", tmp_path / "free")[0] == 0
    group = strict((tmp_path / "free" / "analysis.json").read_text())["groups"][0]
    assert group["clock_period"] is None and {p["slack"] for p in group["paths"]} == {None}
    code, out, _ = cli(capsys, "report", "qor", tmp_path / "free")
    assert code == 0 and "Critical Path Slack:" in out and "unconstrained" in out
    (tmp_path / "c.yaml").write_text("clock_period: 10s\n")
    assert cli(capsys, "analyze", model, "-q", "-c", tmp_path / "c.yaml", "-o", tmp_path / "clocked")[0] == 0
    group = strict((tmp_path / "clocked" / "analysis.json").read_text())["groups"][0]
    assert group["clock_period"] == 10.0 and all(p["slack"] > 0 for p in group["paths"])
    code, out, _ = cli(capsys, "report", "qor", tmp_path / "clocked")
    assert code == 0 and "unconstrained" not in out.split("Design Rules")[0]


def test_unknown_scenario_dims_name_the_dim_and_the_designs_dims(tmp_path, capsys):
    model = batch_mlp(tmp_path / "bm.onnx")
    (tmp_path / "c.yaml").write_text("clock_period: 1s\npath_groups:\n  default:\n    dims: {batch: 2, bogus_dim: 3}\n")
    code, _, err = cli(capsys, "analyze", model, "-q", "-c", tmp_path / "c.yaml")
    line = one_error_line(err)
    assert code == 2 and f"{tmp_path / 'c.yaml'}:4: path_groups.default.dims.bogus_dim: " in line, err
    assert "the design has no dim 'bogus_dim'; its dims: batch" in line
    (tmp_path / "c.yaml").write_text("clock_period: 1s\npath_groups:\n  default:\n    dims: {batch: 2}\n")
    assert cli(capsys, "analyze", model, "-q", "-c", tmp_path / "c.yaml")[0] == 0


def test_an_unknown_target_names_the_constraints_line(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("clock_period: 1s\ntarget: nosuch\n")
    code, _, err = cli(capsys, "analyze", mlp(tmp_path / "m.onnx"), "-q", "-c", tmp_path / "c.yaml")
    assert code == 2 and one_error_line(err) == (
        f"softsyn: error: {tmp_path / 'c.yaml'}:2: target: unknown library 'nosuch'; "
        f"shipped: {', '.join(shipped_libraries())}, or a path to a .yaml library"), err
    code, _, err = cli(capsys, "analyze", mlp(tmp_path / "m.onnx"), "-q", "--target", "nosuch")
    assert code == 2 and one_error_line(err) == ("softsyn: error: unknown library 'nosuch'; shipped: "
                                                 f"{', '.join(shipped_libraries())}, or a path to a .yaml library"), err


# ------------------------------------------------------------------------------------------ libraries

@pytest.mark.parametrize("text, words", [
    (b"library: x\ncells: !foo 3\n", [":2: YAML tag '!foo' is not supported"]),
    (b"library: x\ncells: " + b"[" * 5000 + b"]" * 5000 + b"\n", [":2: ", "nested deeper than 64 levels"]),
    (b"library: x\ncells: [" + b"x" * 10000 + b"\n", [":2: YAML syntax error"]),
    (b"a: &a {x: 1}\nlibrary: x\nb:\n  <<: 5\n", [":4: ", "merge key '<<'"]),
    (b"library: x\xff\xfe\n", ["not a UTF-8 text file"]),
], ids=["tag", "deep", "long line", "merge", "binary"])
def test_bad_library_files_exit_2_in_one_short_line(tmp_path, capsys, text, words):
    (tmp_path / "lib.yaml").write_bytes(text)
    code, _, err = cli(capsys, "analyze", mlp(tmp_path / "m.onnx"), "-q", "--target", tmp_path / "lib.yaml")
    line = one_error_line(err)
    assert code == 2 and str(tmp_path / "lib.yaml") in line and all(w in line for w in words), err
    assert len(line) < 300, line


# ------------------------------------------------------------------------------------------ models

TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1,
              "vocab_size": 10, "intermediate_size": 32}


@pytest.mark.parametrize("config, commands, words", [
    ({"model_type": "nosuchmodel"}, ("analyze", "compile"),
     ["config.json: model_type 'nosuchmodel' is not an architecture transformers"]),
    (dict(TINY_LLAMA, intermediate_size=-5), ("analyze", "compile"),
     ["config.json: transformers cannot build the model: RuntimeError: ", "negative dimension -5"]),
    (dict(TINY_LLAMA, hidden_act="nosuchact"), ("analyze", "compile"),
     ["transformers cannot build the model: KeyError: 'nosuchact'"]),
    (dict(TINY_LLAMA, num_key_value_heads=3), ("analyze",),  # torch.export logged two lines of its own first
     ["config.json: exporting ", "failed: RuntimeError: Attempting to broadcast a dimension of length 3"]),
], ids=["model_type", "negative size", "activation", "export"])
def test_bad_transformers_configs_exit_2_in_one_short_line(tmp_path, capsys, config, commands, words):
    (tmp_path / "config.json").write_text(json.dumps(config))
    for command in commands:
        code, _, err = cli(capsys, command, tmp_path / "config.json", "-q", "-o", tmp_path / "out",
                           "--cache-dir", tmp_path / "cache")
        line = one_error_line(err)
        assert code == 2 and all(w in line for w in words) and len(line) < 400, err


def tiny_hf_folder(folder, shards: bool = False, safe: bool = True):
    """save_pretrained of a seeded 1-layer llama (TINY_LLAMA) into `folder`; `shards`: two safetensors + index;
    `safe` False: its weights as a torch pytorch_model.bin instead (transformers 5 saves safetensors only)."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**TINY_LLAMA, "vocab_size": 64}))
    model.save_pretrained(str(folder), max_shard_size="100KB" if shards else "5GB")
    if not safe:
        (folder / "model.safetensors").unlink()
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
    return folder


@pytest.mark.parametrize("case", ["truncated", "truncated-real-size", "missing-shard", "shard-without-index",
                                  "truncated-bin"])
def test_weight_files_that_cannot_be_read_exit_2_naming_the_file(tmp_path, capsys, monkeypatch, case):
    """A folder whose weights do not load (a safetensors file cut short by a full disk) was compiled "with seeded
    random weights" as if it had none; now compile stops in one line naming the file, before any export."""
    from softsyn.frontends import hf

    folder = tiny_hf_folder(tmp_path / "m", shards=case in ("missing-shard", "shard-without-index"),
                            safe=case != "truncated-bin")
    shards = sorted(folder.glob("model-*.safetensors"))
    if case == "truncated-bin":
        bad = folder / "pytorch_model.bin"
        os.truncate(bad, bad.stat().st_size - 100)
        words = ["is a torch zip archive without its directory", "cut short?"]
    elif case.startswith("truncated"):
        bad = folder / "model.safetensors"
        os.truncate(bad, bad.stat().st_size // 2)
        words = ["holds", "safetensors header describes: cut short"]
    elif case == "missing-shard":
        bad = folder / "model.safetensors.index.json"
        shards[-1].unlink()
        words = [f"names shard {shards[-1].name}, which is not in the folder"]
    else:
        (folder / "model.safetensors.index.json").unlink()
        bad = shards[0]
        words = ["a weight file transformers does not load on its own", "is the shards' index file missing?"]
    if case == "truncated-real-size":
        monkeypatch.setattr(hf, "MATERIALISE_LIMIT", 0)  # the model: real-size, so compile materialises
    capsys.readouterr()  # save_pretrained's progress bar
    code, _, err = cli(capsys, "compile", folder, "-o", tmp_path / "out", "--cache-dir", tmp_path / "cache")
    line = one_error_line(err)
    assert code == 2 and line.startswith(f"softsyn: error: {bad}: ") and all(w in line for w in words), err
    assert "seeded random weights" not in err.replace("seeded random weights are only for", "")
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_a_model_onnx_checker_refuses_exits_2_in_one_line(tmp_path, capsys):
    """A Relu with two inputs: analyze times it, compile's onnx.checker refuses it."""
    model = mlp(tmp_path / "m.onnx", names=("a", "b", "c", "d", "e"))
    proto = onnx.load(model)
    proto.graph.node[1].input.append("x")
    onnx.save(proto, model)
    code, _, err = cli(capsys, "compile", model, "-q", "-o", tmp_path / "out")
    line = one_error_line(err)
    assert code == 2 and "fails onnx.checker: Node(b) with schema(::Relu:14) has input size 2" in line, err
    assert not (tmp_path / "out").exists()


def test_a_checker_failure_of_softsyns_own_output_exits_3(tmp_path, capsys, monkeypatch):
    """A valid source whose compiled model the checker refuses is softsyn's defect (exit 3), never bad input: a
    pass that leaves the graph out of topological order (as fuse's skip norms once did on Qwen3-VL's vision)."""
    import passes

    original = passes.get("kv_layout")

    def disorder(design, **options):
        result = original.run(design, **options)
        graph = design.netlist.model.graph
        last = graph.node(len(graph) - 1)
        graph.remove(last)
        graph.insert_before(graph.node(0), last)  # the Sigmoid now reads h4 before the Add makes it
        return result

    monkeypatch.setitem(passes.PASSES, "kv_layout", passes.Pass("kv_layout", original.help, disorder))
    model = mlp(tmp_path / "m.onnx", names=("a", "b", "c", "d", "e"))
    code, _, err = cli(capsys, "compile", model, "-q", "-o", tmp_path / "out")
    lines = err.strip().splitlines()
    assert code == 3 and len(lines) == 1, err
    assert lines[0].startswith("softsyn: internal error: SoftsynDefect: design m: softsyn wrote model.onnx, which "
                               "fails onnx.checker (a softsyn defect, not your input): "), err
    assert "topologically sorted" in lines[0] and "node: name: e" in lines[0], err
    assert not (tmp_path / "out").exists()


def test_shape_inference_leaves_the_working_directory_alone(tmp_path, capsys, monkeypatch):
    """A GroupQueryAttention without a past cache: ORT's symbolic shape inference cannot finish, and used to
    save sym_shape_infer_temp.onnx into the cwd."""
    vi = helper.make_tensor_value_info
    gqa = helper.make_node("GroupQueryAttention", ["q", "k", "v", "", "", "seqlens_k", "total"], ["o", "pk", "pv"],
                           domain="com.microsoft", num_heads=4, kv_num_heads=2, name="gqa")
    graph = helper.make_graph(
        [gqa, helper.make_node("Relu", ["o"], ["y"], name="relu")], "gqa",
        [vi("q", TensorProto.FLOAT, ["batch", "seq", 64]), vi("k", TensorProto.FLOAT, ["batch", "seq", 32]),
         vi("v", TensorProto.FLOAT, ["batch", "seq", 32]), vi("seqlens_k", TensorProto.INT32, ["batch"]),
         vi("total", TensorProto.INT32, [])], [vi("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18),
                                                                     helper.make_opsetid("com.microsoft", 1)]),
              tmp_path / "gqa.onnx")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    code, _, err = cli(capsys, "analyze", tmp_path / "gqa.onnx", "-q")
    assert code == 0, err
    assert os.listdir(work) == []
