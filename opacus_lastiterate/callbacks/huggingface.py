"""Hugging Face ``transformers`` 5.x adapter of :class:`~opacus_lastiterate.callbacks.PrivacyMonitor`.

Extra ``hf``. Pass the ``DPOptimizer`` of Opacus 1.6's ``make_private(..., wrap_model=False)``
(so that the ``Trainer`` keeps the user's model) as ``Trainer(optimizers=(dp_optimizer,
None), callbacks=[HFPrivacyCallback(monitor)])``, with ``TrainingArguments(max_grad_norm=0.0)``
(``docs/callbacks.md``, "Lightning and Hugging Face", has the whole example).

``max_grad_norm=0.0`` turns off the Trainer's own clipping of ``p.grad`` (Opacus clips per
example). The Trainer's data loader samples fixed-size shuffled batches, not Poisson
batches: ``on_train_begin`` reads that loader
(:meth:`~opacus_lastiterate.callbacks.PrivacyMonitor.observe_loader`), so the accountant and
the log account shuffled batches, labelled so (``docs/samplers.md``); make the loader passed
to ``make_private`` have the Trainer's batch size so that the recorded rate matches.

Events: ``on_train_begin`` tells the monitor which batches the Trainer draws and attaches it to the ``DPOptimizer`` (unwrapping
Accelerate's ``AcceleratedOptimizer``); ``on_optimizer_step`` clears Opacus's per-sample
gradients (the Trainer calls ``model.zero_grad()``, which leaves ``p.grad_sample`` in place);
``on_step_end`` turns a budget stop into ``control.should_training_stop``; ``on_log`` and
``on_epoch_end`` flush the monitor; ``on_train_end`` calls ``monitor.finish()``.

Checkpoints: the callback is an ``ExportableState``; the Trainer saves its :meth:`state` (the
monitor's state, taken after a flush) in ``trainer_state.json`` (``stateful_callbacks``). On
``trainer.train(resume_from_checkpoint=...)`` the state is loaded into the monitor either by
the Trainer (with ``TrainingArguments(restore_callback_states_from_checkpoint=True)`` it
rebuilds the callback as ``HFPrivacyCallback(key=...)`` and sets ``monitor_state``; the
rebuilt callback finds the live monitor registered under the same ``key``) or, with the
default ``False``, by ``on_train_begin``, which finds it in the resumed Trainer state.
Either way the accountant continues from the checkpoint's step and the JSONL/CSV sinks drop
any record written after it (``tests/callbacks/test_huggingface.py`` resumes an interrupted
run and compares it with an uninterrupted one).
"""

from __future__ import annotations

import weakref
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from opacus_lastiterate.callbacks.monitor import PrivacyMonitor

__all__ = ["HFPrivacyCallback"]

_MONITORS: weakref.WeakValueDictionary[str, PrivacyMonitor] = weakref.WeakValueDictionary()


def _find_dp_optimizer(optimizer: Any) -> Any:
    from opacus.optimizers import DPOptimizer

    seen = 0
    while optimizer is not None and not isinstance(optimizer, DPOptimizer) and seen < 8:
        optimizer, seen = getattr(optimizer, "optimizer", None), seen + 1
    if not isinstance(optimizer, DPOptimizer):
        raise ValueError(
            "HFPrivacyCallback: the Trainer's optimizer is not an Opacus DPOptimizer; pass "
            "optimizers=(dp_optimizer, None) with the optimizer make_private returned."
        )
    return optimizer


class HFPrivacyCallback(TrainerCallback, ExportableState):
    """``transformers.TrainerCallback`` that drives a :class:`PrivacyMonitor` (module docs).

    Args:
        monitor: the monitor; None only when the Trainer rebuilds the callback from a
            checkpoint (then the monitor registered under ``key`` is used).
        key: the name under which the monitor is registered for that rebuild (one per
            monitor in a process).
        finish_on_train_end: call ``monitor.finish()`` when training ends.
    """

    def __init__(
        self,
        monitor: PrivacyMonitor | None = None,
        *,
        key: str = "privacy",
        finish_on_train_end: bool = True,
    ) -> None:
        if not isinstance(key, str) or not key:
            raise TypeError(f"`key` must be a non-empty str, got {key!r}.")
        if monitor is None:
            found = _MONITORS.get(key)
            if found is None:
                raise ValueError(
                    f"`monitor` is None and no PrivacyMonitor is registered under key={key!r}."
                )
            monitor = found
        if not isinstance(monitor, PrivacyMonitor):
            raise TypeError(f"`monitor` must be a PrivacyMonitor, got {type(monitor).__name__}.")
        _MONITORS[key] = monitor
        self.monitor, self.key, self.finish_on_train_end = monitor, key, finish_on_train_end

    # -- state (ExportableState) ------------------------------------------------------------

    @property
    def monitor_state(self) -> dict[str, Any]:
        """The monitor's :meth:`~PrivacyMonitor.state_dict`; assigning loads it."""
        return self.monitor.state_dict()

    @monitor_state.setter
    def monitor_state(self, state: dict[str, Any]) -> None:
        self.monitor.load_state_dict(state)

    def state(self) -> dict[str, Any]:
        """What the Trainer stores in ``trainer_state.json``."""
        return {
            "args": {"key": self.key, "finish_on_train_end": self.finish_on_train_end},
            "attributes": {"monitor_state": self.monitor_state},
        }

    # -- events ---------------------------------------------------------------------------------

    def _saved_state(self, state: Any) -> dict[str, Any] | None:
        """This callback's monitor state in the Trainer state (a checkpoint's when resuming)."""
        saved = getattr(state, "stateful_callbacks", None) or {}
        entries = saved.get(type(self).__name__, [])
        for entry in entries if isinstance(entries, list) else [entries]:
            if isinstance(entry, dict) and entry.get("args", {}).get("key") == self.key:
                found = entry.get("attributes", {}).get("monitor_state")
                return found if isinstance(found, dict) else None
        return None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        saved = self._saved_state(state)
        if saved is not None:  # resuming without restore_callback_states_from_checkpoint
            history = saved.get("accountant", {}).get("history", [])
            if sum(int(h[2]) for h in history) != self.monitor.num_steps:
                self.monitor.load_state_dict(saved)
        loader = kwargs.get("train_dataloader")
        if loader is not None:  # the loader the Trainer iterates, resumed runs included
            self.monitor.observe_loader(loader)
        if not self.monitor.attached:
            self.monitor.attach(_find_dp_optimizer(kwargs.get("optimizer")), kwargs.get("model"))
        if self.monitor.should_stop:
            control.should_training_stop = True
        return control

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        opt = self.monitor.optimizer
        if opt is not None:
            opt.zero_grad(set_to_none=True)  # clears p.grad_sample, which model.zero_grad keeps
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.monitor.should_stop:
            control.should_training_stop = True
        return control

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.monitor.flush()
        return control

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.monitor.flush()
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.finish_on_train_end:
            self.monitor.finish()
        return control
