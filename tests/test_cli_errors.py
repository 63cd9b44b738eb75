"""The CLI's error contract: a user's error is one line and a non-zero exit; a bug keeps its traceback."""

import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import linearize.attention
from linearize.cli import app, friendly_errors, is_user_path_error
from linearize.errors import LinearizeError

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]

BUG = """
import linearize.attention

def broken(*args, **kwargs):
    raise {error}

linearize.attention.create_feature_map = broken
from linearize.cli import main
main()
"""


def run_cli(*args, code="from linearize.cli import main; main()", debug=False):
    """``linearize ARGS`` in a fresh interpreter, as a user runs it: (exit code, stderr lines)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("LINEARIZE_DEBUG", None)
    if debug:
        env["LINEARIZE_DEBUG"] = "1"
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)
    return done.returncode, [line for line in done.stderr.splitlines() if line.strip()]


def test_a_user_error_is_one_line_with_exit_1(tmp_path):
    code, lines = run_cli("info", str(tmp_path / "missing"))
    assert code == 1
    assert len(lines) == 1 and lines[0].startswith("error:") and "missing does not exist" in lines[0], lines


def test_linearize_debug_shows_the_traceback_of_a_user_error(tmp_path):
    code, lines = run_cli("info", str(tmp_path / "missing"), debug=True)
    assert code == 1
    assert lines[0] == "Traceback (most recent call last):", lines
    assert lines[-1].startswith("linearize.errors.LinearizeError:") and "missing does not exist" in lines[-1]


def test_an_unexpected_exception_keeps_its_traceback():
    """A bug is not the user's even when it is a ValueError: the traceback is printed, not one line."""
    code, lines = run_cli("methods", code=BUG.format(error="ValueError('boom: a bug')"))
    assert code == 1
    assert lines[0] == "Traceback (most recent call last):", lines
    assert any("in methods_command" in line for line in lines) and any("in broken" in line for line in lines)
    assert lines[-1] == "ValueError: boom: a bug" and not any(line.startswith("error:") for line in lines)


def test_a_path_error_on_a_path_the_user_gave_is_one_line(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    result = runner.invoke(app, ["bench", "attention", "--out", str(tmp_path / "a-file" / "bench"), "--methods", "relu",
                                 "--seq-lens", "8", "--model", "none", "--repeats", "1", "--warmup", "0",
                                 "--no-memory"])
    assert result.exit_code == 1, result.output
    # checked before any work (issue 36): the file in the way is named
    assert result.output.strip().splitlines()[-1].startswith("error: cannot make the output folder")
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_bad_parameter_raised_by_a_command_is_one_line_with_exit_2():
    small = typer.Typer()

    @small.command()
    @friendly_errors
    def count(number: int = 0):
        raise typer.BadParameter(f"{number} is not a positive count", param_hint="--number")

    result = runner.invoke(small, ["--number", "0"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == ["error: Invalid value for --number: 0 is not a positive count"]


@pytest.mark.parametrize("error", [ValueError("boom: a bug"), RuntimeError("boom: a bug"),
                                   FileNotFoundError(2, "No such file or directory", "/nonexistent/linearize/x.json")])
def test_a_bug_in_a_command_propagates_through_friendly_errors(monkeypatch, error):
    """Any exception but the user's, a path error on a path they did not give included, propagates."""
    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(linearize.attention, "create_feature_map", broken)
    result = runner.invoke(app, ["methods"])
    assert result.exception is error
    assert "error:" not in result.output
    frames = "".join(traceback.format_exception(*result.exc_info))
    assert "in methods_command" in frames and "in broken" in frames


def test_user_path_errors_are_those_on_the_given_paths(tmp_path):
    given = [tmp_path / "run", "luna", 3]
    inside = FileNotFoundError(2, "No such file or directory", str(tmp_path / "run" / "model" / "config.json"))
    elsewhere = FileNotFoundError(2, "No such file or directory", "/usr/lib/linearize-internal.json")
    assert is_user_path_error(inside, given)
    assert not is_user_path_error(elsewhere, given)
    assert is_user_path_error(FileExistsError("the output folder is in the way"), given)  # no file named
    assert not is_user_path_error(LinearizeError("not a path error"), given)
