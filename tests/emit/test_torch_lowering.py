"""The cpu-torch lowering: DIR/model.pt2 and runtime/torch.json written instead of the ONNX Runtime files, the package
measured per path group and labelled beside the library's estimate."""
import json
import re

from helpers import cli
from softsyn.runtime.torch_package import read_torch_settings


def test_package_and_settings_written(tiny_torch_artifact):
    out = tiny_torch_artifact
    assert (out / "model.pt2").stat().st_size > 0
    assert not (out / "model.onnx").exists() and not (out / "runtime" / "session.json").exists()
    settings = read_torch_settings(out)
    assert settings["kv_cache"] == {**settings["kv_cache"], "layers": 2, "kv_heads": 2, "head_dim": 32,
                                    "max_length": 512}
    assert settings["vocab_size"] == 1024 and settings["dtype"] == "float32"
    assert settings["reference"]["source"] == "zoo:qwen3-tiny"
    assert set(settings["scenarios"]) == {"prefill", "decode"}
    manifest = json.loads((out / "softsyn-manifest.json").read_text())
    assert "model.pt2" in json.dumps(manifest) and "runtime/torch.json" in json.dumps(manifest)


def test_measured_numbers_are_labelled(tiny_torch_artifact):
    log = (tiny_torch_artifact / "compile.log").read_text()
    measured = re.findall(r"^note: target cpu-torch: (prefill|decode) \(.*\): [\d.]+ ms \(torch package, measured, "
                          r"median of 10\); [\d.]+ ms \(est, cpu-ort library", log, re.M)
    assert sorted(measured) == ["decode", "prefill"]
    assert "per-module torchao precision (int8/int4/fp8) is not built yet" in log
    rpt = (tiny_torch_artifact / "reports" / "torch.rpt").read_text()
    assert rpt.count("torch package, measured") == 3 and rpt.count("(est, cpu-ort library") == 2


def test_a_weightless_plan_is_refused(cache_dir, tmp_path, capsys):
    code, out, err = cli(capsys, "compile", "zoo:qwen3-tiny", "--target", "cpu-torch", "--plan", "-o", tmp_path / "o",
                         "--cache-dir", cache_dir, "-q")
    assert code == 2 and err.count("\n") == 1
    assert "target cpu-torch lowers a model with weights" in err and not (tmp_path / "o").exists()
