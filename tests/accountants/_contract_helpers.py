"""Helpers shared by the accountant contract tests and the Opacus engine suite.

* :func:`registered_names` - every accountant this package registers (new ones are covered
  automatically).
* :func:`make_answerable` - configure an accountant so that it can answer ``get_epsilon``
  (``"asgm"`` needs N, ``"feasgm"`` needs N and L; ``"last_iterate"`` needs nothing).
* :func:`load_opacus_test_module` - import one of the test modules that the Opacus wheel
  ships (``opacus/tests/...``), from the installed wheel, never copied into this repository.
  Those modules import torchvision only for ``FakeData``/``transforms`` and two model
  constructors; where torchvision is not installed (it is not one of our dependencies) a
  minimal stand-in is put in ``sys.modules`` for the import only.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch
from opacus.accountants import IAccountant

from opacus_lastiterate.accountants.registration import registered_accountants

__all__ = [
    "CONFIGURE",
    "TORCHVISION_IS_STAND_IN",
    "load_opacus_test_module",
    "make_answerable",
    "registered_names",
]


def registered_names() -> list[str]:
    """Mechanism names of every accountant registered by opacus_lastiterate, sorted."""
    return sorted(registered_accountants())


def _configure_sizes(acc: IAccountant, dataset_size: int, batch_size: int, loader: Any) -> None:
    if loader is not None:
        acc.configure(data_loader=loader)  # type: ignore[attr-defined]
    else:
        acc.configure(dataset_size=dataset_size, batch_size=batch_size)  # type: ignore[attr-defined]


# Per accountant: how to make a fresh instance answerable, from (N, L) or from the
# (non-DP) DataLoader given to make_private. Accountants not listed need nothing, unless
# they offer `configure`, which is then called the same way (see make_answerable).
CONFIGURE: dict[str, Callable[[IAccountant, int, int, Any], None]] = {
    "asgm": _configure_sizes,
    "feasgm": _configure_sizes,
}


def make_answerable(
    acc: IAccountant,
    *,
    dataset_size: int | None = None,
    batch_size: int | None = None,
    data_loader: Any = None,
) -> IAccountant:
    """Configure ``acc`` (in place, and return it) with what Opacus never passes to an
    accountant: the data set size N and the DataLoader batch size L."""
    if data_loader is not None:
        dataset_size = len(data_loader.dataset)
        batch_size = data_loader.batch_size
    configure = CONFIGURE.get(acc.mechanism())
    if configure is None and callable(getattr(acc, "configure", None)):
        configure = _configure_sizes
    if configure is not None:
        if dataset_size is None or batch_size is None:
            raise ValueError(f"{acc.mechanism()!r} needs dataset_size and batch_size.")
        configure(acc, dataset_size, batch_size, data_loader)
    return acc


# -- a minimal torchvision stand-in, for importing Opacus's own test modules ----------------


class _Compose:
    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x


class _ToTensor:
    def __call__(self, x: Any) -> torch.Tensor:
        return torch.as_tensor(x, dtype=torch.float32)


class _Normalize:
    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.as_tensor(mean, dtype=torch.float32)[:, None, None]
        self.std = torch.as_tensor(std, dtype=torch.float32)[:, None, None]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class _FakeData(torch.utils.data.Dataset):
    """Like torchvision's FakeData: image ``index`` is drawn from a generator seeded with
    ``index + random_offset`` (here already as a tensor in [0, 1], what ToTensor returns)."""

    def __init__(
        self,
        size: int = 1000,
        image_size: tuple[int, ...] = (3, 224, 224),
        num_classes: int = 10,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        random_offset: int = 0,
    ) -> None:
        self.size, self.image_size, self.num_classes = size, tuple(image_size), num_classes
        self.transform, self.target_transform = transform, target_transform
        self.random_offset = random_offset

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        if not 0 <= index < self.size:
            raise IndexError(f"index {index} out of range")
        g = torch.Generator().manual_seed(index + self.random_offset)
        img: Any = torch.rand(self.image_size, generator=g)
        target: Any = int(torch.randint(self.num_classes, (1,), generator=g))
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target


def _missing_model(name: str) -> Any:
    raise AttributeError(
        f"torchvision.models.{name}: torchvision is not installed; this is the minimal "
        "stand-in of tests/accountants/_contract_helpers.py (no model constructors)."
    )


def _torchvision_stand_in() -> dict[str, types.ModuleType]:
    root = types.ModuleType("torchvision")
    transforms = types.ModuleType("torchvision.transforms")
    transforms.Compose = _Compose  # type: ignore[attr-defined]
    transforms.ToTensor = _ToTensor  # type: ignore[attr-defined]
    transforms.Normalize = _Normalize  # type: ignore[attr-defined]
    datasets = types.ModuleType("torchvision.datasets")
    datasets.FakeData = _FakeData  # type: ignore[attr-defined]
    models = types.ModuleType("torchvision.models")
    models.__getattr__ = _missing_model  # type: ignore[attr-defined]  # PEP 562
    root.transforms, root.datasets, root.models = transforms, datasets, models  # type: ignore[attr-defined]
    root.__stand_in__ = True  # type: ignore[attr-defined]
    return {
        "torchvision": root,
        "torchvision.transforms": transforms,
        "torchvision.datasets": datasets,
        "torchvision.models": models,
    }


def _has_torchvision() -> bool:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return False
    return True


TORCHVISION_IS_STAND_IN: bool = not _has_torchvision()
"""True when the Opacus test modules are imported with the torchvision stand-in."""


def load_opacus_test_module(name: str) -> types.ModuleType:
    """Import ``opacus.tests.<name>`` from the installed wheel.

    Raises:
        ImportError: if the wheel does not ship it or one of its other imports is missing.
    """
    if not TORCHVISION_IS_STAND_IN:
        return importlib.import_module(f"opacus.tests.{name}")
    stand_in = _torchvision_stand_in()
    added = [key for key in stand_in if key not in sys.modules]
    sys.modules.update({key: stand_in[key] for key in added})
    try:
        return importlib.import_module(f"opacus.tests.{name}")
    finally:  # the stand-in is for this import only: no other test sees it
        for key in added:
            sys.modules.pop(key, None)
