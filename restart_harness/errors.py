"""Errors the command line turns into one line and exit code 2."""


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2, nothing written."""


class RunFailed(Exception):
    """A launched run failed; the run directory records why."""
