#!/usr/bin/env bash
# Create (or refresh) a virtual environment with this project installed.
#
#   scripts/bootstrap.sh VENV_DIR EXTRAS [EXTRA_PIP_SPEC ...]
#
# torch is installed first, pinned by $TORCH_SPEC (default torch==2.13.0), so that the
# project's `torch>=2.0` range is already satisfied and pip does not fetch another build.
# On a machine whose pip finds a local CPU wheel of that version (as our CI machines do)
# this takes that wheel; elsewhere it takes PyPI's build.  CPU-only users who want to
# avoid the CUDA packages can export, for example,
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# An existing torch in VENV_DIR is kept.  Re-running is cheap: the install is skipped
# while pyproject.toml and the arguments are unchanged.
set -euo pipefail
venv=${1:?usage: bootstrap.sh VENV_DIR EXTRAS [EXTRA_PIP_SPEC ...]}
extras=${2:?usage: bootstrap.sh VENV_DIR EXTRAS [EXTRA_PIP_SPEC ...]}
shift 2
python=${PYTHON:-python3}
torch_spec=${TORCH_SPEC:-torch==2.13.0}
here=$(cd "$(dirname "$0")/.." && pwd)

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
stamp="$venv/.opacus-lastiterate-stamp"
# One line per set of extras installed since pyproject.toml last changed: `make demo`
# (extra `examples`) and `make test` (extra `dev`) share the environment, each adding its part.
want="$(cat "$here/pyproject.toml" | sha256sum | cut -c1-16) $extras $* $torch_spec"
if [ -f "$stamp" ] && grep -qxF "$want" "$stamp"; then
    exit 0
fi
if [ -f "$stamp" ] && ! grep -q "^$(cut -c1-16 <<<"$want") " "$stamp"; then
    rm -f "$stamp"  # pyproject.toml changed: every set is installed again
fi
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "bootstrap: installing $torch_spec into $venv ..."
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
        "${pip[@]}" install "$torch_spec" --index-url "$TORCH_INDEX_URL"
    else
        "${pip[@]}" install "$torch_spec"
    fi
fi
echo "bootstrap: installing opacus-lastiterate[$extras] and its dependencies into $venv" \
    "(a minute or two the first time) ..."
"${pip[@]}" install -e "$here[$extras]" "$@"
echo "$want" >> "$stamp"
echo "bootstrap: $venv is ready (activate it with: source $venv/bin/activate)"
