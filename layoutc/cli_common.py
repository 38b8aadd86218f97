"""What the command modules share (``cli`` and ``cli_equiv``; its own module so neither imports the other's
half of the command line, which would be an import cycle)."""

from __future__ import annotations

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
