"""The normalisation analysis runs with torch and opacus unimportable."""

from __future__ import annotations

import subprocess
import sys

_PROGRAM = """
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("torch", "opacus"):
            raise ImportError("blocked: " + name)

sys.meta_path.insert(0, Block())
import opacus_lastiterate.analysis.normalisation as m
m.asgm_epsilon(1e-5, dataset_size=100, sample_rate=0.1, noise_multiplier=1.0, steps=3)
m.feasgm_epsilon(1e-5, dataset_size=500, batch_size=10, noise_multiplier=1.0, steps=2, dimension=10)
assert not [k for k in sys.modules if k.split(".")[0] in ("torch", "opacus")]
print("ok")
"""


def test_analysis_imports_without_torch_or_opacus() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _PROGRAM], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
