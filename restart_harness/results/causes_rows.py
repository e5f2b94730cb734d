"""The terminal's rows of where a restart went: each phase's largest causes (results/attribution.py) and the
restart's I/O besides the checkpoint's (results/io_sources.py)."""

from __future__ import annotations

from restart_harness.schema import MIB, io_metadata_ops


def attribution_rows(att: dict | None, record: str) -> list[tuple[str, str]]:
    """"where the restart went": each phase's largest causes (results/attribution.py), its slowest rank's."""
    title = "where the restart went"
    if not att:
        return []
    if not att.get("sampled"):
        return [(title, f"not sampled (attribution={att['mode']}): {att['reason']}; phase timings only")]
    rows = [(title, (f"each phase's causes on its slowest rank, s ({att['tool']}, {att['rate_hz']} Hz samples; "
                    f"flame graphs in profiles/{record}/)"))]
    for phase, p in att["phases"].items():
        if not p["seconds"]:
            continue
        shown = [c for c in p["causes"] if c["seconds"] >= 0.05 * p["seconds"]][:3] or p["causes"][:1]
        rest = sum(c["seconds"] for c in p["causes"]) - sum(c["seconds"] for c in shown)
        parts = [f"{c['cause']} {c['seconds']:.2f}" + (_detail(c) if i == 0 else "") for i, c in enumerate(shown)]
        if rest >= 0.005:
            parts.append(f"{len(p['causes']) - len(shown)} more {rest:.2f}")
        parts.append(f"remainder {p['remainder_seconds']:.2f}")
        if p.get("reads"):
            f = p["reads"][0]
            parts.append(f"longest read {f['file']} {f['read_seconds']:.3f} s ({f['read_bytes'] / 2**20:,.2f} MiB)")
        rows.append((f"  {phase}", f"{p['seconds']:.2f}: " + ", ".join(parts)))
    return rows


def _detail(cause: dict) -> str:
    """An import's largest packages and who imported it."""
    said = [f"{k} {v:.2f}" for k, v in list((cause.get("parts") or {}).items())[:2]]
    if cause.get("via"):
        said.append(f"by {cause['via']}")
    return f" ({'; '.join(said)})" if said else ""


def io_rows(io: dict | None) -> list[tuple[str, str]]:
    """The restart's I/O besides the checkpoint's, per rank (results/io_sources.py), and where imports' comes from."""
    if not io or not io.get("ranks"):
        return []
    n, total, kernel = io["ranks"], io["total"]["sources"], io["total"].get("kernel") or {}
    delivered = (f"storage delivered {kernel['storage_read_bytes'] / n / MIB:,.1f} MiB, "
                 f"{kernel.get('major_faults', 0) / n:,.0f} major faults" if "storage_read_bytes" in kernel else "")
    if not io.get("by_source", True):
        return [("restart I/O", f"per rank {delivered or 'not measured'}; by source not counted (anatomy=false)")]
    rest = [c for name, c in total.items() if name != "checkpoint"]
    libraries = [c for name, c in total.items() if name not in ("checkpoint", "pseudo")]  # not /dev/shm segments
    ops = sum(io_metadata_ops(c) for c in rest) / n
    read = sum(c.get("read_bytes", 0) for c in rest) / n
    mapped = sum(c.get("mapped_bytes", 0) for c in libraries) / n
    ckpt = total.get("checkpoint", {})
    text = (f"per rank {ops:,.0f} metadata ops ({sum(c.get('opens', 0) for c in rest) / n:,.0f} opens), "
            f"{read / MIB:,.1f} MiB read and {mapped / MIB:,.0f} MiB of libraries mapped besides the checkpoint's "
            f"{io_metadata_ops(ckpt) / n:,.0f} ops and {ckpt.get('read_bytes', 0) / n / MIB:,.2f} MiB")
    imports = (io["phases"].get("imports") or {}).get("sources") or {}
    if imports:
        ops_by = {name: io_metadata_ops(c) for name, c in imports.items()}
        top = max(ops_by, key=ops_by.get)
        fs = io.get("filesystems", {}).get(top)
        text += (f"; imports {sum(ops_by.values()) / n:,.0f} ops, {ops_by[top] / max(1, sum(ops_by.values())):.0%} "
                 f"in {top}" + (f" ({fs})" if fs else ""))
    return [("restart I/O", text + (f"; {delivered}" if delivered else ""))]
