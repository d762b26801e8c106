"""Text canaries: drawing, the augmented training set, the NLL scores, and a known answer.

The known answer: full-batch DP-GD (every record in every step, a fixed divisor) on a bigram
model. Adding or removing one canary moves the clipped sum by at most C and the noise has
standard deviation sigma C, so T steps are one Gaussian mechanism with mu = sqrt(T) / sigma
(Dong, Roth, Su, *Gaussian Differential Privacy*, arXiv 1905.02383); its exact
(epsilon, delta) curve is solved from the normal CDF (``tests/_gaussian.py``), independently
of the package.
"""

from __future__ import annotations

import math
import types
import warnings

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, Dataset

from opacus_lastiterate.analysis.audit import ScoreAudit
from opacus_lastiterate.auditing.input_space import TextCanaries, fair_coins, make_text_canaries
from opacus_lastiterate.auditing.input_space.text_canaries import (
    TEXT_COIN_SALT,
    draw_text_canaries,
)
from tests._gaussian import gaussian_mechanism_epsilon

V, L = 128, 6


class Progressions(Dataset):
    """Sequences ``a, a+1, ..., a+L-1 (mod V)``: the records, 1-D token tensors."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.tokens = (torch.randint(0, V, (n, 1), generator=g) + torch.arange(L)) % V

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.tokens[i]


class DictRecords(Progressions):
    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:  # type: ignore[override]
        t = self.tokens[i]
        return {"input_ids": t, "labels": t, "attention_mask": torch.ones_like(t)}


# ------------------------------------------------------------------------------ drawing


def test_random_canaries_are_distinct_seeded_and_coined() -> None:
    c = draw_text_canaries(300, vocab_size=V, length=L, seed=3)
    assert c.tokens.shape == (300, L) and c.tokens.dtype == torch.int64
    assert len({tuple(r) for r in c.tokens.tolist()}) == 300
    assert int(c.tokens.min()) >= 0 and int(c.tokens.max()) < V
    np.testing.assert_array_equal(c.included, fair_coins(3, 300, salt=TEXT_COIN_SALT))
    again = draw_text_canaries(300, vocab_size=V, length=L, seed=3)
    assert torch.equal(again.tokens, c.tokens)
    other = draw_text_canaries(300, vocab_size=V, length=L, seed=4)
    assert not torch.equal(other.tokens, c.tokens)
    assert c.scored.tolist() == [False] + [True] * (L - 1)  # nothing predicts token 0
    # uniform tokens: 1800 draws over 128 values, chi-square far below its 0.1% quantile
    counts = np.bincount(c.tokens.numpy().ravel(), minlength=V)
    expected = c.tokens.numel() / V
    assert ((counts - expected) ** 2 / expected).sum() < 200.0


def test_small_space_is_drawn_without_replacement() -> None:
    c = draw_text_canaries(8, vocab_size=V, length=3, alphabet=[5, 9], seed=0)
    assert sorted(map(tuple, c.tokens.tolist())) == [
        (a, b, d) for a in (5, 9) for b in (5, 9) for d in (5, 9)
    ]


def test_template_canaries_fix_the_template_and_score_the_secret() -> None:
    template = [7, 8, None, None, 9, None]
    c = draw_text_canaries(50, vocab_size=V, template=template, alphabet=range(10, 20), seed=1)
    assert c.length == 6
    assert (c.tokens[:, [0, 1, 4]] == torch.tensor([7, 8, 9])).all()
    secret = c.tokens[:, [2, 3, 5]]
    assert int(secret.min()) >= 10 and int(secret.max()) < 20
    assert c.scored.tolist() == [False, False, True, True, False, True]
    assert len({tuple(r) for r in secret.tolist()}) == 50


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"vocab_size": 1}, ValueError, "vocab_size"),
        ({"vocab_size": 64.0}, TypeError, "vocab_size"),
        ({"vocab_size": True}, TypeError, "vocab_size"),
        ({"length": 1}, ValueError, "length"),
        ({"length": None}, ValueError, "length"),
        ({"num_canaries": 0}, ValueError, "num_canaries"),
        ({"num_canaries": 2.5}, TypeError, "num_canaries"),
        ({"num_canaries": 9, "length": 3, "alphabet": [1, 2]}, ValueError, "num_canaries"),
        ({"seed": -1}, ValueError, "seed"),
        ({"reduction": "max"}, ValueError, "reduction"),
        ({"alphabet": [0, 64]}, ValueError, "alphabet"),
        ({"alphabet": [3, 3]}, ValueError, "alphabet"),
        ({"alphabet": []}, TypeError, "alphabet"),
        ({"template": [1, None, 64], "length": None}, ValueError, r"template\[2\]"),
        ({"template": [None, 2, 3], "length": None}, ValueError, "template"),
        ({"template": "abc", "length": None}, TypeError, "template"),
        ({"template": [1, None], "length": 5}, ValueError, "length"),
    ],
)
def test_bad_arguments_name_the_parameter(kwargs: dict, error: type, name: str) -> None:
    args = {"num_canaries": 4, "vocab_size": 64, "length": L, "seed": 0, **kwargs}
    with pytest.raises(error, match=f"`{name}`"):
        draw_text_canaries(**args)


# ------------------------------------------------------------------------------ the data set


def test_included_canaries_are_appended_as_records() -> None:
    train = Progressions(40, seed=0)
    data, c = make_text_canaries(train, 30, vocab_size=V, length=L, seed=2)
    k = int(c.included.sum())
    assert 0 < k < 30 and len(data) == 40 + k
    appended = torch.stack([data[40 + i] for i in range(k)])
    assert torch.equal(appended, c.tokens[c.included])
    assert torch.equal(data[0], train[0])
    batch = next(iter(DataLoader(data, batch_size=len(data))))  # collates with the records
    assert batch.shape == (40 + k, L)


def test_dict_records_copy_the_training_form() -> None:
    train = DictRecords(10, seed=0)
    data, c = make_text_canaries(train, 12, vocab_size=V, length=L, seed=0)
    record = data[len(train)]
    assert set(record) == {"input_ids", "labels", "attention_mask"}
    first = int(np.flatnonzero(c.included)[0])
    assert torch.equal(record["input_ids"], c.tokens[first])
    assert torch.equal(record["labels"], c.tokens[first])
    assert torch.equal(record["attention_mask"], torch.ones(L, dtype=torch.int64))


def test_record_form_errors_and_custom_records() -> None:
    with pytest.raises(ValueError, match="`length`"):
        make_text_canaries(Progressions(5, 0), 4, vocab_size=V, length=L + 1, seed=0)

    class Odd(Progressions):
        def __getitem__(self, i: int) -> dict:  # type: ignore[override]
            return {"input_ids": self.tokens[i], "pixel_values": 0}

    with pytest.raises(TypeError, match="as_item"):
        make_text_canaries(Odd(5, 0), 4, vocab_size=V, length=L, seed=0)
    with pytest.raises(TypeError, match="`train`"):
        make_text_canaries(iter([]), 4, vocab_size=V, length=L, seed=0)  # type: ignore[arg-type]
    data, _ = make_text_canaries(
        Odd(5, 0), 40, vocab_size=V, length=L + 2, seed=0, as_item=lambda t: ("x", t)
    )
    assert data[5][0] == "x" and data[5][1].shape == (L + 2,)


# ------------------------------------------------------------------------------ scores


class FixedLogits(nn.Module):
    """Logits that depend on the previous token only, from a fixed table; optionally wrapped
    like a Hugging Face output (``.logits``)."""

    def __init__(self, hf: bool = False) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.table = nn.Parameter(torch.randn(V, V + 3, generator=g))
        self.hf = hf

    def forward(self, ids: torch.Tensor) -> object:
        logits = self.table[ids]
        return types.SimpleNamespace(logits=logits) if self.hf else logits


def _reference_nll(table: np.ndarray, tokens: list[int], scored: list[bool]) -> list[float]:
    out = []
    for t in range(1, len(tokens)):
        if scored[t]:
            row = table[tokens[t - 1]]
            out.append(-(row[tokens[t]] - math.log(sum(math.exp(v) for v in row))))
    return out


@pytest.mark.parametrize("hf", [False, True])
@pytest.mark.parametrize("template", [None, [3, None, None, 4, None, 5]])
def test_losses_match_a_direct_computation(hf: bool, template: list | None) -> None:
    model = FixedLogits(hf=hf)
    length = None if template else L
    c_sum = draw_text_canaries(9, vocab_size=V, length=length, template=template, seed=0)
    c_mean = draw_text_canaries(
        9, vocab_size=V, length=length, template=template, seed=0, reduction="mean"
    )
    table = model.table.detach().double().numpy()
    want = [_reference_nll(table, r, c_sum.scored.tolist()) for r in c_sum.tokens.tolist()]
    np.testing.assert_allclose(c_sum.losses(model, batch_size=4), [sum(w) for w in want], 1e-6)
    np.testing.assert_allclose(c_mean.losses(model), [np.mean(w) for w in want], rtol=1e-6)
    np.testing.assert_allclose(c_sum.scores(model), -c_sum.losses(model))
    assert model.training  # the mode is restored


def test_scoring_checks_the_model_output() -> None:
    c = draw_text_canaries(4, vocab_size=V, length=L, seed=0)
    with pytest.raises(ValueError, match="shape"):
        c.losses(FixedLogits(), forward=lambda m, ids: m(ids)[:, :-1])
    with pytest.raises(ValueError, match="vocab_size"):
        c.losses(FixedLogits(), forward=lambda m, ids: m(ids)[..., : V - 1])
    with pytest.raises(TypeError, match="`model`"):
        c.losses(lambda ids: ids)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`batch_size`"):
        c.losses(FixedLogits(), batch_size=0)
    assert isinstance(c, TextCanaries) and torch.equal(c.canary(1), c.tokens[1])
    with pytest.raises(ValueError, match="`index`"):
        c.canary(4)


# ------------------------------------------------------------------------------ known answer


def _full_batch_audit(sigma: float, steps: int, m: int = 200) -> tuple[float, float]:
    """Bigram model, full-batch DP-GD with canaries; the one-run and f-DP bounds."""
    torch.manual_seed(0)
    data, canaries = make_text_canaries(Progressions(50, 1), m, vocab_size=V, length=L, seed=0)
    model = nn.Embedding(V, V)  # logits of the next token given this one
    nn.init.zeros_(model.weight)
    n = len(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        private, optimizer, loader = PrivacyEngine().make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=n / 2),
            data_loader=DataLoader(data, batch_size=n),
            noise_multiplier=sigma,
            max_grad_norm=1.0,
            poisson_sampling=False,
        )
        for _ in range(steps):
            for x in loader:
                assert len(x) == n  # every record in every step
                optimizer.zero_grad()
                logits = private(x[:, :-1])
                nn.functional.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1)).backward()
                optimizer.step()
    audit = ScoreAudit.from_canaries(canaries.scores(model), canaries.included)
    return (
        audit.one_run(delta=1e-5).epsilon,
        audit.one_run_fdp(delta=1e-5).epsilon,
    )


@pytest.mark.parametrize(
    ("sigma", "steps", "at_least"),
    [(0.0, 10, 2.0), pytest.param(1.0, 10, 1.0, marks=pytest.mark.slow), (1000.0, 10, 0.0)],
)
def test_known_answer_full_batch_bigram(sigma: float, steps: int, at_least: float) -> None:
    mu = math.sqrt(steps) / sigma if sigma else math.inf
    true_epsilon = math.inf if math.isinf(mu) else gaussian_mechanism_epsilon(mu, 1e-5)
    one_run, fdp = _full_batch_audit(sigma, steps)
    for bound in (one_run, fdp):
        assert at_least <= bound <= true_epsilon
    if sigma == 1000.0:
        assert true_epsilon < 0.05 and one_run == fdp == 0.0


def test_reference_scores_are_the_fall_of_the_loss() -> None:
    before, after = FixedLogits(), FixedLogits()
    with torch.no_grad():
        after.table.mul_(0.5)
    c = draw_text_canaries(7, vocab_size=V, length=L, seed=0)
    calibrated = c.with_reference(before)
    assert c.reference_losses is None  # a copy; the original is unchanged
    np.testing.assert_allclose(calibrated.reference_losses, c.losses(before))
    np.testing.assert_allclose(calibrated.scores(after), c.losses(before) - c.losses(after))
    np.testing.assert_array_equal(calibrated.included, c.included)
