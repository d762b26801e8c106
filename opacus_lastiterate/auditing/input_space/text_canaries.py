"""Text canaries for language models, each included by a fair coin: the canaries of a one-run
audit of a language model (``docs/text_canaries.md``).

A text canary is a token sequence that no real record contains: either ``length`` tokens
drawn uniformly at random, or a fixed template sentence whose slots hold a random secret
(the "exposure" canaries of Carlini, Liu, Erlingsson, Kos, Song, *The Secret Sharer*,
arXiv 1802.08232). :func:`make_text_canaries` draws m distinct canaries, draws one fair coin
per canary (:func:`~opacus_lastiterate.auditing.input_space.canary_set.fair_coins`) and
appends the included ones to the training set, so that they are sampled like any other
record, by a plain ``DataLoader``, Opacus's Poisson loader or the Hugging Face ``Trainer``.

After training, :meth:`TextCanaries.scores` scores every canary on the final model by minus
its negative log-likelihood (summed or averaged over the canary's random tokens, each
predicted from the tokens before it): a lower loss means "included". The scores and coins
are audited like any one-run canaries
(:meth:`ScoreAudit.from_canaries <opacus_lastiterate.analysis.audit.ScoreAudit.from_canaries>`,
Steinke, Nasr, Jagielski, *Privacy Auditing with One (1) Training Run*, arXiv 2305.08846),
e.g. by :class:`~opacus_lastiterate.callbacks.InTrainingCanaryAudit` given
``input_canaries=`` the record returned here.

All draws come from ``seed`` (the coins with salt 5, the tokens with spawn key 6, so that
gradient, input and text canaries of one seed are independent); the global random number
generators are not used.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn
from torch.utils.data import ConcatDataset, Dataset

from opacus_lastiterate.analysis._validation import check_int
from opacus_lastiterate.auditing.input_space.canary_set import fair_coins

__all__ = [
    "TextCanaries",
    "make_text_canaries",
]

TextReduction = Literal["sum", "mean"]
TEXT_REDUCTIONS: tuple[str, ...] = ("sum", "mean")
"""How a canary's per-token negative log-likelihoods are combined into its loss."""

TEXT_COIN_SALT = 5
"""The ``salt`` of the text canaries' coins in :func:`fair_coins` (gradient canaries use 3,
input canaries 2)."""

_TOKEN_KEY = 6  # spawn key of the token draws
_ENUMERATE_LIMIT = 1 << 20  # secret spaces up to this size are drawn without replacement


def _check_reduction(reduction: object) -> TextReduction:
    if reduction not in TEXT_REDUCTIONS:
        raise ValueError(f"`reduction` must be one of {TEXT_REDUCTIONS}, got {reduction!r}.")
    return reduction  # type: ignore[return-value]


