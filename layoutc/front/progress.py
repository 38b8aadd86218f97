"""Progress on work that takes more than a few seconds (tqdm): probes, benchmarks, a first call of
the ``compiled`` lowering, and ``layoutc convert`` (shards, tensors and bytes per second). Shown on
standard error only when it is a terminal and the command was not given ``--quiet``; a pipe or a
log file gets none of it (no control characters in captured output), and the command's own lines
are the same either way.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import IO, Any, Iterator

from tqdm import tqdm

from .text import display

_QUIET = [False]


def set_quiet(quiet: bool) -> None:
    """``--quiet``: no progress for the rest of the process (the CLI sets it per command)."""
    _QUIET[0] = bool(quiet)


def enabled() -> bool:
    stream = sys.stderr
    return not _QUIET[0] and hasattr(stream, "isatty") and stream.isatty()


def bar(total: int | None = None, desc: str = "", unit: str = "it") -> tqdm:
    """A bar over ``total`` steps (``.update(n)``), a no-op one where progress is off."""
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True,
                disable=not enabled())


@contextmanager
def working(desc: str, every: float = 0.5) -> Iterator[Any]:
    """For work of unknown length (a torch.compile): the description and the time it has taken so far,
    refreshed by a thread while the work runs."""
    if not enabled():
        yield None
        return
    with tqdm(total=None, desc=desc, bar_format="{desc}: {elapsed}", file=sys.stderr, leave=False) as b:
        done = threading.Event()

        def tick() -> None:
            while not done.wait(every):
                b.refresh()

        thread = threading.Thread(target=tick, daemon=True)
        thread.start()
        try:
            yield b
        finally:
            done.set()
            thread.join()


class ShardProgress:
    """The bar of one rank: :meth:`start` with this rank's shards and bytes, :meth:`update` as each
    shard is done, :meth:`warn` for a message that must not tear the bar. A context manager (closes the bar)."""

    def __init__(self, label: str, enabled: bool = True, stream: IO[str] | None = None):
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = enabled and bool(isatty and isatty())
        self.label = label
        self.bar = None
        self.shards = 0
        self.total_shards = 0
        self.tensors = 0

    def start(self, shards: int, total_bytes: int) -> None:
        if not self.enabled:
            return
        self.total_shards = shards
        self.bar = tqdm(total=total_bytes, desc=self.label, unit="B", unit_scale=True, unit_divisor=1024,
                        file=self.stream, dynamic_ncols=True, leave=True)
        self._postfix()

    def update(self, shard: str, nbytes: int, tensors: int) -> None:
        self.shards += 1
        self.tensors += tensors
        if self.bar is not None:
            self.bar.update(nbytes)
            self._postfix()

    def _postfix(self) -> None:
        self.bar.set_postfix_str(f"{self.shards}/{self.total_shards} shards, {self.tensors} tensors", refresh=True)

    def warn(self, message: str) -> None:
        text = f"warning: {display(message)}"
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> ShardProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
