"""PyTorch Lightning 2.x adapter of :class:`~opacus_lastiterate.callbacks.PrivacyMonitor`.

Extra ``lightning`` (``pip install opacus-lastiterate[lightning]``). Two classes, one per
Lightning namespace, because a Trainer accepts only callbacks of its own package:

* :class:`PrivacyMonitorCallback` for ``lightning.pytorch`` (the ``lightning`` package; falls
  back to ``pytorch_lightning`` when only that is installed);
* :class:`PLPrivacyMonitorCallback` for ``pytorch_lightning``, the namespace of Opacus's
  ``opacus.lightning.DPLightningDataModule``.

What the callback does: at ``on_train_start`` it tells the monitor which batches the
Trainer's train loader draws (:meth:`~opacus_lastiterate.callbacks.PrivacyMonitor.observe_loader`:
Poisson for Opacus's ``DPDataLoader``/``DPLightningDataModule``, shuffled for a plain
``shuffle=True`` loader, ...) and attaches the monitor to the Opacus
``DPOptimizer`` among ``trainer.optimizers`` (the one ``make_private`` returned in
``configure_optimizers``); at ``on_train_batch_end`` it turns a budget stop
(``monitor.should_stop``) into ``trainer.should_stop``; at ``on_train_epoch_end`` it flushes the monitor (records
are also flushed every ``flush_every`` steps); at ``on_train_end`` it calls
``monitor.finish()``. Its ``state_dict`` is the monitor's (taken after a flush), saved in
Lightning checkpoints with the accountant's history (which Lightning would not save
otherwise) and restored on ``trainer.fit(ckpt_path=...)``: the accountant continues from
the checkpoint's step and the monitor's JSONL/CSV sinks drop any record written after it, so
a resumed run logs every step once (``tests/callbacks/test_lightning.py`` resumes a run
interrupted after its checkpoint and compares it with an uninterrupted one).
"""

from __future__ import annotations

import importlib
from typing import Any

from opacus_lastiterate.callbacks.monitor import PrivacyMonitor

__all__ = ["PrivacyMonitorCallback"]  # and PLPrivacyMonitorCallback, built on access


def _find_dp_optimizer(trainer: Any) -> Any:
    from opacus.optimizers import DPOptimizer

    for opt in trainer.optimizers:
        inner = getattr(opt, "optimizer", opt)  # a LightningOptimizer wraps the optimizer
        if isinstance(opt, DPOptimizer):
            return opt
        if isinstance(inner, DPOptimizer):
            return inner
    raise ValueError(
        "PrivacyMonitorCallback: no Opacus DPOptimizer among trainer.optimizers; call "
        "PrivacyEngine.make_private in configure_optimizers and return its optimizer."
    )


class _MonitorCallbackMixin:
    """The callback's behaviour, shared by both Lightning namespaces."""

    def __init__(self, monitor: PrivacyMonitor, *, finish_on_train_end: bool = True) -> None:
        """Args:
        monitor: the :class:`PrivacyMonitor` to drive (attached to the DPOptimizer at
            ``on_train_start`` unless attached already).
        finish_on_train_end: call ``monitor.finish()`` when training ends.
        """
        if not isinstance(monitor, PrivacyMonitor):
            raise TypeError(f"`monitor` must be a PrivacyMonitor, got {type(monitor).__name__}.")
        if not isinstance(finish_on_train_end, bool):
            raise TypeError(f"`finish_on_train_end` must be a bool, got {finish_on_train_end!r}.")
        super().__init__()
        self.monitor = monitor
        self.finish_on_train_end = finish_on_train_end

    @property
    def state_key(self) -> str:
        return "PrivacyMonitorCallback"

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        loader = getattr(trainer, "train_dataloader", None)
        if loader is not None and not callable(loader):  # what it iterates, resumed included
            self.monitor.observe_loader(loader)
        if not self.monitor.attached:
            self.monitor.attach(_find_dp_optimizer(trainer), pl_module)
        if self.monitor.should_stop:
            trainer.should_stop = True

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.monitor.should_stop:
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.monitor.flush()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.finish_on_train_end:
            self.monitor.finish()

    def state_dict(self) -> dict[str, Any]:
        return self.monitor.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.monitor.load_state_dict(state_dict)


def _callback_base(*modules: str) -> type:
    for name in modules:
        try:
            return importlib.import_module(name).Callback  # type: ignore[no-any-return]
        except ImportError:
            continue
    raise ImportError(
        f"PrivacyMonitorCallback needs PyTorch Lightning ({' or '.join(modules)}): "
        "pip install 'opacus-lastiterate[lightning]'."
    )


_Base: Any = _callback_base("lightning.pytorch", "pytorch_lightning")


class PrivacyMonitorCallback(_MonitorCallbackMixin, _Base):  # type: ignore[misc,valid-type]
    """Lightning callback that drives a :class:`PrivacyMonitor` (module docs).

    Example::

        engine = PrivacyEngine(accountant="last_iterate")   # used in configure_optimizers
        monitor = PrivacyMonitor(engine, delta=1e-5, sinks=[CsvSink("privacy.csv")],
                                 budget=PrivacyBudget(8.0, action="stop"))
        trainer = Trainer(callbacks=[PrivacyMonitorCallback(monitor)])
    """


def __getattr__(name: str) -> Any:
    """:class:`PLPrivacyMonitorCallback`, built on first access (needs pytorch_lightning)."""
    if name == "PLPrivacyMonitorCallback":
        base = _callback_base("pytorch_lightning")
        cls = type(
            "PLPrivacyMonitorCallback",
            (_MonitorCallbackMixin, base),
            {
                "__doc__": "PrivacyMonitorCallback for the ``pytorch_lightning`` namespace "
                "(Opacus's DPLightningDataModule).",
                "__module__": __name__,
            },
        )
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
