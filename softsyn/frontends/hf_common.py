"""What the Hugging Face readers share (softsyn.frontends.hf, hf_torch, vlm): one-line errors for what transformers
or torch raise, and the MoE experts implementation the export traces."""
from __future__ import annotations

import contextlib
import re

from softsyn.errors import SoftsynError

EXPERTS_IMPL = "batched_mm"  # transformers' MoE experts as batched matmuls: the form torch.export traces


def brief(exc: BaseException, limit: int = 200) -> str:
    """One short line for a library's exception: the innermost cause's first line, terminal colours removed; where
    that line only announces what follows (ends in ":", as Inductor's "Failed to run autotuning code block: An
    exception occurred in a subprocess:" before a worker's traceback, which a 0.6B compile's log kept nothing else
    of, H100, 2026-12-06), the last line too: the worker's own exception."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = [line for line in re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip().splitlines() if line.strip()]
    text = " ".join(lines[0].split()) if lines else ""
    if text.endswith(":") and len(lines) > 1:
        last = " ".join(lines[-1].split())
        text = f"{text[:limit // 2 - 4]}... {last}" if len(text) + len(last) + 1 > limit else f"{text} {last}"
    return f"{type(exc).__name__}: {text if len(text) <= limit else text[:limit - 3] + '...'}"


@contextlib.contextmanager
def building(source: str):
    """A model transformers or torch cannot build from its config is bad input: one line naming the config."""
    try:
        yield
    except SoftsynError:
        raise
    except Exception as exc:  # noqa: BLE001 -- a config can fail anywhere in a model's constructor
        raise SoftsynError(f"{source}: transformers cannot build the model: {brief(exc)}") from None
