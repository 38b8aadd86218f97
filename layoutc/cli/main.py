"""The ``layoutc`` command line.

    layoutc check specs/*.lyt                 parse and verify (every parameter combination)
    layoutc check flashinfer_cutlass_bf16     a shipped spec, by name (also for compile, demo, ...)
    layoutc compile SPEC -o converter.py      write a standalone converter module
    layoutc demo [SPEC]                       convert a deterministic synthetic layer and report
    layoutc ops                               the primitives and their signatures

Spec problems print as ``file:line:col: error: ...`` with the source line and a
caret, and exit with status 2. Nothing here prints a Python traceback for bad
input; an unexpected internal failure exits with status 3 and asks for a report.
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
from pathlib import Path
from typing import Any, Callable

import click

from ..front import progress
from .._version import __version__
from .common import SpecFile
from .common import parse_defines as _parse_defines
from .common import refuse_overwrite, spec_inputs
from ..front.errors import Diagnostic, SpecError
from ..limits import MAX_PARAM_COMBINATIONS
from ..front.text import display

#: Optional dependencies -> the extra that installs them (pip install 'layoutc[extra]').
EXTRAS = {"matplotlib": "review", "flashinfer": "flashinfer", "triton": "gpu"}

EXIT_SPEC_ERROR = 2
EXIT_INTERNAL = 3


_SAID_NOT_INSTALLED: set[str] = set()  # libraries this command already said are missing


def _print_diagnostics(diags, filename: str, source: str | None) -> None:
    from ..lang.versions import NotInstalled

    for d in diags:
        if isinstance(d, NotInstalled):  # the same for every spec: once per command, one line
            if d.library not in _SAID_NOT_INSTALLED:
                _SAID_NOT_INSTALLED.add(d.library)
                click.echo(d.one_line(), err=True)
            continue
        click.echo(d.format(filename, source), err=True)


def _guard(fn: Callable[..., int | None]) -> Callable[..., None]:
    """Spec errors -> diagnostics and exit 2; anything unexpected -> a short message and exit 3."""

    @functools.wraps(fn)
    def wrapper(*args, debug: bool = False, **kwargs):
        _DEBUG[0] = _DEBUG[0] or debug
        _SAID_NOT_INSTALLED.clear()  # once per command (an in-process runner calls several)
        progress.set_quiet(False)  # until the command's own --quiet says otherwise
        try:
            code = fn(*args, **kwargs)
        except SpecError as err:
            _print_diagnostics(err.diagnostics, err.filename, err.source)
            n = len(err.errors)
            click.echo(f"{n} error{'s' if n != 1 else ''}", err=True)
            sys.exit(EXIT_SPEC_ERROR)
        except click.exceptions.ClickException:
            raise
        except BrokenPipeError:  # output piped into `head` and closed
            sys.stderr.close()
            sys.exit(0)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as err:  # noqa: BLE001 - the last line of defence against tracebacks
            from ..runtime.checks import LayoutError

            if isinstance(err, LayoutError):  # tensors that break a spec's contract: bad input, not a bug
                click.echo(f"error: {display(str(err))}", err=True)
                sys.exit(EXIT_SPEC_ERROR)
            missing = _missing_extra(err)
            if missing is not None and not _DEBUG[0]:
                click.echo(f"error: {missing}", err=True)
                sys.exit(EXIT_SPEC_ERROR)
            if isinstance(err, OSError) and not _DEBUG[0]:  # disk full, read-only folder, permissions
                where = f": {display(str(err.filename))}" if err.filename else ""
                click.echo(f"error: {err.strerror or err}{where}", err=True)
                sys.exit(EXIT_SPEC_ERROR)
            if "--debug" in sys.argv or _DEBUG[0]:
                raise
            click.echo(f"layoutc: internal error: {type(err).__name__}: {err}", err=True)
            click.echo("please report this with the spec that caused it (rerun with --debug for a traceback)", err=True)
            sys.exit(EXIT_INTERNAL)
        sys.exit(code or 0)

    return wrapper


_DEBUG = [False]


def _missing_extra(err: Exception) -> str | None:
    """For an optional dependency that is not installed: what to install."""
    if not isinstance(err, ImportError):
        return None
    top = (getattr(err, "name", None) or "").split(".")[0]
    if top not in EXTRAS:
        return None
    return (f"this command needs {top}, which is not installed: pip install 'layoutc[{EXTRAS[top]}]' "
            f"(or pip install {'flashinfer-python' if top == 'flashinfer' else top})")


def command(*args, **kwargs):
    """A subcommand with the house rules: errors as messages (:func:`_guard`) and ``--debug`` accepted
    after the subcommand too (``layoutc draw --debug ...``)."""

    def wrap(fn):
        fn = _guard(fn)
        fn = click.option("--debug", is_flag=True, hidden=True, help="Show tracebacks of internal errors.")(fn)
        return main.command(*args, **kwargs)(fn)

    return wrap


def _check_device(ctx, param, value: str | None) -> str | None:
    """cpu, cuda or cuda:N, and a GPU really there when one is asked for."""
    if value is None:
        return None
    import re

    if not re.fullmatch(r"cpu|cuda(:[0-9]+)?", value):
        raise click.BadParameter(f"{display(value)!r}: give cpu, cuda or cuda:N")
    if value.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise click.BadParameter(f"{value}: no CUDA device here (torch {torch.__version__}"
                                     f"{', a CPU build' if torch.version.cuda is None else ''})")
        index = int(value.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise click.BadParameter(f"{value}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return value


SPEC = SpecFile()


class _Lowerings(click.Choice):
    """'auto' and the registered lowerings (layoutc.lower.registry), read when the option is parsed."""

    def __init__(self) -> None:
        super().__init__(["auto"])

    @property
    def choices(self):  # noqa: D401 - click reads this attribute
        from ..lower.registry import names

        return names()

    @choices.setter
    def choices(self, value) -> None:
        pass


LOWERING = _Lowerings()
LOWERING_HELP = "auto: the first lowering that runs on the device (Triton kernels on CUDA, torch gathers on the CPU)."

define_option = click.option(
    "-D", "--define", "defines", multiple=True, metavar="NAME=VALUE", help="Set a spec parameter (repeatable)."
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="layoutc")
@click.option("--debug", is_flag=True, hidden=True, help="Show tracebacks of internal errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Compile MoE weight-layout specs (.lyt) into verified converters."""
    _DEBUG[0] = debug
    if ctx.invoked_subcommand == "convert":
        passive_openmp(os.environ, sys.modules)


