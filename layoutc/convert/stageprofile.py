"""Seconds, CPU seconds and bytes per stage of ``layoutc convert`` (``--profile``), added up over threads."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any


class Profile:
    """Seconds and bytes per stage, added up over threads (thread-safe). ``seconds`` are wall time
    (a thread waiting for a core counts); ``cpu`` is the thread's CPU time over the same spans
    (:func:`time.thread_time`): on a machine with fewer cores than busy threads, ``cpu`` says what
    each stage costs and ``seconds`` how long it took."""

    def __init__(self):
        self._lock = threading.Lock()
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.bytes: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def add(self, stage: str, seconds: float, nbytes: int = 0, cpu: float | None = None) -> None:
        with self._lock:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds
            self.counts[stage] = self.counts.get(stage, 0) + 1
            if cpu is not None:
                self.cpu[stage] = self.cpu.get(stage, 0.0) + cpu
            if nbytes:
                self.bytes[stage] = self.bytes.get(stage, 0) + nbytes

    @contextlib.contextmanager
    def span(self, stage: str, nbytes: int = 0):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - t0, nbytes, time.thread_time() - c0)

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"seconds": {k: round(v, 4) for k, v in sorted(self.seconds.items())},
                    "cpu": {k: round(v, 4) for k, v in sorted(self.cpu.items())},
                    "bytes": dict(sorted(self.bytes.items())), "counts": dict(sorted(self.counts.items()))}


NULL_PROFILE = Profile()  # used when nobody asked; cheap enough to always add up
