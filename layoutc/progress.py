"""Progress of ``layoutc convert`` on a terminal: shards, tensors and bytes per second (tqdm).

Shown only when the stream is a terminal and the user did not ask for ``--quiet``: a log file or a
pipe gets the warnings and the summary line, never a bar's carriage returns.
"""

from __future__ import annotations

import sys
from typing import IO

from .text import display


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
        from tqdm import tqdm

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
