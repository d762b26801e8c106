"""Input-space audits: real examples as canaries, scored on final models
(``docs/input_audits.md``).

- :mod:`.canaries`: input canaries (in-distribution, mislabelled, blank, clip-backdoor,
  user-supplied) and their loss / logit-margin scores;
- :mod:`.canary_set`: m mislabelled canaries with fair coins, for one-run audits
  (:func:`make_input_canaries`, used by the in-training canary audit);
- :mod:`.canary_users`: m canary users of k records sharing one secret label, with fair
  coins, for one-run audits under user-level sampling (:func:`make_canary_users`);
- :mod:`.text_canaries`: m text canaries (random tokens, or secrets in a template sentence)
  with fair coins, for one-run audits of language models (:func:`make_text_canaries`);
- :mod:`.adversarial_samples`: crafted adversarial samples (uniform and adaptive expansion);
- :mod:`.worst_case_init`: worst-case initialisation;
- :mod:`.training`: an Opacus trainer on digits with an input canary;
- :mod:`.batched_training`: many full-batch DP-GD runs at once (:class:`BatchedDPGD`);
- :mod:`.protocols`: the published protocols (Yoon et al.; Annamalai-De Cristofaro) as
  presets of the digits audit (:func:`yoon_protocol`, :func:`annamalai_protocol`,
  :func:`run_protocol`);
- :mod:`.audit`: canary vs crafted samples on the same evaluation runs, crafted on disjoint
  runs; :mod:`.model_cache`: final models kept on disk.

Names resolve lazily on first access (torch loads then).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opacus_lastiterate._lazy import lazy_attributes
from opacus_lastiterate._requires import require

if TYPE_CHECKING:
    from opacus_lastiterate.auditing.input_space.adversarial_samples import (
        CRAFTING_OBJECTIVES,  # the names resolved lazily by __getattr__, for type checkers and IDEs
        CraftedSample,
        craft_adversarial_sample,
    )
    from opacus_lastiterate.auditing.input_space.audit import (
        InputAuditReport,
        SampleAudit,
        run_input_audit,
    )
    from opacus_lastiterate.auditing.input_space.batched_training import (
        BatchedDPGD,
    )
    from opacus_lastiterate.auditing.input_space.canaries import (
        InputCanary,
        InputScore,
        blank_canary,
        clip_backdoor_canary,
        in_distribution_canary,
        least_likely_label,
        mislabelled_canary,
    )
    from opacus_lastiterate.auditing.input_space.canary_set import (
        InputCanaries,
        fair_coins,
        make_input_canaries,
    )
    from opacus_lastiterate.auditing.input_space.canary_users import (
        make_canary_users,
    )
    from opacus_lastiterate.auditing.input_space.protocols import (
        AuditProtocol,
        annamalai_protocol,
        run_protocol,
        yoon_protocol,
    )
    from opacus_lastiterate.auditing.input_space.text_canaries import (
        TextCanaries,
        make_text_canaries,
    )
    from opacus_lastiterate.auditing.input_space.training import (
        OpacusInputTrainer,
        digits_data,
    )

_LAZY: dict[str, str] = {
    "CRAFTING_OBJECTIVES": "adversarial_samples",
    "AuditProtocol": "protocols",
    "BatchedDPGD": "batched_training",
    "annamalai_protocol": "protocols",
    "run_protocol": "protocols",
    "yoon_protocol": "protocols",
    "CraftedSample": "adversarial_samples",
    "InputAuditReport": "audit",
    "InputCanaries": "canary_set",
    "fair_coins": "canary_set",
    "InputCanary": "canaries",
    "InputScore": "canaries",
    "OpacusInputTrainer": "training",
    "SampleAudit": "audit",
    "blank_canary": "canaries",
    "clip_backdoor_canary": "canaries",
    "craft_adversarial_sample": "adversarial_samples",
    "digits_data": "training",
    "in_distribution_canary": "canaries",
    "least_likely_label": "canaries",
    "make_input_canaries": "canary_set",
    "make_canary_users": "canary_users",
    "mislabelled_canary": "canaries",
    "run_input_audit": "audit",
    "TextCanaries": "text_canaries",
    "make_text_canaries": "text_canaries",
}
"""Public name -> defining submodule; resolved on first access."""

__all__ = [
    "CRAFTING_OBJECTIVES",
    "AuditProtocol",
    "BatchedDPGD",
    "CraftedSample",
    "InputAuditReport",
    "InputCanaries",
    "InputCanary",
    "InputScore",
    "OpacusInputTrainer",
    "SampleAudit",
    "TextCanaries",
    "annamalai_protocol",
    "blank_canary",
    "clip_backdoor_canary",
    "craft_adversarial_sample",
    "digits_data",
    "fair_coins",
    "in_distribution_canary",
    "least_likely_label",
    "make_canary_users",
    "make_input_canaries",
    "make_text_canaries",
    "mislabelled_canary",
    "run_input_audit",
    "run_protocol",
    "yoon_protocol",
]

require(__name__, "torch", "opacus")  # every module here trains or scores with torch

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
