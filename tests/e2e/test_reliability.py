"""Issue 12 (reliability): node identity, output ownership, atomic outputs, exit codes and messages,
read-time checks, deterministic artifacts. Each test reproduces a reported failure."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from helpers import cli, mlp
from paths import ROOT
from softsyn import outdir
from softsyn.constraints.model import Constraints
from softsyn.design import Design
from softsyn.errors import LibraryFailure
from softsyn.frontends.hf_common import brief
from softsyn.library import load_library
from softsyn.netlist.model import Netlist

CPU_TINY = ROOT / "constraints" / "cpu-tiny.yaml"


@pytest.fixture
def deadline():
    """Fail instead of hanging: the STA trace once looped forever (23.6 GB RSS) on repeated node names."""
    def expire(*_):
        raise TimeoutError("did not finish within 120 s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


# ------------------------------------------------------------------------------------------ 1. node identity

def test_unnamed_and_repeated_node_names_analyse_and_compile(tmp_path, capsys, deadline):
    model = mlp(tmp_path / "mlp.onnx")
    code, out, err = cli(capsys, "analyze", model, "-q", "--max-paths", "1", "-o", tmp_path / "a")
    assert code == 0, err
    saved = json.loads((tmp_path / "a" / "analysis.json").read_text())
    points = saved["groups"][0]["paths"][0]["points"]
    # every cell once, in execution order, under a stable printable name (op + index for unnamed ones)
    assert [p["name"] for p in points] == ["session.run", "MatMul_0", "Relu_1", "dup", "dup_3", "Sigmoid_4"]
    assert [p["op_type"] for p in points[1:]] == ["MatMul", "Relu", "MatMul", "Add", "Sigmoid"]
    assert points[-1]["arrival"] == pytest.approx(sum(p["incr"] for p in points))

    code, out, err = cli(capsys, "compile", model, "-q", "-o", tmp_path / "c")
    assert code == 0, err
    compiled = onnx.load(tmp_path / "c" / "model.onnx")
    names = [n.name for n in compiled.graph.node]
    assert len(set(names)) == len(names) and "" not in names
    session = ort.InferenceSession(str(tmp_path / "c" / "model.onnx"), providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": np.ones((2, 16), np.float32)})[0].shape == (2, 16)


def test_timing_keys_cells_by_identity_not_name(deadline):
    """A netlist built in memory, where every node has the same name (no frontend renamed them)."""
    x = ir.Value(name="x", shape=ir.Shape([4, 8]), type=ir.TensorType(ir.DataType.FLOAT))
    nodes, value = [], x
    for op in ("Relu", "Neg", "Relu", "Neg"):
        node = ir.node(op, [value], name="same")
        node.outputs[0].shape, node.outputs[0].type = ir.Shape([4, 8]), ir.TensorType(ir.DataType.FLOAT)
        nodes.append(node)
        value = node.outputs[0]
    graph = ir.Graph([x], [value], nodes=nodes, opset_imports={"": 18})
    design = Design(Netlist(ir.Model(graph, ir_version=10), "same-names"), Constraints.default(),
                    load_library("cpu-ort"), progress=False)
    path = design.analyze().groups[0].critical
    assert [p.op_type for p in path.points] == ["Run", "Relu", "Neg", "Relu", "Neg"]
    assert [p.arrival for p in path.points] == sorted(p.arrival for p in path.points)


# ------------------------------------------------------------------------------------------ 2. ownership

def test_a_foreign_directory_is_refused_in_one_line(tmp_path, capsys):
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "thesis.tex").write_text("mine")
    model = mlp(proj / "model.onnx")
    before = sorted(p.name for p in proj.iterdir())
    for command in ("analyze", "compile"):
        code, _, err = cli(capsys, command, model, "-q", "-o", proj)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"{proj}: not a softsyn output directory" in err and "model.onnx, src/, thesis.tex" in err
    assert sorted(p.name for p in proj.iterdir()) == before and (proj / "thesis.tex").read_text() == "mine"


def test_the_input_model_is_never_inside_what_is_replaced(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli(capsys, "compile", mlp(tmp_path / "m.onnx"), "-q", "-o", out)[0] == 0
    weights = (out / "model.onnx.data").read_bytes()
    code, _, err = cli(capsys, "compile", out / "model.onnx", "-q", "-o", out)
    assert code == 2 and "is inside this output directory" in err, err
    assert (out / "model.onnx.data").read_bytes() == weights


def test_user_files_in_an_output_are_kept_and_said(tmp_path, capsys):
    model, out = mlp(tmp_path / "m.onnx"), tmp_path / "out"
    assert cli(capsys, "analyze", model, "-q", "-o", out)[0] == 0
    manifest = json.loads((out / outdir.MANIFEST).read_text())
    assert manifest["kind"] == "analyze" and manifest["design"] == "m"
    assert manifest["files"]["analysis.json"]["by"] == "analyze" and len(manifest["files"]) == 9  # + reports/suggestions.json
    assert all(r["size"] == (out / p).stat().st_size for p, r in manifest["files"].items())
    (out / "notes.txt").write_text("keep me")
    (out / "signoff").mkdir()
    (out / "signoff" / "mine.json").write_text("{}")
    code, _, err = cli(capsys, "analyze", model, "-o", out)
    assert code == 0
    assert (out / "notes.txt").read_text() == "keep me" and (out / "signoff" / "mine.json").read_text() == "{}"
    assert "kept what softsyn did not write: notes.txt, signoff/mine.json" in err
    assert "notes.txt" not in json.loads((out / outdir.MANIFEST).read_text())["files"]


def test_a_listed_file_the_user_changed_is_not_replaced(tmp_path, capsys):
    model, out = mlp(tmp_path / "m.onnx"), tmp_path / "out"
    assert cli(capsys, "analyze", model, "-q", "-o", out)[0] == 0
    (out / "reports" / "qor.rpt").write_text("my annotated copy")
    code, _, err = cli(capsys, "analyze", model, "-q", "-o", out)
    assert code == 2 and "qor.rpt: changed since softsyn wrote it" in err
    assert (out / "reports" / "qor.rpt").read_text() == "my annotated copy"


def test_analyze_into_a_compile_directory_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli(capsys, "compile", mlp(tmp_path / "m.onnx"), "-q", "-o", out)[0] == 0
    listing = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    code, _, err = cli(capsys, "analyze", mlp(tmp_path / "other.onnx"), "-q", "-o", out)
    assert code == 2 and "holds the compiled design m" in err, err
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == listing


# ------------------------------------------------------------------------------------------ 3. leftovers

def test_leftovers_of_a_killed_run_are_cleaned_and_a_cut_swap_restored(tmp_path, capsys):
    model, out = mlp(tmp_path / "m.onnx"), tmp_path / "out"
    assert cli(capsys, "analyze", model, "-q", "-o", out)[0] == 0
    # a killed staging (marker, no live owner) and an empty one from a kill right after mkdtemp
    dead = tmp_path / ".out.softsyn-staging-dead"
    dead.mkdir()
    (dead / outdir.STAGING_MARK).write_text("{}")
    (tmp_path / ".out.softsyn-staging-empty").mkdir()
    # a staging whose owner is alive (its lock is held) and a look-alike that is not ours stay
    alive = tmp_path / ".out.softsyn-staging-alive"
    alive.mkdir()
    (alive / outdir.STAGING_MARK).write_text("{}")
    foreign = tmp_path / ".out.softsyn-staging-foreign"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("mine")
    import fcntl

    lock = os.open(alive, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        assert cli(capsys, "analyze", model, "-q", "-o", out)[0] == 0
    finally:
        os.close(lock)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.softsyn-staging-alive",
                                                           ".out.softsyn-staging-foreign", "m.onnx", "out"]
    # killed between the fallback's two renames: DIR missing, the backup holds the previous output
    backup = tmp_path / ".out.softsyn-backup-cut"
    out.rename(backup)
    assert cli(capsys, "analyze", model, "-q", "-o", out)[0] == 0
    assert not backup.exists() and json.loads((out / outdir.MANIFEST).read_text())["kind"] == "analyze"


def test_the_swap_without_rename_exchange_keeps_a_complete_output(tmp_path, capsys, monkeypatch):
    model, out = mlp(tmp_path / "m.onnx"), tmp_path / "out"
    assert cli(capsys, "analyze", model, "-q", "-o", out)[0] == 0
    monkeypatch.setattr(outdir, "_exchange", lambda a, b: False)
    (out / "notes.txt").write_text("keep me")
    assert cli(capsys, "compile", model, "-q", "-o", out)[0] == 0
    assert json.loads((out / outdir.MANIFEST).read_text())["kind"] == "compile"
    assert (out / "notes.txt").read_text() == "keep me" and not (out / "design.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "out"]


# ------------------------------------------------------------------------------------------ 4. exit codes

def test_internal_errors_exit_3_in_one_line_and_debug_prints_the_trace(tmp_path, capsys, monkeypatch):
    def broken(self):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(Design, "analyze", broken)
    model = mlp(tmp_path / "m.onnx")
    code, _, err = cli(capsys, "analyze", model, "-q")
    assert code == 3 and err == ("softsyn: internal error: RuntimeError: boom second line "
                                 "(rerun with --debug for the trace)\n")
    code, _, err = cli(capsys, "analyze", model, "-q", "--debug")
    assert code == 3 and "Traceback (most recent call last)" in err and "in broken" in err


def test_a_library_failure_exits_2_in_one_line_that_points_at_the_trace(tmp_path, capsys, monkeypatch):
    """A library softsyn drives failing on the design (AOTInductor's compile worker, here): exit 2, one line with the
    worker's own exception, and --debug for the whole trace (the worker's traceback)."""
    def broken(self):
        try:
            raise RuntimeError("Failed to run autotuning code block: An exception occurred in a subprocess:\n"
                               "Traceback (most recent call last):\n  File \"w.py\", line 1\nValueError: worker")
        except RuntimeError as exc:
            raise LibraryFailure(f"m.onnx: lowering failed: {brief(exc)}") from exc

    monkeypatch.setattr(Design, "analyze", broken)
    model = mlp(tmp_path / "m.onnx")
    code, _, err = cli(capsys, "analyze", model, "-q")
    assert code == 2 and err == ("softsyn: error: m.onnx: lowering failed: RuntimeError: Failed to run autotuning code "
                                 "block: An exception occurred in a subprocess: ValueError: worker (rerun with --debug "
                                 "for the trace)\n")
    code, _, err = cli(capsys, "analyze", model, "-q", "--debug")
    assert code == 2 and "Traceback (most recent call last)" in err and 'File "w.py"' in err


def test_bad_output_directories_are_found_before_any_work(tmp_path, capsys, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the design was loaded before -o was checked")

    monkeypatch.setattr(Design, "load", never)
    model = mlp(tmp_path / "m.onnx")
    (tmp_path / "file").write_text("")
    for command in ("compile", "analyze"):
        code, _, err = cli(capsys, command, model, "-q", "-o", tmp_path / "file" / "out")
        assert code == 2 and "file is not a directory" in err, err
        code, _, err = cli(capsys, command, model, "-q", "-o", tmp_path / "file")
        assert code == 2 and len(err.splitlines()) == 1, err


def test_missing_or_truncated_external_data_at_compile_names_the_file(tmp_path, capsys):
    model = mlp(tmp_path / "m.onnx", external=True)
    data = tmp_path / "m.onnx.data"
    with open(data, "r+b") as fh:
        fh.truncate(100)
    code, _, err = cli(capsys, "compile", model, "-q", "-o", tmp_path / "out")
    assert code == 2 and f"its external data file {data} is truncated" in err, err
    data.unlink()
    code, _, err = cli(capsys, "compile", model, "-q", "-o", tmp_path / "out")
    assert code == 2 and f"its external data file {data} is missing" in err, err
    assert not (tmp_path / "out").exists()


def test_verify_on_a_broken_artifact_names_what_is_broken(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli(capsys, "compile", mlp(tmp_path / "m.onnx"), "-q", "-o", out)[0] == 0
    session = json.loads((out / "runtime" / "session.json").read_text())
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    (broken / "runtime" / "session.json").write_text(json.dumps({**session, "scenarios": {"default": {"dims": "x"}}}))
    code, _, err = cli(capsys, "verify", broken)
    assert code == 2 and "session.json: scenarios.default.dims" in err, err
    shutil.rmtree(broken)
    shutil.copytree(out, broken)
    (broken / "model.onnx").write_bytes((broken / "model.onnx").read_bytes()[:200])
    code, _, err = cli(capsys, "verify", broken)
    assert code == 2 and "model.onnx: the compiled model is not a readable ONNX model" in err, err
    assert cli(capsys, "verify", out)[0] == 0


@pytest.mark.parametrize("text, field", [("null", "expected a JSON object"),
                                         ("{", "not a readable softsyn analysis"),
                                         ("groups.0.paths.0.slack=\"abc\"", "groups[0].paths[0].slack"),
                                         ("area.by_kind=7", "area.by_kind: expected a list")])
def test_report_on_a_corrupted_analysis_exits_2(tmp_path, capsys, text, field):
    out = tmp_path / "out"
    assert cli(capsys, "analyze", mlp(tmp_path / "m.onnx"), "-q", "-o", out)[0] == 0
    if "=" in text:
        data = json.loads((out / "analysis.json").read_text())
        keys, value = text.split("=")
        *parents, last = [int(k) if k.isdigit() else k for k in keys.split(".")]
        node = data
        for k in parents:
            node = node[k]
        node[last] = json.loads(value)
        text = json.dumps(data)
    (out / "analysis.json").write_text(text)
    code, _, err = cli(capsys, "report", "timing", out)
    assert code == 2 and field in err and len(err.splitlines()) == 1, err


# ------------------------------------------------------------------------------------------ 5. read time

def test_cycles_and_dangling_inputs_are_refused_at_read_time(tmp_path, capsys):
    cyclic = mlp(tmp_path / "cyclic.onnx", names=("a", "b", "c", "d", "e"))
    proto = onnx.load(cyclic)
    proto.graph.node[0].input[0] = "h4"  # MatMul reads the Add's output, which depends on the MatMul
    onnx.save(proto, cyclic)
    code, _, err = cli(capsys, "analyze", cyclic, "-q")
    assert code == 2 and "node a (#0, MatMul): input 'h4' depends on the node's own output" in err, err
    assert "cycle a (MatMul) -> b (Relu) -> c (MatMul) -> d (Add) -> a" in err
    dangling = mlp(tmp_path / "dangling.onnx")
    proto = onnx.load(dangling)
    proto.graph.node[3].input[1] = "bias_nobody_makes"
    onnx.save(proto, dangling)
    code, _, err = cli(capsys, "analyze", dangling, "-q")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "node dup (#3, Add): input 'bias_nobody_makes' is produced by no node, initializer or graph input" in err


def test_an_op_nothing_knows_is_labelled_warned_and_not_compiled(tmp_path, capsys):
    custom = helper.make_node("Frobnicate", ["y"], ["z"], domain="my.ops", name="frob")
    model = mlp(tmp_path / "m.onnx", names=("m0", "r", "m1", "a", "s"), extra_nodes=[custom])
    proto = onnx.load(model)
    proto.opset_import.append(helper.make_opsetid("my.ops", 1))
    proto.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 16]))
    onnx.save(proto, model)
    code, out, err = cli(capsys, "analyze", model, "-q", "-o", tmp_path / "a")
    assert code == 0, err
    warning = "Warning: 1 cell of op Frobnicate (my.ops) has no library cell and no cost model: 0 assumed"
    assert out.count(warning) == 2  # report_timing and report_qor
    code, out, _ = cli(capsys, "report", "timing", tmp_path / "a", "--no-fold")
    assert code == 0 and warning in out and "Frobnicate.fp32 (no-model)" in out
    code, _, err = cli(capsys, "compile", model, "-q", "-o", tmp_path / "out")
    assert code == 2 and "node frob (op my.ops:Frobnicate) has no kernel; nothing was written" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "m.onnx"]


# ------------------------------------------------------------------------------------------ 6. messages

def test_usage_errors_and_unknown_zoo_names_are_one_line(tmp_path, capsys):
    code, _, err = cli(capsys, "compile", "zoo:qwen3-tiny")
    assert code == 2 and err == ("softsyn: error: softsyn compile: Missing option '-o' / '--output'. "
                                 "(see softsyn compile --help)\n")
    code, _, err = cli(capsys, "analyze", "zoo:qwen9")
    assert code == 2 and len(err.splitlines()) == 1 and "no zoo model 'qwen9' (did you mean zoo:" in err
    bad = tmp_path / "lib.yaml"
    bad.write_text("library: x\nceilings: [1,\n  2\n")
    code, _, err = cli(capsys, "analyze", mlp(tmp_path / "m.onnx"), "--target", bad, "-q")
    assert code == 2 and len(err.splitlines()) == 1 and str(bad) in err, err


# ------------------------------------------------------------------------------------------ 7. determinism

def test_compiles_with_different_caches_are_byte_identical(cache_dir, tmp_path, capsys):
    """Two processes compile: this one on the warm session cache, after whatever this test worker compiled before (a
    pass's new names count on from the netlist's own, softsyn.names, not from the process's history), and a
    `softsyn compile` child exporting into a fresh cache (its own interpreter and hash seed)."""
    a, b = tmp_path / "a", tmp_path / "b"
    code, _, err = cli(capsys, "compile", "zoo:qwen3-tiny", "-c", CPU_TINY, "-q", "--cache-dir", cache_dir, "-o", a)
    assert code == 0, err
    done = subprocess.run([sys.executable, "-m", "softsyn.cli", "compile", "zoo:qwen3-tiny", "-c", str(CPU_TINY),
                           "-q", "--cache-dir", str(tmp_path / "fresh"), "-o", str(b)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for name in ("model.onnx", "model.onnx.data", "netlist.json", "runtime/session.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    for name in ("model.onnx", "runtime/session.json"):
        assert str(cache_dir) not in (a / name).read_bytes().decode("latin-1"), name
    moved = tmp_path / "moved"
    a.rename(moved)  # relocatable: verify finds its reference through the cache, not by a recorded path
    code, out, err = cli(capsys, "verify", moved, "--cache-dir", cache_dir)
    assert code == 0 and "within the accuracy budget" in out, err


def test_an_old_tree_cut_half_way_through_its_deletion_is_still_cleaned(tmp_path, capsys, monkeypatch):
    """Killed while deleting the old output after the swap (an rmtree that dies after removing the manifest,
    the worst order): what is left must still prove it ours, so the next run removes it."""
    model, out = mlp(tmp_path / "m.onnx"), tmp_path / "out"
    assert cli(capsys, "analyze", model, "-q", "-o", out)[0] == 0
    real = shutil.rmtree

    def dies_half_way(path, *args, **kwargs):
        files = sorted((p for p in Path(path).rglob("*") if p.is_file()), key=lambda p: p.name != outdir.MANIFEST)
        if files:
            files[0].unlink()
        raise KeyboardInterrupt  # the kill

    monkeypatch.setattr(shutil, "rmtree", dies_half_way)
    assert cli(capsys, "analyze", model, "-q", "-o", out)[0] == 130
    monkeypatch.setattr(shutil, "rmtree", real)
    assert json.loads((out / outdir.MANIFEST).read_text())["kind"] == "analyze"
    assert len([p for p in tmp_path.iterdir() if p.name.startswith(".out.softsyn-")]) == 1
    assert cli(capsys, "analyze", model, "-q", "-o", out)[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "out"]
