"""Constraints: the SDC of softsyn (see model), and the YAML-with-line-numbers reader every input file uses."""
from softsyn.constraints import model
from softsyn.constraints.model import *  # noqa: F403 -- exactly model.__all__, listed once there
from softsyn.constraints.reader import YamlReader

__all__ = [*model.__all__, "YamlReader"]
