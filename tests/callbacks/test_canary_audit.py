"""In-training canary audit (one run): known answer, placement, bit-identity, no host sync."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import opacus_lastiterate.accountants  # noqa: F401  (registers accountant="last_iterate")
from opacus_lastiterate.auditing.input_space import make_input_canaries
from opacus_lastiterate.callbacks import InTrainingAuditReport, InTrainingCanaryAudit
from tests.callbacks.conftest import DEVICES

DELTA = 1e-5


@dataclass
class LinearRun:
    model: nn.Module
    optimizer: Any
    engine: PrivacyEngine
    audit: InTrainingCanaryAudit | None
    sample_rate: float


def _linear_setup(
    *,
    m: int,
    sigma: float,
    seed: int = 0,
    n: int = 200,
    batch: int = 20,
    lr: float = 0.1,
    audit: bool = True,
    device: str = "cpu",
    poisson: bool = True,
    **audit_kwargs: Any,
) -> LinearRun:
    """Linear model on d = 2m coordinates; the data live on the first m, the canaries on the
    last m, so the data's gradient is zero where the canaries are (the known-answer setting)."""
    d = 2 * m
    torch.manual_seed(seed)
    model = nn.Linear(d, 1, bias=False).to(device)
    x = torch.zeros(n, d)
    x[:, :m] = torch.randn(n, m)
    y = torch.randn(n, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=not poisson)
    engine = PrivacyEngine(accountant="last_iterate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        private, optimizer, dp_loader = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=lr),
            data_loader=loader,
            noise_multiplier=sigma,
            max_grad_norm=1.0,
            poisson_sampling=poisson,
        )
    q = 1 / len(dp_loader)
    canaries = None
    if audit:
        kwargs: dict[str, Any] = {
            "num_canaries": m,
            "sample_rate": q,
            "seed": seed,
            "accountant": engine.accountant,
            "candidates": np.arange(m, d),
        }
        kwargs.update(audit_kwargs)
        canaries = InTrainingCanaryAudit(optimizer, **kwargs)
    run = LinearRun(private, optimizer, engine, canaries, q)
    run.loader = dp_loader  # type: ignore[attr-defined]
    run.device = torch.device(device)  # type: ignore[attr-defined]
    return run


def _train(run: LinearRun, steps: int) -> None:
    taken = 0
    while taken < steps:
        for xb, yb in run.loader:  # type: ignore[attr-defined]
            xb, yb = xb.to(run.device), yb.to(run.device)  # type: ignore[attr-defined]
            run.optimizer.zero_grad()
            nn.functional.mse_loss(run.model(xb), yb).backward()
            run.optimizer.step()
            taken += 1
            if taken == steps:
                return


def _weight(run: LinearRun) -> torch.Tensor:
    return next(run.model.parameters()).detach().clone()


# ------------------------------------------------------------------------------ known answer


@pytest.mark.parametrize("device", DEVICES)
def test_known_answer_bound_positive_and_below_heuristic(device: str) -> None:
    # Data with zero gradient on the canaries' coordinates: each canary's score is exactly
    # Binomial(T, q) + N(0, sigma^2 T) (times lr C / B) against N(0, sigma^2 T), the pair of
    # the heuristic, so the heuristic is the true epsilon and the bound must stay below it.
    run = _linear_setup(m=500, sigma=0.5, device=device)
    _train(run, 50)
    assert _weight(run).device.type == device
    assert run.audit is not None
    report = run.audit.report(delta=DELTA, standard=False)  # PLD at eps ~ 20: seconds
    grad = report.audit("gradient")
    assert grad.num_canaries == 500 and 0 < grad.num_included < 500
    assert report.steps == 50 and report.sample_rate == pytest.approx(0.1)
    assert report.heuristic_epsilon is not None and report.standard_epsilon is None
    for result in (grad.one_run, grad.one_run_fdp):
        assert result.is_bound
        assert 0.5 < result.epsilon <= report.heuristic_epsilon
    # the reference epsilons are those of the accountant
    assert report.heuristic_epsilon == pytest.approx(run.engine.accountant.get_epsilon(DELTA))


