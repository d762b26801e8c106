"""The light install (``light/pyproject.toml``, distribution ``opacus-lastiterate-light``):
the mathematics works without torch and Opacus, and every part that needs them says so
clearly when imported there.

Run in both environments: the development one (torch and Opacus installed; their absence is
simulated in a child process by ``sys.modules[name] = None``, what Python does for a module
that cannot be imported) and the light one of ``make test-light`` (``OPACUS_LASTITERATE_LIGHT=1``,
where the checks of the installed distribution run as well).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import LIGHT, LIGHT_SELECTION, NEEDS_TORCH

REPO = Path(__file__).resolve().parents[1]

# the parts that need torch (and Opacus): module imported -> (the part its error names,
# what that part needs)
_BOTH = ("torch", "opacus")
TORCH_PARTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "opacus_lastiterate.accountants": ("opacus_lastiterate.accountants", _BOTH),
    "opacus_lastiterate.accountants.last_iterate": ("opacus_lastiterate.accountants", _BOTH),
    "opacus_lastiterate.callbacks": ("opacus_lastiterate.callbacks", _BOTH),
    "opacus_lastiterate.callbacks.monitor": ("opacus_lastiterate.callbacks", _BOTH),
    "opacus_lastiterate.samplers": ("opacus_lastiterate.samplers", ("torch",)),
    "opacus_lastiterate.user_samplers": ("opacus_lastiterate.user_samplers", ("torch",)),
    "opacus_lastiterate.schedules": ("opacus_lastiterate.schedules", ("torch",)),
    "opacus_lastiterate.auditing.input_space": ("opacus_lastiterate.auditing.input_space", _BOTH),
    "opacus_lastiterate.auditing.input_space.training":
        ("opacus_lastiterate.auditing.input_space", _BOTH),
    "opacus_lastiterate.auditing.opacus_training":
        ("opacus_lastiterate.auditing.opacus_training", _BOTH),
}

_WITHOUT_TORCH = """
import json, sys
sys.modules["torch"] = None  # what Python does for a module that cannot be imported
sys.modules["opacus"] = None
out = {}
for part in %r:
    try:
        __import__(part)
    except ImportError as error:
        out[part] = [type(error).__name__, error.name, str(error)]
    else:
        out[part] = None
print(json.dumps(out))
"""


def _run(program: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, cwd=REPO, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_each_torch_part_names_itself_the_missing_module_and_the_full_distribution() -> None:
    errors = json.loads(_run(_WITHOUT_TORCH % (list(TORCH_PARTS),)).splitlines()[-1])
    for module, (part, needs) in TORCH_PARTS.items():
        assert errors[module] is not None, f"{module} imported without torch"
        kind, name, message = errors[module]
        assert kind == "ModuleNotFoundError" and name in needs
        assert message.startswith(
            f"{part} needs {' and '.join(needs)}; not installed: {', '.join(needs)}."
        ), message
        assert "opacus-lastiterate-light" in message and "opacus-lastiterate (" in message


def test_the_mathematics_and_the_command_work_without_torch() -> None:
    # torch and opacus made unimportable by a finder (scipy looks torch up in sys.modules, so
    # the None entries of the test above would break it where torch merely is absent)
    program = """
import contextlib, io, sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "opacus"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoTorch())
import dp_accounting
from opacus_lastiterate import DPSGDRun, ScoreAudit, privacy_model
from opacus_lastiterate.analysis import LastIterateHeuristicAccountant
from opacus_lastiterate.cli import main
import opacus_lastiterate.auditing as auditing
step = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0))
accountant = LastIterateHeuristicAccountant().compose(step, 200)
run = DPSGDRun.constant(steps=200, sample_rate=0.01, noise_multiplier=1.0)
print(accountant.get_epsilon(1e-5), privacy_model("heuristic", run).epsilon(1e-5))
audit = ScoreAudit([3.0, 2.0, 2.5, 4.0], [0.0, 1.0, -1.0, 0.5])
result = audit.clopper_pearson(delta=0.0)
print(callable(auditing.audit_records), result.epsilon >= 0.0)
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(["epsilon", "--steps", "20", "--sample-rate", "0.05", "--noise-multiplier", "1",
                 "--delta", "1e-5"])
print(code, "heuristic" in out.getvalue())
print(sorted({m.split(".")[0] for m in sys.modules} & {"torch", "opacus"}))
"""
    lines = _run(program).split("\n")
    from_accountant, from_registry = map(float, lines[0].split())
    assert from_accountant == pytest.approx(from_registry, rel=1e-12) and from_accountant > 0
    assert lines[1] == "True True" and lines[2] == "0 True" and lines[3] == "[]"


def test_needs_torch_lists_exactly_the_selected_files_that_import_torch_at_the_top() -> None:
    heavy = ("torch", "opacus", *TORCH_PARTS)

    def imports_heavy(path: Path) -> bool:
        for node in ast.parse(path.read_text()).body:
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if any(n == h or n.startswith(h + ".") for n in names for h in heavy):
                return True
        return False

    files = set()
    for selected in LIGHT_SELECTION:
        path = REPO / selected
        files |= set(path.rglob("test_*.py")) if path.is_dir() else {path}
    found = {p.relative_to(REPO).as_posix() for p in files if p.exists() and imports_heavy(p)}
    assert found == set(NEEDS_TORCH)


def _toml(path: Path) -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with path.open("rb") as f:
        return tomllib.load(f)["project"]


def test_the_light_pyproject_is_the_full_one_without_torch_and_opacus() -> None:
    full, light = _toml(REPO / "pyproject.toml"), _toml(REPO / "light" / "pyproject.toml")
    assert light["name"] == "opacus-lastiterate-light" and full["name"] == "opacus-lastiterate"
    for key in ("version", "requires-python", "license", "authors", "classifiers", "scripts",
                "urls"):
        assert light[key] == full[key], key
    heavy = {"torch", "opacus"}

    def name(requirement: str) -> str:
        return requirement.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip()

    assert {name(r) for r in full["dependencies"]} & heavy == heavy
    assert light["dependencies"] == [r for r in full["dependencies"] if name(r) not in heavy]
    shared = set(light["optional-dependencies"]) - {"test"}
    for extra in shared:
        assert light["optional-dependencies"][extra] == full["optional-dependencies"][extra]
    assert set(light["optional-dependencies"]["test"]) <= set(full["optional-dependencies"]["test"])
    assert (REPO / "light" / "opacus_lastiterate").resolve() == REPO / "opacus_lastiterate"


@pytest.mark.skipif(not LIGHT, reason="the light environment's own checks (make test-light)")
def test_the_light_environment_has_no_torch_and_imports_the_installed_light_distribution() -> None:
    assert importlib.util.find_spec("torch") is None
    assert importlib.util.find_spec("opacus") is None
    import opacus_lastiterate

    assert "site-packages" in Path(opacus_lastiterate.__file__).parts
    assert importlib.metadata.version("opacus-lastiterate-light") == opacus_lastiterate.__version__
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("opacus-lastiterate")
