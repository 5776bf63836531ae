"""What an artifact's files may name, checked before anything they name is opened: a compile output, a model folder
or an ONNX file can come from anyone.

- `read_json(path, what)`: a regular file of at most MAX_JSON bytes, parsed (a FIFO, a device or a huge file is
  one SoftsynError line, never a hang);
- `check_session(session, path)`: runtime/session.json's model and block files (inside DIR, by
  softsyn.frontends.onnx_file.inside, which also keeps an ONNX model's external data in its folder), its
  session_options (softsyn.runtime.session.SESSION_OPTIONS: documented keys, checked values) and its KV length.
"""
from __future__ import annotations

import json
from pathlib import Path

from softsyn.constraints.reader import MAX_INT, read_text
from softsyn.errors import SoftsynError
from softsyn.frontends.onnx_file import inside
from softsyn.runtime.session import session_options_problem

MAX_JSON = 64 * 2**20  # bytes of a JSON file softsyn reads back (a real-size session.json is a few hundred KB)


def read_json(path: str | Path, what: str, fix: str = "re-run softsyn compile"):
    """The JSON value in the regular file `path`; a SoftsynError naming it (and `fix`) when it cannot be."""
    text = read_text(path, what, limit=MAX_JSON)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise SoftsynError(f"{path}: not readable JSON ({' '.join(str(exc).split())}); {fix}") from None


def check_session(session, path: Path) -> dict:
    """runtime/session.json `session` (read from `path`), its model/block files inside DIR and its
    session_options documented ones: a SoftsynError naming the file and key otherwise."""
    if not isinstance(session, dict):
        raise SoftsynError(f"{path}: not a JSON object; re-run softsyn compile")
    folder = path.parent.parent  # DIR (the file is DIR/runtime/session.json)
    if session.get("model") is not None:
        inside(folder, session["model"], "model", path)
    blocks = session.get("blocks")
    if blocks is not None:
        if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
            raise SoftsynError(f"{path}: blocks: not a list of objects; re-run softsyn compile")
        for i, block in enumerate(blocks):
            inside(folder, block.get("file"), f"blocks[{i}].file", path)
    kv = session.get("kv_cache")
    length = kv.get("max_length") if isinstance(kv, dict) else None
    if kv is not None and (not isinstance(kv, dict) or length is not None and not (type(length) is int
                                                                                   and 1 <= length <= MAX_INT)):
        raise SoftsynError(f"{path}: kv_cache.max_length: {json.dumps(length)} is not valid; valid: an integer "
                           f"1..{MAX_INT} (KV positions) or null; re-run softsyn compile")
    problem = session_options_problem(session.get("session_options", {}))
    if problem:
        raise SoftsynError(f"{path}: {problem}")
    return session


TORCH_FILE = "runtime/torch.json"  # a torch target's settings (softsyn.runtime.torch_package); its presence marks one
TORCH_PACKAGE = "model.pt2"  # the AOTInductor package a torch target compiles (every step, or decode beside:)
TORCH_PREFILL_PACKAGE = "model-prefill.pt2"  # the steps of seq > 1, when the target has a prefill attention form


def scenarios_problem(settings: dict) -> str | None:
    """What is wrong with a settings file's `scenarios` (an artifact's path groups: name -> {"dims": {dim: size}}),
    None when nothing: runtime/session.json and runtime/torch.json are untrusted input."""
    scenarios = settings.get("scenarios")
    if not isinstance(scenarios, dict) or not scenarios:
        return "scenarios: missing or not an object of path groups"
    for name, spec in scenarios.items():
        dims = spec.get("dims") if isinstance(spec, dict) else None
        if not isinstance(dims, dict) or not all(type(v) is int and v >= 0 for v in dims.values()):
            return f"scenarios.{name}.dims: not an object of dim sizes"
    return None


def is_torch_artifact(directory: str | Path) -> bool:
    """Whether `directory` holds a torch target's artifact (runtime/torch.json), not an ONNX Runtime one."""
    return (Path(directory) / TORCH_FILE).is_file()
