"""The `nasctl` command line. Each command group lives in its own module; heavy
libraries (torch, pymoo, optuna, pandas) are imported only inside the commands that
need them, so `nasctl --help` starts fast.  `nasctl predict`, run from scripts on many
models, starts faster still: it builds an app of that one command (`_predict_app`), the
same command with the same root options, without loading the other commands."""

from __future__ import annotations

import sys
from typing import Sequence


def _command(argv: Sequence[str]) -> str | None:
    """The command an argument list names (after the root options), or None."""
    args = iter(argv)
    for arg in args:
        if arg == "--workspace":
            next(args, None)
        elif not arg.startswith("-"):
            return arg
    return None


def _predict_app():
    from . import predict
    from .base import new_app

    app = new_app()
    app.command("predict")(predict.predict)
    return app


def main() -> None:
    if _command(sys.argv[1:]) == "predict":
        return _predict_app()(prog_name="nasctl")
    from .tree import app

    app()


def __getattr__(name: str):
    if name == "app":
        from .tree import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