def passive_openmp(environ, modules) -> bool:
    """(``layoutc convert``, before torch is imported: click parses the subcommand's options, which
    import it, after this group's callback.) OpenMP's idle workers sleep instead of spinning between
    torch's parallel regions, unless the user chose a policy: ``convert`` runs the conversion beside
    reader, hashing and writer threads, and on a 2-core machine the spinning workers took the cores
    those threads needed (45% of the CPU samples of a CPU conversion were libgomp's wait loop; the
    conversion of a 2 GB checkpoint went from 24 to 14-17 s, BENCHMARKS.md). True when it was set."""
    if "torch" in modules or "OMP_WAIT_POLICY" in environ:  # too late (libgomp read it), or the user's
        return False
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


def _param_domains(spec_path: Path, fixed: dict[str, Any]) -> list[dict[str, Any]]:
    """Every combination of the spec's finite parameters (bools, choices), with ``fixed`` applied."""
    from ..front import ast
    from ..lang.resolver import _value_to_python
    from ..front.parse import parse
    from ..front.source import read_spec

    tree = parse(read_spec(spec_path), str(spec_path))
    domains: dict[str, tuple] = {}
    for item in tree.items:
        if isinstance(item, ast.Param) and item.name.text not in fixed:
            default = _value_to_python(item.default)
            if item.choices is not None:
                domains[item.name.text] = tuple(_value_to_python(item.choices))
            elif isinstance(default, bool):
                domains[item.name.text] = (default, not default)
    names = sorted(domains)
    count = 1
    for n in names:
        count *= len(domains[n])
    if count > MAX_PARAM_COMBINATIONS:
        shown = ", ".join(f"{n} ({len(domains[n])} values)" for n in names)
        raise SpecError([Diagnostic("error", f"the spec has {count} parameter combinations ({shown}); check verifies "
                                             f"at most {MAX_PARAM_COMBINATIONS} at once", None,
                                    "fix some with -D NAME=VALUE")], str(spec_path))
    return [dict(fixed, **dict(zip(names, combo))) for combo in itertools.product(*(domains[n] for n in names))]


