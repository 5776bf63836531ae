"""JSON of the same result objects the text reports render (SI units, like OpenSTA -format json)."""
from __future__ import annotations

import json

from softsyn.timing import Analysis

SCHEMA = "softsyn.analysis/1"
UNITS = {"time": "s", "bytes": "B", "flops": "FLOP", "area": "B (VRAM)",
         "note": "all quantities are SI; reports convert only when printing"}


def to_json(analysis: Analysis) -> str:
    """Pretty JSON of Analysis.to_dict() plus "schema" and "units" keys. An unconstrained
    clock period or slack is written as Infinity (Python's json reads it back)."""
    data = {"schema": SCHEMA, "units": UNITS, **analysis.to_dict()}
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


def from_json(text: str) -> Analysis:
    data = json.loads(text)
    data.pop("schema", None)
    data.pop("units", None)
    return Analysis.from_dict(data)
