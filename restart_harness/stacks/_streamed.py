"""Emulated torch.save files written and read back in bounded memory, byte for byte torch.save's (helpers of
stacks/emulated.py, engine=default; how: docs/emulation.md)."""

from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np
import torch
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

from restart_harness.model.digest import BLOCK_WORDS
from restart_harness.plan.checkpoint import STREAM_CHUNK_BYTES
from restart_harness.stacks._deepspeed_files import tensors_of

M64 = 2**64 - 1
DIGEST_BLOCK = 8 * BLOCK_WORDS
SERIALIZATION_ID = ".data/serialization_id"


class StreamedTorchEngine(TorchCheckpointEngine):
    """DeepSpeed's TorchCheckpointEngine, whose save streams the state's data when the emulation hands it a Fill
    for that state (`fill`), and whose load maps the file and reads it through in chunks."""

    fill: Fill | None = None
    # set by the emulated stack where it streams: loads map the file and read its data through in chunks, digesting
    # each tensor (`digests`) inside the manager's untimed("verify")
    streams = False
    untimed = None
    digests: dict[str, str] | None = None

    def save(self, state_dict, path):
        if self.fill is None or self.fill.state is not state_dict:
            return super().save(state_dict, path)
        with torch.serialization.skip_data():
            super().save(state_dict, path)
        self.fill.digests = write(str(path), self.fill)

    def load(self, path, map_location=None):
        if not self.streams:
            return super().load(path, map_location)
        state = torch.load(path, map_location=map_location, weights_only=False, mmap=True)
        self.digests = read(str(path), state, self.untimed)
        return state


@dataclass
class Fill:
    """One file's streamed data: its state (tensors unfilled), the Filler and the fill number of each storage the
    Filler was to fill (by storage, _cdata), and the manager's untimed() (generating data is not the save)."""

    state: object
    filler: object
    fills: dict[int, int]
    untimed: object
    digests: dict[str, str] | None = None


def storages(state) -> list:
    """The storages torch.save writes for `state`, in its order (data/0, data/1, ...): the order its pickler meets
    them (torch.serialization._save's persistent_id keys them so, one key per storage)."""
    order: list = []
    index: dict[int, int] = {}

    class Keys(pickle.Pickler):
        def persistent_id(self, obj):
            if not (isinstance(obj, torch.storage.TypedStorage) or torch.is_storage(obj)):
                return None
            storage = obj._untyped_storage if isinstance(obj, torch.storage.TypedStorage) else obj
            if storage._cdata not in index:
                index[storage._cdata] = len(order)
                order.append(storage)
            return index[storage._cdata]

    Keys(io.BytesIO(), protocol=torch.serialization.DEFAULT_PROTOCOL).dump(state)
    return order


class Running:
    """model/digest.py's tensor_digest of bytes that arrive in pieces."""

    def __init__(self, t: torch.Tensor):
        self.head = f"{t.dtype}:{tuple(t.shape)}"
        self.plain = self.weighted = self.blocks = 0
        self.carry = b""

    def update(self, data: np.ndarray) -> None:
        if self.carry:
            need = DIGEST_BLOCK - len(self.carry)
            self.carry += data[:need].tobytes()
            data = data[need:]
            if len(self.carry) < DIGEST_BLOCK:
                return
            self._blocks(np.frombuffer(self.carry, dtype=np.uint64))
            self.carry = b""
        whole = len(data) // DIGEST_BLOCK * DIGEST_BLOCK
        if whole:
            self._blocks(data[:whole].view(np.uint64))
        self.carry = data[whole:].tobytes()

    def _blocks(self, words: np.ndarray) -> None:
        sums = words.reshape(-1, BLOCK_WORDS).sum(axis=1, dtype=np.uint64)
        weights = np.arange(self.blocks + 1, self.blocks + 1 + len(sums), dtype=np.uint64)
        self.plain = (self.plain + int(sums.sum(dtype=np.uint64))) & M64
        self.weighted = (self.weighted + int((sums * weights).sum(dtype=np.uint64))) & M64
        self.blocks += len(sums)

    def hexdigest(self) -> str:
        whole = len(self.carry) // 8 * 8
        rest = int(np.frombuffer(self.carry[:whole], dtype=np.uint64).sum(dtype=np.uint64)) if whole else 0
        plain, weighted = (self.plain + rest) & M64, (self.weighted + rest * (self.blocks + 1)) & M64
        return f"{self.head}:{plain:016x}{weighted:016x}:{self.carry[whole:].hex()}"


def _feed(spans, chunk: np.ndarray, at: int) -> None:
    for start, end, _, running in spans:
        lo, hi = max(start, at), min(end, at + len(chunk))
        if lo < hi:
            running.update(chunk[lo - at:hi - at])


@dataclass(frozen=True)
class _Record:
    data: int  # offset of its first byte in the file
    nbytes: int
    crc: int
    central: int  # offset of its central directory entry
    descriptor: bool  # its CRC-32 sits in a data descriptor after the data (miniz's writer), else the local header
    local: int


