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


def select(location: str | None) -> type[Target]:
    """The target class whose scheme `ckpt_dir=location` uses; UsageError when none claims it, or when it is malformed."""
    claimed = [cls for cls in all_targets().values() if cls.claims(location)]
    if len(claimed) != 1:
        names = ", ".join(all_targets())
        raise UsageError(f"ckpt_dir={location}: no storage target takes this location (targets: {names})")
    return claimed[0]


def for_location(location: str | None, results_dir: str | Path) -> Target:
    """The target of `ckpt_dir=location` before any run (results_dir: where runs go when location is None)."""
    return select(location)(location, results_dir=results_dir)


def recorded(record: dict, run_dir: Path) -> type[Target]:
    """The target class a run's spec.json names (restart_harness/resolve.py places it from the record)."""
    name = record.get("checkpoint_target") or ("s3" if record.get("checkpoint_url") else "filesystem")  # harness 0.2.0
    try:
        return all_targets()[name]
    except KeyError:
        raise UsageError(f"run={run_dir}: its checkpoints are on storage target {name!r}, which this harness "
                         f"does not know (targets: {', '.join(all_targets())})") from None

