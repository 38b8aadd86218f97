"""What the command modules share (``cli`` and ``cli_equiv``; its own module so neither imports the other's
half of the command line, which would be an import cycle)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .text import display


def parse_defines(defines: tuple[str, ...]) -> dict[str, Any]:
    """``-D NAME=VALUE`` options as spec parameters (a bad one is a usage error naming it)."""
    from .ir import check_param_name, parse_param_value

    out = {}
    for item in defines:
        if "=" not in item:
            raise click.BadParameter(f"expected NAME=VALUE, got {display(item)!r}", param_hint="-D")
        name, value = item.split("=", 1)
        try:
            check_param_name(name.strip())
            out[name.strip()] = parse_param_value(value)
        except ValueError as err:
            raise click.BadParameter(f"{display(name.strip())}: {err}", param_hint="-D") from None
    return out


class SpecFile(click.ParamType):
    """A spec argument: a file, or the name of a shipped spec (``flashinfer_cutlass_bf16``), by the one
    rule every command and the API follow (:func:`layoutc.shipped.locate`)."""

    name = "spec"

    def convert(self, value, param, ctx):
        from .shipped import locate, unknown

        path = locate(value)
        if path.is_file():
            return path
        self.fail(f"{display(str(value))!r}: {unknown(value)}", param, ctx)
