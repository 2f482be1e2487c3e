"""`jaxagent.jobs.experiments.probe_credit` (scripts/probe_credit.py): its figures against hand-computed cases."""

import numpy as np
import pytest

from jaxagent.jobs.experiments import probe_credit as pc


def test_episode_pushes_by_hand():
    # two episodes; agent tokens where the mask is 1; the info term is A - A_ext there
    A = np.array([[9.0, 1.5, 0.5, 9.0], [9.0, -1.0, 0.0, 0.5]])
    ext = np.array([1.0, 0.0])
    mask = np.array([[0, 1, 1, 0], [0, 1, 1, 1]])
    push, info_l1, ext_l1, n = pc.episode_pushes(A, ext, mask)
    np.testing.assert_allclose(push, [0.5 - 0.5, -1.0 + 0.0 + 0.5])
    np.testing.assert_allclose(info_l1, [1.0, 1.5])
    np.testing.assert_allclose(ext_l1, [2.0, 0.0])
    np.testing.assert_array_equal(n, [2, 3])


def test_by_turn_means_valid_turns_only():
    A = np.array([[-1.0, 2.0, 7.0], [-3.0, 0.0, 7.0]])
    valid = np.array([[True, True, False], [True, False, False]])
    assert pc.by_turn(A, valid) == [-2.0, 2.0, None]


def test_summarise_by_hand():
    # group 0 mixed (rewards 1, 0, 0), group 1 all successes (1, 1)
    push = [-0.6, 0.3, 0.9, 0.2, -0.2]
    n = [2, 3, 3, 1, 1]
    reward = [1.0, 0.0, 0.0, 1.0, 1.0]
    group = [0, 0, 0, 1, 1]
    out = pc.summarise(push, n, reward, group, success_threshold=1.0)
    assert out["episodes"] == 5 and out["success_rate"] == pytest.approx(0.6)
    net = out["net_info_per_token"]
    assert net["success"] == pytest.approx((-0.6 + 0.2 - 0.2) / 4)
    assert net["failure"] == pytest.approx(1.2 / 6)
    assert net["mixed"] == pytest.approx(0.6 / 8) and net["all_success"] == pytest.approx(0.0)
    assert net["all_failure"] is None
    assert out["info_l1_share"]["mixed"] == pytest.approx(1.8 / 2.2)
    assert out["info_l1_share"]["all_failure"] == 0.0
    assert out["group_share"] == {"all_success": 0.5, "all_failure": 0.0, "mixed": 0.5}
    # centred outcomes in group 0: +2/3, -1/3, -1/3; pushes -0.6, +0.3, +0.9: every one against
    assert out["against_outcome"] == 1.0
    assert out["corr_info_reward_mixed"] == pytest.approx(np.corrcoef([-0.6, 0.3, 0.9], [1, 0, 0])[0, 1])
    assert out["corr_info_reward_mixed"] < -0.9
