"""`python -m softsyn`: the softsyn command (the same entry point as the `softsyn` script)."""
from softsyn.cli import run

run()
