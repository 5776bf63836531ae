"""The `softsyn` command line: each command reads like a man page under --help.

This module holds the group, the entry point (`run`: exceptions to exit codes) and what the commands share;
the commands register themselves from `softsyn.cli.design` (analyze, compile, verify, signoff, run) and
`softsyn.cli.tools` (report, passes, characterize)."""
from __future__ import annotations

import errno
import os
import sys
import traceback
from pathlib import Path

import click

from softsyn import __version__
from softsyn.constraints.model import MAX_DEVICES
from softsyn.errors import SoftsynError
from passes import EFFORTS

ANALYSIS_FILE = "analysis.json"
# OSErrors that are the machine refusing (full disk, read-only, permissions, a path longer than it allows), not a
# softsyn bug: exit 2
ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG}


def effort_help() -> str:
    """The effort levels for compile's --help: name and help, then its numbered steps."""
    width = max(len(name) for name in EFFORTS) + 2
    lines, earlier = [], []
    for level in EFFORTS.values():
        lines.append(f"  {level.name:<{width}}{level.help}")
        step_lines = level.step_lines()
        bases = [b for b in earlier if level.steps[:len(b.steps)] == b.steps]
        if bases:  # a level extending one below it: that level's steps once, then what this level adds
            base = max(bases, key=lambda b: len(b.steps))
            step_lines = [f"1-{len(base.steps)}. as {base.name}", *step_lines[len(base.steps):]]
        lines += [f"  {'':<{width}}{line}" for line in step_lines]
        earlier.append(level)
    return "\n    ".join(lines)


class TPDegree(click.ParamType):
    """--tp: a tensor-parallel degree (an integer >= 1) or `auto` (the smallest that fits area_constraint)."""

    name = "N|auto"

    def convert(self, value, param, ctx):
        if isinstance(value, int) or value == "auto":
            return value
        text = str(value).strip().lower()
        if text == "auto":
            return "auto"
        if text.isdigit() and 1 <= int(text) <= MAX_DEVICES:
            return int(text)
        self.fail(f"{value!r} is not a tensor-parallel degree; valid: an integer 1..{MAX_DEVICES} or auto", param, ctx)


TP_HELP = ("tensor parallelism over N devices (Megatron column/row splits, vocab-parallel embedding and lm_head, "
           "expert parallel MoE), or auto: the smallest N whose per-device VRAM fits area_constraint; timing and "
           "area are then one device's, and the plan per N is printed (overrides parallel.tensor).")


def help_with(**fields):
    """Fill {field} markers of a command's docstring before click reads it (click takes the help from it)."""
    def fill(f):
        for key, text in fields.items():
            f.__doc__ = f.__doc__.replace("{" + key + "}", text)
        return f
    return fill


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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
    a built-in zoo name: qwen3-tiny, llama-tiny, qwen3-moe-tiny, qwen3-0.6b,
    qwen3-1.7b, qwen3-8b, qwen3-30b-a3b, qwen3-235b-a22b, minilm (optionally prefixed "zoo:").

    \b
    Exit codes: 0 success, 1 timing or area violated, 2 bad input (one
    line naming the file, line, key or node), 3 internal error (rerun with
    --debug for the trace). Output directories hold softsyn-manifest.json,
    the list of what softsyn wrote there; only those files are ever
    replaced, and a non-empty directory without one is refused.
    """
    del debug  # read by run(), which maps exceptions to exit codes and prints the trace


def given_paths(model: str) -> list[Path]:
    """MODEL when it names a file or folder (a zoo name does not)."""
    path = Path(model).expanduser()
    return [path] if not model.startswith("zoo:") and path.exists() else []


def _one_line(text) -> str:
    return " ".join(str(text).split())


def run(argv: list[str] | None = None) -> None:
    """Entry point. Exit 0 met, 1 violated, 2 bad input, 3 internal error; every error is one line on
    stderr ("softsyn: error: ..." or "softsyn: internal error: ..."), the trace only with --debug."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    if debug:  # a global flag, honoured wherever it is on the line
        args = ["--debug"] + [a for a in args if a != "--debug"]
    try:
        code = main.main(args, prog_name="softsyn", standalone_mode=False)
    except SoftsynError as exc:
        _fail(debug, f"softsyn: error: {_one_line(exc)}", 2)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help())
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "softsyn"
        _fail(False, f"softsyn: error: {where}: {_one_line(exc.format_message())} (see {where} --help)", 2)
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


# the commands (imported last: they register on `main`)
from softsyn.cli import design, tools  # noqa: E402,F401
