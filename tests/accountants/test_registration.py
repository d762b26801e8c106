"""Registration of our accountants with Opacus: native registry (>= 1.6) or the shim (1.0-1.5)."""

from __future__ import annotations

import warnings
from typing import Any

import opacus
import opacus.accountants
import opacus.accountants.utils
import opacus.privacy_engine
import pytest
from opacus import PrivacyEngine
from opacus.accountants import IAccountant, RDPAccountant

from opacus_lastiterate.accountants import (
    HeuristicCalibrationWarning,
    LastIterateAccountant,
    register_accountant,
    registration,
)
from opacus_lastiterate.accountants.registration import HAS_NATIVE_REGISTRY, registered_accountants
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun

OPACUS_VERSION = tuple(int(part) for part in opacus.__version__.split(".")[:2])

CREATE_ACCOUNTANT_NAMESPACES = [
    opacus.accountants,  # where it is defined
    opacus.privacy_engine,  # PrivacyEngine(accountant=...)
    opacus.accountants.utils,  # get_noise_multiplier (make_private_with_epsilon)
]


class DummyAccountant(IAccountant):
    """A minimal accountant of 'another package' registered in some tests."""

    def __init__(self) -> None:
        super().__init__()

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        self.history.append((noise_multiplier, sample_rate, 1))

    def get_epsilon(self, delta: float, *args: Any, **kwargs: Any) -> float:
        return 1.0

    def __len__(self) -> int:
        return len(self.history)

    @classmethod
    def mechanism(cls) -> str:
        return "dummy_for_tests"


@pytest.fixture
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let a test register accountants; restore every registry afterwards."""
    monkeypatch.setattr(registration, "_PLUGIN_ACCOUNTANTS", dict(registration._PLUGIN_ACCOUNTANTS))
    if HAS_NATIVE_REGISTRY:
        import opacus.accountants.registry as opacus_registry

        monkeypatch.setattr(opacus_registry, "_ACCOUNTANTS", dict(opacus_registry._ACCOUNTANTS))


def test_native_registry_flag_matches_opacus_version() -> None:
    assert HAS_NATIVE_REGISTRY == (OPACUS_VERSION >= (1, 6))


@pytest.mark.parametrize("namespace", CREATE_ACCOUNTANT_NAMESPACES, ids=lambda m: m.__name__)
def test_last_iterate_resolves_in_every_namespace(namespace: Any) -> None:
    acc = namespace.create_accountant(mechanism="last_iterate")
    assert type(acc) is LastIterateAccountant
    assert namespace.create_accountant("last_iterate") is not acc  # a fresh instance each time


@pytest.mark.parametrize("namespace", CREATE_ACCOUNTANT_NAMESPACES, ids=lambda m: m.__name__)
def test_opacus_accountants_still_resolve_and_unknown_names_still_fail(namespace: Any) -> None:
    assert type(namespace.create_accountant(mechanism="rdp")) is RDPAccountant
    with pytest.raises(ValueError, match="no_such_accountant"):
        namespace.create_accountant(mechanism="no_such_accountant")


def test_privacy_engine_by_name() -> None:
    engine = PrivacyEngine(accountant="last_iterate")
    assert type(engine.accountant) is LastIterateAccountant
    assert engine.accountant.mechanism() == "last_iterate"


def test_registration_is_idempotent() -> None:
    register_accountant("last_iterate", LastIterateAccountant)
    register_accountant("last_iterate", LastIterateAccountant)
    assert registered_accountants()["last_iterate"] is LastIterateAccountant
    if OPACUS_VERSION >= (1, 6):
        import opacus.accountants.registry as opacus_registry

        assert opacus_registry._ACCOUNTANTS["last_iterate"] is LastIterateAccountant
        # On 1.6 nothing of Opacus is replaced.
        assert opacus.accountants.create_accountant is opacus_registry.create_accountant
        assert not hasattr(opacus.accountants.create_accountant, registration._SHIM_MARK)
    else:
        registration._install_compat_shim()
        shim = opacus.accountants.create_accountant
        assert getattr(shim, registration._SHIM_MARK) is True
        assert all(ns.create_accountant is shim for ns in CREATE_ACCOUNTANT_NAMESPACES)
        # Wrapped exactly once: the wrapped function is Opacus's own.
        original = shim.__wrapped__
        assert not hasattr(original, registration._SHIM_MARK)
        assert original.__module__ == "opacus.accountants"


@pytest.mark.usefixtures("isolated_registry")
def test_another_accountant_registers_through_our_function() -> None:
    register_accountant("dummy_for_tests", DummyAccountant)
    assert registered_accountants()["dummy_for_tests"] is DummyAccountant
    engine = PrivacyEngine(accountant="dummy_for_tests")
    assert type(engine.accountant) is DummyAccountant
    for namespace in CREATE_ACCOUNTANT_NAMESPACES:
        assert type(namespace.create_accountant(mechanism="dummy_for_tests")) is DummyAccountant
    # the built-in registration is untouched
    assert type(opacus.accountants.create_accountant("last_iterate")) is LastIterateAccountant


class _Abstract(IAccountant):
    @classmethod
    def mechanism(cls) -> str:
        return "abstract_for_tests"


class _NeedsArgument(DummyAccountant):
    def __init__(self, delta_error: float) -> None:
        super().__init__()

    @classmethod
    def mechanism(cls) -> str:
        return "needs_argument_for_tests"


@pytest.mark.usefixtures("isolated_registry")
@pytest.mark.parametrize(
    ("mechanism", "cls", "error", "fragment"),
    [
        ("", DummyAccountant, TypeError, "`mechanism`"),
        (3, DummyAccountant, TypeError, "`mechanism`"),
        ("rdp", DummyAccountant, ValueError, "'rdp'"),
        ("prv", LastIterateAccountant, ValueError, "'prv'"),
        ("dummy_for_tests", object, TypeError, "`accountant_cls`"),
        ("dummy_for_tests", DummyAccountant(), TypeError, "`accountant_cls`"),
        ("abstract_for_tests", _Abstract, TypeError, "abstract"),
        ("needs_argument_for_tests", _NeedsArgument, TypeError, "delta_error"),
        ("other_name", DummyAccountant, ValueError, "'dummy_for_tests'"),
    ],
)
def test_invalid_registrations_are_rejected(
    mechanism: Any, cls: Any, error: type[Exception], fragment: str
) -> None:
    before = registered_accountants()
    with pytest.raises(error) as info:
        register_accountant(mechanism, cls)
    assert fragment in str(info.value)
    assert registered_accountants() == before
    assert type(opacus.accountants.create_accountant("rdp")) is RDPAccountant


def test_get_noise_multiplier_uses_our_accountant_and_warns() -> None:
    from opacus.accountants.utils import get_noise_multiplier

    q, epochs, target = 0.05, 1, 3.0
    with pytest.warns(HeuristicCalibrationWarning):
        sigma = get_noise_multiplier(
            target_epsilon=target,
            target_delta=1e-5,
            sample_rate=q,
            epochs=epochs,
            accountant="last_iterate",
            robust=False,  # forwarded by Opacus to get_epsilon
        )
    steps = int(epochs / q)
    eps = privacy_model("heuristic", DPSGDRun.constant(steps=steps, sample_rate=q, noise_multiplier=sigma)).epsilon(1e-5)
    assert target - 0.01 <= eps <= target
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rdp_sigma = get_noise_multiplier(
            target_epsilon=target, target_delta=1e-5, sample_rate=q, epochs=epochs, accountant="rdp"
        )
    assert sigma < rdp_sigma  # the heuristic asks for less noise than a composition bound
