"""Canary users for user-level sampling: k held-out records sharing one secret label, a fair
coin per user, added to the training users as one user each; scored by minus the final
model's summed (or mean) loss over the k records; audited in one training run with users as
the unit, below the accountant's user-level standard epsilon."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import TensorDataset

import opacus_lastiterate.accountants  # noqa: F401  (registers accountant="last_iterate")
from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit
from opacus_lastiterate.analysis.sampling import PoissonSampling
from opacus_lastiterate.auditing.input_space import InputCanaries, make_canary_users
from opacus_lastiterate.callbacks import InTrainingCanaryAudit
from opacus_lastiterate.user_samplers import UserDataset, per_user_loss, user_data_loader

D, CLASSES = 8, 4


def _sets(
    n_train: int = 40, n_held: int = 30, d: int = D, seed: int = 1
) -> tuple[TensorDataset, list[int], TensorDataset]:
    g = torch.Generator().manual_seed(seed)
    train = TensorDataset(
        torch.randn(n_train, d, generator=g), torch.randint(0, CLASSES, (n_train,), generator=g)
    )
    held = TensorDataset(
        torch.randn(n_held, d, generator=g), torch.randint(0, CLASSES, (n_held,), generator=g)
    )
    return train, [i // 2 for i in range(n_train)], held  # 20 users of 2 records


def _indices(m: int, k: int) -> np.ndarray:
    return np.arange(m * k).reshape(m, k)[::-1].copy()  # not in source order


# -- building -----------------------------------------------------------------------------------


def test_included_canary_users_join_as_one_user_each_with_their_secret() -> None:
    train, ids, held = _sets()
    idx = _indices(10, 3)
    users, canaries = make_canary_users(train, ids, held, idx, num_classes=CLASSES, seed=3)
    assert isinstance(users, UserDataset) and isinstance(canaries, InputCanaries)
    assert canaries.num_canaries == 10 and canaries.records_per_canary == 3
    assert canaries.reduction == "sum"
    assert canaries.features.shape == (10, 3, D)
    np.testing.assert_array_equal(canaries.source_indices, idx)
    torch.testing.assert_close(canaries.features, held.tensors[0][torch.from_numpy(idx)])
    inside = np.flatnonzero(canaries.included)
    assert 0 < inside.size < 10
    # the training users first, unchanged; then one user per included canary, in order
    assert users.num_users == 20 + inside.size
    assert users.users[:20] == tuple(range(20))
    assert users.users[20:] == tuple(("canary user", int(j)) for j in inside)
    for u, j in enumerate(inside, start=20):
        x, y, mask = users[u]
        assert mask.sum() == 3
        torch.testing.assert_close(x[:3], held.tensors[0][torch.from_numpy(idx[j])])
        assert y[:3].tolist() == [int(canaries.labels[j])] * 3
    assert len(users.dataset) == 40 + 3 * inside.size
    # a canary user is k records, not one example
    with pytest.raises(ValueError, match="canary users"):
        canaries.canary(0)


def test_secrets_and_coins_are_seeded_and_leave_the_global_generators_alone() -> None:
    train, ids, held = _sets()
    state, np_state = torch.get_rng_state(), np.random.get_state()
    _, a = make_canary_users(train, ids, held, _indices(10, 3), num_classes=CLASSES, seed=7)
    _, b = make_canary_users(train, ids, held, _indices(10, 3), num_classes=CLASSES, seed=7)
    _, c = make_canary_users(train, ids, held, _indices(10, 3), num_classes=CLASSES, seed=8)
    assert torch.equal(torch.get_rng_state(), state)
    assert np.array_equal(np.random.get_state()[1], np_state[1])
    assert np.array_equal(a.included, b.included) and torch.equal(a.labels, b.labels)
    assert not (np.array_equal(a.included, c.included) and torch.equal(a.labels, c.labels))
    # the documented draws
    coins = np.random.default_rng(np.random.SeedSequence(7, spawn_key=(8,))).random(10) < 0.5
    secrets = np.random.default_rng(np.random.SeedSequence(7, spawn_key=(7,))).integers(0, 4, 10)
    np.testing.assert_array_equal(a.included, coins)
    np.testing.assert_array_equal(a.labels.numpy(), secrets)


def test_coins_are_fair_and_secrets_uniform() -> None:
    m = 4000
    train, ids, held = _sets(n_held=m, d=2)
    _, canaries = make_canary_users(
        train, ids, held, np.arange(m).reshape(m, 1), num_classes=CLASSES, seed=0
    )
    # Binomial(4000, 1/2): sd = sqrt(1000) ~ 31.6; 5 sd
    assert abs(int(canaries.included.sum()) - m / 2) < 5 * math.sqrt(m / 4)
    counts = np.bincount(canaries.labels.numpy(), minlength=CLASSES)
    sd = math.sqrt(m * (1 / CLASSES) * (1 - 1 / CLASSES))
    assert np.all(np.abs(counts - m / CLASSES) < 5 * sd), counts
    # the coins do not depend on the secrets: the included fraction per secret is near 1/2
    for label in range(CLASSES):
        chosen = canaries.included[canaries.labels.numpy() == label]
        assert abs(chosen.mean() - 0.5) < 5 * math.sqrt(0.25 / chosen.size)


@pytest.mark.parametrize(
    ("change", "error", "name"),
    [
        ({"train": object()}, TypeError, "`train`"),
        ({"source": iter(())}, TypeError, "`source`"),
        ({"user_ids": "abc"}, TypeError, "`user_ids`"),
        ({"user_ids": [0] * 39}, ValueError, "`user_ids`"),
        ({"user_ids": [("canary user", 0)] * 40}, ValueError, "`user_ids`"),
        ({"indices": np.arange(6)}, TypeError, "`indices`"),
        ({"indices": np.zeros((2, 3))}, TypeError, "`indices`"),
        ({"indices": np.zeros((0, 3), dtype=int)}, ValueError, "`indices`"),
        ({"indices": np.array([[0, 1], [1, 2]])}, ValueError, "`indices`"),
        ({"indices": np.array([[0, 30]])}, ValueError, "`indices`"),
        ({"indices": np.array([[-1, 3]])}, ValueError, "`indices`"),
        ({"num_classes": 1}, ValueError, "`num_classes`"),
        ({"num_classes": 2.0}, TypeError, "`num_classes`"),
        ({"seed": -1}, ValueError, "`seed`"),
        ({"seed": "0"}, TypeError, "`seed`"),
        ({"reduction": "max"}, ValueError, "`reduction`"),
        ({"max_records": 2}, ValueError, "`max_records`"),
        ({"max_records": 0}, ValueError, "`max_records`"),
        ({"source": TensorDataset(torch.randn(30, D + 1), torch.zeros(30))}, ValueError, "`source`"),
        ({"source": TensorDataset(torch.randn(30, D))}, TypeError, "`source`"),
    ],
)
def test_bad_arguments_are_named(change: dict, error: type, name: str) -> None:
    train, ids, held = _sets()
    kwargs = {"train": train, "user_ids": ids, "source": held, "indices": _indices(5, 3),
              "num_classes": CLASSES, "seed": 0, **change}  # fmt: skip
    with pytest.raises(error, match=name):
        make_canary_users(
            kwargs.pop("train"), kwargs.pop("user_ids"), kwargs.pop("source"),
            kwargs.pop("indices"), **kwargs,
        )  # fmt: skip


def test_canary_users_record_validates_its_records_axis() -> None:
    coins = np.array([True, False])
    with pytest.raises(ValueError, match="`reduction`"):
        InputCanaries(torch.zeros(2, 3, D), torch.zeros(2), coins, np.zeros(2), reduction="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`features`"):
        InputCanaries(torch.zeros(2), torch.zeros(2), coins, np.zeros(2), reduction="sum")
    with pytest.raises(ValueError, match="`labels`"):
        InputCanaries(torch.zeros(2, 3, D), torch.zeros(3), coins, np.zeros(2), reduction="sum")


# -- scoring ------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_a_canary_users_score_is_minus_its_records_losses(reduction: str) -> None:
    train, ids, held = _sets()
    idx = _indices(7, 3)
    _, canaries = make_canary_users(
        train, ids, held, idx, num_classes=CLASSES, seed=2, reduction=reduction  # type: ignore[arg-type]
    )
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 5), nn.Tanh(), nn.Linear(5, CLASSES))
    model.train()
    scores = canaries.scores(model, batch_size=2)
    assert model.training  # mode restored
    # independently: record by record, in float64, log-softmax written out
    w1, b1, w2, b2 = (p.detach().double() for p in model.parameters())
    for j in range(7):
        secret = int(canaries.labels[j])
        losses = []
        for i in idx[j]:
            x = held.tensors[0][int(i)].double()
            logits = w2 @ torch.tanh(w1 @ x + b1) + b2
            losses.append(float(torch.logsumexp(logits, 0) - logits[secret]))
        expected = -(sum(losses) if reduction == "sum" else sum(losses) / 3)
        assert scores[j] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    # a per-record loss of one's own is reduced the same way
    zero_one = canaries.scores(model, loss=lambda out, y: (out.argmax(1) != y).double())
    wrong = (model(canaries.features).argmax(-1) != canaries.labels[:, None]).double()
    np.testing.assert_allclose(
        zero_one, -(wrong.sum(1) if reduction == "sum" else wrong.mean(1)).numpy()
    )


# -- one training run, users as the unit ----------------------------------------------------------


def test_one_run_audit_of_canary_users_stays_below_the_users_standard_epsilon() -> None:
    """A tiny linear model trained at user level with little noise memorises the canary
    users' secrets: the one-run lower bound is positive, counts users, and stays below the
    user-level standard epsilon (checked against dp_accounting's PLD over users)."""
    from dp_accounting import dp_event, pld

    d, k, m, sigma, epochs = 32, 2, 100, 0.5, 10
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(200, d, generator=g), torch.randint(0, 10, (200,), generator=g))
    held = TensorDataset(torch.randn(m * k, d, generator=g), torch.zeros(m * k, dtype=torch.long))
    users, canaries = make_canary_users(
        train, [i // 2 for i in range(200)], held, np.arange(m * k).reshape(m, k),
        num_classes=10, seed=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = nn.Linear(d, 10)
    engine = PrivacyEngine(accountant="last_iterate")
    loader = user_data_loader(
        users, users_per_step=users.num_users // 4, generator=torch.Generator().manual_seed(1)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer, loader = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=2.0),
            data_loader=loader, noise_multiplier=sigma, max_grad_norm=1.0,
            poisson_sampling=False,
        )  # fmt: skip
    q = 1 / len(loader)
    audit = InTrainingCanaryAudit(
        optimizer, num_canaries=0, sample_rate=q, seed=1, accountant=engine.accountant,
        input_canaries=canaries,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(epochs):
            for x, y, mask in loader:
                optimizer.zero_grad()
                out = model(x)
                losses = nn.functional.cross_entropy(
                    out.reshape(-1, 10), y.reshape(-1), reduction="none"
                ).reshape(y.shape)
                per_user_loss(losses, mask).sum().backward()
                optimizer.step()
    accountant = engine.accountant
    assert accountant.unit == PrivacyUnit.sampled_user()
    assert accountant.sampling == PoissonSampling(rate=q)
    steps = epochs * len(loader)
    assert accountant.history == [(sigma, q, steps)]
    report = audit.report(delta=1e-5, model=model)
    result = report.audit("input")
    assert result.num_canaries == m  # users, not records
    assert result.num_included == int(canaries.included.sum())
    reference = pld.PLDAccountant(value_discretization_interval=1e-3).compose(
        dp_event.SelfComposedDpEvent(
            dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps
        )
    ).get_epsilon(1e-5)
    assert report.standard_epsilon == pytest.approx(reference, rel=1e-2)
    for bound in (result.one_run, result.one_run_fdp):
        assert bound.is_bound
        assert 0 < bound.epsilon <= min(reference, report.standard_epsilon)
