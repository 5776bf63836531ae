"""Plain ONNX files of other architectures (tests/families.py) analyse with a guide-style constraints file:
the exporter's dims are bound by role, and a decoder exported without a KV cache gets a prefill group."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from families import DECODERS, FAMILIES, export_family
from softsyn.cli import main

GUIDE = """\
clock_period: 2000ms
input_delay:
  image: 100ms
  text: 10ms
output_delay: 50ms
area_constraint: 80GB
workload:
  batch: 2
  prompt_len: 24
"""


@pytest.fixture(scope="session")
def family_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("families")


@pytest.fixture(scope="session")
def guide(tmp_path_factory):
    path = tmp_path_factory.mktemp("guide") / "guide.yaml"
    path.write_text(GUIDE)
    return path


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_plain_export_analyses_with_guide_constraints(family, family_dir, guide, tmp_path):
    model = export_family(family, family_dir)
    out = tmp_path / "an"
    result = CliRunner().invoke(main, ["analyze", str(model), "-c", str(guide), "-o", str(out)])
    assert result.exit_code == 0, result.output
    analysis = json.loads((out / "analysis.json").read_text())
    groups = {g["name"]: g for g in analysis["groups"]}
    expected = "prefill" if family in DECODERS else "encoder"
    assert list(groups) == [expected]
    dims = groups[expected]["scenario"]["dims"]
    assert dims["batch"] == 2
    if FAMILIES[family][3] == "tokens":
        assert dims["seq"] == 24  # the workload's prompt_len reached the exporter's s70
    renamed = analysis["provenance"]["dims"]
    assert set(renamed.values()) <= {"batch", "seq"} and "batch" in renamed.values()


def test_a_dim_no_port_explains_is_named_with_the_roles(tmp_path):
    """Dims of a port softsyn does not know keep their names (no guess), and the error names them with the roles."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("features", TensorProto.FLOAT, ["n", "k"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "k"])
    g = helper.make_graph([helper.make_node("Relu", ["features"], ["y"])], "g", [x], [y])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    proc = subprocess.run([sys.executable, "-m", "softsyn.cli", "analyze", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and "dims k, n have no role" in line and "roles: batch, seq, past" in line


def test_seeded_token_ids_stay_inside_a_plain_file_s_embedding(family_dir):
    """A plain file records no vocab size: ids are drawn below the embedding table they index (through views)."""
    from softsyn.frontends import read_design
    from softsyn.runtime.inputs import scenario_inputs

    nl = read_design(str(export_family("gpt2", family_dir)), progress=False)
    ids = scenario_inputs(nl, {"batch": 2, "seq": 64})["input_ids"]
    assert ids.max() < FAMILIES["gpt2"][1]["vocab_size"] and ids.max() > 256