def _logits_of(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """``model(input_ids)``, or its ``.logits`` (Hugging Face causal language models)."""
    out = model(input_ids)
    logits = getattr(out, "logits", out)
    if not isinstance(logits, torch.Tensor):
        raise TypeError(
            "the model must return logits or an object with a `logits` tensor; pass "
            f"`forward=` to compute them, got {type(out).__name__}."
        )
    return logits


@dataclass(frozen=True, eq=False)
class TextCanaries:
    """Text canaries and their coins (built by :func:`make_text_canaries`).

    Attributes:
        tokens: every canary's tokens, included or not, shape ``(m, length)``, int64.
        included: the fair coins, True = appended to the training set.
        scored: which positions carry a random token and count in the loss, shape
            ``(length,)``; position 0 never counts (nothing predicts it).
        vocab_size: the model's vocabulary size (every token is below it).
        reduction: ``"sum"`` or ``"mean"`` of the scored tokens' negative log-likelihoods.
        reference_losses: the canaries' losses under a reference model that does not depend
            on the coins (e.g. the initial model, :meth:`with_reference`), or None.
    """

    tokens: torch.Tensor = field(repr=False)
    included: NDArray[np.bool_] = field(repr=False)
    scored: torch.Tensor = field(repr=False)
    vocab_size: int
    reduction: TextReduction = "sum"
    reference_losses: NDArray[np.float64] | None = field(default=None, repr=False)

    @property
    def num_canaries(self) -> int:
        """m, the canaries with a coin (included or not)."""
        return int(self.included.size)

    @property
    def length(self) -> int:
        """Tokens per canary."""
        return int(self.tokens.shape[1])

    def canary(self, index: int) -> torch.Tensor:
        """The tokens of canary ``index`` (a copy)."""
        i = check_int("index", index)
        if i >= self.num_canaries:
            raise ValueError(f"`index` must be in [0, {self.num_canaries - 1}], got {i}.")
        return self.tokens[i].clone()

    @torch.no_grad()
    def losses(
        self,
        model: nn.Module,
        *,
        forward: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None,
        batch_size: int = 256,
    ) -> NDArray[np.float64]:
        """Each canary's negative log-likelihood under ``model`` (nats), one per canary.

        Token ``t`` of a canary is predicted by the logits at position ``t - 1`` (a causal
        language model); the negative log-probabilities of the :attr:`scored` positions are
        summed, or averaged for ``reduction="mean"``. ``forward(model, input_ids)`` must
        return logits of shape ``(batch, length, V)`` with ``V >= vocab_size`` (default:
        ``model(input_ids)``, or its ``.logits``). The model is put in eval mode for the
        scoring and its mode restored afterwards.
        """
        if not isinstance(model, nn.Module):
            raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}.")
        b = check_int("batch_size", batch_size, minimum=1)
        if forward is not None and not callable(forward):
            raise TypeError(f"`forward` must be callable or None, got {forward!r}.")
        run = _logits_of if forward is None else forward
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        target_mask = self.scored[1:].to(device)
        count = int(target_mask.sum())
        was_training = model.training
        model.eval()
        try:
            out = []
            for start in range(0, self.num_canaries, b):
                ids = self.tokens[start : start + b].to(device)
                logits = run(model, ids)
                if logits.dim() != 3 or logits.shape[:2] != ids.shape:
                    raise ValueError(
                        f"the logits must have shape (batch, length, V) = ({ids.shape[0]}, "
                        f"{ids.shape[1]}, V), got {tuple(logits.shape)}."
                    )
                if logits.shape[2] < self.vocab_size:
                    raise ValueError(
                        f"the logits cover {logits.shape[2]} tokens, fewer than vocab_size = "
                        f"{self.vocab_size}."
                    )
                logp = torch.log_softmax(logits[:, :-1].double(), dim=-1)
                nll = -logp.gather(2, ids[:, 1:, None]).squeeze(2)
                total = (nll * target_mask).sum(dim=1)
                out.append(total / count if self.reduction == "mean" else total)
            return torch.cat(out).cpu().numpy() if out else np.zeros(0)
        finally:
            model.train(was_training)

    def with_reference(
        self,
        model: nn.Module,
        *,
        forward: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None,
        batch_size: int = 256,
    ) -> TextCanaries:
        """A copy that scores each canary by how much its loss fell from ``model``'s.

        Call it before training, on the initial model (or any model that does not depend on
        the coins): a random canary's loss varies from canary to canary before any training,
        and subtracting that variation sharpens the test without touching its validity (the
        score is still a fixed function of the canary and the final model).
        """
        ref = self.losses(model, forward=forward, batch_size=batch_size)
        return replace(self, reference_losses=ref)

    def scores(
        self,
        model: nn.Module,
        *,
        forward: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None,
        batch_size: int = 256,
    ) -> NDArray[np.float64]:
        """The scores of a one-run audit (higher = "in"): minus :meth:`losses`, or, with
        :attr:`reference_losses`, the reference losses minus :meth:`losses`."""
        losses = self.losses(model, forward=forward, batch_size=batch_size)
        return -losses if self.reference_losses is None else self.reference_losses - losses


class _CanaryRecords(Dataset):
    """The included canaries as records of the training set's form."""

    def __init__(self, tokens: torch.Tensor, as_item: Callable[[torch.Tensor], Any]) -> None:
        self._tokens = tokens
        self._as_item = as_item

    def __len__(self) -> int:
        return int(self._tokens.shape[0])

    def __getitem__(self, i: int) -> Any:
        return self._as_item(self._tokens[i].clone())


