"""The flat modules of earlier releases still resolve every moved name, with a
DeprecationWarning that names the new path, and give the very same object."""

from __future__ import annotations

import importlib

import pytest

# old module -> (new module, a public name of it)
MOVED = {
    "arithmetic": ("gradient_space.arithmetic", "DPSGDArithmetic"),
    "canaries": ("gradient_space.canaries", "DiracCanary"),
    "insertion": ("gradient_space.insertion", "PoissonInsertion"),
    "adversaries": ("gradient_space.adversaries", "MaliciousDataset"),
    "simulator": ("gradient_space.simulator", "audit_scores"),
    "exact": ("gradient_space.exact", "malicious_dataset_epsilon"),
    "input_canaries": ("input_space.canaries", "InputCanary"),
    "adversarial_samples": ("input_space.adversarial_samples", "craft_adversarial_sample"),
    "worst_case_init": ("input_space.worst_case_init", "worst_case_initialisation"),
    "input_training": ("input_space.training", "OpacusInputTrainer"),
    "input_audit": ("input_space.audit", "run_input_audit"),
    "model_cache": ("input_space.model_cache", "CachedTrain"),
    "opacus_probe": ("opacus_releases.probe", "run_probe"),
    "probe_agreement": ("opacus_releases.agreement", "check_probe"),
    "opacus_audit": ("opacus_releases.real_code_audit", "audit_installed_opacus"),
    "run_records": ("runner.records", "RunRecords"),
}
PACKAGE = "opacus_lastiterate.auditing"


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_import_warns_with_the_new_path_and_returns_the_same_object(old: str) -> None:
    new, name = MOVED[old]
    module = importlib.import_module(f"{PACKAGE}.{old}")
    with pytest.warns(DeprecationWarning, match=rf"{PACKAGE}\.{new}") as record:
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(f"{PACKAGE}.{new}"), name)
    assert name in str(record[0].message)
    assert record[0].filename == __file__  # attributed to the importing line


def test_from_import_of_an_old_path_warns() -> None:
    with pytest.warns(DeprecationWarning, match="opacus_lastiterate.auditing.runner.records"):
        from opacus_lastiterate.auditing.run_records import RunRecords
    from opacus_lastiterate.auditing.runner import RunRecords as new

    assert RunRecords is new


def test_an_unknown_name_of_an_old_path_is_an_attribute_error() -> None:
    module = importlib.import_module(f"{PACKAGE}.run_records")
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        module.nonexistent


def test_the_package_names_do_not_warn() -> None:
    import warnings

    auditing = importlib.import_module(PACKAGE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in auditing.__all__:
            getattr(auditing, name)


def test_the_step_divisor_literal_has_its_own_name() -> None:
    """``Normalisation`` is the run description's dataclass; the simulator's divisor literal
    is ``StepDivisor``, its former name still read for one release with a warning."""
    import opacus_lastiterate.auditing as auditing
    from opacus_lastiterate.analysis.run import Normalisation
    from opacus_lastiterate.auditing.gradient_space import arithmetic

    assert arithmetic.StepDivisor is auditing.StepDivisor
    with pytest.warns(DeprecationWarning, match="StepDivisor"):
        assert arithmetic.Normalisation is arithmetic.StepDivisor
    assert arithmetic.StepDivisor is not Normalisation
