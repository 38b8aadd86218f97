"""``layoutc equiv`` and ``layoutc infer``: a spec against the conversion code it replaces.

Registered on the main command group by :mod:`layoutc.cli.main` (one import line). Both import the
user's module (``--against MODULE:FUNCTION``), which runs its code, as ``pytest`` does with a test
module. Exit status: 0 equivalent (a spec written), 1 not equivalent (differences reported),
2 a problem with the command (bad MODULE:FUNCTION, the function raised or returned the wrong
thing, dims missing), 3 an internal error.
"""

from __future__ import annotations

from pathlib import Path

import click

from .common import SpecFile, parse_defines, refuse_overwrite, spec_inputs
from ..front.text import display
from ..equiv.usercode import CALL_TIMEOUT

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


def _shown(report: str) -> str:
    """A report for the terminal, each line through display(): it quotes the function's own exception
    text, which may hold control characters (the lines themselves are kept)."""
    return "\n".join(display(line) for line in report.split("\n"))


def _module_file(ref: str) -> list[Path]:
    """The file of MODULE:FUNCTION when it names one (path/to/file.py:fn), else nothing."""
    module = ref.rpartition(":")[0]
    return [Path(module)] if module.endswith(".py") or "/" in module else []


def _fail(err: Exception) -> int:
    click.echo(f"error: {display(str(err))}", err=True)
    return EXIT_USAGE


define_option = click.option(
    "-D", "--define", "defines", multiple=True, metavar="NAME=VALUE", help="Set a spec parameter (repeatable)."
)
timeout_option = click.option(
    "--timeout", default=CALL_TIMEOUT, show_default=True, type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Time limit for each call of FUNCTION and for importing its module; past it the run stops (exit 2).")


@click.argument("spec", type=SpecFile())
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
@timeout_option
@define_option
def equiv(spec: Path, against: str, dims: str | None, shapes: int, args: str | None, returns: str | None,
          variants: str, draw_path: Path | None, quiet: bool, timeout: float, defines: tuple[str, ...]) -> int:
    """Prove SPEC equal to a conversion function, element by element, at several shapes.

    FUNCTION takes the spec's input tensors (a dict; --args for positional tensors) and returns its
    output tensors (a dict; --returns names a tuple; None: converted in place). Exit 0: equivalent,
    1: the first differing elements are printed with the spec line that moved them, 2: usage problem."""
    from ..equiv.compare import EquivError, draw, equivalent

    if draw_path is not None and draw_path.suffix.lower() not in (".png", ".svg"):
        raise click.BadParameter("the picture must end in .png or .svg", param_hint="--draw")
    if draw_path is not None:
        refuse_overwrite(draw_path, [*spec_inputs(spec), *_module_file(against)], "--draw")
    params = parse_defines(defines)
    progress = None if quiet else (lambda text: click.echo(f"  {text} ...", err=True))
    try:
        result = equivalent(spec, against, _dims(dims), params, shapes=shapes, args=_names(args),
                            returns=_names(returns), variants=variants, progress=progress, timeout=timeout,
                            hard_exit=True)
    except EquivError as err:
        return _fail(err)
    text = _shown(result.report())
    if quiet and result.ok:
        text = result.verdict() + "\n"
    click.echo(text, nl=False)
    if draw_path is not None and not result.ok:
        written = draw(result, draw_path)
        if written is not None:
            click.echo(f"wrote {written}", err=True)
    return 0 if result.ok else 1


@click.argument("function", metavar="MODULE:FUNCTION")
@click.option("--dims", required=True, metavar="E=2,I=256,H=512", help="Dims to measure at (more are sampled around them).")
@click.option("--names", default="vllm", show_default=True, type=click.Choice(["vllm"]),
              help="Tensor names of the checkpoint contract (with --quant, --rows, --bias).")
@click.option("--quant", default=None, type=click.Choice(["mxfp4", "nvfp4", "fp8_block", "bf16"]),
              help="Checkpoint format (default: the one format the function accepts).")
@click.option("--rows", default="contiguous", show_default=True, type=click.Choice(["contiguous", "gpt_oss", "single"]),
              help="w13 row order: [w1; w3], gpt-oss interleaved, or one shard (non-gated).")
@click.option("--bias", is_flag=True, help="The layer has w13_bias and w2_bias (optional inputs).")
@click.option("--inputs", "inputs_path", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The checkpoint contract as spec lines (dims, assume, input ...) instead of --names.")
@click.option("--name", "spec_name", default="inferred", show_default=True, help="The written spec's name.")
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Write the spec here (default: standard output).")
@click.option("--shapes", default=4, show_default=True, type=click.IntRange(1, 16), help="Shapes equiv checks the spec at.")
@click.option("--no-check", is_flag=True, help="Do not prove the written spec equal with equiv.")
@timeout_option
@define_option
def infer(function: str, dims: str, names: str, quant: str | None, rows: str, bias: bool, inputs_path: Path | None,
          spec_name: str, output: Path | None, shapes: int, no_check: bool, timeout: float,
          defines: tuple[str, ...]) -> int:
    """Recover a conversion function's index maps and write a spec for it.

    The function is run on self-describing inputs at a few shapes; each tensor's map is explained as
    packing families and registered ops (an explicit table where nothing matches, flagged for review).
    The spec is then verified and proved equal to the function with equiv. -D values are passed to the
    function (a 'params' parameter) and written into the spec. Exit 0: written and equivalent, 1: written
    but not verified or not equivalent (see the notes), 2: usage problem."""
    from ..equiv.compare import EquivError
    from ..equiv.infer import infer as run_infer
    from ..front.source import read_spec

    params = parse_defines(defines)
    if output is not None:
        refuse_overwrite(output, [*_module_file(function), *([inputs_path] if inputs_path else [])])
    contract = read_spec(inputs_path) if inputs_path is not None else None
    try:
        result = run_infer(function, _dims(dims), names=names, quant=quant, rows=rows, bias=bias, inputs=contract,
                           params=params, spec_name=spec_name, check=not no_check, shapes=shapes,
                           progress=lambda text: click.echo(f"  {text} ...", err=True), timeout=timeout,
                           hard_exit=True)
    except EquivError as err:
        return _fail(err)
    if output is None:
        click.echo(result.text, nl=False)
    else:
        output.write_text(result.text)
        click.echo(f"wrote {output}", err=True)
    named = sum(c.named for c in result.chains)
    click.echo(f"{named} of {len(result.chains)} tensors explained by registered ops and families", err=True)
    for note in result.notes:
        click.echo(f"note: {display(note)}", err=True)
    for err in result.verify_errors:
        click.echo(err, err=True)
    if result.verify_errors:
        click.echo("the written spec does not verify: the function's conversion breaks a rule above", err=True)
        return 1
    if result.verdict is not None:
        click.echo(_shown(result.verdict.report()) if not result.verdict.ok else
                   f"equiv: {result.verdict.verdict()} against {result.verdict.function}", err=True)
        return 0 if result.verdict.ok else 1
    return 0


def register(command) -> None:
    """Add the commands to the ``layoutc`` group (``command`` is :func:`layoutc.cli.main.command`)."""
    command()(equiv)
    command()(infer)
