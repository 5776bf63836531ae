"""softsyn compile / verify end to end on qwen3-tiny: emitted artifacts, accuracy check, atomic writes."""
from __future__ import annotations

import json
import shutil

import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner

import passes
from softsyn.cli import main
from softsyn.emit import check
from softsyn.errors import SoftsynError
from softsyn.results.compile_log import CompileLog, LogRow
from passes import LOW
from reports.compile_log import COMPILE_LOG_COLUMNS, compile_log_json, report_compile_log

TINY = "zoo:qwen3-tiny"
# The GPU-target artifact must also run on ORT CPU for verify here: Llama's GQA (rotary absorbed) does;
# Qwen3's q/k norms absorbed into GQA run only on CUDA (test_verify_on_a_provider_that_cannot_run_it).
GPU_MODEL = "zoo:llama-tiny"
GPU_TINY = """\
target: h200-ort-cuda
workload: {batch: 1, prompt_len: 16, context_len: 32}
accuracy: {max_rel_error: 2%, min_top1: 0.9}
"""


# DIR/compile.log as it is written (trailing blanks included: the layout is fixed-width).
COMPILE_LOG = "\n".join([
    'softsyn compile: design qwen3-tiny, library cpu-ort, effort low',
    'script: flatten -> fuse -> precision -> kv_layout',
    '',
    '   ELAPSED                       WORST NEG   TOTAL NEG  DESIGN RULE                      ',
    '      TIME  PHASE               SLACK (ms)  SLACK (ms)         COST          AREA   CELLS  WORST GROUP',
    '  --------  ------------------  ----------  ----------  -----------  ------------  ------  -----------',
    '   0:00:00  elaborate              -12.346     -45.600         0.00       3.40 GB     228  decode',
    '   0:01:05  flatten                  0.000       0.000         0.00       1.23 MB     228  ',
    '   1:02:05  fuse                 -1500.000  -20250.000         0.00         999 B      52  prefill',
    '   1:06:40  precision_long_name       0.000       0.000        12.50      16.38 GB  123456  ',
]) + "\n"


def compile_cli(out, *extra, model=TINY):
    return CliRunner().invoke(main, ["compile", model, "--effort", "low", "-o", str(out), "-q", *extra])


@pytest.fixture(scope="module")
def compiled(cache_dir, tmp_path_factory):
    """llama-tiny compiled for the H200 library (flatten, fuse, fp16), as the CLI does it."""
    root = tmp_path_factory.mktemp("compiled")
    (root / "gpu-tiny.yaml").write_text(GPU_TINY)
    result = compile_cli(root / "out", "-c", str(root / "gpu-tiny.yaml"), "--cache-dir", str(cache_dir),
                         model=GPU_MODEL)
    assert result.exit_code in (0, 1), result.output + repr(result.exception)
    return root / "out"


def test_compile_writes_a_checked_loadable_model_and_its_records(compiled):
    check(compiled / "model.onnx")  # onnx.checker, path form (ORT's default-domain kernels as runtime ops)
    session = ort.InferenceSession(str(compiled / "model.onnx"), providers=["CPUExecutionProvider"])
    types = {i.name: i.type for i in session.get_inputs()}
    assert types["input_ids"] == "tensor(int64)" and types["past_key_values.0.key"] == "tensor(float16)"
    assert (compiled / "model.onnx.data").is_file()

    netlist = json.loads((compiled / "netlist.json").read_text())
    assert netlist["cell_count"] == len(netlist["cells"]) == len(onnx.load(compiled / "model.onnx",
                                                                        load_external_data=False).graph.node)
    for cell in netlist["cells"]:
        assert {"name", "hierarchy", "op", "cell", "precision", "delay", "source"} <= set(cell)
        assert set(cell["delay"]) == {"prefill", "decode"} and all(d >= 0 for d in cell["delay"].values())
    assert any(c["op"] == "MatMul" and c["precision"] == "fp16" for c in netlist["cells"])
    assert any(c["hierarchy"].startswith("model.layers.1") for c in netlist["cells"])

    session_json = json.loads((compiled / "runtime" / "session.json").read_text())
    assert session_json["providers"][0] == "CUDAExecutionProvider" and session_json["precision"] == "fp16"
    assert session_json["outputs"]["logits"]["dtype"] == "float16"
    assert session_json["scenarios"]["decode"]["dims"] == {"batch": 1, "seq": 1, "past": 32}
    # kv_layout's shared buffer: max(prompt_len 16, context_len 32 + 1) positions, whatever the scenario's past
    assert session_json["inputs"]["past_key_values.0.key"]["scenarios"]["decode"] == [1, 2, 33, 32]
    assert session_json["kv_cache"]["max_length"] == 33 and session_json["kv_cache"]["shared_buffer"]
    reference = session_json["reference"]  # relocatable: the spec and its export cache key, no path into the cache
    assert reference["source"] == GPU_MODEL and set(reference) == {"source", "key", "precision", "materialize"}
    assert len(reference["key"]) == 64 and reference["precision"] == "fp32"

    log = (compiled / "compile.log").read_text().splitlines()
    phases = [line.split()[1] for line in log if line.strip()[:1].isdigit()]
    assert phases == ["elaborate", "flatten", "fuse", "precision", "kv_layout", "emit"]
    for name in ("timing", "qor", "area", "constraint", "fusion"):
        assert (compiled / "reports" / f"{name}.rpt").is_file()
    assert not [p.name for p in compiled.parent.iterdir() if p.name.startswith(".")]  # no temp folders left