def test_known_answer_shuffled_run_bound_below_the_shuffled_heuristic() -> None:
    """Shuffled batches (N = 200, B = 20), 5 whole epochs: each included canary is inserted
    once per epoch, exactly as a record is used, so its score is 5 + N(0, sigma^2 T) against
    N(0, sigma^2 T) (times lr C / B): a Gaussian mechanism with mu = 5 / (sigma sqrt(50)),
    the shuffled heuristic, which is then the true epsilon; the one-run bounds stay below it
    and below the Poisson value of the same history."""
    from tests._gaussian import gaussian_mechanism_epsilon

    run = _linear_setup(m=500, sigma=0.5, poisson=False)
    _train(run, 50)
    assert run.audit is not None
    insertions, coins = run.audit.insertions(), run.audit.coins
    assert (insertions[coins] == 5).all() and (insertions[~coins] == 0).all()
    report = run.audit.report(delta=DELTA, standard=False)
    truth = gaussian_mechanism_epsilon(5 / (0.5 * np.sqrt(50)), DELTA)
    assert report.heuristic_epsilon == pytest.approx(truth, rel=1e-9)
    grad = report.audit("gradient")
    for result in (grad.one_run, grad.one_run_fdp):
        assert result.is_bound and 0.5 < result.epsilon <= truth


def test_declared_scheme_gives_every_reference_epsilon_of_that_scheme() -> None:
    """The audit told shuffled batches (N = 200, B = 20) that its accountant does not know
    (a Poisson loader): the heuristic, robust and standard epsilons are all of the declared
    scheme. 5 epochs: the shuffled heuristic of the constant-rate run is the Gaussian
    mechanism with mu = 5 / (sigma sqrt(50)); its robust maximum is at least that and, each
    suffix's value an upper bound within 1e-3 relative, at most 1e-3 above it (mu grows with
    the epochs); the Poisson heuristic of the same history is larger."""
    from opacus_lastiterate.analysis.sampling import ShuffledBatches
    from tests._gaussian import gaussian_mechanism_epsilon

    run = _linear_setup(m=20, sigma=0.5, sampling=ShuffledBatches(200, 20, False))
    _train(run, 50)
    assert run.audit is not None
    report = run.audit.report(delta=DELTA, standard=False)
    truth = gaussian_mechanism_epsilon(5 / (0.5 * np.sqrt(50)), DELTA)
    assert report.heuristic_epsilon == pytest.approx(truth, rel=1e-9)
    assert report.robust_heuristic_epsilon is not None
    assert truth * (1 - 1e-9) <= report.robust_heuristic_epsilon <= truth * (1 + 1e-3)
    assert run.engine.accountant.get_epsilon(DELTA) > 1.5 * truth  # the accountant's Poisson


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
def test_without_an_accountant_the_audit_accounts_the_steps_it_saw() -> None:
    """No accountant: the reference heuristic is that of the steps the canaries went
    through (T = 30, q = 0.1, sigma = 2), checked by independent quadrature; an audit that
    saw no step has no reference epsilon."""
    from tests.analysis._reference import QuadratureHeuristic

    idle = _linear_setup(m=10, sigma=2.0, accountant=None)
    assert idle.audit is not None
    assert idle.audit.report(delta=DELTA).heuristic_epsilon is None
    run = _linear_setup(m=10, sigma=2.0, accountant=None)
    _train(run, 30)
    assert run.audit is not None
    report = run.audit.report(delta=DELTA, standard=False)
    assert report.heuristic_epsilon == pytest.approx(
        QuadratureHeuristic(30, 0.1, 2.0).epsilon(DELTA), rel=1e-8
    )


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
def test_known_answer_large_noise_bound_about_zero() -> None:
    """sigma = 20: the true epsilon of each canary's score is the heuristic pair's, 0.111
    (independent quadrature), and the guesses carry no significant signal, so every valid
    one-run lower bound is 0."""
    from scipy import stats

    from tests.analysis._reference import QuadratureHeuristic

    run = _linear_setup(m=500, sigma=20.0)
    _train(run, 50)
    assert run.audit is not None
    report = run.audit.report(delta=DELTA)
    true_epsilon = QuadratureHeuristic(50, 0.1, 20.0).epsilon(DELTA)
    assert 0.10 < true_epsilon < 0.12
    assert report.heuristic_epsilon == pytest.approx(true_epsilon, rel=1e-8)
    assert report.standard_epsilon is not None
    assert true_epsilon * (1 - 1e-8) <= report.standard_epsilon
    summary = report.as_dict()["audits"][0]
    assert summary["canaries"] == "gradient"
    for name in ("one_run", "one_run_fdp"):
        result = summary[name]
        assert result["kind"] == "bound" and result["confidence"] == 0.95
        r, v = result["num_guesses"], result["num_correct"]
        assert 0 < v <= r <= 500
        # Under epsilon-DP the number of correct guesses is dominated by
        # Binomial(r, e^eps / (1 + e^eps)) (delta only loosens this). At the true epsilon the
        # observed count is unremarkable ...
        p_true = math.exp(true_epsilon) / (1 + math.exp(true_epsilon))
        assert stats.binom.sf(v - 1, r, p_true) > 0.05
        # ... and even eps = 0 (fair guesses) explains it at more than 1 - confidence, so no
        # valid 95 % lower bound exceeds 0.
        assert stats.binom.sf(v - 1, r, 0.5) > 0.05
        assert 0.0 <= result["epsilon"] <= 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_known_answer_larger(seed: int) -> None:
    # m = 1000, T = 100, sigma = 1: heuristic about 5.4, bound about 1 on every seed.
    run = _linear_setup(m=1000, sigma=1.0, seed=seed)
    _train(run, 100)
    assert run.audit is not None
    report = run.audit.report(delta=DELTA)
    assert report.heuristic_epsilon is not None and report.standard_epsilon is not None
    grad = report.audit("gradient")
    for result in (grad.one_run, grad.one_run_fdp):
        assert 0.5 < result.epsilon <= report.heuristic_epsilon <= report.standard_epsilon


