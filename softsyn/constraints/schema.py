"""A JSON Schema (draft 2020-12) of constraints files, generated from the constraints model, so editors validate them.

Every key of `KEYS` has its value's form here (`FORMS`, keyed like the reader's dotted paths); a key added to the
model without one fails `constraints_schema` (and its test), so the schema cannot fall behind the reader. Units,
choices and bounds come from the modules that read them (softsyn.units, softsyn.constraints.model, .reader).
The shipped file is softsyn/constraints/constraints.schema.json (`python -m softsyn.constraints.schema` rewrites
it; a test checks it is current). The reader stays the authority: the schema catches a unit, a key or a choice
in the editor; cross-key checks (clock_uncertainty below every period, ...) remain the reader's."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from softsyn.constraints.model import FALLBACKS, GROUP_KINDS, KEYS, KV_DTYPES, MAX_DEVICES, MAX_IMAGES, MODALITIES, PRECISIONS
from softsyn.constraints.reader import MAX_INT
from softsyn.constraints.serving import MAX_REQUESTS, MAX_TOKENS, SERVING_KEYS
from softsyn.units import BYTE_UNITS, RATE_UNITS, TIME_UNITS

SCHEMA_FILE = Path(__file__).with_name("constraints.schema.json")
SCHEMA_ID = "https://softsyn.invalid/constraints.schema.json"  # an identifier, never fetched

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
# unit spellings as the reader accepts them (case-insensitive: _ci)
_TIME_UNITS = "|".join(sorted({*TIME_UNITS, "µs", "μs"}, key=lambda u: (-len(u), u)))
_BYTE_UNITS = "|".join(sorted(BYTE_UNITS, key=lambda u: (-len(u), u)))


def _ci(alternatives: str) -> str:
    """A regex alternation matched case-insensitively (JSON Schema patterns have no flags)."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() and c.lower() != c.upper() else re.escape(c)
                   for c in alternatives).replace("\\|", "|")


TIME = {"type": "string", "pattern": rf"^\s*{_NUMBER}\s*(?:{_ci(_TIME_UNITS)})\s*$",
        "description": f"a time with its unit: {', '.join(TIME_UNITS)} (e.g. 600ms, 2 s, 250us)"}
SIZE = {"type": "string", "pattern": rf"^\s*{_NUMBER}\s*(?:{_ci(_BYTE_UNITS)})\s*$",
        "description": "a size with its unit: B, KB, MB, GB, TB (1000), KiB, MiB, GiB, TiB (1024), e.g. 80GB"}
PERCENT = {"oneOf": [{"type": "string", "pattern": rf"^\s*{_NUMBER}\s*%\s*$"},
                     {"type": "number", "minimum": 0, "maximum": 1}],
           "description": "a percentage (5%) or a fraction 0..1"}
RATE = {"type": "string", "pattern": rf"^\s*{_NUMBER}\s*[A-Za-z]*\s*/\s*(?:{_ci('|'.join(RATE_UNITS))})\s*$",
        "description": "a rate per time unit: 20/s, 1200/min, 200 tok/s"}
DELAYS = {"oneOf": [TIME, {"type": "object", "additionalProperties": TIME,
                           "description": f"port or modality ({', '.join(MODALITIES)}) or * -> time"}]}


def _integer(minimum: int, maximum: int = MAX_INT) -> dict:
    return {"type": "integer", "minimum": minimum, "maximum": maximum}


def _choice(values, what: str) -> dict:
    return {"type": "string", "enum": sorted({*values, *(v.upper() for v in values)}), "description": what}


def _object(keys: tuple[str, ...], form: dict, what: str) -> dict:
    return {"type": "object", "additionalProperties": False, "properties": dict.fromkeys(keys, form),
            "description": what}


def _strings(what: str) -> dict:
    return {"type": "array", "items": {"type": "string"}, "description": what}


IMAGE_SIZE = {"type": "string", "pattern": r"^\s*\d+\s*[xX]\s*\d+\s*$", "description": "WIDTHxHEIGHT"}

