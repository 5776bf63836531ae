"""passes.serving: a serving block violated at its max_batch is closed by the max_batch the simulation meets every
check with; the analysis, report_qor and the emitted engine settings carry it, the constraints file is untouched."""
import json

from helpers import cli
from paths import ROOT


def _constraints(tmp_path, rate: int) -> str:
    text = (ROOT / "constraints" / "serving-tiny.yaml").read_text()
    text = text.replace("max_batch: 16", "max_batch: 1").replace("arrival_rate: 20/s", f"arrival_rate: {rate}/s")
    path = tmp_path / f"serving-{rate}.yaml"
    path.write_text(text)
    return str(path)


def test_a_violated_load_gets_the_max_batch_that_meets_it(cache_dir, tmp_path, capsys):
    cons = _constraints(tmp_path, 300)  # with cpu-ort's host work, no max_batch meets ttft_p99 at 400/s
    before = open(cons).read()
    code, out, err = cli(capsys, "compile", "zoo:qwen3-tiny", "-c", cons, "--effort", "medium", "-o", tmp_path / "o",
                         "--cache-dir", cache_dir, "-q")
    assert code == 0, err
    log = (tmp_path / "o" / "compile.log").read_text()
    assert "script: flatten -> fuse -> precision -> kv_layout -> optimize -> serving" in log
    note = next(line for line in log.splitlines() if line.startswith("note: serving:"))
    assert "max_batch 1 -> " in note and "all met (simulated, est)" in note, note
    chosen = int(note.split("max_batch 1 -> ")[1].split()[0])
    assert chosen > 1
    assert json.loads((tmp_path / "o" / "runtime" / "vllm.json").read_text())["max_num_seqs"] == chosen
    analysis = json.loads((tmp_path / "o" / "analysis.json").read_text())
    assert f"max_batch {chosen}," in analysis["serving"]["load"]
    assert not any(check["slack"] < 0 for check in analysis["serving"]["checks"])
    assert open(cons).read() == before


def test_a_met_load_keeps_its_max_batch(cache_dir, tmp_path, capsys):
    code, out, err = cli(capsys, "compile", "zoo:qwen3-tiny", "-c", _constraints(tmp_path, 20), "--effort", "medium",
                         "-o", tmp_path / "o", "--cache-dir", cache_dir, "-q")
    assert code == 0, err
    log = (tmp_path / "o" / "compile.log").read_text()
    assert "note: serving: every check met at max_batch 1 (simulated, est)" in log
    assert json.loads((tmp_path / "o" / "runtime" / "vllm.json").read_text())["max_num_seqs"] == 1
