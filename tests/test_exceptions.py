"""Every warning class lives in opacus_lastiterate.exceptions under one base class."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import opacus_lastiterate
from opacus_lastiterate import exceptions

WARNINGS = [
    getattr(exceptions, name)
    for name in exceptions.__all__
    if issubclass(getattr(exceptions, name), Warning)
]


@pytest.mark.parametrize("cls", WARNINGS, ids=lambda c: c.__name__)
def test_every_warning_derives_from_the_package_base(cls: type[Warning]) -> None:
    assert issubclass(cls, exceptions.OpacusLastIterateWarning)
    assert issubclass(cls, UserWarning)
    assert getattr(exceptions, cls.__name__) is cls


def test_the_root_exposes_only_the_base_class() -> None:
    assert opacus_lastiterate.OpacusLastIterateWarning is exceptions.OpacusLastIterateWarning
    assert not set(opacus_lastiterate.__all__) & (set(exceptions.__all__) - {
        "OpacusLastIterateWarning"
    })


def test_the_classes_also_derive_from_the_builtin_kinds() -> None:
    assert issubclass(exceptions.WeightedAccuracyWarning, RuntimeWarning)
    assert issubclass(exceptions.UnsupportedOptimizerError, ValueError)
    assert exceptions.ZeroNoiseWarning in WARNINGS


OPTIONAL_FRAMEWORK_MODULES = frozenset(
    {"opacus_lastiterate.callbacks.lightning", "opacus_lastiterate.callbacks.huggingface"}
)


def test_no_warning_class_is_defined_outside_the_exceptions_module() -> None:
    strays = []
    for info in pkgutil.walk_packages(opacus_lastiterate.__path__, "opacus_lastiterate."):
        if info.name.endswith("__main__"):  # runs the CLI when imported
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # adapters whose framework (an optional extra) is not installed
            if info.name in OPTIONAL_FRAMEWORK_MODULES:
                continue
            raise
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(obj, Warning)
                and obj.__module__.startswith("opacus_lastiterate")
                and obj.__module__ != exceptions.__name__
            ):
                strays.append(f"{obj.__module__}.{obj.__qualname__}")
    assert not strays
