"""The command line loads lazily (issue 24): the group lists its commands from a table of "module:name" and imports a
command's spec only when it is asked for, and a spec imports its body only when the command runs. So `softsyn
--help` and `softsyn COMMAND --help` import none of the heavy modules a run needs; every command in the table
resolves and is listed; and every spec's body takes exactly the options its spec parses."""
import ast
import inspect
import re
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from softsyn.cli import main
from softsyn.cli.app import COMMANDS
from softsyn.cli.common import resolve

from paths import ROOT
HEAVY = ("onnxruntime", "onnx_ir", "onnx", "numpy", "torch", "scipy", "sympy")


def test_every_command_in_the_table_resolves_and_the_help_lists_it():
    text = CliRunner().invoke(main, ["--help"]).output
    listed = re.findall(r"^  (\w+)\s+(\S.*)$", text.split("Commands:\n", 1)[1], re.M)
    assert [name for name, _ in listed] == sorted(COMMANDS)
    for name, short in listed:
        command = resolve(COMMANDS[name])
        assert isinstance(command, click.Command) and command.name == name, COMMANDS[name]
        assert command.get_short_help_str(limit=200).startswith(short.removesuffix("...")), (name, short)


def _body_of(target: str) -> str:
    """The "module:function" the spec `target` performs (its callback's perform call)."""
    module, name = target.split(":")
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
    (spec,) = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == name]
    (call,) = [c for c in ast.walk(spec) if isinstance(c, ast.Call) and getattr(c.func, "id", "") == "perform"]
    return call.args[0].value


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_spec_runs_a_body_taking_exactly_its_options(name):
    spec, body = resolve(COMMANDS[name]), resolve(_body_of(COMMANDS[name]))
    assert [p.name for p in spec.params] == list(inspect.signature(body).parameters), (name, body)
    assert body.__module__.endswith("_run") and body.__module__ != spec.callback.__module__


@pytest.mark.parametrize("argv", [None, ["--help"], ["compile", "--help"], ["characterize", "--help"], ["nosuch"]])
def test_importing_the_cli_and_its_help_import_nothing_heavy(argv):
    """In a fresh interpreter: `import softsyn.cli` (argv None), then the group's or a command's help, then which of
    HEAVY are loaded (none: onnxruntime alone takes a second to import)."""
    code = ("import sys\nfrom softsyn.cli import run\n"
            f"try:\n    run({argv!r}) if {argv!r} is not None else None\nexcept SystemExit:\n    pass\n"
            f"print('LOADED', sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "LOADED []", out.stdout[-500:]
