"""verify and run on a cpu-torch artifact: MET against the fp32 reference, the same greedy tokens as the ONNX Runtime
artifact of the same design, and a runtime/torch.json that points out of DIR refused."""
import json
import shutil

from click.testing import CliRunner

from helpers import cli
from softsyn.cli import main


def _run_json(directory, prompt=252, gen=8):
    # positions 0..259: the decode crosses the package's first attention span (SPAN_STEP 256 slots) into the next
    result = CliRunner().invoke(main, ["run", str(directory), "--prompt-len", str(prompt), "--gen", str(gen), "--runs",
                                       "1", "--warmup", "0", "--json", "-q"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return json.loads(result.output)


def test_verify_met(tiny_torch_artifact, cache_dir):
    result = CliRunner().invoke(main, ["verify", str(tiny_torch_artifact), "--cache-dir", str(cache_dir), "--json",
                                       "-q"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    data = json.loads(result.output)
    assert data["violations"] == [] and data["provider"].startswith("torch AOTInductor")
    outputs = {(c["scenario"], c["output"]) for c in data["checks"]}
    assert ("decode", "logits") in outputs and ("prefill", "present.1.value") in outputs and len(outputs) == 10
    assert all(c["rel"] < 1e-4 and c["top1"] in (None, 1.0) for c in data["checks"])


def test_the_package_returns_the_logits_the_netlist_returns(tiny_torch_artifact, tiny_cpu_artifact):
    """kv_layout leaves the netlist (and the ORT artifact of the same design) with the last position's logits; the
    torch package computes the same function, and torch.json says so (verify then compares the last position)."""
    import onnx_ir as ir

    from softsyn.runtime.decoder import decoder_io

    settings = json.loads((tiny_torch_artifact / "runtime" / "torch.json").read_text())
    assert settings["outputs"]["logits"][:2] == ["batch", 1]
    assert decoder_io(ir.load(str(tiny_cpu_artifact / "model.onnx"))).last_logits


def test_run_tokens_equal_the_ort_artifacts(tiny_torch_artifact, tiny_cpu_artifact):
    torch_run, ort_run = _run_json(tiny_torch_artifact), _run_json(tiny_cpu_artifact)
    assert len(torch_run["tokens"]) == 8
    assert torch_run["tokens"] == ort_run["tokens"]
    assert torch_run["kv_cache"] == "static" and torch_run["ttft"]["median"] > 0 and torch_run["tpot"]["samples"] == 7


def test_run_to_the_end_of_the_cache_keeps_the_ort_tokens(tiny_torch_artifact, tiny_cpu_artifact):
    # positions 0..511 of a 512-slot cache: the last span is the whole cache, a shape torch.export's own program
    # guards against (ExportedProgram.module() refuses it) but the AOTInductor package runs
    torch_run, ort_run = _run_json(tiny_torch_artifact, 500, 12), _run_json(tiny_cpu_artifact, 500, 12)
    assert len(torch_run["tokens"]) == 12 and torch_run["tokens"] == ort_run["tokens"]


def test_torch_json_pointing_out_of_dir_is_refused(tiny_torch_artifact, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_torch_artifact, copy)
    settings = json.loads((copy / "runtime" / "torch.json").read_text())
    (copy / "runtime" / "torch.json").write_text(json.dumps({**settings, "package": "../model.pt2"}))
    code, out, err = cli(capsys, "run", copy, "-q")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "runtime/torch.json: package: \"../model.pt2\" leads out of" in err


def test_signoff_measures_the_package_per_group(tiny_torch_artifact, tmp_path, capsys):
    """signoff on model.pt2: every group measured beside the compile's (ORT-library) prediction, labelled an estimate;
    the package's kernels listed per step (its profiler records on the CPU) and per module kind; the step through
    the compile's macro cells a second prediction; reports/signoff.rpt and signoff/signoff.json written."""
    copy = tmp_path / "art"
    shutil.copytree(tiny_torch_artifact, copy)
    code, out, err = cli(capsys, "signoff", copy, "--runs", "5", "--warmup", "1", "-q")
    assert code in (0, 1), err
    assert "an estimate of the ONNX netlist, not of model.pt2" in out and "Runtime: AOTInductor" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("prefill ", "decode "))]
    assert [r[0] for r in rows] == ["prefill", "decode"] and all(float(r[8]) > 0 for r in rows), rows  # measured
    assert "none listed" not in out and "Largest kernels" in out and "aoti_torch_cpu_mm_out" in out
    assert out.count("Predicted from macro cells (measured at compile") == 2 and "Kernels per source-module kind" in out
    data = json.loads((copy / "signoff" / "signoff.json").read_text())
    assert data["schema"] == "softsyn.signoff/1" and [g["name"] for g in data["groups"]] == ["prefill", "decode"]
    assert all(g["measured_median"] > 0 and g["cells"] == [] and g["macro_predicted"] > 0 for g in data["groups"])
    assert (copy / "reports" / "signoff.rpt").read_text().rstrip() == out.rstrip()


def test_signoff_of_a_cpu_package_on_cuda_is_bad_input(tiny_torch_artifact, capsys):
    code, out, err = cli(capsys, "signoff", tiny_torch_artifact, "--provider", "cuda", "-q")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "a cpu-torch package runs on the CPU; valid --provider: cpu" in err
    assert not (tiny_torch_artifact / "signoff").exists()


def test_signoff_refuses_a_kernel_map_that_is_not_one(tiny_torch_artifact, tmp_path, capsys):
    """runtime/torch_kernels.json is untrusted like every file of the artifact: a call without its module list is
    one line naming the file and the entry, exit 2, before any step runs and with nothing written."""
    copy = tmp_path / "art"
    shutil.copytree(tiny_torch_artifact, copy)
    kernels = copy / "runtime" / "torch_kernels.json"
    data = json.loads(kernels.read_text())
    data["calls"][1] = {"kernel": "aoti_torch_cpu_mm_out", "modules": "lm_head"}
    kernels.write_text(json.dumps(data))
    code, out, err = cli(capsys, "signoff", copy, "-q")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "runtime/torch_kernels.json: calls[1]: not {kernel: a name, modules: [paths]}" in err
    assert not (copy / "signoff").exists()
