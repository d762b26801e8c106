"""Every code block of README.md and docs/ runs as shown (conventions: tests/docs/snippets.py
and docs/contributing_docs.md).

One test per page and kind: the page's Python blocks in order in one namespace, and its
shell commands (``opacus-lastiterate ...`` run through ``python -m opacus_lastiterate``, with
the output the page shows). Blocks marked ``slow-snippet`` run in a separate ``slow`` test.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

import pytest

from tests.docs import snippets
from tests.docs.snippets import PROMPT_SHELL, PYTHON, SCRIPT_SHELL, Block

# Pages whose blocks do not run yet, with the reason; the test of such a page is a strict
# xfail, so it fails as soon as the page runs and the entry must then be removed.
# (Single-quoted keys: tests/test_docs_citations.py reads a double-quoted page name followed
# by a double-quoted string as the citation of a section.)
PENDING: dict[str, str] = {
}


PAGE = "example-page"  # the name of the Markdown texts of the tests below


# --- what the README's blocks claim, checked against independent computations -------------
# Each check runs right after the block that contains its key, with the page's namespace,
# what the block printed and the working directory. The references are written from the
# definitions (tests/analysis/_reference.py) or are Opacus's own accountants.

README_DELTA = 1e-5
# Opacus's PRV accountant returns eps_upper = eps(delta - delta / 1000) + eps_error; the true
# epsilon is >= eps(delta + delta / 1000) - eps_error (opacus.accountants.analysis.prv).
PRV_ERROR = 0.01


def _printed_numbers(printed: str, label: str) -> list[float]:
    for line in printed.splitlines():
        if line.startswith(label):
            return [float(word) for word in line[len(label):].split()]
    raise AssertionError(f"no line starting with {label!r} in\n{printed}")


def _prv_bracket(history: list[tuple[float, float, int]]) -> tuple[float, float]:
    from opacus.accountants import PRVAccountant

    prv = PRVAccountant()
    prv.history = list(history)
    upper = prv.get_epsilon(README_DELTA, eps_error=PRV_ERROR)
    return upper - 2 * PRV_ERROR - 1e-3, upper


def _heuristic_reference(steps: int, q: float, sigma: float) -> float:
    from tests.analysis._reference import ClosedFormMixture

    return ClosedFormMixture.binomial(steps, q, sigma).epsilon(README_DELTA)


def _check_readme_training(namespace: dict, printed: str, cwd: Path) -> None:
    """One epoch of Poisson-sampled DP-SGD (q = 1 / len(loader), sigma = 1): the heuristic
    of Binomial(T, q) + N(0, T) vs N(0, T), its max over suffixes, and a standard epsilon
    that is Opacus's own (PRV) within its error and below Opacus's RDP bound."""
    from opacus.accountants import RDPAccountant

    loader, engine = namespace["loader"], namespace["engine"]
    steps, q = len(loader), 1 / len(loader)  # type: ignore[arg-type]
    assert engine.accountant.history == [(1.0, q, steps)]  # type: ignore[attr-defined]
    (heuristic,) = _printed_numbers(printed, "heuristic")
    (robust,) = _printed_numbers(printed, "robust")
    (standard,) = _printed_numbers(printed, "standard")
    eps_t = [_heuristic_reference(t, q, 1.0) for t in range(1, steps + 1)]
    assert heuristic == pytest.approx(eps_t[-1], rel=1e-9)
    assert max(eps_t) * (1 - 1e-9) <= robust <= max(eps_t) * (1 + 1e-6)
    low, high = _prv_bracket([(1.0, q, steps)])
    rdp = RDPAccountant()
    rdp.history = [(1.0, q, steps)]
    assert low <= standard <= min(high, rdp.get_epsilon(README_DELTA))
    assert heuristic <= standard


def _check_readme_monitor(namespace: dict, printed: str, cwd: Path) -> None:
    """The monitor writes privacy.jsonl: one line per step of the second epoch, the last one
    the final record; each heuristic epsilon is engine.get_epsilon at that step (a fresh accountant
    stepped as often) and the independent heuristic of the run so far."""
    import json

    from opacus_lastiterate.accountants import LastIterateAccountant

    loader, engine = namespace["loader"], namespace["engine"]
    per_epoch, q = len(loader), 1 / len(loader)  # type: ignore[arg-type]
    assert engine.accountant.num_steps == 2 * per_epoch  # type: ignore[attr-defined]
    lines = [json.loads(line) for line in (cwd / "privacy.jsonl").read_text().splitlines()]
    steps = [line["step"] for line in lines]  # one row per step; the final one replaces the last
    assert steps == list(range(per_epoch + 1, 2 * per_epoch + 1))
    finals = [line for line in lines if line["final"]]
    assert len(finals) == 1 and lines[-1] is finals[0] and finals[0]["step"] == 2 * per_epoch
    replay = LastIterateAccountant()
    for _ in range(per_epoch):
        replay.step(noise_multiplier=1.0, sample_rate=q)
    for line in lines[:-1]:
        replay.step(noise_multiplier=1.0, sample_rate=q)
        assert replay.num_steps == line["step"]
        assert line["heuristic_epsilon"] == pytest.approx(replay.get_epsilon(README_DELTA), rel=1e-12)
        assert line["heuristic_epsilon"] == pytest.approx(
            _heuristic_reference(line["step"], q, 1.0), rel=1e-9
        )
    assert finals[0]["heuristic_epsilon"] == pytest.approx(
        engine.get_epsilon(README_DELTA), rel=1e-12  # type: ignore[attr-defined]
    )
    assert f"step={2 * per_epoch}," in printed and "final=True" in printed


def _check_readme_analysis(namespace: dict, printed: str, cwd: Path) -> None:
    """500 steps at sigma = 1 then 500 at sigma = 0.8, q = 0.01: the pair Binomial(1000, q)
    + N(0, 500 + 500 * 0.64) vs N(0, 820) by the closed form (epsilon, delta(1), and the
    trade-off beta(0.01) = Pr_P[y < s Phi^-1(0.99)]), the robust value at least every suffix
    heuristic tried, the standard epsilon Opacus's PRV within its error."""
    import math

    import numpy as np
    from scipy import special, stats

    from tests.analysis._reference import ClosedFormMixture

    lines = [line for line in printed.splitlines() if line.strip()]
    eps, delta_1, beta = (float(w) for w in lines[0].split())
    robust, standard = (float(w) for w in lines[1].split())
    k = np.arange(1001)
    p = stats.binom.pmf(k, 1000, 0.01)
    keep = p > 1e-60
    s = math.sqrt(500 * 1.0**2 + 500 * 0.8**2)
    pair = ClosedFormMixture(k[keep], p[keep], s)
    assert eps == pytest.approx(pair.epsilon(README_DELTA), rel=1e-9)
    assert delta_1 == pytest.approx(pair.delta(1.0), rel=1e-9)
    tau = s * float(special.ndtri(0.99))
    assert beta == pytest.approx(float(np.dot(p[keep], special.ndtr((tau - k[keep]) / s))), rel=1e-9)

    def suffix(t: int) -> float:  # the last t steps
        noisy = min(t, 500) * 0.8**2 + max(t - 500, 0) * 1.0**2
        kk = np.arange(t + 1)
        pp = stats.binom.pmf(kk, t, 0.01)
        ok = pp > 1e-60
        return ClosedFormMixture(kk[ok], pp[ok], math.sqrt(noisy)).epsilon(README_DELTA)

    tried = max(suffix(t) for t in (1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 501, 700, 1000))
    assert robust >= tried * (1 - 1e-9) and robust >= eps * (1 - 1e-9)
    low, high = _prv_bracket([(1.0, 0.01, 500), (0.8, 0.01, 500)])
    assert low <= standard <= high


