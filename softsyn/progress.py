"""Progress on stderr: the one log function and the one progress display of the tree.

`log` prints a line. `step` wraps a piece of work that may take seconds: on a terminal it shows a live rich
progress line (spinner, label, bar with done/total when the work counts itself, elapsed, ETA where a total is
known) that the refresh thread keeps moving while the work blocks (an export, a session load); when the step ends
one line says what it took. Off a terminal (a pipe, a log file) nothing animates: the end line alone is printed,
so logs stay plain. Everything is silent when `enabled` is False (-q)."""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from rich.console import Console
from rich.progress import (BarColumn, Progress, ProgressColumn, SpinnerColumn, Task, TaskID, TextColumn,
                           TimeElapsedColumn)
from rich.text import Text

# Steps shorter than this print no end line (they were never worth watching)
QUIET_BELOW_S = 2.0

_lock = threading.Lock()
_live: Progress | None = None  # the one live display while any step runs on a terminal (steps nest into it)
_depth = 0


def log(message: str, *, enabled: bool = True, end: str = "\n", tag: str = "softsyn") -> None:
    """Print "[tag] message" to stderr, flushed.

    end="" makes it a progress-bar update: shown on a terminal only, over the current line; on a terminal every
    other line first clears what a bar left on it (a log file or pipe gets the plain lines)."""
    if not enabled:
        return
    line = f"[{tag}] {message}"
    if _live is not None:  # a live display owns the terminal's last lines: print above it
        if end != "":
            _live.console.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    tty = sys.stderr.isatty()
    if end == "":
        if tty:
            print("\r" + line, file=sys.stderr, end="", flush=True)
        return
    print("\r\033[K" + line if tty else line, file=sys.stderr, end=end, flush=True)


@dataclass
class Step:
    """A running step: `advance`/`update` move its bar (when it counts its work); `note` changes its label."""
    label: str
    total: float | None = None
    tag: str = "softsyn"
    started: float = field(default_factory=time.perf_counter)
    done: float = 0.0
    _task: TaskID | None = None

    def advance(self, amount: float = 1.0) -> None:
        self.update(self.done + amount)

    def update(self, done: float, total: float | None = None) -> None:
        self.done = done
        if total is not None:
            self.total = total
        if _live is not None and self._task is not None:
            _live.update(self._task, completed=done, total=self.total)

    def note(self, label: str) -> None:
        self.label = label
        if _live is not None and self._task is not None:
            _live.update(self._task, description=f"[{self.tag}] {label}")

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started


class _Counted(ProgressColumn):
    """"done/total" and the ETA for a step that counts its work; nothing for one that cannot (an export)."""

    def render(self, task: Task) -> Text:
        if task.total is None:
            return Text("")
        eta = task.time_remaining
        left = f", ETA {int(eta) // 60}:{int(eta) % 60:02d}" if eta is not None and task.completed else ""
        return Text(f"{int(task.completed)}/{int(task.total)}{left}", style="progress.remaining")


def _display() -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(bar_width=24),
                    TimeElapsedColumn(), _Counted(), console=Console(file=sys.stderr), transient=True,
                    refresh_per_second=4)


@contextmanager
def step(label: str, *, enabled: bool = True, total: float | None = None, done: str | None = None,
         tag: str = "softsyn") -> Iterator[Step]:
    """Show `label` while the block runs; at its end print "[tag] <done or label>: <elapsed> s" when it took
    QUIET_BELOW_S or more. `total`: the units of work (the bar and ETA; `Step.advance` counts them)."""
    global _live, _depth
    current = Step(label, total, tag)
    if not enabled:
        yield current
        return
    with _lock:
        if _live is None and sys.stderr.isatty():
            _live = _display()
            _live.start()
        if _live is not None:
            current._task = _live.add_task(f"[{tag}] {label}", total=total)
        _depth += 1
    ok = False
    try:
        yield current
        ok = True
    finally:
        with _lock:
            _depth -= 1
            if _live is not None and current._task is not None:
                _live.remove_task(current._task)
            if _live is not None and _depth == 0:
                _live.stop()
                _live = None
        if current.elapsed >= QUIET_BELOW_S:
            what = (done or current.label) if ok else f"{current.label} (stopped)"
            log(f"{what}: {current.elapsed:.1f} s", tag=tag)
