"""Agreement statistics against hand-computed textbook examples."""

import pytest

from ground_truth.agreement import cohen_kappa, fleiss_kappa, krippendorff_alpha, wilson_interval


def test_cohen_kappa_textbook():
    # Cohen's kappa, Wikipedia's worked example: 50 proposals, both yes 20, A yes B no 5, A no B yes 10,
    # both no 15. p_o = 0.7, p_e = 0.5*0.6 + 0.5*0.4 = 0.5, kappa = (0.7 - 0.5) / 0.5 = 0.4.
    a = ["yes"] * 20 + ["yes"] * 5 + ["no"] * 10 + ["no"] * 15
    b = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    assert cohen_kappa(a, b) == pytest.approx(0.4)
    assert cohen_kappa(a, a) == pytest.approx(1.0)
    assert cohen_kappa(["x", "x"], ["x", "x"]) is None  # one category: undefined


def test_fleiss_kappa_textbook():
    # Fleiss (1971) as on Wikipedia: 10 subjects, 14 raters, 5 categories; P-bar = 0.378,
    # P-bar_e = 0.213, kappa = 0.210.
    table = [
        [0, 0, 0, 0, 14],
        [0, 2, 6, 4, 2],
        [0, 0, 3, 5, 6],
        [0, 3, 9, 2, 0],
        [2, 2, 8, 1, 1],
        [7, 7, 0, 0, 0],
        [3, 2, 6, 3, 0],
        [2, 5, 3, 2, 2],
        [6, 5, 2, 1, 0],
        [0, 2, 2, 3, 7],
    ]
    units = [[category for category, n in enumerate(row) for _ in range(n)] for row in table]
    assert fleiss_kappa(units) == pytest.approx(0.2099, abs=5e-4)
    with pytest.raises(ValueError):
        fleiss_kappa([[1, 2], [1]])


def test_krippendorff_alpha_textbook_with_missing_values():
    # Krippendorff (2011), "Computing Krippendorff's alpha-reliability", the nominal example: 4 observers,
    # 12 units, missing values; 40 pairable values, alpha = 1 - 39 * 10 / 1,384 ... = 0.743.
    observers = [
        [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
        [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
        [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
        [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
    ]
    units = [[o[u] for o in observers if o[u] is not None] for u in range(12)]
    assert krippendorff_alpha(units) == pytest.approx(0.743, abs=5e-4)


def test_alpha_and_kappas_meet_on_two_complete_raters():
    # With two raters and no missing data, alpha = kappa-like with pooled marginals (Scott's pi) corrected
    # for sample size: alpha = 1 - (2n - 1) * D_o / D_e. Hand check on 4 units: (a,a) (a,b) (b,b) (b,b).
    units = [["a", "a"], ["a", "b"], ["b", "b"], ["b", "b"]]
    # pairable values n = 8: a = 3, b = 5; disagreeing pairs o_ab + o_ba = 2; expected 2 * 3 * 5 = 30
    assert krippendorff_alpha(units) == pytest.approx(1 - 7 * 2 / 30)
    assert krippendorff_alpha([["a", "a"], ["a", "a"]]) is None


def test_wilson_interval_textbook():
    # Newcombe (1998), table I: 81 of 263 gives 0.2553-0.3662; 0 of 10 gives 0-0.2775 (never below 0)
    assert wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(0, 0) is None


def test_wilson_interval_holds_the_observed_share_at_the_edges():
    for trials in range(1, 200):
        assert wilson_interval(trials, trials)[1] == 1.0  # all right: rounding once gave 0.9999999999999999
        assert wilson_interval(0, trials)[0] == 0.0
        for successes in (1, trials // 2, trials - 1):
            low, high = wilson_interval(successes, trials)
            assert low <= successes / trials <= high
