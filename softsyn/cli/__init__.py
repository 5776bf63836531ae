"""The `softsyn` command line: each command reads like a man page under --help.

softsyn.cli.app holds the group `main`, which imports a command's module only when that command is asked for
(its table `COMMANDS`), and the entry point `run` (exceptions to exit codes). A command is a spec (options and
help: softsyn.cli.design, softsyn.cli.tools) whose body (softsyn.cli.design_run, softsyn.cli.tools_run) is
imported only when it runs, so `softsyn --help` and `softsyn COMMAND --help` start in a fraction of a second.
"""
from softsyn.cli.app import main, run

__all__ = ["main", "run"]
