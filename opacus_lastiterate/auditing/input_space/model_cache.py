"""Keep the final models of a many-run audit on disk, so that one set of runs serves several
scores (the canary and crafted samples) and crafting can read the models back.

:class:`CachedTrain` wraps a ``train(include_canary, seed) -> model`` function for
:class:`~opacus_lastiterate.auditing.runner.AuditRunner`: the first call of a
``(include_canary, seed)`` pair trains and saves the model, later calls load it. Files live
under ``directory / <digest of train's identity>``, so a changed training function never reads
another's models. Models are saved with ``torch.save`` of the whole module and loaded with
``weights_only=False`` (pickle): use a directory that only you write to.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from opacus_lastiterate.analysis._validation import check_int
from opacus_lastiterate.auditing.runner import RunRecords
from opacus_lastiterate.auditing.runner.identity import callable_identity, canonical_json

__all__ = []


@dataclass(frozen=True)
class CachedTrain:
    """``train`` with its final models kept under ``directory`` (picklable if ``train`` is).

    Attributes:
        train: ``train(include_canary, seed) -> torch.nn.Module``.
        directory: where the models are kept.
    """

    train: Any
    directory: str

    def __post_init__(self) -> None:
        if not callable(self.train):
            raise TypeError(f"`train` must be callable, got {self.train!r}.")
        if not isinstance(self.directory, (str, os.PathLike)):
            raise TypeError(f"`directory` must be a path, got {self.directory!r}.")
        object.__setattr__(self, "directory", os.fspath(self.directory))

    @property
    def folder(self) -> Path:
        """``directory / <first 16 hex digits of the SHA-256 of train's identity>``."""
        digest = hashlib.sha256(canonical_json(callable_identity(self.train)).encode()).hexdigest()
        return Path(self.directory) / digest[:16]

    def path(self, include_canary: bool, seed: int) -> Path:
        """File of the model of run ``(include_canary, seed)``."""
        if not isinstance(include_canary, bool):
            raise TypeError(f"`include_canary` must be a bool, got {include_canary!r}.")
        return self.folder / f"{'in' if include_canary else 'out'}-{check_int('seed', seed)}.pt"

    def __call__(self, include_canary: bool, seed: int) -> nn.Module:
        """Load the model of ``(include_canary, seed)``, training and saving it if absent."""
        path = self.path(include_canary, seed)
        if path.exists():
            return self.load(include_canary, seed)
        model = self.train(include_canary, seed)
        if not isinstance(model, nn.Module):
            raise TypeError(f"`train` must return a torch.nn.Module, got {type(model).__name__}.")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(model, f)
            os.replace(tmp, path)  # atomic: a reader sees the whole file or none
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return model

    def load(self, include_canary: bool, seed: int) -> nn.Module:
        """The saved model of ``(include_canary, seed)``; FileNotFoundError if it is absent."""
        path = self.path(include_canary, seed)
        if not path.exists():
            raise FileNotFoundError(f"no model of run (include_canary={include_canary}, seed={seed}) in {self.folder}.")
        model = torch.load(path, map_location="cpu", weights_only=False)
        if not isinstance(model, nn.Module):  # pragma: no cover - a foreign file
            raise TypeError(f"{path} does not hold a torch.nn.Module.")
        return model

    def models(self, records: RunRecords) -> tuple[list[nn.Module], list[nn.Module]]:
        """The models of ``records`` (trained through this cache): ``(in_models, out_models)``."""
        ins: list[nn.Module] = []
        outs: list[nn.Module] = []
        for rec in records.records:
            (ins if rec.include_canary else outs).append(self.load(rec.include_canary, rec.seed))
        return ins, outs
