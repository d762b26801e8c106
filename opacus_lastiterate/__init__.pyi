"""Types of the lazily resolved root names of ``opacus_lastiterate`` (``__init__.py``)."""

from opacus_lastiterate import accountants as accountants
from opacus_lastiterate import analysis as analysis
from opacus_lastiterate import exceptions as exceptions
from opacus_lastiterate.accountants import (
    ASGMAccountant as ASGMAccountant,
)
from opacus_lastiterate.accountants import (
    FEASGMAccountant as FEASGMAccountant,
)
from opacus_lastiterate.accountants import (
    LastIterateAccountant as LastIterateAccountant,
)
from opacus_lastiterate.accountants import (
    use_public_divisor as use_public_divisor,
)
from opacus_lastiterate.analysis import (
    BallsInBins as BallsInBins,
)
from opacus_lastiterate.analysis import (
    DeterministicBatches as DeterministicBatches,
)
from opacus_lastiterate.analysis import (
    DPSGDRun as DPSGDRun,
)
from opacus_lastiterate.analysis import (
    PoissonSampling as PoissonSampling,
)
from opacus_lastiterate.analysis import (
    ShuffledBatches as ShuffledBatches,
)
from opacus_lastiterate.analysis import (
    calibrate_noise_multiplier as calibrate_noise_multiplier,
)
from opacus_lastiterate.analysis import (
    compare_epsilons as compare_epsilons,
)
from opacus_lastiterate.analysis import (
    standard_epsilon as standard_epsilon,
)
from opacus_lastiterate.analysis.audit import (
    ScoreAudit as ScoreAudit,
)
from opacus_lastiterate.analysis.privacy_models import (
    privacy_model as privacy_model,
)
from opacus_lastiterate.callbacks import (
    CsvSink as CsvSink,
)
from opacus_lastiterate.callbacks import (
    InTrainingCanaryAudit as InTrainingCanaryAudit,
)
from opacus_lastiterate.callbacks import (
    JsonlSink as JsonlSink,
)
from opacus_lastiterate.callbacks import (
    LoggingSink as LoggingSink,
)
from opacus_lastiterate.callbacks import (
    PrivacyBudget as PrivacyBudget,
)
from opacus_lastiterate.callbacks import (
    PrivacyMonitor as PrivacyMonitor,
)
from opacus_lastiterate.exceptions import OpacusLastIterateWarning as OpacusLastIterateWarning
from opacus_lastiterate.samplers import (
    balls_in_bins_data_loader as balls_in_bins_data_loader,
)

__version__: str
__all__: list[str]