@command()
@click.argument("specs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--affected", is_flag=True,
              help="SPECS are changed files of any kind (a pre-commit hook's list): check every .lyt spec in the "
                   "repository that reads one of them (itself, through an import or a symlink).")
@define_option
@click.option("--quiet", "-q", is_flag=True, help="Print only problems.")
@click.option("--probe", is_flag=True, help="Also verify dynamically: run the converter on self-describing inputs.")
@click.option("--strict", is_flag=True, help="Fail on coverage warnings: guarantees the spec leaves unchecked.")
def check(specs: tuple[Path, ...], defines: tuple[str, ...], quiet: bool, probe: bool, strict: bool,
          affected: bool) -> int:
    """Parse and verify SPECS; every parameter combination unless fixed with -D.

    Warnings say which guarantees the spec leaves unchecked (a scale with no tie, a gated weight
    with no row order, steps outside any declared packing); --strict makes them errors."""
    import time

    from ..api import compile_file
    from ..verify.coverage import strict as as_errors
    from ..equiv.probe import probe as run_probe
    from ..equiv.probe import probe_steps

    progress.set_quiet(quiet)
    from ..lang.families import check_file, is_family_file
    from ..front.parse import parse
    from ..shipped import locate, unknown
    from ..front.source import read_spec

    fixed = _parse_defines(defines)
    failed = 0
    if affected:
        specs = _affected_specs(specs)
    for given in specs:
        path = locate(given)  # a file, or a shipped spec's name
        if not path.is_file():
            click.echo(f"{display(str(given))}: error: {unknown(given)}", err=True)
            failed += 1
            continue
        shown = ""
        try:
            tree = parse(read_spec(path), str(path))
            if is_family_file(tree):  # a file a spec imports: its definitions, checked on their own
                found = check_file(tree)
                if not quiet:
                    click.echo(f"{path}: ok: families {', '.join(f.name for f in found)}")
                continue
            combos = _param_domains(path, fixed)
            for params in combos:
                shown = ", ".join(f"{k}={v}" for k, v in params.items())
                spec = compile_file(path, params)
                _print_diagnostics(spec.warnings, str(path), spec.program.source)
                covered, gaps = spec.coverage
                if strict and any(d.severity == "warning" for d in gaps):
                    raise SpecError(as_errors(gaps), str(path), spec.program.source)
                _print_diagnostics([d for d in gaps if d.severity != "note" or not quiet], str(path),
                                   spec.program.source)
                if probe:
                    start = time.perf_counter()
                    say = (lambda what: None) if quiet else (lambda what: click.echo(what, err=True))
                    say(f"{path}: probing{f' ({shown})' if shown else ''} ...")
                    with progress.bar(total=probe_steps(spec), desc=f"probe {spec.name}", unit="check") as bar:
                        findings = run_probe(spec, progress=lambda what: say(f"  {what}"),
                                             tick=lambda: bar.update(1), strict=strict)
                    if findings:
                        raise SpecError(findings, str(path), spec.program.source)
                    say(f"  probed in {time.perf_counter() - start:.1f} s")
                if not quiet:
                    how = "ok, static and probed" if probe else "ok"
                    click.echo(f"{path}: {how}{f' ({shown})' if shown else ''}: {spec.name}")
                    if covered:  # what the claims cover: every size region, the parameter values
                        click.echo(f"  claims hold {covered[0].scope}")
        except SpecError as err:
            if shown:  # the parameter values the findings hold at (a branch on tp_size, say)
                click.echo(f"{display(str(path))}: with {shown}:", err=True)
            _print_diagnostics(err.diagnostics, err.filename, err.source)
            failed += 1
    if failed:
        click.echo(f"{failed} spec{'s' if failed != 1 else ''} failed", err=True)
        return EXIT_SPEC_ERROR
    return 0


