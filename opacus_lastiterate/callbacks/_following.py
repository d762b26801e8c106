"""How a privacy monitor follows its accountant: noticing a change it did not make.

A monitor evaluates the steps it sees pass through the accountant's hook. Anything else that
changes the accountant (``load_state_dict``, as ``PrivacyEngine.load_checkpoint`` calls it; an
assigned history; steps taken back; steps recorded by another optimizer made private with the
same accountant) would leave its records and its budget guard describing another run.
:class:`AccountantWatch` tells, in O(1) per step, whether the accountant is where the monitor
left it (its :func:`~opacus_lastiterate.accountants.any_accountant.revision_of` token and its step
count), describes a change (:class:`Change`) and warns about it; the monitor then emits the
records of the steps it saw and restarts from the accountant's state
(``docs/callbacks.md``, "Resuming with Opacus's own checkpoints").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opacus_lastiterate._warn import warn
from opacus_lastiterate.accountants.any_accountant import revision_of, steps_of
from opacus_lastiterate.accountants.base import trim_history
from opacus_lastiterate.exceptions import MonitorWarning

__all__ = ["AccountantWatch", "Change"]


@dataclass(frozen=True)
class Change:
    """A change of the accountant that its monitor did not make."""

    seen: int
    """The steps the monitor had seen."""
    steps: int
    """The accountant's steps now (less those its hook has just recorded)."""
    replaced: bool
    """Whether its history was replaced (else: steps were recorded elsewhere)."""

    @property
    def foreign(self) -> bool:
        """Steps recorded by someone else (another optimizer), the history kept."""
        return not self.replaced and self.steps > self.seen

    def cause(self) -> str:
        if self.replaced:
            return (
                "its history was replaced (load_state_dict, an assigned history or steps "
                f"taken back): {self.seen} step(s) seen, {self.steps} now"
            )
        if self.foreign:
            return (
                f"it recorded {self.steps - self.seen} step(s) that did not pass through this "
                "monitor (another optimizer made private with the same accountant, or its "
                "step() called directly)"
            )
        return f"it has {self.steps} step(s), fewer than the {self.seen} this monitor saw"


class AccountantWatch:
    """Whether ``accountant`` is where its monitor left it (module docs)."""

    def __init__(self, accountant: Any) -> None:
        self.accountant = accountant
        self._revision = revision_of(accountant)
        self._warned_foreign = False

    def mark(self) -> None:
        """The accountant's state now is the one the monitor follows (after a sync, or a
        change the monitor made itself, such as a step taken back)."""
        self._revision = revision_of(self.accountant)

    def in_line(self, seen: int) -> bool:
        """Whether the accountant holds the same history as at :meth:`mark`, with ``seen``
        steps (O(1) for this package's accountants)."""
        acc = self.accountant
        return revision_of(acc) is self._revision and steps_of(acc) == seen

    def refuse_if_missed(self, seen: int) -> None:
        """After the optimizer's hook ran: raise if it recorded nothing in the accountant.

        Raises:
            RuntimeError: if the accountant is unchanged (``seen`` steps, the same history).
        """
        if self.in_line(seen):
            raise RuntimeError(
                "PrivacyMonitor: the optimizer's step hook did not record this step in the "
                "monitor's accountant (the optimizer was made private by another "
                "PrivacyEngine, or its hook was replaced): the monitor would report steps "
                "that were not accounted. Build the monitor on the engine that made this "
                "optimizer private."
            )

    def change(self, seen: int, *, recorded: int = 0, attached: bool = True) -> Change | None:
        """The change since :meth:`mark`, if any: the accountant's steps less the
        ``recorded`` ones its hook has just added are not ``seen``, or its history was
        replaced. Steps recorded while the monitor is detached (``attached`` False) are not
        a change here (``finish()`` reports them)."""
        acc = self.accountant
        steps = steps_of(acc) - recorded
        replaced = revision_of(acc) is not self._revision
        if not replaced and (steps == seen or (steps > seen and not attached)):
            return None
        return Change(seen=seen, steps=steps, replaced=replaced)

    def report(self, change: Change) -> None:
        """A :class:`MonitorWarning` for ``change``, unless the monitor had seen no step (as
        if it were attached now) or it is more steps of another optimizer (warned once)."""
        if not change.seen or (change.foreign and self._warned_foreign):
            return
        self._warned_foreign = self._warned_foreign or change.foreign
        warn(
            f"PrivacyMonitor: the accountant changed without this monitor: {change.cause()}. "
            f"The monitor follows it from its state at step {change.steps}: the records (and "
            "the budget guard) from there on are of the accountant's whole history"
            + (" (at every step where this happens; warned once)" if change.foreign else "")
            + ". To resume a run, load the checkpoint before attaching the monitor "
            "(docs/callbacks.md, 'Checkpoints and resuming').",
            MonitorWarning,
        )

    def align(self, fed: Any, recorded: int = 0) -> None:
        """Give ``fed`` (a corrected accountant the monitor feeds itself) the accountant's
        history less its last ``recorded`` steps, its own configuration kept."""
        state = dict(fed.state_dict())
        state["history"] = trim_history(self.accountant.history, recorded)
        state.pop("sampling", None)  # of the history replaced
        fed.load_state_dict(state)
