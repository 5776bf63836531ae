"""On-disk export cache, keyed by content (config + exporter + versions + options).

Layout: ``<cache_dir>/<name>-<key16>/model.onnx`` (+ ``model.onnx.data`` for materialised
weights). Meta (weightless) models are saved without a data file: their initializers are
external references that are never read. Entries are written to a temporary folder and
renamed into place, so a crash never leaves a half-written entry that looks complete. Processes share a cache:
one exporting an entry holds a lock on it (`exporting`), and a second asking for the same entry waits, then reads it.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import onnx_ir as ir

from softsyn.errors import SoftsynError
from softsyn.netlist import Netlist

FRONTEND_VERSION = "5"  # bump when what an export records changes (kinds, roles, derived dims): old entries are stale
MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
# Provenance keys that describe a run on one machine, not the design: where the cache entry is and
# whether it was a hit, how long the export took, the absolute path a file was read from.
RUN_FACTS = ("cache", "export_seconds", "materialise_seconds", "file")


def default_cache_dir() -> Path:
    """$SOFTSYN_CACHE, else $XDG_CACHE_HOME/softsyn (the XDG base-directory rule), else ~/.cache/softsyn."""
    env = os.environ.get("SOFTSYN_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # the XDG spec: a relative XDG_CACHE_HOME is invalid and ignored
    return (Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache") / "softsyn"


def versions() -> dict:
    out = {}
    for pkg in ("torch", "transformers", "onnx", "onnx-ir", "onnxscript"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def design_provenance(provenance: dict) -> dict:
    """Provenance without RUN_FACTS: what an artifact may record and stay the same wherever it was made."""
    return {k: v for k, v in provenance.items() if k not in RUN_FACTS}


def content_key(material: dict) -> str:
    blob = json.dumps(material, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def entry_dir(cache_dir: Path, name: str, key: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return Path(cache_dir) / f"{safe}-{key[:16]}"


@contextlib.contextmanager
def exporting(entry: Path):
    """Held while this process looks `entry` up and, on a miss, exports it: a second softsyn process asking for the
    same entry (two compiles of one model, a CI matrix) waits, then reads the first one's entry instead of exporting
    it again (minutes for a large model). An flock on a hidden file beside the entry, which the kernel releases if the
    holder dies; a cache folder this process cannot write gets no lock (reading it still works)."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(entry.parent / f".{entry.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        fd = None
    if fd is None:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def load_entry(entry: Path) -> Netlist | None:
    path = entry / MODEL_FILE
    if not path.is_file():
        return None
    try:
        model = ir.load(str(path))
    except Exception:
        return None
    return Netlist.from_model(model)


def _has_materialised(model: ir.Model) -> bool:
    return any(
        v.const_value is not None and not isinstance(v.const_value, ir.ExternalTensor)
        for v in model.graph.initializers.values()
    )


def save_entry(nl: Netlist, entry: Path, progress: bool = False) -> Netlist:
    """Save the netlist into the cache entry atomically and return it re-loaded from there (lazy data). The disk
    refusing (full, read-only, no permission) is a SoftsynError naming the entry; nothing half-written stays.
    `progress`: an exporting line is open on stderr; a failure ends it (" failed") before the error's line."""
    nl.store_meta()
    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=entry.name + ".tmp-", dir=entry.parent))
        os.chmod(tmp, 0o755)
        path = tmp / MODEL_FILE
        if _has_materialised(nl.model):
            ir.save(nl.model, str(path), external_data=DATA_FILE, size_threshold_bytes=1024)
        else:
            ir.save(nl.model, str(path))
        if entry.exists() and load_entry(entry) is not None:  # written meanwhile by a process that took no lock: same key, same content
            shutil.rmtree(tmp, ignore_errors=True)
            tmp = None
        else:
            if entry.exists():  # unreadable (a stale or damaged entry): this export replaces it
                shutil.rmtree(entry, ignore_errors=True)
            os.replace(tmp, entry)
    except OSError as exc:  # the exporter's writers raise OSErrors of their own, some without an errno
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if progress:
            print(" failed", file=sys.stderr, flush=True)
        why = exc.strerror or " ".join(str(exc).split())
        raise SoftsynError(f"{entry}: cannot write the export cache entry: {why}; free space there or point "
                           "$SOFTSYN_CACHE / --cache-dir at a disk with room") from None
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    loaded = load_entry(entry)
    if loaded is None:  # pragma: no cover - just saved
        raise RuntimeError(f"cache entry {entry} unreadable right after saving")
    return loaded
