"""`python -m softsyn.cli`: the softsyn command."""
from softsyn.cli import run

run()
