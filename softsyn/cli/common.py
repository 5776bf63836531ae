"""What the command specs (softsyn.cli.design, softsyn.cli.tools) and their bodies (softsyn.cli.design_run,
softsyn.cli.tools_run) share: option types and help texts, and `perform`, which imports a command's body only when
the command runs, so the group's listing and a command's --help import nothing heavy (onnx_ir, onnxruntime, numpy)."""
from __future__ import annotations

import importlib
import re
import textwrap
from pathlib import Path

import click

from softsyn.constraints.model import MAX_DEVICES
from passes import EFFORTS

ANALYSIS_FILE = "analysis.json"
# when the command started, set by softsyn.cli.app.run: the compile log's zero (None: not started through run)
STARTED: float | None = None


def resolve(target: str):
    """The object `target` ("package.module:name") names, its module imported now."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def perform(target: str, options: dict):
    """Run a command's body `target` ("module:function") with the command's parsed options."""
    return resolve(target)(**options)


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


def given_paths(model: str) -> list[Path]:
    """MODEL when it names a file or folder (a zoo name does not)."""
    path = Path(model).expanduser()
    return [path] if not model.startswith("zoo:") and path.exists() else []
