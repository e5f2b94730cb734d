"""Errors the command line turns into one line and exit code 2."""


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2, nothing written."""


class RunFailed(Exception):
    """A launched run failed; the run directory records why."""


def refused(key: str, value: object, why: str, accepted: str | None = None) -> UsageError:
    """The one shape of a refusal of a key's value: `key=value: why; accepted: what`, the value as it was given
    (never dropped: a user who typed engine=lazy reads engine=lazy back)."""
    return UsageError(f"{key}={value}: {why}" + (f"; accepted: {accepted}" if accepted else ""))
