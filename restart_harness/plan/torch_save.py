"""Bytes of a torch.save file, predicted without writing it: the tensor storages exactly, the zip structure and the
pickle estimated, calibrated on files the harness wrote (docs/planner.md: the model and its measured residuals)."""

from __future__ import annotations

from dataclasses import dataclass

# Names of the entries torch.save writes besides the storages (data/0, data/1, ...), under "<file stem>/".
_META_ENTRIES = ("data.pkl", ".format_version", ".storage_alignment", "byteorder", "version", ".data/serialization_id")
_ENTRY_FIXED_BYTES = 30 + 46 + 62  # local header + central directory record + mean alignment padding
_END_RECORD_BYTES = 22

# Pickle bytes: base per file kind, and per name (added to the name's length). Calibrated on tiny runs
# (tests/test_planner.py checks the whole estimate against real files of three layouts); ZeRO-3's model files (a
# placeholder, its own empty storage and its shape per parameter) on tiny and llama3-8B shrink=64, 4 and 32 layers
# (tests/test_mlperf.py checks the latter's files).
PICKLE_BASE = {"layer_states": 100, "model_states_pipe": 800, "model_states": 6700, "optimizer_states": 1450,
               "model_states_zero3": 1020, "optimizer_states_zero3": 1500}
PICKLE_PER_NAME = {"layer_states": 62, "model_states_pipe": 30, "model_states": 40, "optimizer_states": 40,
                   "model_states_zero3": 186, "optimizer_states_zero3": 0}


@dataclass(frozen=True)
class SavedFile:
    """What goes into one torch.save call: storage sizes (exact) and the names the pickle will hold."""

    stem: str  # file name without ".pt": torch uses it as the archive's top folder
    storage_bytes: tuple[int, ...]
    pickle_kind: str  # key of PICKLE_BASE
    names: tuple[str, ...] = ()

    @property
    def tensor_bytes(self) -> int:
        return sum(self.storage_bytes)

    def zip_bytes(self) -> int:
        entries = list(_META_ENTRIES) + [f"data/{i}" for i in range(len(self.storage_bytes))]
        return _END_RECORD_BYTES + sum(_ENTRY_FIXED_BYTES + 2 * len(f"{self.stem}/{e}") for e in entries)

    def pickle_bytes(self) -> int:
        per = PICKLE_PER_NAME[self.pickle_kind]
        return PICKLE_BASE[self.pickle_kind] + sum(len(n) + per for n in self.names)

    def bytes(self) -> int:
        """Predicted file size: exact storages + estimated pickle and zip structure."""
        return self.tensor_bytes + self.pickle_bytes() + self.zip_bytes()
