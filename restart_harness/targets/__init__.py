"""Storage targets: where checkpoints are kept (a file system, an S3 bucket, ...), one module each holding one
subclass of targets.base.Target, discovered here. The target is chosen once, from ckpt_dir; nothing outside this
package asks which kind it is. Importing a target module imports no torch and no S3 client."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from restart_harness.errors import UsageError
from restart_harness.plugins import discover
from restart_harness.targets.base import Target


@cache
def all_targets() -> dict[str, type[Target]]:
    return discover(__name__, __path__, Target)


def select(location: str | None, key: str = "ckpt_dir") -> type[Target]:
    """The target class whose scheme `key=location` uses; UsageError when none claims it, or when it is malformed."""
    try:
        claimed = [cls for cls in all_targets().values() if cls.claims(location)]
    except ValueError as exc:  # a scheme claimed, the rest of the location malformed
        raise UsageError(f"{key}={location}: {exc}") from None
    if len(claimed) != 1:
        names = ", ".join(all_targets())
        raise UsageError(f"{key}={location}: no storage target takes this location (targets: {names})")
    return claimed[0]


def for_location(location: str | None, results_dir: str | Path, key: str = "ckpt_dir") -> Target:
    """The target of `key=location` before any run (results_dir: where runs go when location is None)."""
    return select(location, key)(location, results_dir=results_dir)


def recorded(record: dict, run_dir: Path) -> type[Target]:
    """The target class a run's spec.json names (restart_harness/resolve.py places it from the record)."""
    name = record.get("checkpoint_target") or ("s3" if record.get("checkpoint_url") else "filesystem")  # harness 0.2.0
    try:
        return all_targets()[name]
    except KeyError:
        raise UsageError(f"run={run_dir}: its checkpoints are on storage target {name!r}, which this harness "
                         f"does not know (targets: {', '.join(all_targets())})") from None
