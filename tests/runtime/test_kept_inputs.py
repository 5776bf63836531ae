"""softsyn.runtime.binding.KeptInputs: one device value per (input, shape), updated in place when the shape comes again
(what `softsyn run`'s prefill and the serving harness bind), at most `per_name` shapes per input."""
import numpy as np

from softsyn.runtime.binding import KeptInputs


def test_a_shape_seen_before_reuses_its_value_updated_and_old_shapes_are_dropped():
    kept = KeptInputs("cpu", per_name=2)
    a = kept("ids", np.arange(4, dtype=np.int64).reshape(1, 4))
    b = kept("ids", np.arange(10, 14, dtype=np.int64).reshape(1, 4))
    assert b is a and a.numpy().tolist() == [[10, 11, 12, 13]]  # the same value, holding the new ids
    other = kept("mask", np.ones((1, 4), np.int64))
    assert other is not a  # per input name
    kept("ids", np.zeros((1, 6), np.int64))
    kept("ids", np.zeros((1, 8), np.int64))  # a third shape of "ids": the least recent one goes
    assert sorted(shape for name, shape in kept.values if name == "ids") == [(1, 6), (1, 8)]
    assert kept("ids", np.full((1, 4), 7, np.int64)) is not a  # made anew, holding 7s
    assert ("mask", (1, 4)) in kept.values
