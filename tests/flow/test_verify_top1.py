"""verify's top-1 agreement: exact argmax, except near-ties that rounding within the accuracy budget decides."""
import numpy as np

from softsyn.flow.verify import compare

REF = np.array([[1.0, 0.999, 0.0], [2.0, 0.0, 0.5]])


def test_without_a_budget_top1_is_exact_argmax_agreement():
    assert compare(REF + 0.0, REF, True)[3] == 1.0
    assert compare(np.array([[0.9985, 0.9995, 0.0], [2.0, 0.0, 0.5]]), REF, True)[3] == 0.5


def test_a_near_tie_inside_the_budget_agrees_and_a_real_flip_does_not():
    tie = np.array([[0.9985, 0.9995, 0.0], [2.0, 0.0, 0.5]])  # 1.5e-3 off: the 1e-3 tie flips
    assert compare(tie, REF, True, max_rel=0.01)[3] == 1.0
    flip = np.array([[1.0, 0.999, 0.0], [0.0, 2.0, 0.5]])  # row 2: a 2.0 margin is not rounding
    assert compare(flip, REF, True, max_rel=0.01)[3] == 0.5