FORMS: dict[str, dict] = {
    "target": {"type": "string", "description": "a library name (cpu-ort, cpu-ort-xeon, h200-ort-cuda), a .yaml "
                                                "path, relative to this file, or the PyTorch target cpu-torch "
                                                "(DIR/model.pt2, timed with cpu-ort)"},
    "clock_period": TIME, "clock_uncertainty": TIME, "input_delay": DELAYS, "output_delay": DELAYS,
    "area_constraint": SIZE, "dont_touch": _strings("hierarchy globs (lm_head, model.layers.0.*)"),
    "workload.*": _integer(1),
    "path_group.clock_period": TIME, "path_group.weight": {"type": "number", "minimum": 0, "maximum": 1e6},
    "path_group.critical_range": TIME, "path_group.kind": _choice(GROUP_KINDS, "path group kind"),
    "path_group.dims": {"type": "object", "additionalProperties": _integer(0), "description": "dim name -> integer"},
    "path_group.inputs": _strings("input port names"), "path_group.input_delay": DELAYS,
    "path_group.batch": _integer(1),
    "path_group.image_size": IMAGE_SIZE, "path_group.image": dict(IMAGE_SIZE, description="WIDTHxHEIGHT (image_size)"),
    "path_group.images": dict(_integer(0, MAX_IMAGES), description="images per sequence (0: text only; default 1 "
                                                                    "on a vision-language composite's prefill)"),
    "accuracy.max_rel_error": PERCENT, "accuracy.min_top1": PERCENT,
    "accuracy.fallback": _choice(FALLBACKS, "the compile loop's design when its best map is over the accuracy budget "
                                            "(bf16: uniform bf16; none: the design before the map)"),
    "precision.allowed": {"oneOf": [{"type": "array", "minItems": 1, "items": _choice(PRECISIONS, "precision")},
                                    _choice(PRECISIONS, "precision")]},
    "precision.default": _choice(PRECISIONS, "precision"),
    "kv_cache.dtype": _choice(KV_DTYPES, "KV cache dtype"), "kv_cache.max_length": _integer(1),
    "parallel.tensor": _integer(1, MAX_DEVICES), "parallel.devices": _integer(1, MAX_DEVICES),
    "parallel.weights": _choice(("int8", "int4"), "weight precision (what-if)"),
    "serving.arrival_rate": RATE, "serving.max_batch": _integer(1, 4096), "serving.batch_timeout": TIME,
    "serving.prompt_len": {"oneOf": [_integer(1, MAX_TOKENS), _object(SERVING_KEYS["serving.lengths"],
                                                                      _integer(1, MAX_TOKENS), "tokens at p50, p99")]},
    "serving.gen_len": {"oneOf": [_integer(1, MAX_TOKENS), _object(SERVING_KEYS["serving.lengths"],
                                                                   _integer(1, MAX_TOKENS), "tokens at p50, p99")]},
    "serving.ttft": _object(SERVING_KEYS["serving.ttft"], TIME, "time to first token budgets"),
    "serving.tpot": _object(SERVING_KEYS["serving.tpot"], TIME, "time per output token budgets"),
    "serving.throughput": _object(SERVING_KEYS["serving.throughput"], RATE, "generated tokens/s, at least"),
    "serving.requests": _integer(10, MAX_REQUESTS), "serving.seed": _integer(0),
    "serving.warm_prompts": {"type": "boolean", "description": "a prefill at every prompt length at load"},
    "serving.prompt_buckets": _integer(1, MAX_TOKENS),
}


def _form(section: str, key: str) -> dict:
    path = f"{section}.{key}" if section else key
    form = FORMS.get(path) or FORMS.get(f"{section}.*")
    if form is None:
        raise KeyError(f"constraints key {path!r} has no form in softsyn.constraints.schema.FORMS")
    return form


def _section(section: str) -> dict:
    return {"type": ["object", "null"], "additionalProperties": False,
            "properties": {key: _form(section, key) for key in KEYS[section]}}


def constraints_schema() -> dict:
    """The JSON Schema of a constraints file: every key of the model's KEYS, nothing else."""
    top = {}
    for key in KEYS[""]:
        if key == "path_groups":
            top[key] = {"type": "object", "additionalProperties": _section("path_group"),
                        "description": "group name -> its clock_period, weight, kind, dims, ..."}
        elif key in KEYS:
            top[key] = _section(key)
        else:
            top[key] = _form("", key)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            "title": "softsyn constraints file",
            "description": "Generated by softsyn.constraints.schema from the constraints model; the reader "
                           "(softsyn.constraints.model) is the authority and checks what a schema cannot.",
            "type": "object", "additionalProperties": False, "properties": top}


def schema_text() -> str:
    return json.dumps(constraints_schema(), indent=1, ensure_ascii=False) + "\n"


if __name__ == "__main__":  # rewrite the shipped file
    SCHEMA_FILE.write_text(schema_text(), encoding="utf-8")
    sys.stdout.write(f"wrote {SCHEMA_FILE}\n")
