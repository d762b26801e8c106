"""User-level sampling: the users' dataset and loaders, per-user clipping under Opacus's
``make_private``, the scheme and unit the accountant detects, and its epsilons against
independent computations over users (dp_accounting, quadrature, the Gaussian closed form)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import opacus_lastiterate.accountants  # noqa: F401  (registers accountant="last_iterate")
from opacus_lastiterate.accountants.sampling_detection import detect_sampling
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit
from opacus_lastiterate.analysis.sampling import PoissonSampling, ShuffledBatches
from opacus_lastiterate.user_samplers import UserDataset, per_user_loss, user_data_loader
from tests._gaussian import gaussian_mechanism_epsilon
from tests.analysis._reference import QuadratureHeuristic


def _records(n: int = 40, d: int = 5, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, d, generator=g), torch.randint(0, 3, (n,), generator=g))


def _users(n: int = 40) -> list[int]:
    # user 0 owns 8 records; users 1..16 own 2 each (32 records)
    return [0] * 8 + [1 + i // 2 for i in range(n - 8)]


# -- the dataset of users -------------------------------------------------------------------------


def test_user_items_stack_the_users_records_with_a_mask() -> None:
    records = _records()
    users = UserDataset(records, _users())
    assert users.num_users == len(users) == 17
    assert users.max_records == 8
    x, y, mask = users[0]
    assert x.shape == (8, 5) and y.shape == (8,) and mask.tolist() == [1.0] * 8
    torch.testing.assert_close(x, records.tensors[0][:8])
    x1, _y1, mask1 = users[1]
    assert mask1.tolist() == [1.0, 1.0] + [0.0] * 6
    torch.testing.assert_close(x1[:2], records.tensors[0][8:10])
    assert torch.count_nonzero(x1[2:]) == 0 and users.records_of(1) == (8, 9)


def test_max_records_caps_each_user_and_counts_the_dropped() -> None:
    users = UserDataset(_records(), _users(), max_records=3)
    assert users[0][2].tolist() == [1.0, 1.0, 1.0]
    assert users.records_of(0) == (0, 1, 2)
    assert users.dropped_records == 5


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"user_ids": [0] * 39}, ValueError, "user_ids"),
        ({"user_ids": "abc"}, TypeError, "user_ids"),
        ({"user_ids": [[0]] * 40}, TypeError, "user_ids"),
        ({"user_ids": [0] * 40, "max_records": 0}, ValueError, "max_records"),
    ],
)
def test_bad_dataset_arguments_name_the_parameter(kwargs, error, name) -> None:
    with pytest.raises(error, match=name):
        UserDataset(_records(), **kwargs)


def test_per_user_loss_sums_or_averages_the_real_records() -> None:
    losses = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert per_user_loss(losses, mask).tolist() == [3.0, 4.0]
    assert per_user_loss(losses, mask, reduction="mean").tolist() == [1.5, 4.0]
    with pytest.raises(ValueError, match="reduction"):
        per_user_loss(losses, mask, reduction="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="record_losses"):
        per_user_loss(losses[:, :2], mask)


# -- loaders, detection, sample rate --------------------------------------------------------------


def _indexed_users() -> UserDataset:
    """Record i has features all equal to i, so a batch row names its user."""
    x = torch.arange(40, dtype=torch.float32).unsqueeze(1).repeat(1, 5)
    return UserDataset(TensorDataset(x, torch.zeros(40, dtype=torch.int64)), _users())


def _user_ids(users: UserDataset, x: torch.Tensor) -> list[int]:
    first = {users.records_of(u)[0]: u for u in range(users.num_users)}
    return [first[int(x[row, 0, 0])] for row in range(x.shape[0])]


def test_poisson_loader_samples_users_at_one_over_steps() -> None:
    users = _indexed_users()
    loader = user_data_loader(users, users_per_step=4, generator=torch.Generator().manual_seed(1))
    steps = round(17 / 4)
    assert len(loader) == steps
    detected = detect_sampling(loader)
    assert detected.scheme == PoissonSampling(rate=1 / steps)
    assert detected.unit == PrivacyUnit.sampled_user()
    assert detected.unit.label() == "user-level sampling"
    # each user in each batch with frequency q (Monte Carlo: 2000 batches, 5 standard errors)
    counts = np.zeros(17)
    batches = 0
    for _ in range(500):
        for x, _y, mask in loader:
            batches += 1
            assert x.shape[1:] == (8, 5) and mask.shape[1:] == (8,)
            for u in _user_ids(users, x):
                counts[u] += 1
    q = 1 / steps
    tolerance = 5 * math.sqrt(q * (1 - q) / batches)
    assert np.all(np.abs(counts / batches - q) < tolerance)


def test_shuffled_loader_uses_every_user_once_per_epoch() -> None:
    users = _indexed_users()
    loader = user_data_loader(
        users, users_per_step=4, sampling="shuffled", generator=torch.Generator().manual_seed(2)
    )
    detected = detect_sampling(loader)
    assert detected.scheme == ShuffledBatches(dataset_size=17, batch_size=4, drop_last=False)
    assert detected.unit == PrivacyUnit.sampled_user()
    seen = [u for x, _y, _m in loader for u in _user_ids(users, x)]
    assert sorted(seen) == list(range(17))


def test_a_record_loader_keeps_the_record_unit() -> None:
    assert detect_sampling(DataLoader(_records(), batch_size=4)).unit == PrivacyUnit.record()


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"users_per_step": 0}, ValueError, "users_per_step"),
        ({"users_per_step": 18}, ValueError, "users_per_step"),
        ({"users_per_step": 2, "sampling": "balls"}, ValueError, "sampling"),
        ({"users_per_step": 2, "drop_last": True}, ValueError, "drop_last"),
        ({"users_per_step": 2, "batch_size": 3}, ValueError, "batch_size"),
        ({"users_per_step": 2, "generator": 3}, TypeError, "generator"),
    ],
)
def test_bad_loader_arguments_name_the_parameter(kwargs, error, name) -> None:
    users = UserDataset(_records(), _users())
    with pytest.raises(error, match=name):
        user_data_loader(users, **kwargs)


# -- clipping is per user -------------------------------------------------------------------------


class _UserMLP(nn.Module):
    """Keeps the records' dimension: (users, records, 5) -> (users, records, 3)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _user_loss(model: nn.Module, x, y, mask, reduction="sum") -> torch.Tensor:
    logits = model(x)
    losses = nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none"
    ).reshape(y.shape)
    return per_user_loss(losses, mask, reduction=reduction)


