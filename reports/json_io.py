"""JSON of the same result objects the text reports render (SI units, like OpenSTA -format json)."""
from __future__ import annotations

import json
import math
import types
import typing
from dataclasses import MISSING, fields, is_dataclass

from softsyn.timing import Analysis
from softsyn.results.analysis import UNCONSTRAINED_FIELDS

SCHEMA = "softsyn.analysis/1"
# Lists the reports index into, never empty as analyze writes them (a group has a path per output port).
NON_EMPTY = {("GroupTiming", "paths")}
UNITS = {"time": "s", "bytes": "B", "flops": "FLOP", "area": "B (VRAM)",
         "note": "all quantities are SI; reports convert only when printing"}


def to_json(analysis: Analysis) -> str:
    """Pretty JSON of Analysis.to_dict() plus "schema" and "units" keys; strict JSON: an unconstrained
    clock period, required time or slack is null (a file from before, with Infinity, still reads)."""
    data = {"schema": SCHEMA, "units": UNITS, **analysis.to_dict()}
    return json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n"


def from_json(text: str) -> Analysis:
    """The Analysis to_json wrote. ValueError naming the field for anything else: not JSON, another
    schema, a field missing or of the wrong type (the result classes' annotations are the schema)."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, found {_kind(data)}")
        if data.get("schema") != SCHEMA:
            raise ValueError(f"schema is {data.get('schema')!r}, expected {SCHEMA!r}")
        body = {k: v for k, v in data.items() if k not in ("schema", "units")}
        _check_object(Analysis, body, "")
    except RecursionError:  # json and the checks recurse: lists in lists thousands deep are no analysis
        raise ValueError("nested too deeply") from None
    return Analysis.from_dict(body)


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_object(cls, data, where: str) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{where or 'top level'}: expected an object ({cls.__name__}), found {_kind(data)}")
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if (cls.__name__, f.name) in UNCONSTRAINED_FIELDS and f.name in data and data[f.name] in (None, math.inf):
            continue  # unconstrained: null (Infinity in files from before strict JSON)
        if f.name in data:
            _check_value(hints[f.name], data[f.name], f"{where}{f.name}")
            if (cls.__name__, f.name) in NON_EMPTY and not data[f.name]:
                raise ValueError(f"{where}{f.name}: empty")
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ValueError(f"{where}{f.name}: missing")


def _check_plain(value, where: str) -> None:
    """Free-form data (provenance): any JSON, but no Infinity or NaN, which to_json could not write back."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: expected a finite number, found {_show(value)}")
    for key, item in value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ():
        _check_plain(item, f"{where}.{key}")


def _check_value(hint, value, where: str) -> None:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return
        hint = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if is_dataclass(hint):
        _check_object(hint, value, where + ".")
    elif origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list, found {_kind(value)}")
        for i, item in enumerate(value):
            _check_value(args[0], item, f"{where}[{i}]")
    elif origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object, found {_kind(value)}")
        for key, item in value.items():
            if args:
                _check_value(args[1], item, f"{where}.{key}")
            else:
                _check_plain(item, f"{where}.{key}")
    elif hint is float:
        if type(value) not in (int, float) or (isinstance(value, float) and not math.isfinite(value)):
            raise ValueError(f"{where}: expected a finite number, found {_show(value)}")
    elif hint in (int, str, bool) and type(value) is not hint:
        raise ValueError(f"{where}: expected {hint.__name__}, found {_show(value)}")