def _affected_specs(changed: tuple[Path, ...]) -> tuple[Path, ...]:
    """The ``.lyt`` specs of this repository (git's index, else the current folder) that read one of
    ``changed``: the file itself, a link on the way, or a file it imports. A family file named
    ``families.txt`` behind ``fam.lyt -> families.txt`` has no ``.lyt`` name for a hook to match."""
    from .gitrepo import run_git, toplevel
    from ..front.tree import file_dependencies, located

    try:
        top = toplevel(Path("."))
        listed = run_git("ls-files", "-z", cwd=top).stdout.decode("utf-8", "surrogateescape").split("\0")
        candidates = [top / p for p in listed if p.endswith(".lyt")]
    except ValueError:
        candidates = sorted(Path(".").rglob("*.lyt"))
    touched = set().union(*(located(p) for p in changed)) if changed else set()
    out = [p for p in changed if p.name.endswith(".lyt") and p.exists()]
    mine = set().union(*(located(p) for p in out)) if out else set()
    for spec in candidates:
        if located(spec) & mine:
            continue
        deps, complete = file_dependencies(spec)
        if deps & touched or not complete:  # an import that is gone is an error to report too
            out.append(spec)
    return tuple(out)


@command(name="compile")
@click.argument("spec", type=SPEC)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Where to write the module.")
@define_option
def compile_cmd(spec: Path, output: Path | None, defines: tuple[str, ...]) -> int:
    """Compile SPEC into a standalone converter module (torch only)."""
    from ..api import compile_file

    if output is not None:
        refuse_overwrite(output, spec_inputs(spec))
    compiled = compile_file(spec, _parse_defines(defines))
    _print_diagnostics(compiled.warnings, str(spec), compiled.program.source)
    if output is None:
        click.echo(compiled.source, nl=False)
    else:
        compiled.write(output)
        click.echo(f"wrote {output} ({compiled.name}, sha256 {compiled.sha256[:12]})", err=True)
    return 0


@command()
@click.argument(
    "spec", required=False, default=None, type=SPEC
)
@click.option("--shape", default="E=8,I=256,H=512", show_default=True, help="Dims of the synthetic layer.")
@click.option("--seed", default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True, callback=_check_device, help="cpu, cuda or cuda:N")
@define_option
def demo(spec: Path | None, shape: str, seed: int, device: str, defines: tuple[str, ...]) -> int:
    """Compile SPEC (default: the FlashInfer CUTLASS BF16 spec), verify it, convert a
    deterministic synthetic MoE layer, check the round trip and print a short report."""
    from .demo import run_demo

    ok = run_demo(spec, _parse_shape(shape), seed, device, _parse_defines(defines), echo=click.echo)
    return 0 if ok else 1


def _parse_shape(shape: str) -> dict[str, int]:
    """``E=8,I=256,H=512``: dims as positive integers (a zero or negative size is a usage error here,
    not an internal error deep in the converter)."""
    dims = {}
    for item in shape.split(","):
        k, _, v = item.partition("=")
        try:
            if not k.strip().isidentifier():
                raise ValueError
            dims[k.strip()] = int(v)
        except ValueError:
            raise click.BadParameter(f"expected NAME=INT, got {display(item)!r}", param_hint="--shape") from None
        if dims[k.strip()] <= 0:
            raise click.BadParameter(f"{k.strip()}={dims[k.strip()]}: a dim must be a positive integer",
                                     param_hint="--shape")
    return dims


