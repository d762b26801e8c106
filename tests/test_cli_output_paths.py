"""Every option that names an output file or folder is checked when the command line is
parsed: a usage error (exit 2) naming the option, before anything is computed."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from opacus_lastiterate.cli import main

EPSILON = ["epsilon", "--steps", "3", "--sample-rate", "0.1", "--noise-multiplier", "1",
           "--delta", "1e-5"]
PLAN = ["plan", "--dataset-size", "1000", "--batch-sizes", "100", "--target-epsilon", "2",
        "--delta", "1e-5", "--steps", "10"]
VERSIONS = ["compare-versions", "--dataset-size", "147", "--batch-size", "3",
            "--noise-multiplier", "1", "--delta", "1e-5", "--versions", "1.6.0"]
DIGITS = ["audit", "digits", "--quick", "--no-progress"]

# (command line without the output option, the output option, the heavy function that must
# never run when the option is refused: module, attribute)
CASES = {
    "epsilon --plot": (EPSILON, "--plot", ("opacus_lastiterate.analysis.comparison",
                                           "compare_epsilons")),
    "plan --plot": (PLAN, "--plot", ("opacus_lastiterate.analysis.hyperparameter_plan",
                                     "plan_batch_sizes")),
    "compare-versions --plot": (VERSIONS, "--plot", ("opacus_lastiterate.analysis.opacus_versions",
                                                     "compare_versions")),
    "audit records --plot": (["audit", "records", "RECORDS"], "--plot",
                             ("opacus_lastiterate.auditing.runner", "read_records")),
    "audit digits --plot": (DIGITS, "--plot", ("opacus_lastiterate.auditing.runner",
                                               "AuditRunner")),
    "audit digits --records": (DIGITS, "--records", ("opacus_lastiterate.auditing.runner",
                                                     "AuditRunner")),
    "reproduce FIGURE --plot": (["reproduce", "last-iterate-fig1", "--quick"], "--plot",
                                ("opacus_lastiterate.figures", "load")),
}


def _forbid(monkeypatch: pytest.MonkeyPatch, target: tuple[str, str]) -> None:
    module = importlib.import_module(target[0])
    assert hasattr(module, target[1])

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{target[1]} ran although the output path is unusable")

    monkeypatch.setattr(module, target[1], never)


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


def _argv(case: str, tmp_path: Path, value: str) -> tuple[list[str], str]:
    base, option, _ = CASES[case]
    records = tmp_path / "input.jsonl"
    records.write_text("")  # an existing input file: 'audit records' checks only that it exists
    argv = [str(records) if part == "RECORDS" else part for part in base]
    return [*argv, option, value], option


def _image(case: str) -> str:
    return "runs.jsonl" if CASES[case][1] == "--records" else "out.png"


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_path_under_a_regular_file_is_refused_before_computing(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    _forbid(monkeypatch, CASES[case][2])
    argv, option = _argv(case, tmp_path, str(blocker / "sub" / _image(case)))
    err = _refused(capsys, argv)
    assert f"Invalid value for '{option}'" in err
    assert f"'{blocker}' is a file" in err
    assert not (tmp_path / "a_file").is_dir()  # nothing was created


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_existing_folder_where_a_file_goes_is_refused(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = tmp_path / _image(case)  # a folder named like the file
    target.mkdir()
    _forbid(monkeypatch, CASES[case][2])
    argv, option = _argv(case, tmp_path, str(target))
    if option == "--plot":
        # --plot DIR means DIR/NAME.png: make that an existing folder too
        name = {"epsilon": "epsilon.png", "plan": "plan.png",
                "compare-versions": "opacus_versions.png", "audit": "audit_scores.png",
                "reproduce": "last-iterate-fig1.png"}[argv[0]]
        (target / name).mkdir()
        target = target / name
    err = _refused(capsys, argv)
    assert f"Invalid value for '{option}'" in err
    assert f"'{target}' is an existing folder, not a file" in err


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="root may write into any folder")
@pytest.mark.parametrize("case", sorted(CASES))
def test_an_unwritable_folder_is_refused(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        _forbid(monkeypatch, CASES[case][2])
        argv, option = _argv(case, tmp_path, str(locked / _image(case)))
        err = _refused(capsys, argv)
        assert f"Invalid value for '{option}'" in err and "is not writable" in err
    finally:
        locked.chmod(0o700)


def test_reproduce_all_out_must_be_a_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _forbid(monkeypatch, ("opacus_lastiterate.figures", "load"))
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    err = _refused(capsys, ["reproduce", "all", "--quick", "--out", str(a_file)])
    assert "Invalid value for '--out'" in err and "exists and is not a folder" in err
    err = _refused(capsys, ["reproduce", "all", "--quick", "--out", str(a_file / "figs")])
    assert "Invalid value for '--out'" in err and f"'{a_file}' is a file" in err
    assert not (tmp_path / "figs").exists()


def test_reproduce_default_picture_is_checked_before_computing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")  # without it the default picture is skipped, not checked
    _forbid(monkeypatch, ("opacus_lastiterate.figures", "load"))
    # ./NAME.png is a folder, so the picture would go to ./NAME.png/NAME.png: a folder too
    (tmp_path / "last-iterate-fig1.png" / "last-iterate-fig1.png").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    err = _refused(capsys, ["reproduce", "last-iterate-fig1", "--quick"])
    assert "Invalid value for '--plot'" in err and "is an existing folder" in err


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_missing_folder_is_refused_and_never_created(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A file in a folder that does not exist is refused before computing, the message names
    the option and the missing folder, and no folder is created (not even the first one)."""
    _forbid(monkeypatch, CASES[case][2])
    missing = tmp_path / "missing"
    argv, option = _argv(case, tmp_path, str(missing / "deeper" / _image(case)))
    err = _refused(capsys, argv)
    assert f"Invalid value for '{option}'" in err
    assert f"the directory '{missing / 'deeper'}' does not exist" in err
    assert not missing.exists()


