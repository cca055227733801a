"""What every `nasctl` app shares: the group that turns user errors into one line, the
root options (--workspace, --version) and the handling of library warnings."""

from __future__ import annotations

import errno
import os
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup

from .. import __version__, workspace
from ..errors import NasctlError, UsageError


class NasctlGroup(TyperGroup):
    """Turns user errors into one line on stderr and an exit code (a file the user named that
    cannot be read or written included); bugs keep their traceback."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            _refuse_empty(sys.argv[1:] if args is None else list(args))
            with _library_warnings():
                rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as e:  # usage errors: bad flag, bad value
            if not standalone_mode:
                raise
            if type(e).__name__ == "NoArgsIsHelpError":
                # a group run without a subcommand: not an error. Rich help is already on
                # stdout (the message is then empty); plain help is the message itself.
                if e.format_message():
                    typer.echo(e.format_message())
                sys.exit(0)
            _fail(_with_value(e, sys.argv[1:] if args is None else [str(a) for a in args]), e.exit_code)
        except typer.Abort:
            if not standalone_mode:
                raise
            _fail("aborted", 130)
        except NasctlError as e:
            if not standalone_mode:
                raise
            _fail(str(e), e.exit_code)
        except OSError as e:  # a path the user gave that cannot be read or written: a folder, a full disk, ...
            if not standalone_mode:
                raise
            names = " -> ".join(f"'{f}'" for f in (e.filename, e.filename2) if f is not None)
            reason = e.strerror or " ".join(str(e).split()) or type(e).__name__
            _fail(f"cannot use {names}: {reason}" if names else f"{reason} (writing or reading a file)",
                  2 if e.errno in PATH_ERRORS and names else 1)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


def _with_value(e: typer.TyperException, args: list[str]) -> str:
    """A bad value's message naming the value typed: "Invalid value for '--kernels': ..."
    becomes "--kernels 0: ..." (the range checks name only the bound)."""
    message = e.format_message()
    param = getattr(e, "param", None)
    prefix = "Invalid value for "
    if not isinstance(e, typer.BadParameter) or param is None or not message.startswith(prefix):
        return message
    opts = [o for o in getattr(param, "opts", []) if o.startswith("-")]
    for i, arg in reversed(list(enumerate(args))):  # a flag given twice: its last value is the one read
        flag, _, inline = arg.partition("=")
        if flag in opts and (inline or i + 1 < len(args)):
            value = inline if inline else args[i + 1]
            return f"{flag} {value}: {message.split(': ', 1)[-1]}"
    return message


def _refuse_empty(args: list[str]) -> None:
    """An empty value (`--objectives ""`, `--storage=`, an empty argument) is a mistake, often
    an unset shell variable: refused, not read as the flag's default."""
    args = [str(a) for a in args]
    for i, arg in enumerate(args):
        if arg == "--":
            return
        if arg.startswith("--") and arg.endswith("=") and len(arg) > 3:
            raise UsageError(f"{arg[:-1]}: the value is empty; give a value or leave the flag out")
        if not arg.strip():
            after = args[i - 1] if i and args[i - 1].startswith("-") and "=" not in args[i - 1] else None
            raise UsageError(f"{after}: the value {arg!r} is empty; give a value or leave the flag out" if after
                             else f"argument {i + 1} is empty ({arg!r}); give a value")


# errors of a path the user chose (exit 2, bad input); other OSErrors with a file name, such as
# a full disk, exit 1
PATH_ERRORS = {errno.EISDIR, errno.ENOTDIR, errno.ENOENT, errno.EEXIST, errno.EACCES, errno.EPERM, errno.EROFS,
               errno.ENAMETOOLONG}
WARNINGS_ENV = "NASCTL_WARNINGS"


@contextmanager
def _library_warnings():
    """Python warnings of the libraries nasctl drives (scikit-learn's ConvergenceWarning,
    numpy's overflow RuntimeWarning, ...) are not the user's to act on: they stay off the
    terminal, in worker processes too, unless NASCTL_WARNINGS=1 (or python -W /
    PYTHONWARNINGS) asks for them."""
    if os.environ.get(WARNINGS_ENV, "") not in ("", "0"):
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            yield
        return
    if sys.warnoptions:  # the interpreter was told what to show
        yield
        return
    before = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = "ignore"  # spawned workers start with it
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        if before is None:
            os.environ.pop("PYTHONWARNINGS", None)
        else:
            os.environ["PYTHONWARNINGS"] = before


def _fail(message: str, code: int):
    typer.echo(f"error: {' '.join(message.split())}", err=True)
    sys.exit(code)


HELP = ("Hardware-aware neural architecture search. "
        "Python warnings of the libraries it drives are hidden; NASCTL_WARNINGS=1 shows them.")


def _version(value: bool):
    if value:
        typer.echo(f"nasctl {__version__}")
        raise typer.Exit()


def new_app() -> typer.Typer:
    """An app with nasctl's root options and error handling, and no commands yet."""
    app = typer.Typer(cls=NasctlGroup, no_args_is_help=True, add_completion=False,
                      pretty_exceptions_show_locals=False, help=HELP)

    @app.callback()
    def _root(
        workspace_dir: Annotated[Optional[Path], typer.Option(
            "--workspace", envvar="NASCTL_WORKSPACE",
            help="Folder holding search_spaces/, hardware/, predictors/ and runs/.")] = None,
        version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                              help="Print the version and exit.")] = False,
    ):
        workspace.set_workspace(workspace_dir)

    return app
