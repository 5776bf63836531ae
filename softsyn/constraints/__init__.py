"""Constraints: the SDC of softsyn (see model), and the YAML-with-line-numbers reader every input file uses."""
from softsyn.constraints.model import (GROUP_KINDS, KEYS, KV_DTYPES, PRECISIONS, Accuracy, Constraints,
                                       ConstraintsError, KVCache, PathGroupSpec, Precision, Workload,
                                       load_constraints, parse_constraints)
from softsyn.constraints.reader import YamlReader

__all__ = [
    "ConstraintsError",
    "Workload",
    "PathGroupSpec",
    "Accuracy",
    "Precision",
    "KVCache",
    "Constraints",
    "load_constraints",
    "parse_constraints",
    "PRECISIONS",
    "KV_DTYPES",
    "GROUP_KINDS",
    "KEYS",
    "YamlReader",
]
