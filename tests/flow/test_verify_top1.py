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


def test_a_logits_error_names_how_many_positions_are_over_the_budget():
    # a routed model's near-tied experts move a few whole tokens: the check says how many positions are over
    from softsyn.flow.verify import judge, positions_over

    ref = np.random.default_rng(0).standard_normal((1, 16, 32))
    got = ref.copy()
    got[0, [3, 11]] += 0.5 * np.abs(ref).max()  # two tokens sent elsewhere
    got[0, 5] += 0.001 * np.abs(ref).max()  # rounding, within budget
    assert positions_over(got, ref, 0.02) == (2, 16)
    check = judge("prefill", "logits", got, ref, logits=True, max_rel=0.02, min_top1=None)
    assert (check.positions_over, check.positions) == (2, 16)
    assert check.violations == [f"rel error {check.rel:.3e} > 2.000e-02 at 2 of 16 positions"]
    every = judge("prefill", "logits", ref * 1.5, ref, logits=True, max_rel=0.02, min_top1=None)
    assert every.positions_over == every.positions == 16 and every.violations[0].endswith("> 2.000e-02")
    state = judge("prefill", "present.0.recurrent", got, ref, logits=False, max_rel=0.02, min_top1=None)
    assert state.positions is None and positions_over(np.zeros(3), np.zeros(3), 0.1) is None
    # a KV cache [batch, heads, positions, head_dim]: the positions are its third axis
    kv_ref = np.random.default_rng(1).standard_normal((1, 2, 16, 8))
    kv_got = kv_ref.copy()
    kv_got[0, 1, 7] += 0.3 * np.abs(kv_ref).max()
    kv = judge("prefill", "present.0.key", kv_got, kv_ref, logits=False, max_rel=0.02, min_top1=None)
    assert (kv.positions_over, kv.positions) == (1, 16) and kv.violations[0].endswith("at 1 of 16 positions")
