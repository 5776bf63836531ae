"""The `softsyn` command line's group, its entry point (`run`: exceptions to exit codes) and what the commands share;
the commands register themselves on `main` from softsyn.cli.design and softsyn.cli.tools (softsyn.cli loads both)."""
from __future__ import annotations

import errno
import os
import re
import sys
import textwrap
import time
import traceback
from pathlib import Path

import click

from softsyn import __version__
from softsyn.constraints.model import MAX_DEVICES
from softsyn.errors import SoftsynError
from passes import EFFORTS

ANALYSIS_FILE = "analysis.json"
def process_age() -> float:
    """Seconds since this process started (/proc/self/stat's start time against /proc/uptime; 0 where there is no
    /proc): the interpreter's start-up belongs to the command's wall time too."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


STARTED: float | None = None  # when the command started, set by run() (the compile log's zero; None: not through run)
# OSErrors that are the machine refusing (full disk, read-only, permissions, a path longer than it allows), not a
# softsyn bug: exit 2
ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG}


HELP_WIDTH = 100  # the group's max_content_width: lines inside a \\b block are printed as written, so wrapped here


def effort_help() -> str:
    """The effort levels for compile's --help: name and help, then its numbered steps (wrapped to HELP_WIDTH)."""
    width = max(len(name) for name in EFFORTS) + 2
    lines, earlier = [], []
    for level in EFFORTS.values():
        lines += _wrapped(f"  {level.name:<{width}}", level.help)
        step_lines = level.step_lines()
        bases = [b for b in earlier if level.steps[:len(b.steps)] == b.steps]
        if bases:  # a level extending one below it: that level's steps once, then what this level adds
            base = max(bases, key=lambda b: len(b.steps))
            step_lines = [f"1-{len(base.steps)}. as {base.name}", *step_lines[len(base.steps):]]
        for line in step_lines:
            step = re.match(r"(\d+\. \S+\s+)(.*)", line)  # "N. pass  what": continuation lines hang under `what`
            lines += _wrapped(f"  {'':<{width}}{step[1]}", step[2]) if step else [f"  {'':<{width}}{line}"]
        earlier.append(level)
    return "\n    ".join(lines)


def _wrapped(lead: str, text: str) -> list[str]:
    """`lead` + text wrapped so every line (after the 4-space help indent) fits HELP_WIDTH; continuations hang."""
    return textwrap.wrap(text, HELP_WIDTH - 6, initial_indent=lead, subsequent_indent=" " * len(lead)) or [lead]


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


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": HELP_WIDTH})
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
    llama-tiny, qwen3-moe-tiny, qwen3-wide, qwen3-vl-tiny, qwen3-0.6b,
    qwen3-1.7b, qwen3-8b, qwen3-30b-a3b, qwen3-235b-a22b, minilm.

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


def given_paths(model: str) -> list[Path]:
    """MODEL when it names a file or folder (a zoo name does not)."""
    path = Path(model).expanduser()
    return [path] if not model.startswith("zoo:") and path.exists() else []


def _one_line(text) -> str:
    return " ".join(str(text).split())


def run(argv: list[str] | None = None) -> None:
    """Entry point. Exit 0 met, 1 violated, 2 bad input, 3 internal error; every error is one line on
    stderr ("softsyn: error: ..." or "softsyn: internal error: ..."), the trace only with --debug."""
    global STARTED
    # the process is the command when argv comes from the command line: its interpreter start-up counts too
    STARTED = time.perf_counter() - (process_age() if argv is None else 0.0)
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
        text = f"{text.rstrip('.')}; valid: {', '.join(sorted(group.commands))}"
    return text


def _internal(debug: bool, exc: Exception) -> None:
    hint = "" if debug else " (rerun with --debug for the trace)"
    _fail(debug, f"softsyn: internal error: {type(exc).__name__}: {_one_line(exc)}{hint}", 3)


def _fail(debug: bool, line: str, code: int) -> None:
    if debug:
        traceback.print_exc()
    click.echo(line, err=True)
    sys.exit(code)

