"""Tell the accountant which batches ``make_private`` really draws.

Opacus hands an accountant only ``sample_rate = 1 / len(data_loader)``; the loader itself
(Poisson ``DPDataLoader``, or the user's own loader when ``poisson_sampling=False``) never
reaches it. :func:`install` wraps ``PrivacyEngine.make_private`` and
``PrivacyEngine.make_private_with_epsilon`` once (the wrappers are marked, so installing
twice is harmless) so that:

* after ``make_private`` returns, the loader it returns is read by
  :func:`~opacus_lastiterate.accountants.sampling_detection.detect_sampling` and the scheme
  is given to the engine's accountant when it is one of this package's
  (:meth:`~opacus_lastiterate.accountants.base.RunAccountant.observe_sampling`; a scheme
  the user declared with ``declare_sampling`` wins), with the privacy unit of its items
  (:meth:`~opacus_lastiterate.accountants.base.RunAccountant.observe_unit`: one user under
  user-level sampling, :mod:`opacus_lastiterate.user_samplers`). A sampler the package cannot model
  gets a :class:`~opacus_lastiterate.exceptions.SamplingWarning` naming it and what to do.
  With one of Opacus's own accountants (``"rdp"``, ``"prv"``, ``"gdp"``), a run that does
  not draw Poisson batches gets a warning that Opacus's epsilon assumes Poisson sampling
  and is not a guarantee for that run.
* while ``make_private_with_epsilon`` calibrates the noise (Opacus's
  ``get_noise_multiplier`` creates a fresh accountant by name), accountants of this package
  created in that call start with the scheme of the loader the call will use, and with the
  privacy unit of the engine's accountant (:mod:`.unit_setting`), so the noise multiplier is
  calibrated for the run that is trained and for what it protects; and for an adaptive
  optimizer (Adam, AdamW, ...) a ``LastIterateAccountant`` created there answers with the
  optimizer's weights (:mod:`~opacus_lastiterate.accountants.adaptive_plan`): the settings of
  the optimizer given to the call, assumed for every step, or the per-step
  ``optimizer_settings=`` keyword, which this wrapper takes out of the call (Opacus never sees
  it).

Reading the loader never aborts ``make_private``: anything unexpected is a warning, and the
accountant then keeps Opacus's Poisson view (labelled as assumed).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opacus_lastiterate._warn import warn
from opacus_lastiterate.accountants.base import RunAccountant, sampling_of_new_accountants
from opacus_lastiterate.accountants.sampling_detection import DetectedSampling, detect_sampling
from opacus_lastiterate.accountants.unit_setting import unit_of_new_accountants
from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit
from opacus_lastiterate.analysis.sampling import (
    PoissonSampling,
    SamplingScheme,
    effective_sampling,
)
from opacus_lastiterate.exceptions import SamplingWarning

if TYPE_CHECKING:
    from opacus_lastiterate.accountants.adaptive_plan import AdaptivePlan

__all__ = []

_MARK = "__opacus_lastiterate_sampling__"


def warn_about_detection(detected: DetectedSampling, accountant: object) -> None:
    """The warning a detected scheme calls for with ``accountant`` (none for a modelled
    scheme with one of this package's accountants, or Poisson with any accountant)."""
    scheme = detected.scheme
    if not detected.modelled:
        assumed = effective_sampling(scheme)
        assumed_text = assumed.describe() if assumed is not None else "Poisson sampling"
        warn(
            f"The data loader draws its batches with {detected.sampler}, whose privacy "
            "opacus_lastiterate cannot model; every epsilon of this run is computed assuming "
            f"{assumed_text} and labelled so. If you know how the batches are drawn, "
            "declare it (accountant.declare_sampling(ShuffledBatches(...)) and friends, "
            "docs/samplers.md), or train with Opacus's Poisson DPDataLoader "
            "(poisson_sampling=True) or opacus_lastiterate.samplers.balls_in_bins_data_loader.",
            SamplingWarning,
        )
    elif not isinstance(accountant, RunAccountant) and not isinstance(scheme, PoissonSampling):
        mechanism = getattr(type(accountant), "mechanism", lambda: "?")()
        warn(
            f"Opacus's {mechanism!r} accountant assumes Poisson sampling, but this run draws "
            f"{scheme.describe()}: the epsilon it reports is not a guarantee for this run. "
            "PrivacyEngine(accountant='last_iterate') and opacus_lastiterate's monitor report "
            "the numbers of this scheme, labelled for it (docs/samplers.md).",
            SamplingWarning,
        )


def _give_scheme(engine: Any, data_loader: Any) -> None:
    accountant = getattr(engine, "accountant", None)
    try:
        detected = detect_sampling(data_loader)
    except Exception as exc:  # never abort make_private
        warn(
            f"opacus_lastiterate could not read the data loader's sampler ({exc}); the "
            "numbers of this run assume Poisson sampling at Opacus's rate.",
            SamplingWarning,
        )
        return
    if isinstance(accountant, RunAccountant):
        accountant.observe_sampling(detected.scheme)
        accountant.observe_unit(detected.unit)
    warn_about_detection(detected, accountant)


def _wrap_make_private(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def make_private(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        # (module, optimizer, data_loader), or (..., criterion, data_loader) with ghost
        # clipping: the loader is always last.
        if isinstance(result, tuple) and result:
            _give_scheme(self, result[-1])
        return result

    setattr(make_private, _MARK, True)
    return make_private


def _wrap_make_private_with_epsilon(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def make_private_with_epsilon(self: Any, *args: Any, **kwargs: Any) -> Any:
        from opacus_lastiterate.accountants.adaptive_plan import adaptive_plan_of_new_accountants

        optimizer_settings = kwargs.pop("optimizer_settings", None)
        plan = _adaptive_plan(self, signature, args, kwargs, optimizer_settings)
        scheme: SamplingScheme | None = None
        unit = getattr(getattr(self, "accountant", None), "unit", None)
        unit = unit if isinstance(unit, PrivacyUnit) else None
        if isinstance(getattr(self, "accountant", None), RunAccountant):
            try:
                bound = signature.bind_partial(self, *args, **kwargs)
                poisson = bound.arguments.get("poisson_sampling", True)
                loader = bound.arguments.get("data_loader")
                if not poisson and loader is not None:
                    scheme = detect_sampling(loader).scheme
            except Exception:  # Opacus reports bad arguments itself
                scheme = None
        with (
            sampling_of_new_accountants(scheme),
            unit_of_new_accountants(unit),
            adaptive_plan_of_new_accountants(plan),
        ):
            return original(self, *args, **kwargs)

    setattr(make_private_with_epsilon, _MARK, True)
    return make_private_with_epsilon


def _adaptive_plan(
    engine: Any, signature: inspect.Signature, args: Any, kwargs: Any, settings: Any
) -> AdaptivePlan | None:
    """The plan of ``make_private_with_epsilon``'s adaptive run when the engine's accountant
    is the last-iterate one (:func:`~.adaptive_plan.plan_for_calibration`), else None;
    ``optimizer_settings`` with another accountant is a ValueError."""
    # imported here: without torch, the package's import names torch first (base, above)
    from opacus_lastiterate.accountants.adaptive_plan import plan_for_calibration
    from opacus_lastiterate.accountants.last_iterate import LastIterateAccountant

    if not isinstance(getattr(engine, "accountant", None), LastIterateAccountant):
        if settings is not None:
            raise ValueError(
                "`optimizer_settings` is for PrivacyEngine(accountant='last_iterate'): the "
                "other accountants do not read the optimizer's weights."
            )
        return None
    bound = signature.bind_partial(engine, *args, **kwargs).arguments
    missing = [k for k in ("optimizer", "data_loader", "max_grad_norm", "epochs") if k not in bound]
    if missing:
        return None  # Opacus reports the missing arguments itself
    loader = bound["data_loader"]
    steps = int(bound["epochs"] / (1 / len(loader)))  # get_noise_multiplier's number of steps
    return plan_for_calibration(
        optimizer=bound["optimizer"], optimizer_settings=settings, data_loader=loader,
        max_grad_norm=bound["max_grad_norm"], steps=steps,
    )  # fmt: skip


def install() -> None:
    """Wrap ``PrivacyEngine.make_private`` and ``make_private_with_epsilon`` (idempotent)."""
    from opacus import PrivacyEngine

    for name, wrap in (
        ("make_private", _wrap_make_private),
        ("make_private_with_epsilon", _wrap_make_private_with_epsilon),
    ):
        current = getattr(PrivacyEngine, name, None)
        if current is None or getattr(current, _MARK, False):
            continue
        setattr(PrivacyEngine, name, wrap(current))
