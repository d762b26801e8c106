"""The few-coordinate adversaries on tiny inputs."""

from __future__ import annotations

import numpy as np
import pytest

from opacus_lastiterate.auditing import (
    AdversarialDataset,
    DPSGDArithmetic,
    MaliciousDataset,
    PoissonInsertion,
)
from opacus_lastiterate.auditing.gradient_space.adversaries import WorstCaseLandscape
from opacus_lastiterate.auditing.gradient_space.insertion import PeriodicInsertion


def test_arithmetic_validation_and_divisors() -> None:
    with pytest.raises(ValueError, match="expected_batch_size"):
        DPSGDArithmetic(1.0, normalisation="expected")
    with pytest.raises(ValueError, match="normalisation"):
        DPSGDArithmetic(1.0, normalisation="mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="noise_multiplier"):
        DPSGDArithmetic(0.0)
    a = DPSGDArithmetic(1.0, learning_rate=2.0, normalisation="realised")
    np.testing.assert_array_equal(a.step_scale(np.array([0, 1, 4])), [2.0, 2.0, 0.5])
    skip = DPSGDArithmetic(1.0, normalisation="realised", empty_batch="skip")
    np.testing.assert_array_equal(skip.step_scale(np.array([0, 2])), [0.0, 0.5])
    assert DPSGDArithmetic(1.0, normalisation="expected", expected_batch_size=8.0).step_scale() == 0.125
    clipped = DPSGDArithmetic(1.0, clipping_norm=1.0).clip(np.array([[3.0, 4.0], [0.3, 0.4], [0, 0]]))
    np.testing.assert_allclose(clipped, [[0.6, 0.8], [0.3, 0.4], [0, 0]])


def test_adversarial_dataset_craft() -> None:
    attack = AdversarialDataset(PoissonInsertion(0.1), num_others=3)
    canary = attack.craft(DPSGDArithmetic(1.0, clipping_norm=2.0), dimension=4, coordinate=2)
    assert canary.gradient.tolist() == [0, 0, 2.0, 0]
    assert attack.others_rate == 0.1
    with pytest.raises(ValueError, match="others_sample_rate"):
        _ = AdversarialDataset(PeriodicInsertion(2), num_others=3).others_rate
    with pytest.raises(TypeError, match="insertion"):
        AdversarialDataset(0.1)  # type: ignore[arg-type]


def test_worst_case_landscape_gradients() -> None:
    attack = WorstCaseLandscape(batch_size=4, clipping_norm=2.0)
    assert attack.h == 1.0 and attack.canary_gradient() == -2.0
    # above h the records' gradient is -C, so descent pushes theta further up (and vice versa)
    np.testing.assert_array_equal(attack.record_gradients(np.array([1.5, 0.5])), [-2.0, 2.0])
    with pytest.raises(ValueError, match="batch_size"):
        WorstCaseLandscape(batch_size=0)


def test_malicious_repeaters_reach_their_targets() -> None:
    """One literal step without noise: the repeaters move theta exactly to the targets."""
    arith = DPSGDArithmetic(1.0, learning_rate=0.5, normalisation="expected", expected_batch_size=10.0)
    attack = MaliciousDataset(steps=4, insertion=PoissonInsertion(0.5), num_repeaters=10_000, big_value=50.0)
    u = attack.unit(arith)
    assert u == pytest.approx(0.5 / 10.0)
    theta = np.array([[60 * u, 3 * u, 0.7 * u, 0.2 * u]])  # step 2: coordinates 0 (past), 1 (last)
    grad = attack.repeater_gradient(theta, 2, arith)
    assert np.linalg.norm(grad) <= arith.clipping_norm  # not clipped
    after = theta - arith.step_scale() * attack.num_repeaters * grad
    np.testing.assert_allclose(after, [[50 * u, 50 * u, 0.0, 0.0]], atol=1e-12)
    theta2 = np.array([[-60 * u, 1.9 * u, 0.7 * u, 0.2 * u]])  # 1.9 < tau = 2: "absent"
    after2 = theta2 - arith.step_scale() * attack.num_repeaters * attack.repeater_gradient(theta2, 2, arith)
    np.testing.assert_allclose(after2, [[-50 * u, -50 * u, 0.0, 0.0]], atol=1e-12)
    assert attack.canary_gradient(1, arith).tolist() == [0, -1.0, 0, 0]


def test_malicious_score_orders_records() -> None:
    arith = DPSGDArithmetic(0.5)
    attack = MaliciousDataset(steps=3, insertion=PoissonInsertion(0.1))
    none = np.array([-100.0, -100.0, 0.0])
    one = np.array([100.0, -100.0, 0.0])
    last = np.array([-100.0, -100.0, 1.5])
    s = attack.score(np.stack([none, one, last]), arith)
    assert s[1] > s[0] and s[2] > s[0]
    with pytest.raises(ValueError, match="past_threshold"):
        MaliciousDataset(steps=3, insertion=PoissonInsertion(0.1), big_value=1.0, past_threshold=2.0)


def test_malicious_decoded_probabilities_and_score_terms() -> None:
    from scipy.special import ndtr

    sigma = 0.5
    attack = MaliciousDataset(steps=5, insertion=PoissonInsertion(0.2), last_threshold=1.5)
    # BIG = 100: no flip, no decoding error; P(d = 1) = Phi((b - tau) / sigma)
    np.testing.assert_allclose(attack.decoded_probabilities(sigma, present=True), ndtr(-1.0))
    np.testing.assert_allclose(attack.decoded_probabilities(sigma, present=False), ndtr(-3.0))
    assert attack.flip_probabilities(sigma) == (0.0, 0.0)
    # flips: record j is re-thresholded T - 2 - j times (a two-state Markov chain, here by
    # matrix powers), then decoded by the last step's noise
    leaky = MaliciousDataset(steps=40, insertion=PoissonInsertion(0.2), big_value=1.0, past_threshold=0.2, last_threshold=1.5)
    down, up = leaky.flip_probabilities(sigma)
    assert down == pytest.approx(ndtr(-1.6)) and up == pytest.approx(ndtr(-2.4))
    probs = leaky.decoded_probabilities(sigma, present=True)
    chain = np.array([[1 - down, down], [up, 1 - up]])  # states (+BIG, -BIG)
    keep = ndtr(1.0 / sigma)
    for j in (0, 17, 38):
        plus = (np.array([ndtr(-1.0), ndtr(1.0)]) @ np.linalg.matrix_power(chain, 38 - j))[0]
        assert probs[j] == pytest.approx(plus * keep + (1 - plus) * (1 - keep), rel=1e-12)
    # the score is the sum of its documented terms
    w1, w0 = attack.record_weights(sigma)
    final = np.array([[100.0, -100.0, -100.0, 100.0, 0.7]])
    want = w1[0] + w0[1] + w0[2] + w1[3] + np.log(0.8 + 0.2 * np.exp((2 * 0.7 - 1) / (2 * sigma**2)))
    assert attack.score(final, DPSGDArithmetic(sigma))[0] == pytest.approx(want)
