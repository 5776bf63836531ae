"""The `softsyn` command line: each command reads like a man page under --help.

softsyn.cli.app holds the group `main`, the entry point `run` (exceptions to exit codes) and what the commands share;
the commands register themselves on `main` from softsyn.cli.design (analyze, compile, verify, signoff, run) and
softsyn.cli.tools (report, passes, characterize), both loaded here.
"""
from softsyn.cli import design, tools  # noqa: F401 -- importing them registers the commands on `main`
from softsyn.cli.app import main, run

__all__ = ["main", "run"]
