"""Progress messages on stderr: one line per step, "[softsyn] message", flushed so it interleaves with output."""
from __future__ import annotations

import sys


def log(message: str, *, enabled: bool = True, end: str = "\n") -> None:
    if enabled:
        print(f"[softsyn] {message}", file=sys.stderr, end=end, flush=True)
