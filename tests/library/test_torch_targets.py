"""The torch targets' bad inputs: a plain ONNX file (the torch targets need the source model) and h200-torch compiled
where torch sees no CUDA device, each one line and exit 2; h200-torch analyzed anywhere (its STA needs no device)."""
import pytest
import torch

from helpers import cli


def test_onnx_file_with_a_torch_target_is_bad_input(tmp_path, capsys):
    onnx = tmp_path / "m.onnx"
    onnx.write_bytes(b"not read")
    code, out, err = cli(capsys, "compile", onnx, "--target", "cpu-torch", "-o", tmp_path / "o", "-q")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "target cpu-torch lowers the source model in torch, which a plain ONNX file" in err
    assert not (tmp_path / "o").exists()


def test_h200_torch_analyzes_with_the_h200_library(capsys):
    code, out, err = cli(capsys, "analyze", "zoo:qwen3-tiny", "--target", "h200-torch", "-q")
    assert code in (0, 1), err
    assert "h200-ort-cuda" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_h200_torch_compile_without_cuda_is_refused_before_the_passes(tmp_path, capsys):
    code, out, err = cli(capsys, "compile", "zoo:qwen3-tiny", "--target", "h200-torch", "-o", tmp_path / "o", "-q")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "target h200-torch compiles a CUDA package and torch sees no CUDA device here" in err
    assert "use target cpu-torch" in err and not (tmp_path / "o").exists()


@pytest.mark.parametrize("name, kept", [("cpu-torch", ["fp32", "int8"]),
                                        ("h200-torch", ["fp16", "fp8", "int8", "int4"])])
def test_narrowing_keeps_what_each_torch_target_builds(name, kept):
    """The loop is offered the precisions the target's package builds (int4 and fp8 only where their kernels run:
    CUDA), and the KV cache pinned to the target's float dtype; the log line names what was dropped."""
    from types import SimpleNamespace

    from softsyn.library.torch_targets import narrow_constraints, torch_target

    cons = SimpleNamespace(precision=SimpleNamespace(allowed=["fp32", "fp16", "fp8", "int8", "int4"], default="int4"),
                           kv_cache=SimpleNamespace(dtype="int8"))
    line = narrow_constraints(torch_target(name), cons)
    assert cons.precision.allowed == [p for p in ["fp32", "fp16", "fp8", "int8", "int4"] if p in kept]
    assert cons.precision.default == ("int4" if "int4" in kept else kept[0])
    assert cons.kv_cache.dtype == kept[0] and line.startswith(f"target {name}: precision.allowed")
    before, after = line.split("->")[0], line.split("->")[1].split("(")[0]
    dropped = [p for p in ["fp32", "fp16", "fp8", "int8", "int4"] if p not in kept]
    assert dropped and all(p in before and p not in after for p in dropped)
