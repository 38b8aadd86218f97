"""``layoutc equiv`` and ``layoutc infer``: a spec against the conversion code it replaces.

Registered on the main command group by :mod:`layoutc.cli` (one import line). Both import the
user's module (``--against MODULE:FUNCTION``), which runs its code, as ``pytest`` does with a test
module. Exit status: 0 equivalent (a spec written), 1 not equivalent (differences reported),
2 a problem with the command (bad MODULE:FUNCTION, the function raised or returned the wrong
thing, dims missing), 3 an internal error.
"""

from __future__ import annotations

from pathlib import Path

import click

from .text import display

EXIT_USAGE = 2


def _dims(value: str | None) -> dict[str, int] | None:
    if value is None:
        return None
    out: dict[str, int] = {}
    for item in value.split(","):
        if not item.strip():
            continue
        k, sep, v = item.partition("=")
        try:
            if not sep or not k.strip().isidentifier():
                raise ValueError
            out[k.strip()] = int(v)
        except ValueError:
            raise click.BadParameter(f"expected NAME=INT[,NAME=INT...], got {display(item)!r}",
                                     param_hint="--dims") from None
        if out[k.strip()] <= 0:
            raise click.BadParameter(f"{k.strip()} must be positive", param_hint="--dims")
    return out


def _names(value: str | None) -> tuple[str, ...] | None:
    return tuple(n.strip() for n in value.split(",") if n.strip()) if value else None


def _fail(err: Exception) -> int:
    click.echo(f"error: {display(str(err))}", err=True)
    return EXIT_USAGE


def _defines(defines):
    from .cli import _parse_defines

    return _parse_defines(defines)


define_option = click.option(
    "-D", "--define", "defines", multiple=True, metavar="NAME=VALUE", help="Set a spec parameter (repeatable)."
)


@click.argument("spec", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--against", "against", required=True, metavar="MODULE:FUNCTION",
              help="The conversion function (module path or file.py), run on probe inputs. Importing it runs its module.")
@click.option("--dims", default=None, metavar="E=2,I=256,H=512", help="Dims to compare at (and shapes sampled around them).")
@click.option("--shapes", default=4, show_default=True, type=click.IntRange(1, 16), help="How many shapes to compare at.")
@click.option("--args", "args", default=None, metavar="NAME,...", help="Call FUNCTION with these tensors positionally.")
@click.option("--returns", "returns", default=None, metavar="NAME,...", help="Names of the tensors FUNCTION returns as a tuple.")
@click.option("--variants", default="all", show_default=True, type=click.Choice(["all", "full"]),
              help="Optional inputs: every combination, or all present only.")
@click.option("--draw", "draw_path", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Write a picture of the differing elements (.png or .svg).")
@click.option("--quiet", "-q", is_flag=True, help="Print only the verdict and the differences.")
@define_option
def equiv(spec: Path, against: str, dims: str | None, shapes: int, args: str | None, returns: str | None,
          variants: str, draw_path: Path | None, quiet: bool, defines: tuple[str, ...]) -> int:
    """Prove SPEC equal to a conversion function, element by element, at several shapes.

    FUNCTION takes the spec's input tensors (a dict; --args for positional tensors) and returns its
    output tensors (a dict; --returns names a tuple; None: converted in place). Exit 0: equivalent,
    1: the first differing elements are printed with the spec line that moved them, 2: usage problem."""
    from .equiv import EquivError, draw, equivalent

    if draw_path is not None and draw_path.suffix.lower() not in (".png", ".svg"):
        raise click.BadParameter("the picture must end in .png or .svg", param_hint="--draw")
    params = _defines(defines)
    progress = None if quiet else (lambda text: click.echo(f"  {text} ...", err=True))
    try:
        result = equivalent(spec, against, _dims(dims), params, shapes=shapes, args=_names(args),
                            returns=_names(returns), variants=variants, progress=progress)
    except EquivError as err:
        return _fail(err)
    text = result.report()
    if quiet and result.ok:
        text = result.verdict() + "\n"
    click.echo(text, nl=False)
    if draw_path is not None and not result.ok:
        written = draw(result, draw_path)
        if written is not None:
            click.echo(f"wrote {written}", err=True)
    return 0 if result.ok else 1


def register(command) -> None:
    """Add the commands to the ``layoutc`` group (``command`` is :func:`layoutc.cli.command`)."""
    command()(equiv)
