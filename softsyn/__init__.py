"""softsyn: a soft-synthesis compiler for neural-network inference (see docs/architecture.md)."""
__version__ = "0.1.0"
