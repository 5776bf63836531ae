"""Target libraries: ceilings and delay tables of a runtime x device (model), their lookup rules (interp)
and the YAML files they are read from (load)."""
from softsyn.library.interp import LINEAR_AXES
from softsyn.library.load import (FORMAT_VERSION, HEADER_KEYS, UnknownLibraryError, default_library, load_library,
                                  parse_library, shipped_libraries)
from softsyn.library.model import HOST_BOUND, PRECISIONS, Ceilings, Cell, Library, canonical_precision

__all__ = [
    "Library",
    "Cell",
    "Ceilings",
    "PRECISIONS",
    "HOST_BOUND",
    "LINEAR_AXES",
    "canonical_precision",
    "FORMAT_VERSION",
    "HEADER_KEYS",
    "load_library",
    "UnknownLibraryError",
    "parse_library",
    "shipped_libraries",
    "default_library",
]
