"""What the command modules share (``cli`` and ``cli_equiv``; its own module so neither imports the other's
half of the command line, which would be an import cycle)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..front.text import display


def parse_defines(defines: tuple[str, ...]) -> dict[str, Any]:
    """``-D NAME=VALUE`` options as spec parameters (a bad one is a usage error naming it)."""
    from ..lang.resolver import check_param_name, parse_param_value

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


def refuse_overwrite(output, inputs, option: str = "-o") -> None:
    """A usage error when ``output`` names one of ``inputs`` (the same file by path, link or hard
    link): a command writes its result beside what it read, never over it."""
    import os
    from pathlib import Path

    out = Path(output)
    for given in inputs:
        src = Path(given)
        same = out.resolve() == src.resolve()
        if not same and out.exists() and src.exists():
            try:
                same = os.path.samefile(out, src)
            except OSError:
                same = False
        if same:
            raise click.BadParameter(f"{display(str(out))} is an input of this command ({display(str(src))}); "
                                     f"write the output elsewhere", param_hint=option)


def spec_inputs(spec_path) -> list:
    """The spec file and every file it reads (its imports, and the links on the way: the spec's
    dependencies as :func:`layoutc.front.tree.file_dependencies` finds them)."""
    from pathlib import Path

    from ..front.tree import file_dependencies

    deps, _ = file_dependencies(Path(spec_path))
    return [Path(spec_path), *sorted(Path(d) for d in deps)]


class SpecFile(click.ParamType):
    """A spec argument: a file, or the name of a shipped spec (``flashinfer_cutlass_bf16``), by the one
    rule every command and the API follow (:func:`layoutc.shipped.locate`)."""

    name = "spec"

    def convert(self, value, param, ctx):
        from ..shipped import locate, unknown

        path = locate(value)
        if path.is_file():
            return path
        self.fail(f"{display(str(value))!r}: {unknown(value)}", param, ctx)
