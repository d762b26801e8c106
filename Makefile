# Entry points; each one installs what it needs into a virtual environment first.
#   make demo        train a small DP-SGD model with the last-iterate accountant, a privacy
#                    monitor logging heuristic, robust and standard epsilon every step, and
#                    gradient canaries; ends with the in-training audit of the final model
#   make test        the default test suite (what CI runs first)
#   make lint        ruff and mypy
#   make test-slow   statistical / reproduction tests (marked `slow`)
#   make test-corpus-exact  the output corpus (fast and slow entries) compared bit for bit: a
#                    developer's check on the CPU that recorded it (make test compares at
#                    the tolerances stated in tests/test_output_corpus.py)
#   make test-compat the Opacus integration tests and the real-code probe on Opacus 1.5.4 (no
#                    accountant registry)
#   make probe-versions  probe the real code of all 26 Opacus releases (0.9.0-1.6.0), one
#                    environment each under $(OPACUS_ENVS), and audit 1.0.0, 1.6.0 and 0.15.0;
#                    writes docs/results/opacus_probes.json and opacus_audits.json
#   make examples    every example script in its quick mode
#   make bench       benchmark scripts (print timings and ratios)
#   make docs        the documentation site, warnings as errors (docs/_build/html)
#   make docs-layout the site in headless Chromium at 1280 px: nothing clipped; screenshots
#   make check-dist  build the wheel and the sdist, install the wheel into a fresh environment
#   make test-light  the light distribution (light/pyproject.toml: no torch, no Opacus) with
#                    the extras test, jax and allocation in a fresh environment, and the tests
#                    that need no torch run there (the JAX example's included); its size and
#                    import time
#   make mutation    mutation testing (mutmut) of the heuristic, sampling-heuristic and
#                    audit-statistics modules, in build/mutation/ (docs/testing.md); a
#                    developer's check, slow, not part of make test or CI
PYTHON ?= python3
VENV ?= .venv
VENV_COMPAT ?= .venv-opacus15
OPACUS_ENVS ?= $(HOME)/.cache/opacus-lastiterate/opacus-versions
PROBE_ARGS ?= --native
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: venv demo test lint test-slow test-corpus-exact test-compat probe-versions examples \
	bench docs docs-layout check-dist test-light mutation clean

venv:
	PYTHON=$(PYTHON) scripts/bootstrap.sh $(VENV) dev

demo:  # the package and scikit-learn only (extra `examples`), not the development tools
	PYTHON=$(PYTHON) scripts/bootstrap.sh $(VENV) examples
	$(PY) examples/train_digits.py --canaries 1000 --robust-every 1

# prints the 25 slowest tests and the wall time (the target: 5 minutes on 2 quiet cores)
test: venv
	@start=$$(date +%s); $(PY) -m pytest -n 2 --durations=25 $(PYTEST_ARGS); status=$$?; \
	echo "make test: $$(( $$(date +%s) - start )) s wall on $$(nproc) cores"; exit $$status

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy opacus_lastiterate

test-slow: venv
	$(PY) -m pytest -n 2 -m slow $(PYTEST_ARGS)

test-corpus-exact: venv
	OUTPUT_CORPUS_EXACT=1 $(PY) -m pytest -n 2 -m "slow or not slow" tests/test_output_corpus.py $(PYTEST_ARGS)

test-compat:
	PYTHON=$(PYTHON) scripts/bootstrap.sh $(VENV_COMPAT) test "opacus==1.5.4"
	$(VENV_COMPAT)/bin/python -m pytest -n 2 tests/accountants tests/auditing/opacus_releases/test_probe.py $(PYTEST_ARGS)

probe-versions: venv
	$(PY) scripts/probe_opacus_versions.py --envs $(OPACUS_ENVS) $(PROBE_ARGS)

examples: venv
	$(PY) scripts/run_examples.py --quick

bench: venv
	for f in benchmarks/*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

docs: venv
	$(PY) -m sphinx -b html -W --keep-going docs docs/_build/html

# the site in headless Chromium at 1280 px: fails on clipped tables and code, CDN maths, raw
# LaTeX or file names as link texts; screenshots in docs/results/screenshots/. Needs the
# system's Chromium (Debian: apt-get install -y chromium); Playwright comes with the `layout`
# extra.
docs-layout:
	PYTHON=$(PYTHON) scripts/bootstrap.sh $(VENV) dev,layout
	$(PY) scripts/check_docs_layout.py

# the wheel and the sdist, built, checked and installed into a fresh environment (.ci/run)
check-dist:
	PYTHON=$(PYTHON) scripts/check_dist.sh

# the light distribution in a fresh environment without torch, and its tests (.ci/run)
test-light:
	PYTHON=$(PYTHON) scripts/test_light.sh

# MUTATION_ARGS: targets and options of scripts/mutation.py, e.g. "heuristic --fresh"
MUTATION_ARGS ?=
mutation: venv
	$(PY) -m pip install -q mutmut==3.8.1
	$(PY) scripts/mutation.py $(MUTATION_ARGS)

clean:
	rm -rf $(VENV) $(VENV_COMPAT) build dist *.egg-info docs/_build light/build light/*.egg-info
