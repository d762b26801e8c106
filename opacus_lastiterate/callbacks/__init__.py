"""Privacy monitoring during training: a framework-free monitor, sinks and adapters.

* :class:`PrivacyMonitor` (:mod:`.monitor`) attaches to an Opacus ``DPOptimizer`` and
  records, after every step, the heuristic, robust, standard and corrected epsilon (each on
  its cadence, each labelled), with an optional :class:`PrivacyBudget` that stops training
  before the step that would exceed it.
* Sinks (:mod:`.sinks`): logging, JSONL, CSV, TensorBoard, Weights & Biases, MLflow.
* Adapters, imported on first access so that the monitor never needs the frameworks:
  :class:`PrivacyMonitorCallback` for PyTorch Lightning 2.x (:mod:`.lightning`, extra
  ``lightning``) and :class:`HFPrivacyCallback` for Hugging Face ``transformers`` 5.x
  (:mod:`.huggingface`, extra ``hf``). In a plain loop, call ``monitor.attach(optimizer)``
  once and ``monitor.finish()`` at the end.
* :class:`InTrainingCanaryAudit` (:mod:`.canary_audit`): an in-training canary audit of the
  final model in one run (gradient and input canaries; one-run lower bounds beside the
  heuristic and standard epsilons).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from opacus_lastiterate._requires import requires

with requires("opacus_lastiterate.callbacks", "torch", "opacus"):  # clear error without torch
    from opacus_lastiterate.callbacks.canary_audit import (
        CanaryAuditResult,
        InTrainingAuditReport,
        InTrainingCanaryAudit,
    )
    from opacus_lastiterate.callbacks.monitor import (
        LABELS,
        EpsilonRecord,
        MonitorAudit,
        PrivacyBudget,
        PrivacyMonitor,
    )
    from opacus_lastiterate.callbacks.sinks import (
        CsvSink,
        JsonlSink,
        LoggingSink,
        MlflowSink,
        TensorBoardSink,
        WandbSink,
    )
from opacus_lastiterate.exceptions import MonitorWarning, PrivacyBudgetExceededError

if TYPE_CHECKING:
    from opacus_lastiterate.callbacks.huggingface import HFPrivacyCallback
    from opacus_lastiterate.callbacks.lightning import PrivacyMonitorCallback

_LAZY = {
    "PrivacyMonitorCallback": "opacus_lastiterate.callbacks.lightning",
    "HFPrivacyCallback": "opacus_lastiterate.callbacks.huggingface",
}

__all__ = [
    "LABELS",
    "CanaryAuditResult",
    "CsvSink",
    "EpsilonRecord",
    "HFPrivacyCallback",
    "InTrainingAuditReport",
    "InTrainingCanaryAudit",
    "JsonlSink",
    "LoggingSink",
    "MlflowSink",
    "MonitorAudit",
    "MonitorWarning",
    "PrivacyBudget",
    "PrivacyBudgetExceededError",
    "PrivacyMonitor",
    "PrivacyMonitorCallback",
    "TensorBoardSink",
    "WandbSink",
]


def __getattr__(name: str) -> Any:
    """The framework adapters, imported on first access (PEP 562)."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
