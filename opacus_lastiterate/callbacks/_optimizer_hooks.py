"""How a privacy monitor hooks into an Opacus ``DPOptimizer``, and how it lets go.

Opacus calls ``optimizer.step_hook`` (the accountant's hook) inside ``DPOptimizer.pre_step``,
after the noise is added and before the parameters change; ``DPOptimizer.step`` then calls
``original_optimizer.step()``, the update. :class:`OptimizerHooks` wraps one optimizer at a
time for one monitor:

* the step hook becomes the monitor's, and the accountant's is kept as
  :attr:`~OptimizerHooks.inner_hook`, for the monitor to call first;
* the wrapped optimizer gets an instance ``step`` that applies the update, unless the
  monitor refused the step (:attr:`~OptimizerHooks.skip_update`), and then calls the
  monitor (``DPOptimizer.step`` itself is left alone: learning-rate schedulers wrap it);
* ``pre_step``, called once per ``optimizer.step()`` call, virtual (skipped) steps included,
  is counted in :attr:`~OptimizerHooks.physical_steps`; the count at each queued (logical)
  step is noted (:meth:`~OptimizerHooks.mark`) until its record is made
  (:meth:`~OptimizerHooks.physical_steps_at`).

:meth:`~OptimizerHooks.remove` undoes all three. An optimizer has one monitor at most (a weak
registry, so that a forgotten optimizer is not kept alive).

The monitor (:class:`~opacus_lastiterate.callbacks.monitor.PrivacyMonitor`) validates with
:meth:`~OptimizerHooks.check` before it changes anything, then calls
:meth:`~OptimizerHooks.install`. It reads each step's learning rate with :func:`host_float`,
which never synchronises a device.
"""

from __future__ import annotations

import numbers
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["OptimizerHooks", "hooked_accountant", "host_float"]

_ATTACHED: weakref.WeakKeyDictionary[Any, object] = weakref.WeakKeyDictionary()
"""The monitor attached to each optimizer (one at most)."""


def host_float(value: object) -> float | None:
    """A learning rate as a float without a device synchronisation (None for a CUDA tensor)."""
    if isinstance(value, numbers.Real):
        return float(value)
    device = getattr(value, "device", None)
    if device is not None and getattr(device, "type", "cpu") == "cpu":
        return float(value)  # type: ignore[arg-type]
    return None


def hooked_accountant(hook: object) -> Any:
    """The Opacus accountant that an optimizer's step hook records into, when the hook
    shows it: a bound method of an accountant, or a function (the hook that
    ``get_optimizer_hook_fn`` returns) holding one among its closure's variables; None when
    it cannot be told (a hook of the user's)."""
    from opacus.accountants import IAccountant

    owner = getattr(hook, "__self__", None)
    if isinstance(owner, IAccountant):
        return owner
    for cell in getattr(hook, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, IAccountant):
            return value
    return None


