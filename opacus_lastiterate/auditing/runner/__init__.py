"""Many-run audits of a real training function (``docs/auditing.md``, "Pipeline (multi-run)").

- :mod:`.contract`: what ``train`` and ``score`` are (:class:`TrainFunction`,
  :class:`ScoreFunction`) and which coin and seed each run gets (:func:`run_assignment`);
- :mod:`.audit_runner`: :class:`AuditRunner` (train, record, audit), :func:`run_audit` and
  :func:`audit_records` (re-audit recorded runs, training nothing);
- :mod:`.process_pool` and :mod:`.ray_backend`: where the runs execute (a local spawn-safe
  process pool, or one Ray task per run);
- :mod:`.records`: the resumable JSON-lines record files (:class:`RunRecords`,
  :func:`read_records`); :mod:`.identity`: the configuration hash they are checked against.

Importing this package loads neither torch nor Opacus (nor Ray).
"""

from opacus_lastiterate.auditing.runner.audit_runner import AuditRunner, audit_records, run_audit
from opacus_lastiterate.auditing.runner.contract import (
    ScoreFunction,
    TrainFunction,
)
from opacus_lastiterate.auditing.runner.records import (
    RECORD_FORMAT,
    RunRecord,
    RunRecords,
    read_records,
)

__all__ = [
    "RECORD_FORMAT",
    "AuditRunner",
    "RunRecord",
    "RunRecords",
    "ScoreFunction",
    "TrainFunction",
    "audit_records",
    "read_records",
    "run_audit",
]
