"""What the Hugging Face readers share (softsyn.frontends.hf, hf_torch, vlm): one-line errors for what transformers
or torch raise, and the MoE experts implementation the export traces."""
from __future__ import annotations

import contextlib
import re

from softsyn.errors import SoftsynError

EXPERTS_IMPL = "batched_mm"  # transformers' MoE experts as batched matmuls: the form torch.export traces


def brief(exc: BaseException, limit: int = 200) -> str:
    """One short line for a library's exception: the innermost cause's first line, terminal colours removed."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip().splitlines()
    first = " ".join(lines[0].split()) if lines else ""
    return f"{type(exc).__name__}: {first if len(first) <= limit else first[:limit - 3] + '...'}"


@contextlib.contextmanager
def building(source: str):
    """A model transformers or torch cannot build from its config is bad input: one line naming the config."""
    try:
        yield
    except SoftsynError:
        raise
    except Exception as exc:  # noqa: BLE001 -- a config can fail anywhere in a model's constructor
        raise SoftsynError(f"{source}: transformers cannot build the model: {brief(exc)}") from None