@pytest.mark.parametrize(
    ("reduction", "mode"), [("sum", "hooks"), ("mean", "hooks"), ("sum", "functorch")]
)
def test_clipping_is_per_user(reduction: str, mode: str) -> None:
    """Opacus's clipped sum equals the sum over users of each user's gradient (of all its
    records, by autograd on a plain copy) clipped to C; a user with 8 records adds at most C."""
    torch.manual_seed(0)
    users = UserDataset(_records(), _users())
    model = _UserMLP()
    plain = _UserMLP()
    plain.load_state_dict(model.state_dict())
    clip = 0.05
    loader = user_data_loader(users, users_per_step=17, sampling="shuffled")
    engine = PrivacyEngine(accountant="last_iterate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dp_model, optimizer, _ = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=loader,
            noise_multiplier=0.0,
            max_grad_norm=clip,
            poisson_sampling=False,
            loss_reduction="sum",
            grad_sample_mode=mode,
        )
    batch = [users[u] for u in range(users.num_users)]
    x, y, mask = (torch.stack(f) for f in zip(*batch, strict=True))
    optimizer.zero_grad()
    _user_loss(dp_model, x, y, mask, reduction).sum().backward()
    optimizer.clip_and_accumulate()
    opacus_sum = [p.summed_grad.clone() for p in model.parameters()]

    expected = [torch.zeros_like(p) for p in plain.parameters()]
    norms = []
    for u in range(users.num_users):
        xu, yu, mu = (t.unsqueeze(0) for t in users[u])
        grads = torch.autograd.grad(_user_loss(plain, xu, yu, mu, reduction).sum(), list(plain.parameters()))
        norm = torch.sqrt(sum((g**2).sum() for g in grads))
        norms.append(float(norm))
        factor = min(1.0, clip / (float(norm) + 1e-6))
        for e, g in zip(expected, grads, strict=True):
            e += factor * g
    assert min(norms) > 2 * clip  # every user is clipped: the test can tell the units apart
    for got, want in zip(opacus_sum, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    total = torch.sqrt(sum((g**2).sum() for g in opacus_sum))
    assert float(total) <= users.num_users * clip * (1 + 1e-5)

    # user 0 alone (8 records): its contribution is at most C; per-record clipping would add
    # up to 8 C, and does add more than C here
    optimizer.zero_grad()
    _user_loss(dp_model, x[:1], y[:1], mask[:1], reduction).sum().backward()
    optimizer.clip_and_accumulate()
    alone = torch.sqrt(sum((p.summed_grad**2).sum() for p in model.parameters()))
    assert float(alone) <= clip * (1 + 1e-5)
    per_record = [torch.zeros_like(p) for p in plain.parameters()]
    for r in range(8):
        xr, yr = users[0][0][r : r + 1], users[0][1][r : r + 1]
        grads = torch.autograd.grad(
            nn.functional.cross_entropy(plain(xr), yr), list(plain.parameters())
        )
        norm = float(torch.sqrt(sum((g**2).sum() for g in grads)))
        for e, g in zip(per_record, grads, strict=True):
            e += min(1.0, clip / norm) * g
    if reduction == "sum":
        assert float(torch.sqrt(sum((e**2).sum() for e in per_record))) > 1.5 * clip


# -- the accountant over users --------------------------------------------------------------------


def _train(users: UserDataset, sampling: str, epochs: int, sigma: float):
    torch.manual_seed(3)
    model = _UserMLP()
    loader = user_data_loader(
        users, users_per_step=4, sampling=sampling, generator=torch.Generator().manual_seed(4)
    )
    engine = PrivacyEngine(accountant="last_iterate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dp_model, optimizer, loader = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=loader,
            noise_multiplier=sigma,
            max_grad_norm=1.0,
            poisson_sampling=False,
        )
        for _ in range(epochs):
            for x, y, mask in loader:
                optimizer.zero_grad()
                _user_loss(dp_model, x, y, mask).mean().backward()
                optimizer.step()
    return engine.accountant, len(loader)


def test_poisson_over_users_is_accounted_as_records_over_users() -> None:
    from dp_accounting import dp_event, pld

    users = UserDataset(_records(), _users())
    accountant, steps = _train(users, "poisson", epochs=3, sigma=1.5)
    q = 1 / steps
    assert accountant.sampling == PoissonSampling(rate=q)
    assert accountant.unit == PrivacyUnit.sampled_user()
    assert accountant.run.unit.label() == "user-level sampling"
    assert accountant.history == [(1.5, q, 3 * steps)]
    delta = 1e-5
    # heuristic: X ~ Binomial(T, q) against N(0, T sigma^2), by quadrature
    reference = QuadratureHeuristic(3 * steps, q, 1.5).epsilon(delta)
    assert accountant.get_epsilon(delta) == pytest.approx(reference, rel=1e-6)
    # standard: dp_accounting's PLD of the Poisson-subsampled Gaussian over U users
    event = dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(1.5)), 3 * steps
    )
    reference_pld = pld.PLDAccountant().compose(event).get_epsilon(delta)
    standard = privacy_model("standard", accountant.run).epsilon(delta)
    assert standard == pytest.approx(reference_pld, rel=1e-3)


