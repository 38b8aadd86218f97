"""Diagnostics: every problem in a spec points at its source, the way compilers do.

    specs/x.lyt:12:14: error: unknown operation 'swap_halve'
       12 | swap_halves(w13_weight, dim=1); swap_halve(w13_bias)
          |                                 ^^^^^^^^^^
       hint: did you mean 'swap_halves'?
"""

from __future__ import annotations

from typing import Iterable, Sequence

import attrs

from .ast import Pos


@attrs.frozen
class Diagnostic:
    severity: str  # "error" | "warning" | "note"
    message: str
    pos: Pos | None = None
    hint: str | None = None
    tensors: tuple[str, ...] = ()  # tensors the finding is about
    related: tuple[tuple[str, Pos], ...] = ()  # (note, position) of other lines involved

    def format(self, filename: str, source: str | None) -> str:
        return format_diagnostic(self, filename, source)


def _excerpt(lines: Sequence[str], pos: Pos) -> list[str]:
    if not 1 <= pos.line <= len(lines):
        return []
    text = lines[pos.line - 1].rstrip("\n").expandtabs(1)
    width = len(str(pos.line))
    end = pos.end_column if pos.end_line == pos.line and pos.end_column > pos.column else pos.column + 1
    end = min(max(end, pos.column + 1), len(text) + 2)
    caret = " " * (pos.column - 1) + "^" * (end - pos.column)
    return [f"  {pos.line:>{width}} | {text}", f"  {' ' * width} | {caret}"]


def format_diagnostic(d: Diagnostic, filename: str, source: str | None) -> str:
    lines = source.splitlines() if source is not None else []
    where = f"{filename}:{d.pos.line}:{d.pos.column}" if d.pos else filename
    out = [f"{where}: {d.severity}: {d.message}"]
    if d.pos:
        out += _excerpt(lines, d.pos)
    for note, pos in d.related:
        out.append(f"{filename}:{pos.line}:{pos.column}: note: {note}")
        out += _excerpt(lines, pos)
    if d.hint:
        out.append(f"  hint: {d.hint}")
    return "\n".join(out)


class SpecError(Exception):
    """A spec could not be parsed, resolved or verified. Carries every error found."""

    def __init__(self, diagnostics: Iterable[Diagnostic], filename: str = "<spec>", source: str | None = None):
        self.diagnostics = tuple(diagnostics)
        self.filename = filename
        self.source = source
        super().__init__(self.render())

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.severity == "error")

    def render(self) -> str:
        return "\n".join(d.format(self.filename, self.source) for d in self.diagnostics)
