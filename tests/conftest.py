"""Shared fixtures: one export cache per test session, so each zoo model is exported once."""
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("softsyn-cache")
    os.environ["SOFTSYN_CACHE"] = str(path)
    return path