def _records(path: str) -> dict[str, _Record]:
    """name inside the archive -> record, in the order written."""
    out: dict[str, _Record] = {}
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        central = z.start_dir
        for info in z.infolist():
            f.seek(central)
            name_len, extra_len, comment_len = struct.unpack("<HHH", f.read(46)[28:34])
            f.seek(info.header_offset)
            local_name, local_extra = struct.unpack("<HH", f.read(30)[26:30])
            out[info.filename.split("/", 1)[1]] = _Record(info.header_offset + 30 + local_name + local_extra,
                                                          info.file_size, info.CRC, central,
                                                          bool(info.flag_bits & 0x08), info.header_offset)
            central += 46 + name_len + extra_len + comment_len
    return out


def _set_crc(fd: int, record: _Record, crc: int) -> None:
    packed = struct.pack("<I", crc)
    os.pwrite(fd, packed, record.central + 16)
    if record.descriptor:
        at = record.data + record.nbytes
        os.pwrite(fd, packed, at + 4 if os.pread(fd, 4, at) == b"PK\x07\x08" else at)
    else:
        os.pwrite(fd, packed, record.local + 14)


def _chunks(path: str, state):
    """The file's records; per storage of `state`, (first byte, end byte, key, running digest) of every tensor in it;
    and (storage index, storage, its record, offset, length) of every chunk of the file's data, in file order."""
    order, records = storages(state), _records(path)
    index = {s._cdata: i for i, s in enumerate(order)}
    spans: list[list[tuple[int, int, str, Running]]] = [[] for _ in order]
    for key, t in tensors_of(state).items():
        assert t.is_contiguous(), key  # DeepSpeed's state holds whole tensors and contiguous views
        start = t.storage_offset() * t.element_size()
        spans[index[t.untyped_storage()._cdata]].append((start, start + t.nbytes, key, Running(t)))

    def chunks():
        for i, storage in enumerate(order):
            record, nbytes = records[f"data/{i}"], storage.nbytes()
            for at in range(0, nbytes, STREAM_CHUNK_BYTES):
                yield i, storage, record, at, min(STREAM_CHUNK_BYTES, nbytes - at)

    return records, spans, chunks()


def _digests(spans) -> dict[str, str]:
    return {key: running.hexdigest() for per in spans for _, _, key, running in per}


def write(path: str, fill: Fill) -> dict[str, str]:
    """Fill the storages of the skeleton torch.save left at `path` and make its CRCs and serialization id torch's;
    the digest of every tensor of the state."""
    records, spans, chunks = _chunks(path, fill.state)
    buffer = torch.empty(STREAM_CHUNK_BYTES, dtype=torch.uint8)
    view = buffer.numpy()
    crcs = {}
    with open(path, "r+b") as f:
        fd = f.fileno()
        for i, storage, record, at, length in chunks:
            with fill.untimed("generate"):
                if storage._cdata in fill.fills:
                    fill.filler.pattern(fill.fills[storage._cdata], storage.nbytes(), at, buffer[:length])
                else:  # a tensor with a value of its own (Adam's step): its bytes
                    buffer[:length].copy_(torch.empty(0, dtype=torch.uint8).set_(storage)[at:at + length])
                _feed(spans[i], view[:length], at)
            crcs[f"data/{i}"] = zlib.crc32(view[:length], crcs.get(f"data/{i}", 0))
            os.pwrite(fd, view[:length], record.data + at)
        for name, crc in crcs.items():
            _set_crc(fd, records[name], crc)
        combined = 0
        for name, record in records.items():
            if name != SERIALIZATION_ID and record.nbytes:  # torch's writer combines non-empty records only
                value = crcs.get(name, record.crc)  # c10::hash_combine
                combined = (combined ^ ((value + 0x9E3779B9 + ((combined << 6) & M64) + (combined >> 2)) & M64)) & M64
        sid = records[SERIALIZATION_ID]
        value = os.pread(fd, sid.nbytes, sid.data)[:20] + f"{combined:020d}".encode()
        os.pwrite(fd, value, sid.data)
        _set_crc(fd, sid, zlib.crc32(value))
    return _digests(spans)


def read(path: str, state, untimed) -> dict[str, str]:
    """Every storage of `state` (loaded from `path` with mmap=True) read from the file in chunks into one buffer (what
    a load reads), and the digest of each of its tensors, taken chunk by chunk inside untimed("verify")."""
    _, spans, chunks = _chunks(path, state)
    view = np.empty(STREAM_CHUNK_BYTES, dtype=np.uint8)
    with open(path, "rb", buffering=0) as f:
        for i, _, record, at, length in chunks:
            got = os.preadv(f.fileno(), [memoryview(view)[:length]], record.data + at)
            if got != length:
                raise OSError(f"{path}: data/{i} ends {length - got} bytes early")
            with untimed("verify"):
                _feed(spans[i], view[:length], at)
    return _digests(spans)
