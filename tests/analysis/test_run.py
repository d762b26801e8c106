"""DPSGDRun: validated once at the boundary, trusted inside."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from opacus_lastiterate.analysis.run import (
    DPSGDRun,
    Normalisation,
    TrainingSegment,
    append_steps,
    as_run,
)


def test_from_history_merges_nothing_but_drops_empty_segments() -> None:
    run = DPSGDRun.from_history([(1.0, 0.1, 3), (2.0, 0.2, 0), (0.5, 0.1, 2)])
    assert run.as_history() == [(1.0, 0.1, 3), (0.5, 0.1, 2)]
    assert run.num_steps == 5 and not run.has_zero_noise and not run.is_constant
    sigma, q = run.per_step()
    assert sigma.tolist() == [1.0] * 3 + [0.5] * 2 and q.tolist() == [0.1] * 5


def test_constant_and_suffix() -> None:
    run = DPSGDRun.constant(steps=4, sample_rate=0.1, noise_multiplier=1.0)
    assert run.is_constant and run.as_history() == [(1.0, 0.1, 4)]
    assert DPSGDRun.constant(steps=0, sample_rate=0.1, noise_multiplier=1.0).num_steps == 0
    mixed = DPSGDRun.from_history([(1.0, 0.1, 3), (2.0, 0.2, 2)], weights=[1, 2, 3, 4, 5])
    tail = mixed.suffix(3)
    assert tail.as_history() == [(1.0, 0.1, 1), (2.0, 0.2, 2)]
    assert tail.weights is not None and tail.weights.tolist() == [3, 4, 5]


def test_zero_noise_is_a_valid_run() -> None:
    run = DPSGDRun.from_history([(0.0, 0.1, 2)])
    assert run.has_zero_noise


@pytest.mark.parametrize(
    "history,error,fragment",
    [
        ([(1.0, 1.5, 2)], ValueError, "history[0].sample_rate"),
        ([(1.0, 0.1, 2), (-1.0, 0.1, 2)], ValueError, "history[1].noise_multiplier"),
        ([(math.nan, 0.1, 2)], ValueError, "history[0].noise_multiplier"),
        ([(1.0, 0.1, 2.5)], TypeError, "history[0].steps"),
        ([(1.0, 0.1, -1)], ValueError, "history[0].steps"),
        ([(1.0, 0.1)], TypeError, "history[0]"),
        ([(1.0, "0.1", 2)], TypeError, "history[0].sample_rate"),
        ("abc", TypeError, "history"),
        (3, TypeError, "history"),
    ],
)
def test_bad_history_names_the_entry(history: object, error: type, fragment: str) -> None:
    with pytest.raises(error, match=r"`" + fragment.replace("[", r"\[").replace("]", r"\]")):
        DPSGDRun.from_history(history)  # type: ignore[arg-type]


def test_weights_are_validated_and_read_only() -> None:
    with pytest.raises(ValueError, match="one entry per step"):
        DPSGDRun.from_history([(1.0, 0.1, 3)], weights=[1.0, 2.0])
    with pytest.raises(ValueError, match=r"`weights\[1\]`"):
        DPSGDRun.from_history([(1.0, 0.1, 2)], weights=[1.0, -2.0])
    source = np.array([1.0, 2.0])
    run = DPSGDRun.from_history([(1.0, 0.1, 2)], weights=source)
    source[0] = 9.0  # the run keeps its own copy
    assert run.weights is not None and run.weights.tolist() == [1.0, 2.0]
    with pytest.raises(ValueError):
        run.weights[0] = 3.0


def test_run_is_immutable_and_as_run_passes_it_through() -> None:
    run = DPSGDRun.constant(steps=2, sample_rate=0.5, noise_multiplier=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.segments = ()  # type: ignore[misc]
    assert as_run(run) is run
    assert as_run([(1.0, 0.5, 2)]).as_history() == run.as_history()
    assert as_run([TrainingSegment(1.0, 0.5, 2)]).as_history() == run.as_history()


@pytest.mark.parametrize(
    "kwargs,error,fragment",
    [
        (dict(rule="other"), ValueError, "rule"),
        (dict(rule="realised"), ValueError, "dataset_size"),
        (dict(rule="public"), ValueError, "public_divisor"),
        (dict(rule="realised", dataset_size=0), ValueError, "dataset_size"),
        (dict(rule="floored_expected", dataset_size=10, batch_size=2.0), TypeError, "batch_size"),
        (dict(rule="sum", drop_last=1), TypeError, "drop_last"),
        (dict(rule="public", public_divisor=-1.0), ValueError, "public_divisor"),
    ],
)
def test_bad_normalisation_names_the_field(kwargs: dict, error: type, fragment: str) -> None:
    with pytest.raises(error, match=fragment):
        Normalisation(**kwargs)


def test_append_steps_is_the_run_length_code_of_the_expanded_steps() -> None:
    rng = np.random.default_rng(7)
    settings = [(1.0, 0.1), (1.0, 0.2), (0.5, 0.1), (0.0, 0.1)]
    history: list[TrainingSegment] = []
    expanded: list[tuple[float, float]] = []
    for _ in range(300):
        sigma, q = settings[int(rng.integers(len(settings)))]
        steps = int(rng.integers(1, 4))
        append_steps(history, sigma, q, steps)
        expanded += [(sigma, q)] * steps
    # naive expansion of the history: the same steps, in order
    assert [(s.noise_multiplier, s.sample_rate) for s in history for _ in range(s.steps)] == expanded
    # maximal runs: no two neighbouring segments share a setting, none is empty
    assert all(
        (a.noise_multiplier, a.sample_rate) != (b.noise_multiplier, b.sample_rate)
        for a, b in itertools.pairwise(history)
    )
    assert all(s.steps >= 1 for s in history)
    assert DPSGDRun.from_history(history).num_steps == len(expanded)


def test_a_segment_unpacks_as_the_opacus_triple() -> None:
    sigma, q, steps = TrainingSegment(1.5, 0.25, 3)
    assert (sigma, q, steps) == (1.5, 0.25, 3)