CLAIMS = {
    "README.md": {
        "engine.make_private(": _check_readme_training,
        "PrivacyMonitor(": _check_readme_monitor,
        "DPSGDRun.from_history(": _check_readme_analysis,
    },
}


def _blocks(page: str, languages: frozenset[str]) -> list[Block]:
    return [b for b in snippets.page_blocks(page) if b.language in languages]


def _params(languages: frozenset[str], *, slow: bool) -> list[object]:
    params = []
    for page in snippets.pages():
        blocks = _blocks(page, languages)
        if not blocks or (slow and not any(b.slow for b in blocks)):
            continue
        marks = [pytest.mark.slow] if slow else []
        if page in PENDING:
            marks.append(pytest.mark.xfail(reason=PENDING[page], strict=True))
        params.append(pytest.param(page, marks=marks, id=page))
    return params


def _run_python(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow: bool) -> None:
    monkeypatch.chdir(tmp_path)  # files a snippet writes land here
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace: dict[str, object] = {"__name__": "__main__"}
    claims = dict(CLAIMS.get(page, {}))
    ran = 0
    with warnings.catch_warnings():
        for block, output in snippets.python_blocks(snippets.page_blocks(page)):
            if block.skipped or (block.slow and not slow):
                continue
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                snippets.run_python(block, namespace)
            if output is not None:
                snippets.check_output(block, output, printed.getvalue())
            for key in [k for k in claims if k in block.code]:
                claims.pop(key)(namespace, printed.getvalue(), tmp_path)
            ran += 1
    assert not claims, f"{page}: no block contains {sorted(claims)} any more"
    try:
        import matplotlib.pyplot as plt

        plt.close("all")
    except ImportError:
        pass
    if ran == 0:
        pytest.skip(f"every Python block of {page} is marked")


