"""Greedy sampling (softsyn.runtime.greedy): the same index as numpy's argmax for every float16 row, fast path or
not — signed zeros, infinities, ties and NaNs included."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from softsyn.runtime.greedy import greedy_token, greedy_tokens

SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, 65504.0, -65504.0, 6e-8, -6e-8, 1.0, -1.0], np.float16)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float16, st.integers(1, 64), elements=st.floats(width=16, allow_nan=True)))
def test_float16_rows_pick_numpys_index(row):
    assert greedy_token(row) == int(np.argmax(row))


def test_ties_signed_zeros_and_batches():
    rng = np.random.default_rng(0)
    rows = rng.choice(SPECIAL, size=(200, 16)).astype(np.float16)
    rows[::7] = -rows[::7]  # all-negative and all-zero rows among them
    assert (greedy_tokens(rows) == np.argmax(rows, axis=-1)).all()
    assert greedy_token(np.array([-0.0, 0.0], np.float16)) == 0  # equal values: the first, as numpy
    assert greedy_token(np.array([1.0, -np.nan, np.nan], np.float16)) == 1  # the first NaN, whatever its sign


def test_other_dtypes_are_numpys():
    row = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    assert greedy_token(row) == int(np.argmax(row))
