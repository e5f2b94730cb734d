"""The on-disk format of engine=lazy (docs/engines.md#the-format-of-enginelazy), its reader and its converter to
DeepSpeed's own torch.save layout (`python -m engines.lazy.format to-torch-save SRC_TAG DST_TAG`). Needs only torch."""

from __future__ import annotations

import io
import json
import pickle
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from engines._state_tree import relocate
from engines.lazy.buffers import ALIGNMENT, Reads, aligned, aligned_empty

FORMAT = "restart-harness-lazy"
VERSION = 1
HEADER, REMAINDER = "header.json", "remainder.pkl"


def part_name(k: int) -> str:
    return f"part-{k}.bin"


def is_lazy(path: str | Path) -> bool:
    return (Path(path) / HEADER).is_file()


class _Pickler(pickle.Pickler):
    def __init__(self, f, tensors: list):
        super().__init__(f, protocol=5)
        self.tensors = tensors
        self.index: dict[int, int] = {}  # id(tensor) -> its index: a tensor referred to twice is stored once

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor):
            if id(obj) not in self.index:
                self.index[id(obj)] = len(self.tensors)
                self.tensors.append(obj.detach())  # writers read the data; autograd history is not state
            return ("t", self.index[id(obj)])
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, tensors: list):
        super().__init__(f)
        self.tensors = tensors

    def persistent_load(self, pid):
        kind, i = pid
        assert kind == "t", pid
        return self.tensors[i]


def split(state: object) -> tuple[list[torch.Tensor], bytes]:
    """(the state's tensors, detached, in pickling order, the remainder pickled with persistent ids in their place)."""
    tensors: list[torch.Tensor] = []
    buf = io.BytesIO()
    _Pickler(buf, tensors).dump(state)
    return tensors, buf.getvalue()


def plan(tensors: list[torch.Tensor], shares: int) -> tuple[dict, list[tuple[int, int, int]]]:
    """The header, and (part, offset, nbytes) of each tensor: tensors in order, cut into `shares` parts of about
    equal bytes, each tensor at an aligned offset of its part (part k of a file split over replicas is written by
    data-parallel rank k)."""
    sizes = [t.numel() * t.element_size() for t in tensors]
    total = sum(sizes)
    placements, part, offset, done = [], 0, 0, 0
    ends = [0] * shares
    for n in sizes:
        if part < shares - 1 and offset > 0 and done + n / 2 > total * (part + 1) / shares:
            ends[part] = offset
            part, offset = part + 1, 0
        placements.append((part, offset, n))
        offset = aligned(offset + n)
        done += n
    ends[part] = offset
    return {"format": FORMAT, "version": VERSION, "alignment": ALIGNMENT,
            "tensors": [{"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "part": p, "offset": o,
                         "nbytes": n} for t, (p, o, n) in zip(tensors, placements, strict=True)],
            "parts": [{"file": part_name(k), "bytes": ends[k], "writer_dp_rank": k} for k in range(shares)],
            "remainder": REMAINDER}, placements


def read_header(path: Path) -> dict:
    """The directory's header, once every part file is checked to hold its bytes (check_parts)."""
    header = json.loads((path / HEADER).read_text())
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise ValueError(f"{path}: not a {FORMAT} v{VERSION} directory")
    check_parts(path, header)
    return header


def check_parts(path: Path, header: dict) -> None:
    """Every part file holds its bytes (a stat each: nothing read)."""
    for part in header["parts"]:
        f = path / part["file"]
        if f.stat().st_size < part["bytes"]:
            raise OSError(f"{f}: {f.stat().st_size} bytes, {part['bytes']} expected (a torn checkpoint?)")


def read(path: Path, threads: int = 4) -> tuple[dict, bytes, list[torch.Tensor]]:
    """The directory's header, its pickled remainder and every part in a buffer of its own, read here."""
    header = read_header(path)
    buffers = [aligned_empty(part["bytes"]) for part in header["parts"]]
    with ThreadPoolExecutor(threads) as pool:  # every part's requests queued at once: `threads` in flight
        reads = [Reads(path / part["file"], buf, pool) for part, buf in zip(header["parts"], buffers, strict=True)]
        for r in reads:
            r.wait()
    return header, (path / header["remainder"]).read_bytes(), buffers


def load(path: str | Path, threads: int = 4, map_location=None, reuse: dict | None = None, reader=None) -> object:
    """The state dict saved at path: each part read into one buffer, tensors built as views of it. With `reuse`
    (a dict the caller keeps), loading the same path again right after rebuilds the state from the buffers already
    read instead of reading the files again (DeepSpeed's load reads a pp=1 model file twice). `reader`: path ->
    (header, remainder, buffers) instead of read() (engine=lazy's broadcast load)."""
    path = Path(path)
    if reuse is not None and reuse.get("path") == str(path):
        header, remainder, buffers = reuse["read"]
        check_parts(path, header)  # checked on every load, a reused one too
    else:
        header, remainder, buffers = reader(path) if reader else read(path, threads)
        if reuse is not None:
            reuse.update(path=str(path), read=(header, remainder, buffers))
    flats = [(buffers[t["part"]][t["offset"]:t["offset"] + t["nbytes"]], t) for t in header["tensors"]]
    tensors = [flat.view(getattr(torch, t["dtype"])).view(t["shape"]) for flat, t in flats]
    tensors = list(relocate(dict(enumerate(tensors)), map_location).values())
    return _Unpickler(io.BytesIO(remainder), tensors).load()


def to_torch_save(src: str | Path, dst: str | Path) -> list[Path]:
    """A checkpoint tag directory of engine=lazy -> the same tag as DeepSpeed's default engine writes it."""
    src, dst = Path(src), Path(dst)
    written = []
    for entry in sorted(src.rglob("*")):
        rel = entry.relative_to(src)
        if any(is_lazy(src / q) for q in rel.parents[:-1]):
            continue  # inside a lazy directory: converted with it
        out, lazy = dst / rel, entry.is_dir() and is_lazy(entry)
        if lazy or entry.is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            if lazy:
                torch.save(load(entry), out)
            else:
                shutil.copy2(entry, out)
            written.append(out)
    return written


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "to-torch-save":
        error = "usage: python -m engines.lazy.format to-torch-save SRC_TAG_DIR DST_TAG_DIR"
    elif not (src := Path(argv[1])).is_dir():
        error = f"error: {src}: no such checkpoint directory"
    elif (dst := Path(argv[2])).exists() and any(dst.iterdir()):
        error = f"error: {dst}: exists and is not empty"
    else:
        print(f"{len(to_torch_save(src, dst))} files written under {dst}")
        return 0
    print(error, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