@pytest.mark.parametrize("page", _params(PYTHON, slow=False))
def test_python_blocks_run(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _run_python(page, tmp_path, monkeypatch, slow=False)


@pytest.mark.parametrize("page", _params(PYTHON, slow=True))
def test_python_blocks_run_with_slow_ones(
    page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run_python(page, tmp_path, monkeypatch, slow=True)


def _run_shell(page: str, tmp_path: Path, slow: bool) -> None:
    failures = []
    targets = snippets.make_targets()
    for block in _blocks(page, PROMPT_SHELL | SCRIPT_SHELL):
        if block.skipped or (block.slow and not slow):
            continue
        for command in snippets.commands(block):
            kind, args = snippets.classify(command.argv)
            if kind == "cli":
                failures.append(snippets.run_cli(command, args, tmp_path))
            elif kind == "make":
                missing = [t for t in args if t not in targets] or ([] if args else ["(none)"])
                if missing:
                    failures.append(f"{command.where}: no Makefile target {missing}")
            elif kind == "script":
                if not (snippets.ROOT / args[0]).is_file():
                    failures.append(f"{command.where}: no file {args[0]}")
            elif kind == "unknown":
                failures.append(
                    f"{command.where}: `{command.text}` is neither an opacus-lastiterate "
                    "command, a make target, a script nor a set-up command; mark the block "
                    "<!-- skip-snippet: reason --> if it cannot run here"
                )
    failures = [f for f in failures if f]
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("page", _params(PROMPT_SHELL | SCRIPT_SHELL, slow=False))
def test_shell_commands_run(page: str, tmp_path: Path) -> None:
    _run_shell(page, tmp_path, slow=False)


@pytest.mark.parametrize("page", _params(PROMPT_SHELL | SCRIPT_SHELL, slow=True))
def test_shell_commands_run_with_slow_ones(page: str, tmp_path: Path) -> None:
    _run_shell(page, tmp_path, slow=True)


# --- the conventions themselves ------------------------------------------------------------


def test_markers_have_reasons_and_commands_are_in_shell_blocks() -> None:
    problems = []
    for page in snippets.pages():
        for block in snippets.page_blocks(page):  # raises on a marker without a block
            if block.marker in ("skip-snippet", "slow-snippet") and not block.reason:
                problems.append(f"{block.where}: {block.marker} needs a reason")
            if block.language in PYTHON | PROMPT_SHELL | SCRIPT_SHELL:
                continue
            for line in block.code.splitlines():
                if line.lstrip("$ ").startswith(("opacus-lastiterate ", "python -m opacus_")):
                    problems.append(
                        f"{block.where}: a command in a ```{block.language or '(no language)'}"
                        " block is never run; use ```console (with `$ `) or ```bash"
                    )
                    break
    assert not problems, "\n".join(problems)


def test_output_blocks_follow_python_blocks() -> None:
    for page in snippets.pages():
        snippets.python_blocks(snippets.page_blocks(page))  # raises on a misplaced one
    text = "```python\nprint(1 + 1)\n```\n<!-- snippet-output -->\n```text\n2\n```\n"
    ((block, output),) = snippets.python_blocks(snippets.parse_blocks(text, PAGE))
    assert output is not None and output.code == "2\n"
    snippets.check_output(block, output, "2\n")
    with pytest.raises(AssertionError, match="printed other output"):
        snippets.check_output(block, output, "3\n")
    with pytest.raises(ValueError, match="must follow a Python block"):
        snippets.python_blocks(snippets.parse_blocks(text.split("\n", 3)[3], PAGE))


def test_pending_pages_exist() -> None:
    assert set(PENDING) <= set(snippets.pages())


MARKDOWN = """\
Text.

<!-- skip-snippet: needs a GPU -->

```python
import torch
```

~~~console
$ opacus-lastiterate epsilon --steps 3 \\
      --delta 1e-6   # comment
heuristic ...
$ make test
~~~

<!-- slow-snippet: trains for a minute -->
````bash
.venv/bin/opacus-lastiterate --help
TORCH_INDEX_URL=https://example.org make demo
python examples/train_digits.py --quick
pip install -e .
rm -rf runs
````
"""


def test_parser_reads_blocks_markers_and_commands() -> None:
    skip, console, bash = snippets.parse_blocks(MARKDOWN, PAGE)
    assert (skip.language, skip.line, skip.skipped, skip.reason) == (
        "python", 6, True, "needs a GPU",
    )
    assert skip.code == "import torch\n"
    assert console.marker is None and bash.slow and bash.reason == "trains for a minute"
    first, second = snippets.commands(console)
    assert first.line == console.line and first.expected == "heuristic ..."
    assert snippets.classify(first.argv) == (
        "cli", ["epsilon", "--steps", "3", "--delta", "1e-6"],
    )
    assert snippets.classify(second.argv) == ("make", ["test"]) and second.expected is None
    kinds = [snippets.classify(c.argv)[0] for c in snippets.commands(bash)]
    assert kinds == ["cli", "make", "script", "setup", "unknown"]


@pytest.mark.parametrize(
    "text",
    ["<!-- skip-snippet: x -->\nplain text\n```python\npass\n```\n", "<!-- slow-snippet: x -->\n"],
)
def test_a_marker_must_precede_a_block(text: str) -> None:
    with pytest.raises(ValueError, match="marker not followed by a code block"):
        snippets.parse_blocks(text, PAGE)


def test_console_output_is_compared(tmp_path: Path) -> None:
    text = "```console\n$ opacus-lastiterate --help\n...opacus-lastiterate...epsilon...\n```\n"
    (command,) = snippets.commands(snippets.parse_blocks(text, PAGE)[0])
    args = snippets.classify(command.argv)[1]
    assert snippets.run_cli(command, args, tmp_path) == ""
    wrong = snippets.Command(command.block, command.line, command.text, "...no such output...")
    assert "printed other output" in snippets.run_cli(wrong, args, tmp_path)
    failing = snippets.Command(command.block, command.line, "opacus-lastiterate nonsense", None)
    assert "exited with" in snippets.run_cli(failing, ["nonsense"], tmp_path)
