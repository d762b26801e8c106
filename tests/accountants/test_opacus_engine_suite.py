"""Opacus's own PrivacyEngine tests, with each of our accountants as the engine's default.

The test classes are imported from the installed Opacus wheel
(``opacus/tests/privacy_engine_test.py``), never copied here. For every registered accountant
of ours and every (not skipped) test class there, a subclass is generated whose ``setUp``

* makes ``PrivacyEngine()`` default to ``accountant=<ours>`` (``PrivacyEngine.__init__``'s
  keyword default is patched for the test's duration), and
* makes ``PrivacyEngine.make_private`` first configure the engine's accountant from the
  DataLoader it is given (``"asgm"`` and ``"feasgm"`` need N and L, which Opacus never passes
  to an accountant: ``_contract_helpers.make_answerable``), as a user of those must.

Hypothesis tests run on explicit, fixed examples (``EXAMPLES``: the whole space where it is
finite) instead of a random search, so the run is deterministic and short. Tests that cannot
run here or that do not involve the accountant are listed in ``EXCLUDED`` (all accountants)
and ``EXCLUDED_FOR`` (one accountant), with the reason; they are reported as skipped.

By default one model family (``DEFAULT_CLASSES``) runs for every accountant; the other
families are marked ``slow`` (``make test-slow``).

Expected to fail until our accountants accept ``noise_multiplier=0.0`` (a configuration
Opacus accepts; see test_contract.py, item 7): every test that trains with zero noise
(``test_checkpoints``, ``test_flat_clipping``, ``test_sample_grad_aggregation``, the
``do_noise=False`` examples of ``test_compare_to_vanilla``).
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import unittest
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
import torch
from opacus import PrivacyEngine

from opacus_lastiterate.accountants.registration import registered_accountants

from ._contract_helpers import (
    TORCHVISION_IS_STAND_IN,
    load_opacus_test_module,
    make_answerable,
    registered_names,
)

try:
    _opacus_tests = load_opacus_test_module("privacy_engine_test")
except ImportError as err:  # a wheel without its tests, or one of their imports missing
    pytest.skip(
        f"opacus.tests.privacy_engine_test cannot be imported: {err}", allow_module_level=True
    )

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning",
    "ignore::opacus_lastiterate.accountants.NormalisationWarning",
)

_BASE = _opacus_tests.BasePrivacyEngineTest

_TORCHVISION_MODELS = (
    "builds a torchvision model (torchvision is not a dependency of this project"
    + ("; the stand-in used here has no models" if TORCHVISION_IS_STAND_IN else "")
    + ")"
)

EXCLUDED: dict[str, str] = {
    "test_model_validator": (
        f"{_TORCHVISION_MODELS}; and no accountant is involved: make_private rejects the "
        "ResNet-18 in ModuleValidator before the accountant's hook is attached."
    ),
    "test_model_validator_after_fix": (
        f"{_TORCHVISION_MODELS}; make_private on a ResNet-18 only constructs the accountant "
        "and attaches its hook, no step is taken (test_basic covers that path, with steps)."
    ),
    "test_validator_weight_update_check": (
        f"{_TORCHVISION_MODELS} (DenseNet-121, seconds to build); no step is taken, so the "
        "accountant is only constructed."
    ),
    "test_generate_noise_in_secure_mode": (
        "skipped by Opacus itself (needs torchcsprng); tests noise generation, no accountant."
    ),
}
"""Opacus tests not run for any accountant, with the reason."""

_NO_CALIBRATION = (
    "calibration is documented as unsupported for this accountant: make_private_with_epsilon "
    "creates a fresh, unconfigured accountant by name in get_noise_multiplier, which raises "
    "ValueError (it needs dataset_size/batch_size). test_contract.py::"
    "test_make_private_with_epsilon_calibrates_or_fails_clearly checks that error is clear."
)

EXCLUDED_FOR: dict[str, dict[str, str]] = {
    "asgm": {"test_make_private_with_epsilon": _NO_CALIBRATION},
    "feasgm": {"test_make_private_with_epsilon": _NO_CALIBRATION},
}
"""Opacus tests not run for one accountant, with the reason."""

EXCLUDED_CLASSES: dict[str, str] = {
    cls_name: f"skipped by Opacus itself: {obj.__unittest_skip_why__}"
    for cls_name, obj in vars(_opacus_tests).items()
    if isinstance(obj, type)
    and issubclass(obj, unittest.TestCase)
    and issubclass(obj, _BASE)
    and getattr(obj, "__unittest_skip__", False)
}
"""Opacus test classes not run (those Opacus skips), with the reason."""

DEFAULT_CLASSES = (
    "PrivacyEngineConvNetTest",
    "PrivacyEngineCustomLayerTest",
    "PrivacyEngineCustomLayerHooksTest",
    "PrivacyEngineTextTest",
)
"""Run by default: conv/norm layers (FakeData images), custom layers (wrapped and hooks
mode), attention on text (batch second); the other families and grad-sample modes are
``slow``."""

EXAMPLES: dict[str, list[dict[str, Any]]] = {
    "test_compare_to_vanilla": [
        {"do_clip": clip, "do_noise": noise, "use_closure": closure, "max_steps": steps}
        for clip, noise, closure, steps in itertools.product(
            (False, True), (False, True), (False, True), (1, 3)
        )
    ],
    "test_checkpoints": [
        {"has_noise_scheduler": noise, "has_grad_clip_scheduler": clip}
        for noise, clip in itertools.product((False, True), repeat=2)
    ],
    "test_noise_level": [
        {"noise_multiplier": sigma, "max_steps": steps, "secure_mode": False}
        for sigma, steps in ((0.5, 3), (1.7, 4), (5.0, 5))
    ],
}
"""Fixed examples for Opacus's Hypothesis tests (their strategies' ranges)."""


def _with_examples(test: Any, examples: list[dict[str, Any]]) -> Any:
    """Run a Hypothesis test's body on fixed examples; keep the test as it is if its
    parameters are not those of the examples (another Opacus version)."""
    inner = test.hypothesis.inner_test
    params = set(inspect.signature(inner).parameters) - {"self"}
    if any(set(example) != params for example in examples):
        return test

    def run(self: unittest.TestCase) -> None:
        for example in examples:
            with self.subTest(**example):
                inner(self, **example)

    run.__name__, run.__doc__ = test.__name__, test.__doc__
    return run


def _excluded(reason: str) -> Callable[..., None]:
    @unittest.skip(reason)
    def skipped(self: unittest.TestCase) -> None:  # pragma: no cover - never runs
        pass

    return skipped


def _set_up(opacus_cls: type, name: str) -> Callable[[unittest.TestCase], None]:
    original_make_private = PrivacyEngine.make_private

    def make_private(engine: PrivacyEngine, *args: Any, **kwargs: Any) -> Any:
        loader = kwargs.get("data_loader")
        if loader is not None and engine.accountant.mechanism() == name:
            make_answerable(engine.accountant, data_loader=loader)
        return original_make_private(engine, *args, **kwargs)

    def setUp(self: unittest.TestCase) -> None:
        stack = contextlib.ExitStack()
        self.addCleanup(stack.close)
        stack.enter_context(
            mock.patch.dict(PrivacyEngine.__init__.__kwdefaults__, {"accountant": name})
        )
        stack.enter_context(mock.patch.object(PrivacyEngine, "make_private", make_private))
        # Tiny models: one thread is faster, and much faster on a shared 2-core machine.
        stack.callback(torch.set_num_threads, torch.get_num_threads())
        torch.set_num_threads(1)
        opacus_cls.setUp(self)

    return setUp


def _test_default_accountant_is_ours(name: str) -> Callable[[unittest.TestCase], None]:
    def test_default_accountant_is_ours(self: unittest.TestCase) -> None:
        """The swap is in force: the rest of the class really runs with our accountant."""
        self.assertIs(type(PrivacyEngine().accountant), registered_accountants()[name])

    return test_default_accountant_is_ours


def _generate(opacus_cls: type, name: str) -> type:
    namespace: dict[str, Any] = {
        "setUp": _set_up(opacus_cls, name),
        "test_default_accountant_is_ours": _test_default_accountant_is_ours(name),
        "__module__": __name__,
        "__qualname__": f"{opacus_cls.__name__}__{name}",
        "__doc__": f"Opacus's {opacus_cls.__name__} with PrivacyEngine(accountant={name!r}).",
    }
    for attr in dir(opacus_cls):
        test = getattr(opacus_cls, attr)
        if attr.startswith("test") and hasattr(test, "hypothesis") and attr in EXAMPLES:
            namespace[attr] = _with_examples(test, EXAMPLES[attr])
    for test_name, reason in {**EXCLUDED, **EXCLUDED_FOR.get(name, {})}.items():
        if hasattr(opacus_cls, test_name):
            namespace[test_name] = _excluded(reason)
    if opacus_cls.__name__ not in DEFAULT_CLASSES:
        namespace["pytestmark"] = [pytest.mark.slow]
    return type(f"{opacus_cls.__name__}__{name}", (opacus_cls,), namespace)


OPACUS_CLASSES = sorted(
    cls_name
    for cls_name, obj in vars(_opacus_tests).items()
    if isinstance(obj, type)
    and issubclass(obj, unittest.TestCase)
    and issubclass(obj, _BASE)
    and cls_name not in EXCLUDED_CLASSES
)


def _generate_all() -> dict[str, type]:
    generated = (
        _generate(getattr(_opacus_tests, cls_name), name)
        for cls_name, name in itertools.product(OPACUS_CLASSES, registered_names())
    )
    return {cls.__name__: cls for cls in generated}


globals().update(_generate_all())


def test_default_classes_exist() -> None:
    """The default subset names classes that this Opacus version ships."""
    assert set(DEFAULT_CLASSES) & set(OPACUS_CLASSES)
