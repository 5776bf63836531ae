"""README.md stays a two-minute read whose commands still parse: every `softsyn ...` it shows (the quick start's
and the command table's) is accepted by the command line as it stands, its python compiles, its make targets
exist, and it stays under 200 lines."""
import re
import shlex

import click
import pytest

from paths import ROOT
from softsyn.cli import main

README = (ROOT / "README.md").read_text(encoding="utf-8")


def shown_commands() -> list[str]:
    """The softsyn command lines README shows: `$ softsyn ...` in its console blocks, `softsyn ...` in code spans."""
    console = re.findall(r"^\$ (softsyn .+)$", README, re.M)
    spans = [s.replace("\\|", "|") for s in re.findall(r"`(softsyn [^`]+)`", README)]
    return console + spans


def concrete(line: str) -> list[str]:
    """A shown line as arguments: optional parts ([-o DIR]) dropped, the first of a|b alternatives taken, MODEL
    and LEVEL given a value."""
    line = re.sub(r"\s*\[[^\]]*\]", "", line)
    words = [w.split("|")[0] if "|" in w else w for w in shlex.split(line)]
    values = {"MODEL": "zoo:qwen3-tiny", "LEVEL": "low", "N": "8", "C.yaml": "constraints/cpu-tiny.yaml"}
    return [values.get(w, w) for w in words][1:]


def parse(args: list[str]) -> None:
    """Parse as `softsyn` would, without running: the group, then the command with its options and arguments."""
    if args[0].startswith("-"):  # the group's own options (--help, --version)
        try:
            main.make_context("softsyn", list(args))
        except click.exceptions.Exit as done:  # --help printed and exited 0: parsed
            assert done.exit_code == 0
        return
    command = main.get_command(click.Context(main, info_name="softsyn"), args[0])
    if command is None:
        raise click.UsageError(f"no such command {args[0]!r}")
    with command.make_context(args[0], list(args[1:]), parent=click.Context(main, info_name="softsyn")):
        pass


def test_readme_shows_commands():
    assert len(shown_commands()) >= 10


@pytest.mark.parametrize("line", shown_commands())
def test_shown_command_parses(line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # DIR arguments that must exist: out/tiny and DIR, as after the quick start
    for folder in ("out/tiny", "DIR"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "constraints").symlink_to(ROOT / "constraints")
    try:
        parse(concrete(line))
    except click.ClickException as exc:
        pytest.fail(f"README shows `{line}`, which softsyn refuses: {exc.format_message()}")


def test_readme_python_compiles():
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks
    for block in blocks:
        compile(block, "README.md", "exec")


def test_make_targets_exist():
    makefile = (ROOT / "Makefile").read_text()
    for target in set(re.findall(r"^make (\w+)", README, re.M)) | {"demo", "test"}:
        assert re.search(rf"^{target}:", makefile, re.M), f"README says `make {target}`; the Makefile has no such target"


def test_two_minute_read():
    lines = README.splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines"
    assert "QUICKSTART_" not in README  # the quick start's output is pasted, not a placeholder
    assert re.search(r"Real output.*\(\d{4}-\d{2}-\d{2}, on a fresh `git clone`", README, re.S)
