"""User-facing errors.

Anything the user can fix (a wrong flag, an unknown name, a malformed spec, an
infeasible constraint) is a :class:`NasctlError`.  The CLI prints its message as one
line on stderr and exits with :attr:`exit_code`; bugs keep their traceback.
"""


class NasctlError(Exception):
    """Base class of errors caused by user input or the user's environment."""

    exit_code = 1


class UsageError(NasctlError):
    """A flag, name or value the user gave is not allowed (exit code 2)."""

    exit_code = 2


class ConfigError(UsageError):
    """A spec or config file is malformed; the message names the key path."""


class WorkFailed(NasctlError):
    """The work ran but could not produce the requested result (exit code 1)."""


class Interrupted(NasctlError):
    """The user stopped the work (Ctrl-C); what was finished is kept (exit code 130)."""

    exit_code = 130