def _like(value: Any, tokens: torch.Tensor, name: str) -> Any:
    """``tokens`` in the container type of ``value`` (a training record's field)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 1:
            raise TypeError(f"the training records' {name!r} must be 1-D, got {value.dim()}-D.")
        return tokens.to(value.dtype)
    if isinstance(value, np.ndarray):
        return tokens.numpy().astype(value.dtype)
    if isinstance(value, list):
        return tokens.tolist()
    raise TypeError(
        f"cannot build a canary record like the training records' {name!r} of type "
        f"{type(value).__name__}; pass `as_item`."
    )


def _infer_as_item(train: Dataset, length: int) -> Callable[[torch.Tensor], Any]:
    """A record builder copying the form of ``train[0]``: a 1-D token tensor (list, array),
    or a mapping with ``input_ids`` (and ``labels`` = the tokens, ``attention_mask`` = ones
    when the record has them)."""
    first = train[0]
    if isinstance(first, Mapping):
        keys = set(first)
        if "input_ids" not in keys or not keys <= {"input_ids", "labels", "attention_mask"}:
            raise TypeError(
                "the training records are mappings with keys "
                f"{sorted(map(str, keys))}; the canary records are built for 'input_ids' with "
                "optional 'labels' and 'attention_mask' only; pass `as_item`."
            )
        sequence = first["input_ids"]
    else:
        sequence = first
    n = len(sequence)
    if n != length:
        raise ValueError(
            f"`length` ({length}) must equal the training records' length ({n}) so that the "
            "canaries batch with them; pass `as_item` to pad them yourself."
        )
    if not isinstance(first, Mapping):
        return lambda t: _like(first, t, "record")
    return lambda t: {
        k: _like(v, t if k != "attention_mask" else torch.ones_like(t), k)
        for k, v in first.items()
    }


def _check_template(
    template: Sequence[int | None] | None, length: int | None, vocab: int
) -> list[int | None]:
    if template is None:
        if length is None:
            raise ValueError("`length` is required for random canaries (no `template`).")
        n = check_int("length", length, minimum=2)
        return [None] * n
    if isinstance(template, (str, bytes)) or not isinstance(template, Sequence):
        raise TypeError(
            f"`template` must be a sequence of token ids and None (the secret's slots), got "
            f"{type(template).__name__}."
        )
    slots: list[int | None] = []
    for i, t in enumerate(template):
        if t is not None:
            t = check_int(f"template[{i}]", t)
            if t >= vocab:
                raise ValueError(f"`template[{i}]` = {t} is not below vocab_size = {vocab}.")
        slots.append(t)
    if length is not None and check_int("length", length) != len(slots):
        raise ValueError(f"`length` ({length}) must equal len(template) = {len(slots)}.")
    if len(slots) < 2 or not any(s is None for s in slots[1:]):
        raise ValueError(
            "`template` must have at least 2 tokens and a secret slot (None) after position 0."
        )
    return slots


def _check_alphabet(alphabet: Sequence[int] | None, vocab: int) -> NDArray[np.int64]:
    if alphabet is None:
        return np.arange(vocab, dtype=np.int64)
    a = np.asarray(alphabet)
    if a.ndim != 1 or a.size == 0 or not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"`alphabet` must be a non-empty 1-D sequence of token ids, got {alphabet!r}.")
    if a.min() < 0 or a.max() >= vocab:
        raise ValueError(f"`alphabet` must lie in [0, vocab_size = {vocab}).")
    if np.unique(a).size != a.size:
        raise ValueError("`alphabet` must be distinct token ids.")
    return a.astype(np.int64)


def _distinct_draws(rng: np.random.Generator, m: int, base: int, slots: int) -> NDArray[np.int64]:
    """``m`` distinct rows of ``slots`` digits in ``[0, base)``, uniform among such sets."""
    space = base**slots
    if space <= _ENUMERATE_LIMIT:
        flat = rng.choice(space, size=m, replace=False)
        return (flat[:, None] // base ** np.arange(slots - 1, -1, -1)) % base
    rows = rng.integers(0, base, size=(m, slots))
    while True:  # resample repeated rows; repeats are rare when the space is this large
        _, first = np.unique(rows, axis=0, return_index=True)
        repeated = np.setdiff1d(np.arange(m), first)
        if repeated.size == 0:
            return rows
        rows[repeated] = rng.integers(0, base, size=(repeated.size, slots))


def draw_text_canaries(
    num_canaries: int,
    *,
    vocab_size: int,
    seed: int,
    length: int | None = None,
    template: Sequence[int | None] | None = None,
    alphabet: Sequence[int] | None = None,
    reduction: TextReduction = "sum",
) -> TextCanaries:
    """Draw m distinct text canaries and their fair coins (no data set involved).

    Args:
        num_canaries: m >= 1.
        vocab_size: the model's vocabulary size V >= 2.
        seed: seed of the tokens and coins.
        length: tokens per random canary (>= 2); with a ``template``, optional and then
            equal to ``len(template)``.
        template: None for random canaries (every token random, all but the first
            scored), or token ids with None at the secret's slots (e.g. a sentence
            ``"my pin is"`` followed by four None): the fixed tokens are the same in every
            canary and only the secret's tokens are scored.
        alphabet: the token ids the random tokens are drawn from (default all V).
        reduction: ``"sum"`` or ``"mean"`` of the scored tokens' negative log-likelihoods.
    """
    m = check_int("num_canaries", num_canaries, minimum=1)
    v = check_int("vocab_size", vocab_size, minimum=2)
    s = check_int("seed", seed)
    red = _check_reduction(reduction)
    slots = _check_template(template, length, v)
    letters = _check_alphabet(alphabet, v)
    free = [i for i, t in enumerate(slots) if t is None]
    space = letters.size ** len(free)
    if m > space:
        raise ValueError(
            f"`num_canaries` must be at most the {space} distinct canaries of this alphabet "
            f"and template, got {m}."
        )
    rng = np.random.default_rng(np.random.SeedSequence(s, spawn_key=(_TOKEN_KEY,)))
    secrets = letters[_distinct_draws(rng, m, letters.size, len(free))]
    tokens = np.tile(np.array([t if t is not None else 0 for t in slots], dtype=np.int64), (m, 1))
    tokens[:, free] = secrets
    scored = torch.tensor([t is None for t in slots])
    scored[0] = False
    coins = fair_coins(s, m, salt=TEXT_COIN_SALT)
    return TextCanaries(torch.from_numpy(tokens), coins, scored, v, red)


def make_text_canaries(
    train: Dataset,
    num_canaries: int,
    *,
    vocab_size: int,
    seed: int,
    length: int | None = None,
    template: Sequence[int | None] | None = None,
    alphabet: Sequence[int] | None = None,
    reduction: TextReduction = "sum",
    as_item: Callable[[torch.Tensor], Any] | None = None,
) -> tuple[Dataset, TextCanaries]:
    """Training set with the included text canaries appended, and the record of the coins.

    The canaries are drawn by :func:`draw_text_canaries` (same arguments); each included
    one becomes one record after those of ``train`` (``ConcatDataset``), so it is sampled
    like any record. ``as_item(tokens)`` builds a record from a canary's 1-D int64 tokens;
    by default the records copy the form of ``train[0]``: a 1-D token sequence, or a mapping
    with ``input_ids`` (and ``labels`` = the tokens, ``attention_mask`` = ones, when the
    record has them), the form the Hugging Face ``Trainer`` collates. Without ``as_item``
    the canaries must be as long as ``train[0]``'s sequence.

    Returns:
        ``(ConcatDataset([train, included canaries]), TextCanaries)``.
    """
    try:
        n_train = len(train)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError("`train` must be a map-style data set with a length.") from None
    if as_item is not None and not callable(as_item):
        raise TypeError(f"`as_item` must be callable or None, got {as_item!r}.")
    canaries = draw_text_canaries(
        num_canaries, vocab_size=vocab_size, seed=seed, length=length, template=template,
        alphabet=alphabet, reduction=reduction,
    )
    if as_item is None:
        if n_train == 0:
            raise ValueError("`train` is empty: pass `as_item` to say what a record is.")
        as_item = _infer_as_item(train, canaries.length)
    keep = torch.from_numpy(np.flatnonzero(canaries.included))
    records = _CanaryRecords(canaries.tokens[keep], as_item)
    return ConcatDataset([train, records]), canaries

