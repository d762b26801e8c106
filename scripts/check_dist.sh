#!/usr/bin/env bash
# What a user installs from a package index, built and tested (issue 26):
#
#   scripts/check_dist.sh            (called by .ci/run; WORK defaults to build/check-dist)
#
# 1. builds the sdist and, from the sdist, the wheel (`python -m build`: a wheel that builds
#    from the sdist proves the sdist complete); `twine check --strict` checks their metadata;
# 2. installs the wheel into a fresh virtual environment (CPU torch first: $TORCH_SPEC,
#    default torch==2.13.0, from $TORCH_INDEX_URL when set), then `pip check`;
# 3. from outside the checkout: imports the package (and checks it is the installed copy),
#    `opacus-lastiterate --version` (equal to the wheel's version), one `epsilon` call.
# Prints the time of each stage; the tools (build, twine) come from PyPI into their own
# environment.
set -euo pipefail
cd "$(dirname "$0")/.."
here=$(pwd)
python=${PYTHON:-python3}
torch_spec=${TORCH_SPEC:-torch==2.13.0}
work=${WORK:-build/check-dist}
rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd)
pipq=(-m pip --disable-pip-version-check -q)
stage() { printf 'check_dist: %-44s %4d s\n' "$1" "$SECONDS"; }
SECONDS=0

"$python" -m venv "$work/tools"
"$work/tools/bin/python" "${pipq[@]}" install build twine >"$work/tools.log" 2>&1 \
    || { tail -30 "$work/tools.log"; exit 1; }
stage "tools (build, twine) installed"
"$work/tools/bin/python" -m build --outdir "$work/dist" "$here" >"$work/build.log" 2>&1 \
    || { tail -30 "$work/build.log"; exit 1; }
ls -l "$work/dist"
"$work/tools/bin/python" -m twine check --strict "$work/dist"/*
stage "sdist and wheel built, metadata checked"

wheel=$(ls "$work/dist"/*.whl)
sdist=$(ls "$work/dist"/*.tar.gz)
version=$(basename "$wheel" | cut -d- -f2)
tar -tzf "$sdist" >"$work/sdist.txt"
for required in README.md pyproject.toml opacus_lastiterate/py.typed opacus_lastiterate/cli/__init__.py; do
    grep -q "/$required\$" "$work/sdist.txt" || { echo "sdist lacks $required"; exit 1; }
done
"$work/tools/bin/python" -m zipfile -l "$wheel" >"$work/wheel.txt"
for required in opacus_lastiterate/py.typed opacus_lastiterate/cli/__init__.py; do
    grep -q "$required" "$work/wheel.txt" || { echo "wheel lacks $required"; exit 1; }
done

"$python" -m venv "$work/venv"
py=$work/venv/bin/python
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    "$py" "${pipq[@]}" install "$torch_spec" --index-url "$TORCH_INDEX_URL"
else
    "$py" "${pipq[@]}" install "$torch_spec"
fi
stage "fresh environment with $torch_spec"
"$py" "${pipq[@]}" install "$wheel"
"$py" -m pip check
stage "wheel installed ($(du -sh "$work/venv" | cut -f1) environment)"

cd "$work"  # not the checkout: the import must find the installed copy
"$py" - <<'PY'
import opacus_lastiterate, pathlib
where = pathlib.Path(opacus_lastiterate.__file__)
assert "site-packages" in where.parts, f"imported {where}, not the installed wheel"
print("import:", where.parent)
PY
got=$("$work/venv/bin/opacus-lastiterate" --version)
echo "--version: $got"
case "$got" in *"$version"*) ;; *) echo "version $got is not the wheel's $version"; exit 1;; esac
"$work/venv/bin/opacus-lastiterate" epsilon --steps 1000 --sample-rate 0.01 \
    --noise-multiplier 1 --delta 1e-5
stage "smoke test passed"
echo "check_dist: OK ($(basename "$wheel"), $(basename "$sdist"))"