def test_compile_log_renders_its_columns_as_text_and_json():
    log = CompileLog("qwen3-tiny", "cpu-ort", LOW)
    log.rows = [LogRow(0.4, "elaborate", -0.0123456, -0.0456, 3.4e9, "decode", 228),
                LogRow(65.2, "flatten", 0.0, 0.0, 1.23e6, "", 228),
                LogRow(3725.9, "fuse", -1.5, -20.25, 999.0, "prefill", 52),
                LogRow(4000, "precision_long_name", 0.0, 0.0, 16.38e9, "", 123456, 12.5)]
    assert report_compile_log(log) == COMPILE_LOG

    data = json.loads(compile_log_json(log))
    assert data["effort"] == "low" and data["script"] == ["flatten", "fuse", "precision", "kv_layout"]
    assert [c["key"] for c in data["columns"]] == [c.key for c in COMPILE_LOG_COLUMNS]
    assert data["rows"][0] == {"elapsed": 0.4, "phase": "elaborate", "wns": -0.0123456, "tns": -0.0456,
                               "area": 3.4e9, "worst_group": "decode", "cells": 228, "rules": 0.0}
    assert data["units"]["wns"] == "s" and len(data["rows"]) == 4


def test_verify_meets_the_budget(compiled):
    result = CliRunner().invoke(main, ["verify", str(compiled), "--cpu"])
    assert result.exit_code == 0, result.output
    assert "prefill    logits" in result.output and "decode     present.1.value" in result.output
    assert "VIOLATED" not in result.output


def test_verify_names_the_output_a_corrupted_model_breaks(compiled, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(compiled, broken)
    model = onnx.load(broken / "model.onnx")
    head = next(t for t in model.graph.initializer if "lm_head" in t.name)
    data = onnx.numpy_helper.to_array(head)
    head.CopyFrom(onnx.numpy_helper.from_array((data * 1.5).astype(data.dtype), head.name))
    onnx.save(model, broken / "model.onnx", save_as_external_data=True, location="model.onnx.data")

    result = CliRunner().invoke(main, ["verify", str(broken), "--cpu"])
    assert result.exit_code == 1, result.output
    assert "VIOLATED: prefill/logits: rel error" in result.output
    assert "present.0.key" in result.output and "VIOLATED: prefill/present" not in result.output


def test_verify_on_a_provider_that_cannot_run_it(cache_dir, tmp_path, monkeypatch):
    """qwen3-tiny for the H200: GQA carries the q/k norms, which only CUDA runs; without verify's CPU view
    (softsyn.flow.cpu_view, tested in test_compile_real) the CPU provider cannot run it: a clear error, exit 2."""
    import softsyn.flow.cpu_view as cpu_view

    (tmp_path / "gpu-tiny.yaml").write_text(GPU_TINY)
    out = tmp_path / "out"
    result = compile_cli(out, "-c", str(tmp_path / "gpu-tiny.yaml"), "--cache-dir", str(cache_dir))
    assert result.exit_code in (0, 1), result.output
    monkeypatch.setattr(cpu_view, "expand_qk_norms", lambda model: 0)
    result = CliRunner().invoke(main, ["verify", str(out), "--cpu"], standalone_mode=False)
    assert isinstance(result.exception, SoftsynError)
    message = str(result.exception)
    assert "CPUExecutionProvider cannot run the compiled model" in message and "CUDAExecutionProvider" in message


def test_failed_compile_leaves_no_directory(cache_dir, tmp_path, monkeypatch):
    def broken(design):
        raise RuntimeError("pass blew up")

    passes.load_all()
    monkeypatch.setitem(passes.PASSES, "precision", passes.Pass("precision", "broken", broken))
    out = tmp_path / "out"
    result = compile_cli(out, "--cache-dir", str(cache_dir))
    assert isinstance(result.exception, RuntimeError)
    assert list(tmp_path.iterdir()) == []


def test_missing_pass_in_the_script_fails_before_any_work(tmp_path, monkeypatch):
    passes.load_all()
    monkeypatch.delitem(passes.PASSES, "fuse")
    result = compile_cli(tmp_path / "out")
    assert isinstance(result.exception, SoftsynError)
    assert "effort low: pass fuse is not registered" in str(result.exception)
    assert not (tmp_path / "out").exists()


def test_foreign_directory_is_refused(tmp_path):
    (tmp_path / "thesis.tex").write_text("mine")
    result = compile_cli(tmp_path)
    assert isinstance(result.exception, SoftsynError) and "not a softsyn output directory" in str(result.exception)
    assert [p.name for p in tmp_path.iterdir()] == ["thesis.tex"]


def test_compile_rewrites_its_own_output_in_place(cache_dir, compiled, tmp_path):
    out = tmp_path / "again"
    shutil.copytree(compiled, out)
    (out / "stale.txt").write_text("from an older compile")
    result = compile_cli(out, "--cache-dir", str(cache_dir))  # cpu-ort default: fp32, no precision change
    assert result.exit_code in (0, 1), result.output + repr(result.exception)
    assert (out / "stale.txt").read_text() == "from an older compile"  # not softsyn's: kept (issue 12)
    assert json.loads((out / "runtime" / "session.json").read_text())["precision"] == "fp32"
    verify = CliRunner().invoke(main, ["verify", str(out)])
    assert verify.exit_code == 0 and "default for fp32" in verify.output, verify.output
    assert [p.name for p in tmp_path.iterdir()] == ["again"]  # the old output moved aside and removed