@command()
@click.argument("spec", type=SPEC)
@click.option("--shape", default="E=128,I=2944,H=2944", show_default=True, help="Dims of the synthetic layer.")
@click.option("--device", default="cpu", show_default=True, callback=_check_device, help="cpu, cuda or cuda:N")
@click.option("--lowering", default="auto", show_default=True, type=LOWERING, help=LOWERING_HELP)
@click.option("--reps", default=20, show_default=True, type=click.IntRange(1, 100_000),
              help="Timed repetitions (the median is reported).")
@click.option("--eager/--no-eager", default=False, help="Also time the eager lowering.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar (none is shown when stderr is not a terminal).")
@define_option
def bench(spec: Path, shape: str, device: str, lowering: str, reps: int, eager: bool, as_json: bool, quiet: bool,
          defines: tuple[str, ...]) -> int:
    """Time SPEC's converter, the vLLM-style sequence it replaces and a device copy, in one run."""
    progress.set_quiet(quiet)
    from ..api import compile_file
    from .bench import bench as run_bench
    from .bench import report, to_json

    compiled = compile_file(spec, _parse_defines(defines))
    dims = _parse_shape(shape)
    missing = [d for d in compiled.program.dims if d not in dims]
    if missing:
        raise click.BadParameter(f"--shape must give {', '.join(missing)}", param_hint="--shape")
    result = run_bench(compiled, {d: dims[d] for d in compiled.program.dims}, device, lowering, reps, eager=eager)
    click.echo(to_json(result) if as_json else report(result))
    return 0


@command()
@click.argument("spec", type=SPEC)
@click.option("--format", "fmt", default="text", show_default=True, type=click.Choice(["text", "markdown", "json"]))
@click.option("--tensor", default=None, help="Only this tensor.")
@define_option
def explain(spec: Path, fmt: str, tensor: str | None, defines: tuple[str, ...]) -> int:
    """What SPEC does to each tensor: statements, composed map, rows, ties, needs, verdict."""
    from ..api import compile_file
    from .explain import explain as run_explain
    from .explain import render

    compiled = compile_file(spec, _parse_defines(defines))
    if tensor is not None and tensor not in compiled.input_names:
        from ..front.errors import suggest

        hint = suggest(tensor, list(compiled.input_names))
        raise click.BadParameter(f"{tensor!r} is not a tensor of {compiled.name}" + (f"; {hint}" if hint else "")
                                 + f" ({', '.join(compiled.input_names)})", param_hint="--tensor")
    click.echo(render(run_explain(compiled, tensor), fmt), nl=False)
    return 0


@command(name="diff")
@click.argument("paths", nargs=-1, required=True)
@click.option("--git", "revs", nargs=2, default=None, metavar="REV1 REV2", help="Compare one file at two git revisions.")
@click.option("--format", "fmt", default="text", show_default=True, type=click.Choice(["text", "markdown", "json"]))
@define_option
def diff_cmd(paths: tuple[str, ...], revs: tuple[str, str] | None, fmt: str, defines: tuple[str, ...]) -> int:
    """Semantic diff: OLD.lyt NEW.lyt, or --git REV1 REV2 FILE. Exit 0: no layout change, 1: layouts differ."""
    from ..api import compile_source
    from .diff import as_json, as_markdown, as_text, diff
    from .gitrepo import text_at
    from ..shipped import locate, unknown
    from ..front.source import read_spec

    params = _parse_defines(defines)
    if revs:
        if len(paths) != 1:
            raise click.UsageError("with --git give exactly one spec file")
        # each side entirely from its own revision: the spec and every file it imports
        sides = [text_at(rev, paths[0]) for rev in revs]
    else:
        if len(paths) != 2:
            raise click.UsageError("give OLD.lyt NEW.lyt (or --git REV1 REV2 FILE)")
        sides = []
        for p in paths:
            path = locate(p)  # a file, or a shipped spec's name
            if not path.is_file():
                raise click.BadParameter(f"{display(p)!r}: {unknown(p)}")
            sides.append((read_spec(path), None, str(path)))
    old, new = (compile_source(text, name, params, verify_spec=False, tree=tree) for text, tree, name in sides)
    result = diff(old, new)
    click.echo({"json": as_json, "markdown": as_markdown}.get(fmt, as_text)(result), nl=False)
    return 1 if result.changed else 0