def test_placement_and_scaling_without_noise() -> None:
    # sigma = 0: theta_0[c] - theta_T[c] = lr * C * (steps with the canary) / B exactly, B the
    # expected batch size Opacus divides by: the canary enters the clipped sum once per step.
    run = _linear_setup(m=50, sigma=0.0, lr=0.1, accountant=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _train(run, 30)
    audit = run.audit
    assert audit is not None
    counts = audit.insertions()
    coins = audit.coins
    assert np.all(counts[~coins] == 0)
    assert counts[coins].sum() > 0
    assert counts.max() <= 30
    # Binomial(30, 0.1) per included canary: mean 3
    assert abs(counts[coins].mean() - 3.0) < 1.0
    expected = 0.1 * 1.0 * counts / run.optimizer.expected_batch_size
    np.testing.assert_allclose(audit.gradient_scores(), expected, rtol=1e-5, atol=1e-7)
    # distinct coordinates, drawn from the candidates
    coords = audit.coordinates
    assert np.unique(coords).size == 50 and coords.min() >= 50 and coords.max() < 100


def test_canaries_do_not_touch_the_data_coordinates() -> None:
    # The audit uses its own generators: with canaries on, the data's coordinates (which
    # the canaries do not enter) are bit-for-bit those of a run without the audit.
    with_canaries = _linear_setup(m=40, sigma=1.0)
    _train(with_canaries, 20)
    without = _linear_setup(m=40, sigma=1.0, audit=False)
    _train(without, 20)
    a, b = _weight(with_canaries), _weight(without)
    assert torch.equal(a[:, :40], b[:, :40])
    assert not torch.equal(a[:, 40:], b[:, 40:])


@pytest.mark.parametrize("disabled", [{"enabled": False}, {"num_canaries": 0}])
def test_disabled_canaries_leave_training_bit_identical(disabled: dict[str, Any]) -> None:
    reference = _linear_setup(m=40, sigma=1.0, audit=False)
    _train(reference, 20)
    reference_rng = torch.get_rng_state()
    run = _linear_setup(m=40, sigma=1.0, **disabled)
    assert run.audit is not None and not run.audit.enabled
    assert "add_noise" not in vars(run.optimizer)
    _train(run, 20)
    assert torch.equal(_weight(run), _weight(reference))
    assert torch.equal(torch.get_rng_state(), reference_rng)  # the global RNG is untouched
    report = run.audit.report(delta=DELTA, standard=False)
    assert report.audits == () and "nothing audited" in str(report)
    assert report.heuristic_epsilon == pytest.approx(run.engine.accountant.get_epsilon(DELTA))


# ------------------------------------------------------------------------------ device safety


_SYNCING = ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__")


@contextmanager
def _count_host_reads() -> Iterator[dict[str, int]]:
    counts = dict.fromkeys(_SYNCING, 0)
    originals = {name: getattr(torch.Tensor, name) for name in _SYNCING}

    def counting(name: str) -> Any:
        original = originals[name]

        def wrapper(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return original(self, *args, **kwargs)

        return wrapper

    for name in _SYNCING:
        setattr(torch.Tensor, name, counting(name))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def test_no_host_reads_per_step() -> None:
    without = _linear_setup(m=20, sigma=1.0, audit=False)
    with _count_host_reads() as base:
        _train(without, 10)
    run = _linear_setup(m=20, sigma=1.0)
    with _count_host_reads() as counts:
        _train(run, 10)
    assert counts == base  # the canaries add no .item()/.cpu()/.tolist()/bool() per step
    with _count_host_reads() as at_end:
        assert run.audit is not None
        run.audit.gradient_scores()
    assert at_end["cpu"] == 1  # one read-back, at the end


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_steps_do_not_synchronise() -> None:  # pragma: no cover - GPU only
    torch.manual_seed(0)
    device = torch.device("cuda")
    m, d = 64, 128
    model = nn.Linear(d, 1, bias=False).to(device)
    x = torch.zeros(200, d)
    x[:, :m] = torch.randn(200, m)
    loader = DataLoader(TensorDataset(x, torch.randn(200, 1)), batch_size=20)
    engine = PrivacyEngine(accountant="last_iterate")
    private, optimizer, dp_loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        poisson_sampling=True,
    )
    audit = InTrainingCanaryAudit(
        optimizer, num_canaries=m, sample_rate=0.1, seed=0, candidates=np.arange(m, d)
    )
    batches = [(xb.to(device), yb.to(device)) for xb, yb in dp_loader]
    for xb, yb in batches[:5]:
        optimizer.zero_grad()
        nn.functional.mse_loss(private(xb), yb).backward()
        optimizer.clip_and_accumulate()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            audit._insert()  # the canaries' per-step work: raises on any synchronisation
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert audit.insertions().shape == (m,)
    assert audit.insertions().sum() > 0


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_precision_autocast(device: str) -> None:
    run = _linear_setup(m=40, sigma=1.0, device=device)
    taken = 0
    for xb, yb in run.loader:  # type: ignore[attr-defined]
        xb, yb = xb.to(device), yb.to(device)
        run.optimizer.zero_grad()
        with torch.autocast(device, dtype=torch.bfloat16):
            out = run.model(xb)
        nn.functional.mse_loss(out.float(), yb).backward()
        run.optimizer.step()
        taken += 1
    assert run.audit is not None and run.audit.steps == taken
    scores = run.audit.gradient_scores()
    assert np.all(np.isfinite(scores)) and scores.dtype == np.float64
    assert next(run.model.parameters()).dtype == torch.float32


# ------------------------------------------------------------------------------ input canaries


from tests.auditing.input_space.test_canary_set import _classification_sets  # noqa: E402


def test_input_canaries_end_to_end_report() -> None:
    train, source = _classification_sets()
    augmented, canaries = make_input_canaries(train, source, 60, num_classes=3, seed=0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    engine = PrivacyEngine(accountant="last_iterate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        private, optimizer, loader = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
            data_loader=DataLoader(augmented, batch_size=30),
            noise_multiplier=0.3,
            max_grad_norm=1.0,
            poisson_sampling=True,
        )
        audit = InTrainingCanaryAudit(
            optimizer,
            num_canaries=100,
            sample_rate=1 / len(loader),
            seed=0,
            accountant=engine.accountant,
            input_canaries=canaries,
        )
        for _ in range(20):
            for xb, yb in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(private(xb), yb).backward()
                optimizer.step()
    with pytest.raises(ValueError, match="`model`"):
        audit.report(delta=DELTA)
    report = audit.report(delta=DELTA, model=model, standard=False)
    assert isinstance(report, InTrainingAuditReport)
    assert [a.canaries for a in report.audits] == ["gradient", "input"]
    inp = report.audit("input")
    assert inp.num_canaries == 60 and inp.one_run.is_bound
    assert 0.0 <= inp.one_run.epsilon <= report.heuristic_epsilon  # type: ignore[operator]
    # memorisation: the included (mislabelled) canaries have the lower losses on average
    scores = canaries.scores(model)
    assert scores[canaries.included].mean() > scores[~canaries.included].mean()
    assert model.training  # the scoring restores the mode
    data = report.as_dict()
    json.dumps(data)
    assert data["audits"][1]["num_canaries"] == 60
    text = str(report)
    assert "input canaries: 60" in text and "gradient canaries: 100" in text
    assert "lower bound" in text and "not a DP guarantee" in text


# ------------------------------------------------------------------------------ argument checks


def test_argument_checks() -> None:
    run = _linear_setup(m=10, sigma=1.0, audit=False)
    opt = run.optimizer
    with pytest.raises(TypeError, match="`optimizer`"):
        InTrainingCanaryAudit(opt.original_optimizer, num_canaries=1, sample_rate=0.1, seed=0)
    with pytest.raises(ValueError, match="`num_canaries`"):
        InTrainingCanaryAudit(opt, num_canaries=21, sample_rate=0.1, seed=0)
    with pytest.raises(TypeError, match="`num_canaries`"):
        InTrainingCanaryAudit(opt, num_canaries=1.0, sample_rate=0.1, seed=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`sample_rate`"):
        InTrainingCanaryAudit(opt, num_canaries=1, sample_rate=0.0, seed=0)
    with pytest.raises(TypeError, match="`seed`"):
        InTrainingCanaryAudit(opt, num_canaries=1, sample_rate=0.1, seed=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`enabled`"):
        InTrainingCanaryAudit(opt, num_canaries=1, sample_rate=0.1, seed=0, enabled=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`candidates`"):
        InTrainingCanaryAudit(opt, num_canaries=3, sample_rate=0.1, seed=0, candidates=[0, 1])
    with pytest.raises(ValueError, match="`candidates`"):
        InTrainingCanaryAudit(opt, num_canaries=1, sample_rate=0.1, seed=0, candidates=[0, 20])
    with pytest.raises(ValueError, match="`candidates`"):
        InTrainingCanaryAudit(opt, num_canaries=1, sample_rate=0.1, seed=0, candidates=[3, 3])
    with pytest.raises(TypeError, match="`input_canaries`"):
        InTrainingCanaryAudit(opt, num_canaries=1, sample_rate=0.1, seed=0, input_canaries=[])  # type: ignore[arg-type]
    opt.rank = 0  # what Opacus's distributed optimizers carry
    with pytest.raises(TypeError, match="distributed"):
        InTrainingCanaryAudit(opt, num_canaries=1, sample_rate=0.1, seed=0)
    del opt.rank
    audit = InTrainingCanaryAudit(opt, num_canaries=2, sample_rate=0.1, seed=0)
    with pytest.raises(ValueError, match="already"):
        InTrainingCanaryAudit(opt, num_canaries=2, sample_rate=0.1, seed=1)
    with pytest.raises(ValueError, match="`delta`"):
        audit.report(delta=0.0)
    with pytest.raises(ValueError, match="`confidence`"):
        audit.report(delta=DELTA, confidence=1.0)
    audit.detach()
    assert "add_noise" not in vars(opt)
    InTrainingCanaryAudit(opt, num_canaries=2, sample_rate=0.1, seed=1)  # attachable again


def test_detach_stops_insertion() -> None:
    run = _linear_setup(m=30, sigma=0.0, accountant=None)
    assert run.audit is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _train(run, 10)
        run.audit.detach()
        before = run.audit.gradient_scores()
        _train(run, 10)
    assert run.audit.steps == 10
    np.testing.assert_array_equal(run.audit.gradient_scores(), before)