def test_a_folder_at_the_filesystem_root_is_never_created(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--plot /missing/x.png`` is refused; nothing appears at the root."""
    missing = Path("/").absolute() / "opacus_lastiterate_no_such_folder"
    assert not missing.exists()
    err = _refused(capsys, [*EPSILON, "--plot", str(missing / "x.png")])
    assert "Invalid value for '--plot'" in err and f"'{missing}' does not exist" in err
    assert not missing.exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_folder_that_takes_no_file_is_refused_before_computing(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """/proc takes no new file, whatever its permission bits say (also for root): refused
    before computing, naming the option and the user's path, not a temporary file."""
    _forbid(monkeypatch, CASES[case][2])
    target = f"/proc/{_image(case)}"
    argv, option = _argv(case, tmp_path, target)
    err = _refused(capsys, argv)
    assert f"Invalid value for '{option}'" in err
    assert f"cannot write '{target}'" in err and "the folder '/proc' is not writable" in err
    assert ".tmp" not in err


def test_a_folder_the_user_names_is_created_but_not_its_parents(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--plot DIR/`` creates DIR (the folder the user named) when its parent exists, and
    nothing when it does not."""
    pytest.importorskip("matplotlib")
    fast = [*EPSILON, "--value-discretization-interval", "1e-3"]
    assert main([*fast, "--plot", f"{tmp_path / 'figures'}/"]) == 0
    assert (tmp_path / "figures" / "epsilon.png").read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    err = _refused(capsys, [*fast, "--plot", f"{tmp_path / 'a' / 'figures'}/"])
    assert f"the directory '{tmp_path / 'a'}' does not exist" in err
    assert not (tmp_path / "a").exists()


def test_a_write_that_fails_after_the_check_names_the_option_and_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The folder passed the check but the write fails (a full disk, say): the error names
    --plot and the user's path."""
    figure_module = pytest.importorskip("matplotlib.figure")

    def full_disk(self: object, fname: object, *args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device", str(fname))

    monkeypatch.setattr(figure_module.Figure, "savefig", full_disk)
    target = tmp_path / "eps.png"
    with pytest.raises(SystemExit) as stop:
        main([*EPSILON, "--value-discretization-interval", "1e-3", "--plot", str(target)])
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert f"--plot '{target}': could not write the file: No space left on device" in err


def test_a_refused_path_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check leaves nothing behind (its test file is removed): a command refused for
    another reason after the output option was accepted leaves the folder as it was."""
    target = tmp_path / "eps.png"
    err = _refused(capsys, [*EPSILON[:-2], "--epsilon", "1", "--plot", str(target)])
    assert "pass --delta" in err
    assert list(tmp_path.iterdir()) == []
