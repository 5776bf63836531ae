"""Progress lines on stderr: the one log function of the tree."""
from __future__ import annotations

import sys


def log(message: str, *, enabled: bool = True, end: str = "\n", tag: str = "softsyn") -> None:
    """Print "[tag] message" to stderr, flushed.

    end="" makes it a progress-bar update: shown on a terminal only, over the current line; on a terminal every
    other line first clears what a bar left on it (a log file or pipe gets the plain lines)."""
    if not enabled:
        return
    line = f"[{tag}] {message}"
    tty = sys.stderr.isatty()
    if end == "":
        if tty:
            print("\r" + line, file=sys.stderr, end="", flush=True)
        return
    print("\r\033[K" + line if tty else line, file=sys.stderr, end=end, flush=True)
