"""The `softsyn` command line's group `main`, whose commands are imported by name when one runs or its help is shown
(`COMMANDS`: click's LazyGroup pattern), and its entry point (`run`: exceptions to exit codes). What the commands
share is in softsyn.cli.common."""
from __future__ import annotations

import errno
import logging
import os
import sys
import time
import traceback
from pathlib import Path

import click

from softsyn import __version__
from softsyn.cli import common
from softsyn.cli.common import HELP_WIDTH, resolve
from softsyn.errors import LibraryFailure, SoftsynError

# Library notices that are not the user's business, silenced before any command imports their library: torchao's
# warning per optional CUDA kernel a CPU wheel cannot load, torch's per enum torchao registers with pytree.
for _name in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_name).setLevel(logging.ERROR)

# every command, by name: where its click spec (options, help) lives; each spec imports its body only when it runs
COMMANDS = {
    "analyze": "softsyn.cli.design:analyze",
    "compile": "softsyn.cli.design:compile_cmd",
    "verify": "softsyn.cli.design:verify",
    "signoff": "softsyn.cli.design:signoff",
    "run": "softsyn.cli.design:run_cmd",
    "report": "softsyn.cli.tools:report",
    "passes": "softsyn.cli.tools:list_passes",
    "characterize": "softsyn.cli.tools:characterize",
}


class LazyGroup(click.Group):
    """A group listing its commands from a table of "module:name" and importing one when it is asked for (run,
    --help, completion): click's documented LazyGroup, so `softsyn X` imports X's module and no other's."""

    def __init__(self, *args, lazy: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx):
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx, cmd_name):
        if cmd_name not in self.lazy:
            return super().get_command(ctx, cmd_name)
        command = resolve(self.lazy[cmd_name])
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.lazy[cmd_name]} (command {cmd_name}) is {type(command).__name__}, not a command")
        return command


def process_age() -> float:
    """Seconds since this process started (/proc/self/stat's start time against /proc/uptime; 0 where there is no
    /proc): the interpreter's start-up belongs to the command's wall time too."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


# OSErrors that are the machine refusing (full disk, read-only, permissions, a path longer than it allows), not a
# softsyn bug: exit 2
ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG}


@click.group(cls=LazyGroup, lazy=COMMANDS,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": HELP_WIDTH})
@click.version_option(__version__, prog_name="softsyn")
@click.option("--debug", is_flag=True, help="on an internal error (exit status 3), print Python's trace; "
                                            "may be given anywhere on the line.")
def main(debug):
    """softsyn - timing-driven synthesis of neural-network inference.

    \b
    Reads a model into a netlist of cells, binds every cell to a kernel
    library characterised on a runtime and device, and times every path group
    (prefill/TTFT, decode/TPOT, encoder...) against the latency budget in a
    constraints file, printing Design Compiler / PrimeTime style reports.

    \b
    MODEL may be a .onnx file, a Hugging Face model folder or config.json, or
    a built-in zoo name (optionally prefixed "zoo:"): qwen3-tiny,
    llama-tiny, qwen3-moe-tiny, qwen3-wide, qwen3-vl-tiny, qwen3-next-tiny,
    qwen3-0.6b, qwen3-1.7b, qwen3-8b, qwen3-vl-2b, qwen3-vl-4b, qwen3-vl-8b,
    qwen3-vl-2b-reduced, qwen3-30b-a3b, qwen3-235b-a22b, qwen3-next-80b-a3b,
    gemma2-tiny, gemma3-tiny, gemma2-2b, minilm.

    \b
    Exit codes: 0 success, 1 timing or area violated, 2 bad input (one
    line naming the file, line, key or node), 3 internal error (rerun with
    --debug for the trace). Output directories hold softsyn-manifest.json,
    the list of what softsyn wrote there; only those files are ever
    replaced, and a non-empty directory without one is refused.

    \b
    Shell completion (bash; zsh: zsh_source, fish: fish_source):
      eval "$(_SOFTSYN_COMPLETE=bash_source softsyn)"
    """
    del debug  # read by run(), which maps exceptions to exit codes and prints the trace


def _one_line(text) -> str:
    return " ".join(str(text).split())


def run(argv: list[str] | None = None) -> None:
    """Entry point. Exit 0 met, 1 violated, 2 bad input, 3 internal error; every error is one line on
    stderr ("softsyn: error: ..." or "softsyn: internal error: ..."), the trace only with --debug."""
    # the process is the command when argv comes from the command line: its interpreter start-up counts too
    common.STARTED = time.perf_counter() - (process_age() if argv is None else 0.0)
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    if debug:  # a global flag, honoured wherever it is on the line
        args = ["--debug"] + [a for a in args if a != "--debug"]
    try:
        code = main.main(args, prog_name="softsyn", standalone_mode=False)
    except SoftsynError as exc:
        hint = " (rerun with --debug for the trace)" if isinstance(exc, LibraryFailure) and not debug else ""
        _fail(debug, f"softsyn: error: {_one_line(exc)}{hint}", 2)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help())
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "softsyn"
        prefix = "" if where == "softsyn" else f"{where}: "  # "softsyn: error: softsyn: ..." says it twice
        _fail(False, f"softsyn: error: {prefix}{_usage_message(exc)} (see {where} --help)", 2)
    except click.ClickException as exc:
        _fail(False, f"softsyn: error: {_one_line(exc.format_message())}", 2)
    except (click.exceptions.Abort, KeyboardInterrupt):
        _fail(False, "softsyn: interrupted", 130)
    except BrokenPipeError:  # the reader of our output went away (`softsyn report ... | head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
    except OSError as exc:
        if exc.errno not in ENVIRONMENT_ERRNOS:
            _internal(debug, exc)
        _fail(debug, f"softsyn: error: {exc.filename or ''}{': ' if exc.filename else ''}{exc.strerror}", 2)
    except Exception as exc:
        _internal(debug, exc)
    sys.exit(code if isinstance(code, int) else 0)


def _usage_message(exc: click.UsageError) -> str:
    """click's message in one line; an unknown command also lists the valid ones."""
    text = _one_line(exc.format_message())
    group = exc.ctx.command if exc.ctx is not None else None
    if text.startswith("No such command") and isinstance(group, click.Group):
        text = f"{text.rstrip('.')}; valid: {', '.join(group.list_commands(exc.ctx))}"
    return text


def _internal(debug: bool, exc: Exception) -> None:
    hint = "" if debug else " (rerun with --debug for the trace)"
    _fail(debug, f"softsyn: internal error: {type(exc).__name__}: {_one_line(exc)}{hint}", 3)


def _fail(debug: bool, line: str, code: int) -> None:
    if debug:
        traceback.print_exc()
    if sys.stderr.isatty():  # a progress bar may hold the line (progress.log end=""): the error gets its own
        click.echo("\r\033[K", err=True, nl=False)
    click.echo(line, err=True)
    sys.exit(code)

