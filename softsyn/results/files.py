"""How results reach disk: JSON without infinities (json_nulls), a file replaced whole (write_atomic).

On the ground floor so that flow (signoff, annotate), the CLI and reports write the same way.
"""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path


def umask() -> int:
    """The process umask (read without changing it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def json_nulls(data):
    """``data`` with every infinite or NaN float replaced by None: JSON has neither (an unconstrained budget, the
    error of a zero measurement are null)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: json_nulls(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_nulls(v) for v in data]
    return data


def write_atomic(path: Path, text: str) -> Path:
    """Write text to `path` via a temporary file in the same directory and os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600; a report is as readable as any file the user writes
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path
