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
from opacus_lastiterate.exceptions import AuditWarning
from opacus_lastiterate.user_samplers import (
    UserDataset,
    per_user_loss,
    user_data_loader,
    users_fetched,
)
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


def test_users_fetched_counts_the_loaders_batches_only() -> None:
    users = UserDataset(_records(), _users())
    before = users_fetched()
    users[0], users[1]  # direct indexing: not counted
    assert users_fetched() == before
    batches = list(user_data_loader(users, users_per_step=5, sampling="shuffled"))
    assert users_fetched() - before == sum(len(b[0]) for b in batches) == 17


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


# -- the wiring check: one per-sample gradient per user -------------------------------------------


class _RecordConv(nn.Module):
    """Flattens the users' records for its Conv2d (which needs 4-D input): per-record
    gradients for the convolution; ``flat_head`` keeps them flat up to the loss too."""

    def __init__(self, flat_head: bool) -> None:
        super().__init__()
        self.flat_head = flat_head
        self.conv = nn.Conv2d(1, 2, 3)
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, k = x.shape[:2]
        h = self.conv(x.reshape(b * k, *x.shape[2:])).relu().flatten(1)
        return self.head(h).reshape(b, k, 3) if self.flat_head else self.head(h.reshape(b, k, -1))


class _PerUserConv(nn.Module):
    """A convolution holding its own parameters: Opacus differentiates it per batch element
    (its functorch fallback), so its gradients stay per user although it reshapes inside."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(0.3 * torch.randn(2, 1, 3, 3))
        self.bias = nn.Parameter(torch.zeros(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, k = x.shape[:2]
        h = nn.functional.conv2d(x.reshape(b * k, *x.shape[2:]), self.weight, self.bias)
        return h.reshape(b, k, -1)


class _UserConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = _PerUserConv()
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).relu())


def _image_users() -> UserDataset:
    g = torch.Generator().manual_seed(0)
    images = TensorDataset(
        torch.randn(60, 1, 6, 6, generator=g), torch.randint(0, 3, (60,), generator=g)
    )
    return UserDataset(images, [i // 3 for i in range(60)])  # 20 users of 3 images


class _RecordModel(nn.Module):
    """A per-record model: images (n, 1, 6, 6) -> logits (n, 3)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).relu().flatten(1))


def _monitored(
    model: nn.Module,
    users: UserDataset,
    *,
    pass_model: bool = True,
    flatten_outside: bool = False,
    fetch_first: bool = False,
):
    """make_private over a Poisson loader of users, a monitor attached with its wiring check;
    returns the monitor, the accountant and a function taking the first step
    (``flatten_outside``: the loop flattens the users' records before calling the model;
    ``fetch_first``: the batch is fetched before the monitor is attached)."""
    from opacus_lastiterate.callbacks import PrivacyMonitor

    torch.manual_seed(0)
    loader = user_data_loader(
        users, users_per_step=5, sampling="poisson", generator=torch.Generator().manual_seed(1)
    )
    engine = PrivacyEngine(accountant="last_iterate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Opacus's secure-RNG notice
        dp_model, optimizer, loader = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=loader,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            poisson_sampling=False,
        )
    assert engine.accountant.unit == PrivacyUnit.sampled_user()
    batch = next(iter(loader)) if fetch_first else None
    monitor = PrivacyMonitor(engine, delta=1e-5)
    monitor.attach(optimizer, dp_model if pass_model else None)

    def first_step() -> None:
        x, y, mask = batch if batch is not None else next(iter(loader))
        assert len(x) > 1  # a batch of several users, each with 3 records
        optimizer.zero_grad()
        if flatten_outside:
            logits = dp_model(x.reshape(-1, *x.shape[2:])).reshape(*y.shape, -1)
            losses = nn.functional.cross_entropy(
                logits.reshape(-1, 3), y.reshape(-1), reduction="none"
            ).reshape(y.shape)
            per_user_loss(losses, mask).mean().backward()
        else:
            _user_loss(dp_model, x, y, mask).mean().backward()
        optimizer.step()

    return monitor, engine.accountant, first_step


_REFUSED = {
    "conv fed records": (lambda: _RecordConv(False), {}),
    "every layer fed records": (lambda: _RecordConv(True), {}),
    "no model given": (lambda: _RecordConv(True), {"pass_model": False}),
    "flattened before the model": (_RecordModel, {"flatten_outside": True}),
}


@pytest.mark.parametrize("case", list(_REFUSED))
def test_a_layer_fed_the_users_records_is_refused_at_the_first_step(case: str) -> None:
    """A Conv2d fed (users * records, C, H, W) has per-record gradients: Opacus would clip
    records while the accountant reports users. The wiring check names the layer before the
    step is accounted: also when every layer is per record (all counts agree), when the
    monitor has no model (the users fetched count them), and when the loop flattens the
    batch before calling the model."""
    from opacus_lastiterate.exceptions import PrivacyWiringError

    build, options = _REFUSED[case]
    _, accountant, first_step = _monitored(build(), _image_users(), **options)
    with pytest.raises(PrivacyWiringError, match="users") as caught:
        first_step()
    assert accountant.num_steps == 0
    expected = {"_module.conv.weight", "_module.conv.bias"}
    if case != "conv fed records":
        expected |= {"_module.head.weight", "_module.head.bias"}
    if case == "no model given":  # parameters named by their place in the optimizer
        expected = {f"param_groups[0][{i}]" for i in range(4)}
    assert {name.split(" (")[0] for name in caught.value.problems} == expected
    assert all("record loader" in why for why in caught.value.problems.values())


@pytest.mark.parametrize("model", [_UserMLP, _UserConv], ids=["mlp", "per-user conv"])
@pytest.mark.parametrize("pass_model", [True, False])
def test_per_user_gradients_pass_the_check(model, pass_model: bool) -> None:
    """Layers keeping the users first (the user-level MLP, a convolution reshaping inside a
    module that Opacus differentiates per user) pass; the accountant records the step."""
    users = UserDataset(_records(), _users()) if model is _UserMLP else _image_users()
    monitor, accountant, first_step = _monitored(model(), users, pass_model=pass_model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AuditWarning)
        first_step()
    assert monitor.wiring is not None and monitor.wiring.report is not None
    counts = {r.examples for r in monitor.wiring.report.parameters}
    assert len(counts) == 1 and accountant.num_steps == 1


def test_when_users_cannot_be_counted_the_check_says_so() -> None:
    """No model, and the batch fetched before the monitor was attached: nothing counts the
    users; the check warns rather than passing silently."""
    monitor, _, first_step = _monitored(
        _RecordConv(True), _image_users(), pass_model=False, fetch_first=True
    )
    with pytest.warns(AuditWarning, match="cannot count the users"):
        first_step()
    assert monitor.wiring is not None and monitor.wiring.report is not None  # not detected