class OptimizerHooks:
    """The wrapping of one Opacus ``DPOptimizer`` at a time (module docs).

    The object holds no reference to its monitor: the monitor's callbacks are passed to
    :meth:`install` and live on the optimizer while it is wrapped.
    """

    def __init__(self) -> None:
        self.optimizer: Any = None
        """The ``DPOptimizer`` wrapped (None when none is)."""
        self.inner_hook: Callable[[Any], None] | None = None
        """The optimizer's step hook before the last :meth:`install` (the accountant's)."""
        self.physical_steps = 0
        """``optimizer.step()`` calls seen while attached (virtual steps included)."""
        self.skip_update = False
        """True: the next update is not applied (the monitor refused its step)."""
        self._own_pre_step: Any = None  # the optimizer's own instance pre_step, if any
        self._physical_at: dict[int, int] = {}  # logical step -> physical steps then

    def mark(self, step: int) -> None:
        """Note the physical steps so far as those of the logical step ``step``."""
        self._physical_at[step] = self.physical_steps

    def physical_steps_at(self, step: int) -> int | None:
        """The physical steps noted at ``step`` (None if none were); the notes of the
        earlier steps are dropped then."""
        physical = self._physical_at.get(step)
        if physical is not None:
            for old in [s for s in self._physical_at if s < step]:
                del self._physical_at[old]
        return physical

    def restart(self, physical_steps: int) -> None:
        """Count from ``physical_steps`` (a restored checkpoint's), with no notes."""
        self.physical_steps = physical_steps
        self._physical_at = {}

    def check(self, optimizer: object, accountant: object = None) -> bool:
        """Whether ``optimizer`` may be wrapped now: True, or False when it is the one
        wrapped already.

        Raises:
            TypeError: if ``optimizer`` is not a ``DPOptimizer``.
            ValueError: if it has no step hook (no accountant attached), its hook records
                into another accountant than ``accountant`` (when given;
                :func:`hooked_accountant`), another monitor is attached to it, or this
                object wraps another optimizer.
        """
        from opacus.optimizers import DPOptimizer

        if not isinstance(optimizer, DPOptimizer):
            raise TypeError(
                "`optimizer` must be the Opacus DPOptimizer returned by make_private, got "
                f"{type(optimizer).__name__}."
            )
        if self.optimizer is not None:
            if self.optimizer is optimizer:
                return False
            raise ValueError("this PrivacyMonitor is attached to another optimizer already.")
        if optimizer in _ATTACHED:
            raise ValueError("`optimizer` has a PrivacyMonitor attached already.")
        if optimizer.step_hook is None:
            raise ValueError(
                "`optimizer` has no step hook: make_private attaches the accountant's hook; "
                "a monitor needs it to follow the accountant."
            )
        hooked = hooked_accountant(optimizer.step_hook)
        if accountant is not None and hooked is not None and hooked is not accountant:
            raise ValueError(
                "`optimizer` records its steps in another accountant than the monitor's (it "
                f"was made private by another PrivacyEngine: its hook feeds a "
                f"{type(hooked).__name__} that is not the monitor's "
                f"{type(accountant).__name__}); build the monitor on the engine that made "
                "this optimizer private."
            )
        return True

    def install(
        self,
        optimizer: Any,
        owner: object,
        step_hook: Callable[[Any], None],
        after_update: Callable[[], None],
    ) -> None:
        """Wrap ``optimizer`` (one that :meth:`check` accepted) for the monitor ``owner``:
        ``step_hook(optim)`` replaces its step hook, and the wrapped optimizer's ``step``
        applies the update (returning its result), then calls ``after_update()``; when
        :attr:`skip_update` is set it only clears it and returns None."""
        self.inner_hook = optimizer.step_hook
        optimizer.step_hook = step_hook
        inner = optimizer.original_optimizer
        inner_step = inner.step

        def step(*args: Any, **kwargs: Any) -> Any:
            if self.skip_update:
                self.skip_update = False
                return None
            out = inner_step(*args, **kwargs)
            after_update()
            return out

        inner.step = step  # instance attribute: DPOptimizer.step calls original_optimizer.step()
        self._own_pre_step = optimizer.__dict__.get("pre_step")
        pre_step = optimizer.pre_step

        def counted_pre_step(*args: Any, **kwargs: Any) -> Any:  # every physical step
            self.physical_steps += 1
            return pre_step(*args, **kwargs)

        # DPOptimizer.step calls self.pre_step() once per optimizer.step() call, skipped
        # (virtual) steps included; step itself is left alone (LR schedulers wrap it)
        optimizer.pre_step = counted_pre_step
        _ATTACHED[optimizer] = owner
        self.optimizer = optimizer

    def remove(self) -> None:
        """Undo :meth:`install` (the accountant's hook is restored); nothing when no
        optimizer is wrapped."""
        opt = self.optimizer
        if opt is None:
            return
        opt.step_hook = self.inner_hook
        opt.original_optimizer.__dict__.pop("step", None)
        if self._own_pre_step is not None:
            opt.pre_step = self._own_pre_step
        else:
            opt.__dict__.pop("pre_step", None)
        _ATTACHED.pop(opt, None)
        self.optimizer = None
