"""The weight files of a Hugging Face folder: found, and checked readable before anything is built from them.

A folder that holds weight files brings its own weights: they load, or the read stops with one line naming the
file. A safetensors file cut short by a full disk or an interrupted download is not a folder without weights;
seeded random weights are for configs and weightless plans only. The checks read headers and directories, never
the tensors, so a folder of any size is checked in milliseconds.
"""
from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

from softsyn.errors import SoftsynError

# What transformers' from_pretrained loads a folder's weights from, in the order it looks
LOADABLE = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_HEADER_LIMIT = 100 * 1024 * 1024  # safetensors refuses headers above 100 MB: a larger length is a corrupt file


def weight_files(folder: Path | None) -> list[Path]:
    """Every weight file in `folder`: safetensors files and shards, torch .bin files and shards, their indexes."""
    if folder is None or not folder.is_dir():
        return []
    found = {*folder.glob("*.safetensors"), *folder.glob("pytorch_model*.bin"), *folder.glob("*.index.json")}
    return sorted(f for f in found if f.is_file() and (f.suffix != ".json" or f.name in LOADABLE))


def checked_weights(folder: Path | None) -> Path | None:
    """The file transformers loads `folder`'s weights from, after every weight file there is checked readable;
    None for a folder without weight files. SoftsynError naming the file that cannot be read."""
    files = weight_files(folder)
    if not files:
        return None
    for file in files:
        problem = weight_file_problem(file)
        if problem:
            raise SoftsynError(f"{file}: {problem}; the folder's weights cannot be loaded (re-download or re-save "
                               "them; seeded random weights are only for a config without weight files)")
    entry = next((folder / name for name in LOADABLE if (folder / name).is_file()), None)
    if entry is None:
        raise SoftsynError(f"{files[0]}: a weight file transformers does not load on its own (it reads "
                           f"{', '.join(LOADABLE)}); is the shards' index file missing?")
    return entry


def weight_file_problem(path: Path) -> str | None:
    """Why `path` cannot be read as the weight file it is named as, or None."""
    try:
        if path.suffix == ".safetensors":
            return _safetensors_problem(path)
        if path.suffix == ".json":
            return _index_problem(path)
        return _torch_zip_problem(path)
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"


def _safetensors_problem(path: Path) -> str | None:
    """The 8-byte header length, the JSON header, and the data its offsets describe all inside the file."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"holds {size} bytes, fewer than a safetensors file's 8-byte header length (cut short?)"
        (length,) = struct.unpack("<Q", head)
        if length > _HEADER_LIMIT or 8 + length > size:
            return (f"its safetensors header of {length} bytes runs past the end of the file ({size} bytes): "
                    "cut short, or not a safetensors file")
        try:
            header = json.loads(f.read(length))
        except ValueError as exc:
            return f"its safetensors header is not JSON ({exc})"
    if not isinstance(header, dict):
        return "its safetensors header is not a JSON object"
    try:
        ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
    except (KeyError, IndexError, TypeError, ValueError):
        return "its safetensors header has a tensor without [begin, end] data_offsets"
    need = 8 + length + max(ends, default=0)
    if size < need:
        return (f"holds {size} bytes of the {need} its safetensors header describes: cut short (a full disk or an "
                "interrupted download?)")
    return None


def _index_problem(path: Path) -> str | None:
    """A shards index: JSON with a weight_map whose shards are all in the folder."""
    try:
        index = json.loads(path.read_text())
    except ValueError as exc:
        return f"is not JSON ({exc}): cut short?"
    shards = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(shards, dict) or not shards:
        return "has no weight_map (a shards index names each weight's file)"
    missing = sorted({s for s in shards.values() if not (path.parent / str(s)).is_file()})
    if missing:
        return f"names shard {missing[0]}, which is not in the folder" + (f" ({len(missing)} missing)" if len(missing) > 1 else "")
    return None


def _torch_zip_problem(path: Path) -> str | None:
    """A torch .bin is a zip archive (torch.save since 1.6): its directory, at the end, is there when it is whole.
    An older pickle file (no zip magic) is left to torch."""
    with path.open("rb") as f:
        if f.read(4) != b"PK\x03\x04":
            return None
    try:
        with zipfile.ZipFile(path):
            return None
    except zipfile.BadZipFile as exc:
        return f"is a torch zip archive without its directory ({exc}): cut short?"
