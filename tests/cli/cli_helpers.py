"""What the CLI tests share: running a command, and the shape of a user error."""

from typer.testing import CliRunner

from nasctl.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(result, code, text):
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and text in lines[0], result.stderr
