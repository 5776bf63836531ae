"""The torch targets' bad inputs: a plain ONNX file (the torch targets need the source model) and h200-torch (named,
not built), each one line and exit 2."""
from helpers import cli


def test_onnx_file_with_a_torch_target_is_bad_input(tmp_path, capsys):
    onnx = tmp_path / "m.onnx"
    onnx.write_bytes(b"not read")
    code, out, err = cli(capsys, "compile", onnx, "--target", "cpu-torch", "-o", tmp_path / "o", "-q")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "target cpu-torch lowers the source model in torch, which a plain ONNX file" in err
    assert not (tmp_path / "o").exists()


def test_h200_torch_is_refused_as_not_built(capsys):
    code, out, err = cli(capsys, "analyze", "zoo:qwen3-tiny", "--target", "h200-torch", "-q")
    assert code == 2 and err.count("\n") == 1
    assert "target h200-torch is not built yet" in err and "valid torch targets: cpu-torch" in err
