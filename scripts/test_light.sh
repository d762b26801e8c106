#!/usr/bin/env bash
# The light install, tested where torch is not (make test-light; .ci/run):
#
#   scripts/test_light.sh            (WORK defaults to build/test-light; EXTRAS to test,jax,allocation)
#
# 1. builds the wheel of the light distribution (light/pyproject.toml, opacus-lastiterate-light:
#    this package without torch and Opacus) from a clean tree, and checks that it holds the
#    files of the full one;
# 2. installs it with the extras $EXTRAS into a fresh virtual environment, `pip check`, and
#    fails if torch or Opacus got in;
# 3. from a copy of tests/ and examples/ (not the checkout: the tests import the installed
#    copy) runs the tests that need no torch (tests/conftest.py: LIGHT_SELECTION, less
#    NEEDS_TORCH) with OPACUS_LASTITERATE_LIGHT=1, where a test skipped for any reason other
#    than torch/Opacus missing is an error (the JAX example's test included);
# 4. prints the environment's size (du -sh) and the import time of the accounting.
set -euo pipefail
cd "$(dirname "$0")/.."
here=$(pwd)
python=${PYTHON:-python3}
extras=${EXTRAS:-test,jax,allocation}
work=${WORK:-build/test-light}
rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd)
pipq=(-m pip --disable-pip-version-check -q)
stage() { printf 'test_light: %-50s %4d s\n' "$1" "$SECONDS"; }
SECONDS=0

clean() { rm -rf light/build light/*.egg-info build/lib build/bdist.* ./*.egg-info; }
clean  # no stale files from an earlier in-tree build in the wheels
"$python" -m venv "$work/venv"
py=$work/venv/bin/python
"$py" "${pipq[@]}" wheel --no-deps -w "$work/dist" ./light . >"$work/build.log" 2>&1 \
    || { clean; tail -30 "$work/build.log"; exit 1; }
clean
wheel=$(ls "$work/dist"/opacus_lastiterate_light-*.whl)
files() { "$py" -m zipfile -l "$1" | awk 'NR > 1 {print $1}' | grep -v '\.dist-info/' | sort; }
if ! diff <(files "$wheel") <(files "$(ls "$work/dist"/opacus_lastiterate-*.whl)") >"$work/files.diff"; then
    echo "test_light: the light and the full wheel hold different files:"; cat "$work/files.diff"
    exit 1
fi
stage "light wheel built, same files as the full one ($(basename "$wheel"))"
"$py" "${pipq[@]}" install "$wheel[$extras]" >"$work/install.log" 2>&1 \
    || { tail -30 "$work/install.log"; exit 1; }
"$py" -m pip check
if "$py" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('torch') or u.find_spec('opacus')))"; then
    echo "test_light: torch or opacus is installed in the light environment"; exit 1
fi
stage "installed with [$extras], no torch/opacus ($(du -sh "$work/venv" | cut -f1))"

mkdir -p "$work/src"
cp -r tests examples pyproject.toml "$work/src/"
mkdir -p "$work/src/light"  # tests/test_light_install.py compares the two pyproject files
cp -a light/pyproject.toml light/opacus_lastiterate "$work/src/light/"
mkdir -p "$work/src/docs"  # committed results that tests read (probe tables, the JAX log)
cp -r docs/results "$work/src/docs/"
cd "$work/src"
selection=$("$py" -c "from tests.conftest import LIGHT_SELECTION; print(' '.join(LIGHT_SELECTION))")
OPACUS_LASTITERATE_LIGHT=1 JAX_PLATFORMS=cpu "$py" -m pytest -p no:cacheprovider -q \
    ${PYTEST_ARGS:-} $selection
stage "tests passed without torch"

"$py" - <<'PY'
import importlib.metadata, pathlib, opacus_lastiterate
where = pathlib.Path(opacus_lastiterate.__file__)
assert "site-packages" in where.parts, where
print("test_light: imported", where.parent, importlib.metadata.version("opacus-lastiterate-light"))
PY
for i in 1 2 3; do  # the whole import, in a fresh process each time
    "$py" -c '
import resource, time
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
c, t = cpu(), time.perf_counter()
import opacus_lastiterate.analysis.dp_accounting_accountant, opacus_lastiterate.analysis.audit
print(f"test_light: import of the accounting and audit statistics: "
      f"{cpu() - c:.2f} s CPU, {time.perf_counter() - t:.2f} s wall")'
done
echo "test_light: OK ($(du -sh "$work/venv" | cut -f1) environment; $here)"