@command()
@click.argument("spec", type=SPEC)
@click.option("--tensor", default=None, help="The tensor to draw (with its tied tensors).")
@click.option("--graph", is_flag=True, help="Draw the transform graph of the whole spec instead.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path), help="file.png or file.svg")
@click.option("--no-verify", is_flag=True, help="Draw a spec that fails verification (to see the desync).")
@define_option
def draw(spec: Path, tensor: str | None, graph: bool, output: Path, no_verify: bool, defines: tuple[str, ...]) -> int:
    """A picture of a tensor's layout on a small instance (tied scales beside it), or the spec's graph."""
    from ..api import compile_file
    from .draw import draw_graph, draw_layout

    if output.suffix.lower() not in (".png", ".svg"):
        raise click.BadParameter("the output must end in .png or .svg", param_hint="-o")
    refuse_overwrite(output, spec_inputs(spec))
    compiled = compile_file(spec, _parse_defines(defines)) if not no_verify else _compile_unverified(spec, defines)
    if graph:
        draw_graph(compiled, output)
    else:
        if tensor is None or tensor not in compiled.input_names:
            raise click.BadParameter(f"give --tensor, one of {', '.join(compiled.input_names)}", param_hint="--tensor")
        draw_layout(compiled, tensor, output)
    click.echo(f"wrote {output}", err=True)
    return 0


def _compile_unverified(spec: Path, defines: tuple[str, ...]):
    from ..api import compile_source
    from ..front.source import read_spec

    return compile_source(read_spec(spec), str(spec), _parse_defines(defines), verify_spec=False)


@command()
@click.argument("rev_range", metavar="BASE..HEAD")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the Markdown here (default: standard output).")
@click.option("--images", type=click.Path(file_okay=False, path_type=Path), default=Path("layoutc-review"),
              show_default=True, help="Folder for the pictures.")
def review(rev_range: str, output: Path | None, images: Path) -> int:
    """A Markdown report for a pull request: diff, explain and pictures of every changed spec."""
    from .review import review as run_review
    from .review import safe_folder, write_file

    try:
        if output is not None:  # before any work: no report through a committed symlink
            safe_folder(output.parent)
            if output.is_symlink():
                raise ValueError(f"{output} is a symlink; review does not write through links (delete it)")
        text, ok = run_review(rev_range, images, report_dir=output.parent if output else None)
        if output is not None:
            write_file(output, text.encode("utf-8"))
    except ValueError as err:  # not a git clone, a bad revision, a symlink where output goes: one line
        click.echo(f"error: {display(str(err))}", err=True)
        sys.exit(EXIT_SPEC_ERROR)
    if output is None:
        click.echo(text, nl=False)
    else:
        click.echo(f"wrote {output}", err=True)
    return 0 if ok else EXIT_SPEC_ERROR


@command(name="convert")
@click.option("--spec", "spec_path", required=True, type=SPEC)
@click.option("--in", "in_dir", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--names", default="vllm", show_default=True, help="Name mapping: vllm, gpt-oss or a JSON file.")
@click.option("--device", default=None, callback=_check_device,
              help="cpu or cuda (under torchrun, cuda means cuda:<local rank>; default: that with GPUs, else cpu)")
@click.option("--lowering", default="auto", show_default=True, type=LOWERING, help=LOWERING_HELP)
@click.option("--no-verify", is_flag=True, help="Skip the round-trip check of a sample layer per shard.")
@click.option("--prefetch", default=None, type=click.IntRange(0, 64), metavar="N",
              help="Shards read ahead of the one being converted (default 2; 0: one shard at a time, no threads).")
@click.option("--writers", default=None, type=click.IntRange(1, 64), metavar="N",
              help="Shards written at once (default 2).")
@click.option("--hash-threads", default=None, type=click.IntRange(1, 64), metavar="N",
              help="Threads hashing the input for the resume stamps (default: the CPU count, at most 8).")
@click.option("--profile", "profile_path", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Write seconds and bytes per stage (read, hash, convert, write, fsync, ...) as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary line: only warnings and errors.")
@define_option
def convert_cmd(spec_path: Path, in_dir: Path, out_dir: Path, names: str, device: str | None, lowering: str,
                no_verify: bool, prefetch: int | None, writers: int | None, hash_threads: int | None,
                profile_path: Path | None, quiet: bool, defines: tuple[str, ...]) -> int:
    """Convert a safetensors checkpoint (single file or sharded) into SPEC's kernel layout.

    With -D tp_size=N and no tp_rank, every slice is converted, rank r's into OUT/tp<r>, reading
    the checkpoint once."""
    import json
    import os
    import time

    from ..convert.sharddigest import EarlyDigests  # no torch: started before torch is imported

    params = _parse_defines(defines)
    if profile_path is not None and in_dir.resolve() in profile_path.resolve().parents:
        raise click.BadParameter(f"{display(str(profile_path))} is inside --in; layoutc convert never writes into "
                                 f"its input", param_hint="--profile")
    world, rank, local = _torchrun_env(os.environ)
    # The input hashed while torch is imported and the spec compiles (one rank owns every shard; the pipelined
    # reads take these digests): those are one core of Python, the hashing the other core and the disk
    early = EarlyDigests(sorted(in_dir.resolve().glob("*.safetensors"))) if world == 1 and prefetch != 0 else None
    try:
        import torch

        from ..api import compile_file
        from ..convert.checkpoint import PREFETCH, WRITERS, convert_checkpoint, finish
        from ..runtime.checks import LayoutError
        from ..convert.shardio import Profile

        spec = compile_file(spec_path, params)
        specs, outs = [spec], [out_dir]
        tp_size = spec.params.get("tp_size", 1)
        if "tp_rank" in spec.params and "tp_rank" not in params and isinstance(tp_size, int) and tp_size > 1:
            specs = [compile_file(spec_path, {**params, "tp_rank": r}) for r in range(tp_size)]
            outs = [out_dir / f"tp{r}" for r in range(tp_size)]
    finally:
        digests = early.stop() if early is not None else None
    dist = None
    if world > 1:
        import torch.distributed as dist

        if (device is None and torch.cuda.is_available()) or device == "cuda":
            if local >= torch.cuda.device_count():
                raise click.BadParameter(f"local rank {local} has no GPU ({torch.cuda.device_count()} here)",
                                         param_hint="--device")
            device = f"cuda:{local}"
        if device is not None and device.startswith("cuda"):
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device is not None and device.startswith("cuda") else "gloo")
    device = device or "cpu"

    from ..front.progress import ShardProgress

    bar = ShardProgress(f"rank {rank}/{world} converting" if world > 1 else "converting", enabled=not quiet)
    failure: Exception | None = None
    profile = Profile()
    from ..convert.heap import keep_freed_memory

    keep_freed_memory()  # this process converts layer after layer: their outputs reuse freed pages
    t0, cpu0 = time.perf_counter(), os.times()
    try:
        with bar:
            summary = convert_checkpoint(specs, in_dir, outs, names, device, rank, world, bar, lowering,
                                         not no_verify, PREFETCH if prefetch is None else prefetch,
                                         WRITERS if writers is None else writers, profile,
                                         hash_threads=hash_threads, warn=bar.warn, digests=digests)
    except Exception as err:  # noqa: BLE001 -- re-raised below, after the other ranks have heard of it
        failure = err
    seconds = time.perf_counter() - t0
    if dist is not None:
        # Instead of a barrier: a rank that failed must not leave the others waiting for it.
        failed = torch.tensor([int(failure is not None)], device=device if device.startswith("cuda") else "cpu")
        dist.all_reduce(failed)
        dist.destroy_process_group()
        if failure is None and int(failed) > 0:
            failure = LayoutError(f"{int(failed)} other rank(s) failed; their messages name the shard")
    if failure is not None:
        raise failure
    if rank == 0:
        for s, o in zip(specs, outs):
            finish(s, in_dir, o, names, summary["names"])
    if profile_path is not None:
        stages = profile.as_dict()
        cpu1 = os.times()  # every thread's CPU time (torch's own threads too), this process
        report = {"rank": rank, "world": world, "device": device, "wall_s": round(seconds, 4),
                  "process_cpu_s": round(cpu1.user + cpu1.system - cpu0.user - cpu0.system, 3), "summary": summary,
                  "slices": len(specs), "stages": stages["seconds"], "cpu": stages["cpu"], "bytes": stages["bytes"],
                  "counts": stages["counts"]}
        if world > 1:
            profile_path = profile_path.with_name(f"{profile_path.stem}.rank{rank}{profile_path.suffix}")
        profile_path.write_text(json.dumps(report, indent=1))
    if quiet:
        return 0
    read = profile.bytes.get("read_bytes", 0)
    rate = f", {read / seconds / 1e9:.2f} GB/s read" if read and seconds > 0 else ""
    click.echo(f"rank {rank}: {summary['written_shards']} shard(s) written, {summary['skipped_shards']} already done, "
               f"{summary['converted_layers']} MoE layer(s) converted, {summary['verified_layers']} verified "
               f"({seconds:.1f} s{rate})", err=True)
    return 0


def _torchrun_env(env) -> tuple[int, int, int]:
    """WORLD_SIZE, RANK and LOCAL_RANK as torchrun sets them; anything else is a usage error."""
    values = {}
    for key, default, low in (("WORLD_SIZE", "1", 1), ("RANK", "0", 0), ("LOCAL_RANK", "0", 0)):
        text = env.get(key, default)
        try:
            values[key] = int(text)
        except ValueError:
            values[key] = None
        if values[key] is None or values[key] < low:
            raise click.UsageError(f"the environment variable {key}={display(repr(text))} is not an integer >= {low} "
                                   f"(torchrun sets it; unset it for a single process)")
    if values["RANK"] >= values["WORLD_SIZE"]:
        raise click.UsageError(f"RANK={values['RANK']} is not below WORLD_SIZE={values['WORLD_SIZE']}")
    return values["WORLD_SIZE"], values["RANK"], values["LOCAL_RANK"]


@main.command()
def ops() -> None:
    """List the layout primitives and the packing families (the prelude's)."""
    from ..lang.families import prelude
    from ..lang.ops import PUBLIC
    from ..lang.ops.binder import describe_signature

    width = max(len(describe_signature(c)) for c in PUBLIC.values())
    click.echo("primitives (layoutc/ops):")
    for name in sorted(PUBLIC):
        cls = PUBLIC[name]
        click.echo(f"  {describe_signature(cls):<{width}}  {cls.facts.describe():<18} {cls.summary}")
    click.echo("")
    click.echo("packing families (layoutc/lang/prelude.lyt; a spec can define its own with 'family'):")
    click.echo(f"  {'interleave(tensor, family, param=value, ...)':<{width}}  applies the family's chain for the tensor's role")
    for fam in prelude():
        params = ", ".join(f"{k}={v}" for k, v in fam.params)
        click.echo(f"  {fam.name + (f'({params})' if params else ''):<{width}}  packs {', '.join(fam.role_names)}")


from .equiv_cmds import register as _register_equiv  # noqa: E402 -- the equiv and infer commands
_register_equiv(command)

if __name__ == "__main__":  # pragma: no cover
    main()
