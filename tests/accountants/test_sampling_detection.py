"""detect_sampling reads the loader training uses; make_private hands the scheme on."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from opacus.data_loader import DPDataLoader
from torch.utils.data import (
    DataLoader,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler

from opacus_lastiterate.accountants import LastIterateAccountant, detect_sampling
from opacus_lastiterate.analysis.sampling import (
    BallsInBins,
    DeterministicBatches,
    PoissonSampling,
    ShuffledBatches,
    UnknownSampling,
)
from opacus_lastiterate.exceptions import SamplingWarning
from opacus_lastiterate.samplers import balls_in_bins_data_loader
from tests._gaussian import gaussian_mechanism_epsilon

N = 1000
DATA = TensorDataset(torch.randn(N, 5), torch.randint(0, 2, (N,)))


class Wrapper:
    """An Accelerate-like loader wrapper: exposes the wrapped batch sampler."""

    def __init__(self, loader: DataLoader) -> None:
        self.batch_sampler = Wrapper.Inner(loader.batch_sampler)
        self._len = len(loader)

    def __len__(self) -> int:
        return self._len

    class Inner:
        def __init__(self, batch_sampler: object) -> None:
            self.batch_sampler = batch_sampler


@pytest.mark.parametrize(
    ("loader", "expected"),
    [
        (DataLoader(DATA, batch_size=100, shuffle=True), ShuffledBatches(N, 100, False)),
        (DataLoader(DATA, batch_size=96, shuffle=True, drop_last=True), ShuffledBatches(N, 96, True)),
        (DataLoader(DATA, batch_size=100), DeterministicBatches(N, 100, False)),
        (DPDataLoader.from_data_loader(DataLoader(DATA, batch_size=50)), PoissonSampling(0.05)),
        (balls_in_bins_data_loader(DataLoader(DATA, batch_size=100)), BallsInBins(10)),
        (DataLoader(DATA, batch_size=50, sampler=SubsetRandomSampler(range(500))), ShuffledBatches(500, 50, False)),
        (
            DataLoader(DATA, batch_size=25, sampler=DistributedSampler(DATA, num_replicas=4, rank=1)),
            ShuffledBatches(N, 100, False),
        ),
        (
            DataLoader(DATA, batch_size=25, sampler=DistributedSampler(DATA, num_replicas=4, rank=0, shuffle=False)),
            DeterministicBatches(N, 100, False),
        ),
        (Wrapper(DataLoader(DATA, batch_size=100, shuffle=True)), ShuffledBatches(N, 100, False)),
    ],
    ids=["shuffled", "shuffled-drop-last", "sequential", "poisson", "balls-in-bins", "subset", "ddp", "ddp-sequential", "wrapped"],
)
def test_detects_the_scheme(loader: object, expected: object) -> None:
    detected = detect_sampling(loader)
    assert detected.modelled
    assert detected.scheme == expected


@pytest.mark.parametrize(
    "loader",
    [
        DataLoader(DATA, batch_size=100, sampler=WeightedRandomSampler(torch.ones(N), N)),
        DataLoader(DATA, batch_size=100, sampler=torch.utils.data.RandomSampler(DATA, replacement=True)),
        DataLoader(DATA, batch_sampler=[[0, 1], [2, 3]]),
        DataLoader(DATA, batch_size=10, sampler=DistributedSampler(DATA, num_replicas=3, rank=0)),
    ],
    ids=["weighted", "replacement", "list-batch-sampler", "ddp-padding"],
)
def test_unmodelled_samplers_are_unknown_assuming_opacus_rate(loader: DataLoader) -> None:
    detected = detect_sampling(loader)
    assert not detected.modelled
    assert isinstance(detected.scheme, UnknownSampling)
    assert detected.scheme.assumed == PoissonSampling(1 / len(loader))


def _train(engine: PrivacyEngine, loader: DataLoader, *, poisson: bool, epochs: int = 1, **kw):
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if "target_epsilon" in kw:
        m, o, dl = engine.make_private_with_epsilon(
            module=model, optimizer=optimizer, data_loader=loader, max_grad_norm=1.0,
            poisson_sampling=poisson, epochs=epochs, **kw,
        )
    else:
        m, o, dl = engine.make_private(
            module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=1.0,
            max_grad_norm=1.0, poisson_sampling=poisson,
        )
    for _ in range(epochs):
        for x, y in dl:
            o.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            o.step()
    return o


def test_make_private_gives_the_accountant_the_scheme_of_the_returned_loader() -> None:
    engine = PrivacyEngine(accountant="last_iterate")
    _train(engine, DataLoader(DATA, batch_size=100, shuffle=True), poisson=False)
    assert engine.accountant.sampling == ShuffledBatches(N, 100, False)
    engine = PrivacyEngine(accountant="last_iterate")
    _train(engine, DataLoader(DATA, batch_size=100, shuffle=True), poisson=True)
    assert engine.accountant.sampling == PoissonSampling(0.1)
    state = engine.accountant.state_dict()
    fresh = LastIterateAccountant()
    fresh.load_state_dict(state)
    assert fresh.sampling == PoissonSampling(0.1)


def test_weighted_sampler_warns_at_make_private_naming_it() -> None:
    engine = PrivacyEngine(accountant="last_iterate")
    loader = DataLoader(DATA, batch_size=100, sampler=WeightedRandomSampler(torch.ones(N), N))
    with pytest.warns(SamplingWarning, match="WeightedRandomSampler"):
        _train(engine, loader, poisson=False)
    assert isinstance(engine.accountant.sampling, UnknownSampling)


def test_opacus_accountant_on_a_shuffled_run_warns_that_it_assumes_poisson() -> None:
    engine = PrivacyEngine(accountant="prv")
    with pytest.warns(SamplingWarning, match="assumes Poisson"):
        _train(engine, DataLoader(DATA, batch_size=100, shuffle=True), poisson=False)


def test_poisson_run_gives_no_sampling_warning() -> None:
    for mechanism in ("last_iterate", "rdp"):
        engine = PrivacyEngine(accountant=mechanism)
        with warnings.catch_warnings():
            warnings.simplefilter("error", SamplingWarning)
            _train(engine, DataLoader(DATA, batch_size=100), poisson=True)


def test_declared_scheme_wins_over_detection_and_is_checked() -> None:
    engine = PrivacyEngine(accountant="last_iterate")
    engine.accountant.declare_sampling(DeterministicBatches(N, 100, False))
    _train(engine, DataLoader(DATA, batch_size=100, shuffle=True), poisson=False)
    assert engine.accountant.sampling == DeterministicBatches(N, 100, False)
    assert engine.accountant.sampling_declared
    with pytest.raises(ValueError, match="scheme"):
        engine.accountant.declare_sampling(ShuffledBatches(N, 50, False))
    assert engine.accountant.sampling == DeterministicBatches(N, 100, False)
    with pytest.raises(TypeError, match="scheme"):
        engine.accountant.declare_sampling("shuffled")


def test_a_step_at_another_rate_drops_the_scheme_with_a_warning_not_the_step() -> None:
    acc = LastIterateAccountant()
    acc.declare_sampling(ShuffledBatches(N, 100, False))
    acc.step(noise_multiplier=1.0, sample_rate=0.1)
    with pytest.warns(SamplingWarning, match="sample rate"):
        acc.step(noise_multiplier=1.0, sample_rate=0.2)
    assert acc.num_steps == 2 and acc.sampling is None


def test_make_private_with_epsilon_calibrates_for_the_detected_scheme() -> None:
    """The accountant Opacus creates to calibrate starts with the scheme of the loader, so
    the trained run meets the target for that scheme: its reported epsilon is within
    Opacus's tolerance below the target."""
    engine = PrivacyEngine(accountant="last_iterate")
    loader = DataLoader(DATA, batch_size=100, shuffle=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _train(engine, loader, poisson=False, epochs=2, target_epsilon=2.0, target_delta=1e-5)
    assert engine.accountant.sampling == ShuffledBatches(N, 100, False)
    eps = engine.get_epsilon(1e-5)
    assert 2.0 - 0.02 <= eps <= 2.0


def test_shuffled_run_reports_the_shuffled_heuristic_and_poisson_is_unchanged() -> None:
    """3 whole epochs of N = 1000, B = 100, sigma = 1 (T = 30): the record is in exactly one
    step per epoch, so the final model is a Gaussian mechanism with mu = 3 / sqrt(30); the
    Poisson run of the same loader keeps the value of an accountant with no scheme."""
    engine = PrivacyEngine(accountant="last_iterate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        _train(engine, DataLoader(DATA, batch_size=100, shuffle=True), poisson=False, epochs=3)
    assert engine.accountant.num_steps == 30
    expected = gaussian_mechanism_epsilon(3 / np.sqrt(30), 1e-5)
    assert engine.get_epsilon(1e-5) == pytest.approx(expected, rel=1e-9)

    poisson = PrivacyEngine(accountant="last_iterate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        _train(poisson, DataLoader(DATA, batch_size=100, shuffle=True), poisson=True, epochs=3)
    assert poisson.accountant.sampling == PoissonSampling(0.1)
    plain = LastIterateAccountant()
    plain.history = poisson.accountant.history
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert poisson.get_epsilon(1e-5) == plain.get_epsilon(1e-5)
    assert poisson.get_epsilon(1e-5) > expected  # the Poisson value is not the shuffled one


def test_a_history_at_other_rates_drops_the_scheme_with_a_warning() -> None:
    acc = LastIterateAccountant()
    acc.declare_sampling(ShuffledBatches(N, 100, False))
    acc.history = [(1.0, 0.1, 20)]  # fits: kept
    assert acc.sampling == ShuffledBatches(N, 100, False)
    with pytest.warns(SamplingWarning, match="does not fit"):
        acc.history = [(1.0, 0.5, 20)]
    assert acc.sampling is None and not acc.sampling_declared
