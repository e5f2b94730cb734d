"""One rank's memory: the high-water mark of each phase, step and save, from VmRSS and VmHWM (reset through
/proc/self/clear_refs) and, on CUDA, torch's allocated bytes; main thread only. docs/measurements.md#memory-per-save."""

from __future__ import annotations

import sys


def added(now: int | None, before: int | None) -> int | None:
    """Bytes added since `before` (None where either is unknown)."""
    return now - before if now is not None and before is not None else None


class Window:
    """Memory from `open` to `close`: the resident set at its start and the highest one inside it (bytes)."""

    def __init__(self, rss: int | None, peak: int | None, device: int | None, device_peak: int | None):
        self.start_rss, self.peak_rss = rss, peak
        self.start_device, self.peak_device = device, device_peak
        self.end_rss = self.end_device = None

    def fold(self, hwm: int | None, device_peak: int | None) -> None:
        self.peak_rss = max((v for v in (self.peak_rss, hwm) if v is not None), default=None)
        self.peak_device = max((v for v in (self.peak_device, device_peak) if v is not None), default=None)


class MemoryProbe:
    def __init__(self):
        self._open: list[Window] = []
        self._cuda = None  # torch.cuda once a phase has initialized it (never imported here: imports is a phase)
        hwm, rss, _, _ = self._sample()
        # the first phase's window holds everything since the process started (VmHWM was never reset before)
        self._phase = self._opened(Window(rss, hwm, None, None))

    # ---- reading ---------------------------------------------------------------------------------------------------
    def _device(self):
        if self._cuda is None:
            torch = sys.modules.get("torch")  # only once the stack imported it
            if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
                self._cuda = torch.cuda
        return self._cuda

    def _sample(self) -> tuple[int | None, int | None, int | None, int | None]:
        """(host high-water mark since the last sample, host RSS now, device peak, device allocated), after which
        both high-water marks restart from now; the marks are folded into every open window first."""
        hwm = rss = None
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        hwm = int(line.split()[1]) * 1024
                    elif line.startswith("VmRSS:"):
                        rss = int(line.split()[1]) * 1024
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except (OSError, ValueError):
            hwm = rss = None
        device_peak = device_now = None
        cuda = self._device()
        if cuda is not None:
            device_peak, device_now = cuda.max_memory_allocated(), cuda.memory_allocated()
            cuda.reset_peak_memory_stats()
        for w in self._open:
            w.fold(hwm, device_peak)
        return hwm, rss, device_peak, device_now

    def _opened(self, w: Window) -> Window:
        self._open.append(w)
        return w

    # ---- windows ---------------------------------------------------------------------------------------------------
    def open(self) -> Window:
        """A window starting now (a step, a save)."""
        _, rss, _, device = self._sample()
        return self._opened(Window(rss, rss, device, device))

    def now(self) -> tuple[int | None, int | None]:
        """(host RSS, device allocated bytes) now; the high-water marks so far are kept by the open windows."""
        _, rss, _, device = self._sample()
        return rss, device

    def close(self, w: Window) -> Window:
        """The window's figures, final: its peak includes everything up to now; end_rss / end_device: now."""
        _, w.end_rss, _, w.end_device = self._sample()
        if w in self._open:
            self._open.remove(w)
        return w

    def phase_peaks(self) -> dict:
        """The memory high-water marks of the phase ending now (since the previous call), and a new phase's window:
        {"peak_rss_bytes": ..., "peak_device_bytes": ... (CUDA only)}."""
        w = self.close(self._phase)
        out = {"peak_rss_bytes": w.peak_rss} | ({} if w.peak_device is None else {"peak_device_bytes": w.peak_device})
        self._phase = self._opened(Window(None, None, None, None))
        return out
