"""What the package needs of any Opacus accountant, its own or Opacus's (RDP, PRV, GDP): the
accountant behind an engine or optimizer hook, its steps and last step, a revision token,
validating a state before loading it, and taking steps back."""

from __future__ import annotations

from collections.abc import Mapping

from opacus.accountants import IAccountant

from opacus_lastiterate.accountants.base import RunAccountant, trim_history, validate_history

__all__ = []

def accountant_of(source: object) -> IAccountant:
    """The Opacus accountant of ``source``: a ``PrivacyEngine`` (its ``.accountant``) or an
    accountant itself.

    Raises:
        TypeError: for anything else.
    """
    accountant = getattr(source, "accountant", source)
    if not isinstance(accountant, IAccountant):
        raise TypeError(
            "`accountant` must be an Opacus accountant or a PrivacyEngine, got "
            f"{type(source).__name__}."
        )
    return accountant


def check_accountant_state(accountant: IAccountant, state: object) -> None:
    """Validate ``state`` as ``accountant.load_state_dict`` would take it, without loading:
    ours check all of it (:meth:`RunAccountant.check_state_dict`); for Opacus's own, the
    state must be a mapping whose ``"history"`` is a valid history.

    Raises:
        TypeError, ValueError: naming the bad entry; nothing changes.
    """
    if isinstance(accountant, RunAccountant):
        accountant.check_state_dict(state)  # type: ignore[arg-type]
        return
    if not isinstance(state, Mapping) or "history" not in state:
        raise ValueError(
            f"`state_dict` must be a mapping with the key 'history', got {type(state).__name__}."
        )
    validate_history(state["history"], "state_dict['history']")


def revision_of(accountant: IAccountant) -> object:
    """A token (compare with ``is``) that is replaced when the accountant's history is
    replaced and kept while steps are recorded: :attr:`RunAccountant.revision` for ours;
    None for Opacus's own, which have none (some replace their history list at every step),
    so that only a change of their step count can be noticed."""
    if isinstance(accountant, RunAccountant):
        return accountant.revision
    return None


def steps_of(accountant: IAccountant) -> int:
    """The number of steps an Opacus accountant has recorded (its history's total)."""
    if isinstance(accountant, RunAccountant):
        return accountant.num_steps
    return int(sum(h[2] for h in accountant.history))


def last_step_of(accountant: IAccountant) -> tuple[float, float]:
    """(noise_multiplier, sample_rate) of an Opacus accountant's last recorded step."""
    if isinstance(accountant, RunAccountant):
        return accountant.last_step
    sigma, q, _ = accountant.history[-1]
    return float(sigma), float(q)


def take_back_steps(accountant: IAccountant, steps: int = 1) -> None:
    """Remove the last ``steps`` recorded steps of any Opacus accountant
    (:meth:`RunAccountant.take_back` for ours; Opacus's own through their state dict)."""
    if isinstance(accountant, RunAccountant):
        accountant.take_back(steps)
        return
    state = dict(accountant.state_dict())
    state["history"] = trim_history(state["history"], steps)
    accountant.load_state_dict(state)