def test_shuffled_users_whole_epochs_give_the_gaussian_mechanism_over_users() -> None:
    users = UserDataset(_records(), _users())
    accountant, steps = _train(users, "shuffled", epochs=2, sigma=2.0)
    assert steps == math.ceil(17 / 4)
    assert accountant.sampling == ShuffledBatches(dataset_size=17, batch_size=4, drop_last=False)
    assert accountant.unit == PrivacyUnit.sampled_user()
    # a constant learning rate and whole epochs: each user is in exactly one step per epoch,
    # so the final model is the Gaussian mechanism with mu = E / (sigma sqrt(T))
    mu = 2 / (2.0 * math.sqrt(2 * steps))
    assert accountant.get_epsilon(1e-5) == pytest.approx(
        gaussian_mechanism_epsilon(mu, 1e-5), rel=1e-6
    )


def test_observe_unit_refuses_several_records_per_contribution() -> None:
    from opacus_lastiterate.accountants import LastIterateAccountant

    accountant = LastIterateAccountant()
    with pytest.raises(ValueError, match="unit"):
        accountant.observe_unit(PrivacyUnit.user(4))
    with pytest.raises(TypeError, match="unit"):
        accountant.observe_unit("user")  # type: ignore[arg-type]
    assert accountant.unit == PrivacyUnit.record()


def test_the_monitor_follows_a_user_loader_it_is_shown() -> None:
    """A loader the monitor is shown (the Trainer adapters' path) gives the accountant the
    scheme over users and the unit; the monitor's records are the users' numbers."""
    from opacus_lastiterate.callbacks import PrivacyMonitor

    users = UserDataset(_records(), _users())
    model = _UserMLP()
    engine = PrivacyEngine(accountant="last_iterate")
    records = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dp_model, optimizer, _ = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(_records(), batch_size=10),  # not the loader trained on
            noise_multiplier=2.0,
            max_grad_norm=1.0,
            poisson_sampling=False,
        )
        assert engine.accountant.unit == PrivacyUnit.record()
        monitor = PrivacyMonitor(engine, delta=1e-5, sinks=[records.append], optimizer=optimizer)
        loader = user_data_loader(users, users_per_step=4, sampling="shuffled", drop_last=True)
        monitor.observe_loader(loader)
        assert engine.accountant.unit == PrivacyUnit.sampled_user()
        assert engine.accountant.sampling == ShuffledBatches(17, 4, True)
        for x, y, mask in loader:
            optimizer.zero_grad()
            _user_loss(dp_model, x, y, mask).mean().backward()
            optimizer.step()
        monitor.finish()
    assert [r.step for r in records if not r.final] == [1, 2, 3, 4]
    # 4 batches of 4 users (drop_last cuts one of the 17), sigma 2, one epoch: a user is in
    # exactly one step with probability 16/17 and in none with 1/17, so the final model's
    # shift is that mixture against N(0, T sigma^2) (quadrature)
    reference = QuadratureHeuristic(
        4, 0.0, 2.0, weights=[1 / 17, 16 / 17], shifts=[0.0, 1.0]
    ).epsilon(1e-5)
    assert records[-1].heuristic_epsilon == pytest.approx(reference, rel=1e-5)
    assert records[-1].heuristic_epsilon < gaussian_mechanism_epsilon(1 / (2.0 * 2), 1e-5)
