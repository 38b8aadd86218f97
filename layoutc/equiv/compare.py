"""``layoutc equiv``: prove that a spec does what an existing conversion function does.

Engines adopt layoutc by replacing hand-written conversion code (vLLM's
``process_weights_after_loading`` branches, FlashInfer's preparation helpers, in-house
scripts) with specs. This module compares the two element by element, and says where they
differ in terms of the spec: which output element, what the spec reads there (tensor, index,
the statement and line that moved it) and what the function read.

How (docs/design.md §5 has the same idea for the spec's own converter, ``probe.py``):

1. *Encode.* The function is called on self-describing inputs. Every input element carries its
   own global address, one digit per call: tensors whose chain only moves data (including bit
   permutations such as the SM90 FP4 interleave, and relabelling ``view``\\ s) are encoded bit by
   bit -- in call ``d`` each input bit is bit ``d`` of its own bit address plus one -- so
   movements of single bits (FP4 nibbles, bit tables) are traced exactly; tensors whose chain
   converts values (``cast``) carry base-``B`` digits of their element address plus one, with
   ``B`` small enough that the digits survive the casts (256 for bf16). Addresses are global
   over all inputs, so an output read from the wrong tensor is seen as such. An output digit
   pattern of all zeros (all ones, for bits) is a constant, i.e. padding.
2. *Decode.* The function's outputs spell, for every output bit (or element), the input bit
   (element) it holds, or a constant.
3. *Compare.* The spec's composed index map for each tensor says the same thing; the two are
   compared per bit. One more call with random inputs compares values (casts, padding values)
   with the spec's converter, and checks that the function really copies what it was seen to
   copy (a function whose result depends on values is not a movement).
4. *Explain.* Each differing tensor is explained: the spec's path of every differing element
   (the statements that moved it), and hypotheses tried against the function's sources --
   the spec with one statement left out, or with one argument or family parameter changed.
   A hypothesis that explains every differing element is one finding ("as if line 31 were
   not applied to w13_weight_scale"); otherwise differing elements are grouped by the
   statement that moved them and by how far the function's source is from the spec's.

This is repeated at several shapes sampled around the given dims (ones that need padding,
smaller and larger ones), and for every combination of optional inputs.

Why not :class:`layoutc.equiv.probe.ProbeRun` itself: it runs the spec's own converter and decodes its
outputs through the spec's inverses. Here the outputs come from a black box, so nothing about
them may be decoded with the spec being checked; the addresses are global (across tensors) and
bit-level for every width. The encoding helpers (:func:`layoutc.algebra.indexmap.bits_to_bytes`,
``bytes_to_bits``) are shared.

Importing the function's module runs its code: ``equiv --against`` is meant for one's own
conversion code, like ``pytest`` importing a test module.

This module is the driver (:func:`equivalent`, :class:`Result`, the report and the picture); the parts
live beside it: :mod:`.function_runner` (loading and calling the function), :mod:`.encoding` (steps 1
and 2), :mod:`.findings` (steps 3 and 4) and :mod:`.shapes` (the dims compared at).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import attrs
import torch

from . import usercode
from ..lang.compiler import Variant
from .encoding import UNEXPLAINED, Plan, observe
from .findings import ShapeResult, TensorDiff, _Compare, _fmt_dims, _fmt_index
from .function_runner import EquivError, FunctionFailed, Target, as_target
from .shapes import _valid, sample_shapes


# ---------------------------------------------------------------------------
# the whole comparison


@attrs.frozen
class Result:
    spec_name: str
    spec_file: str
    function: str
    params: dict
    shapes: tuple[ShapeResult, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.shapes)

    @property
    def first_failure(self) -> ShapeResult | None:
        return next((s for s in self.shapes if not s.ok), None)

    def verdict(self) -> str:
        n = len({tuple(sorted(s.dims.items())) for s in self.shapes})
        variants = len({s.present for s in self.shapes})
        if self.ok:
            extra = f" ({variants} combinations of optional inputs)" if variants > 1 else ""
            return f"equivalent at {n} shape{'s' if n != 1 else ''}{extra}"
        return "NOT equivalent"

    def report(self) -> str:
        params = ", ".join(f"{k}={v}" for k, v in self.params.items())
        lines = [f"layoutc equiv: {self.spec_file} ({self.spec_name}{', ' + params if params else ''}) "
                 f"against {self.function}"]
        for s in self.shapes:
            opt = f"; optional inputs: {', '.join(s.present) or 'none'}" if s.present is not None else ""
            status = "same" if s.ok else f"{len(s.diffs)} tensor{'s' if len(s.diffs) != 1 else ''} differ"
            lines.append(f"  {_fmt_dims(s.dims)}{opt}: {status}" + (f" ({s.note})" if s.note else ""))
        fail = self.first_failure
        if fail is not None:
            lines.append("")
            lines.append(f"first differences, at {_fmt_dims(fail.dims)}"
                         + (f" (optional inputs: {', '.join(fail.present) or 'none'})"
                            if fail.present is not None else "")
                         + ":")
            for d in fail.diffs:
                lines += _render_diff(d, self.spec_file)
        lines.append("")
        lines.append(self.verdict() + f" ({self.seconds:.1f} s)")
        return "\n".join(lines) + "\n"


def _render_diff(d: TensorDiff, spec_file: str) -> list[str]:
    if d.problem:
        return [f"{d.tensor}: {d.problem}" if not d.problem.startswith(d.tensor) else d.problem]
    out = [f"{d.tensor}: {d.differing} of {d.total} elements differ"]
    for i, f in enumerate(d.findings, 1):
        where = f" [{spec_file}:{f.line}]" if f.line else ""
        out.append(f"  finding {i}: {f.summary} ({f.count} element{'s' if f.count != 1 else ''}){where}")
        if f.statement and f.statement != "no statement" and not f.summary.startswith("as if"):
            out.append(f"    spec statement: {f.statement}")
        elif f.statement == "no statement" and "bits in other places" in f.summary:
            out.append("    the spec moves no bits within elements of this tensor")
        for el in f.examples:
            out.append(f"    {d.tensor}{_fmt_index(el.index)}: spec reads {el.spec}"
                       + (f" ({el.path})" if el.path else ""))
            out.append(f"    {' ' * len(d.tensor + _fmt_index(el.index))}  function read {el.function}")
        for line in f.detail:
            out.append(f"    {line}")
    return out


@contextlib.contextmanager
def _threads(n: int | None):
    """Small tensors, many calls: one intra-op thread avoids fork/join costs (restored afterwards)."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def equivalent(spec, fn, dims: Mapping[str, int] | None = None, params: Mapping[str, Any] | None = None,
               shapes: int = 4, args: Sequence[str] | None = None, returns: Sequence[str] | None = None,
               variants: str = "all", stop_at_first: bool = True, threads: int | None = 1,
               progress: Callable[[str], None] | None = None, timeout: float | None = usercode.CALL_TIMEOUT,
               hard_exit: bool = False) -> Result:
    """Compare ``spec`` (a CompiledSpec, a path to a .lyt file, or spec text) with the conversion
    function ``fn`` (a callable, ``"module:function"`` or a :class:`Target`) at ``shapes`` shapes
    sampled around ``dims``, for every combination of optional inputs (``variants="all"``; ``"full"``:
    only with every optional input present). ``timeout``: seconds per call of the function (exiting or
    running out of time is an :class:`EquivError`, never a verdict)."""
    start = time.perf_counter()
    compiled = load_spec(spec, params)
    target = as_target(fn, args, returns, timeout, hard_exit)
    for what, names, known in (("--args", target.args, compiled.input_names),
                               ("--returns", target.returns, compiled.output_names)):
        unknown = [n for n in names or () if n not in known]
        if unknown:
            raise EquivError(f"{what} names {', '.join(unknown)}, "
                             f"not {'an input' if what == '--args' else 'an output'} "
                             f"of {compiled.name} ({', '.join(known)})")
    results: list[ShapeResult] = []
    plan_list = _plans(compiled, dims, shapes, variants)
    with _threads(threads):
        for variant, env in plan_list:
            t0 = time.perf_counter()
            if progress is not None:
                progress(f"comparing at {_fmt_dims(env)}")
            try:
                r = compare_at(compiled, target, variant, env)
            except FunctionFailed as err:
                if not results:  # at the dims the user gave (or the first ones sampled): a usage problem
                    raise EquivError(f"{err}; give dims the function accepts (--dims)") from None
                r = ShapeResult(dict(env), (), (TensorDiff("*", 0, 0, (), f"{err}, where the spec converts (restrict "
                                                                          f"the spec with assume lines, or compare at "
                                                                          f"fewer shapes)"),))
            results.append(attrs.evolve(r, seconds=time.perf_counter() - t0))
            if stop_at_first and not r.ok:
                break
    has_optional = bool(compiled.program.optional_inputs)
    if not has_optional:
        results = [attrs.evolve(r, present=None) for r in results]
    return Result(compiled.name, compiled.program.filename, target.name, dict(compiled.params), tuple(results),
                  time.perf_counter() - start)


def _plans(compiled, dims, shapes: int, variants: str) -> list[tuple[Variant, dict]]:
    program = compiled.program
    optional = set(program.optional_inputs)
    all_variants = list(compiled.compiled.variants)
    full = [v for v in all_variants if optional <= v.present] or all_variants
    if dims is not None:
        missing = [d for d in program.dims if d not in dims]
        if missing:
            raise EquivError(f"--dims must give {', '.join(missing)} (the spec's dims are {', '.join(program.dims)})")
        unknown = [d for d in dims if d not in program.dims]
        if unknown:
            raise EquivError(f"{', '.join(unknown)} {'is not a dim' if len(unknown) == 1 else 'are not dims'} of "
                             f"{program.name} (its dims: {', '.join(program.dims)})")
    out: list[tuple[Variant, dict]] = []
    # every optional input present, at all shapes (variants with other size conditions: their own dims)
    main = None
    for v in full:
        try:
            envs = sample_shapes(compiled, v, dims, shapes)
        except EquivError:
            if dims is not None and len(full) == 1:
                raise
            continue
        if main is None:
            main = envs[0]
        out += [(v, e) for e in envs]
    if not out:
        if dims is not None:
            sample_shapes(compiled, full[0], dims, shapes)  # raises with the reason
        raise EquivError("no dims satisfy the spec's rules")
    if variants == "all":
        for v in all_variants:
            if v in full:
                continue
            if main is not None and _valid(compiled, v, main) is None:
                out.append((v, main))
            else:
                try:
                    out.append((v, sample_shapes(compiled, v, None, 1)[0]))
                except EquivError:
                    continue
    return out


def load_spec(spec, params: Mapping[str, Any] | None = None):
    from ..api import CompiledSpec, compile_file, compile_source

    if isinstance(spec, CompiledSpec):
        if params and dict(params) != {k: v for k, v in spec.params.items() if k in params}:
            raise EquivError("params given for an already compiled spec; compile it with them")
        return spec
    from ..shipped import find, locate

    text = str(spec)
    if isinstance(spec, Path) or (("\n" not in text) and (text.endswith(".lyt") or find(text) is not None)):
        path = locate(spec)  # a file, or a shipped spec's name
        if not path.is_file():
            raise EquivError(f"{path}: no such spec file")
        return compile_file(path, params)
    return compile_source(text, "<spec>", params)


def compare_at(compiled, target: Target, variant: Variant, dims: Mapping[str, int]) -> ShapeResult:
    plan = Plan.for_variant(variant, dims)
    optional = compiled.program.optional_inputs
    present = tuple(sorted(n for n in variant.present if n in optional))
    where = f"at {_fmt_dims(dims)}"
    if optional:
        where += f", optional inputs {', '.join(present) or 'absent'}"
    observed = observe(target, plan, compiled.params, where)
    # a function that does not move whole elements where the spec does: look at its bits
    loose = [n for n, e in plan.inputs.items() if e.mode == "elements" and n in observed.codes
             and bool((observed.codes[n] == UNEXPLAINED).any())]
    if loose:
        plan = Plan.for_variant(variant, dims, force_bits=loose)
        observed = observe(target, plan, compiled.params, where)
    spec_random = compiled.convert({k: v.clone() for k, v in observed.random_in.items()}, plan.dims, "eager")
    diffs, masks = [], {}
    for chain in variant.chains:
        d, mask = _Compare(compiled, chain, plan, observed, spec_random).run()
        if d is not None:
            diffs.append(d)
            if mask is not None:
                masks[chain.tensor] = mask
    expected = {c.tensor for c in variant.chains}
    extra = sorted(set(observed.shapes) - expected - set(plan.inputs))
    note = f"the function also returns {', '.join(extra)}, which the spec does not have" if extra else ""
    return ShapeResult(dict(dims), present, tuple(diffs), note, mismatch=masks)


# ---------------------------------------------------------------------------
# a picture of the differences


def draw(result: Result, path: str | Path) -> Path | None:
    """A picture of the differing tensors at the first failing shape. For each: the input row every output
    element reads, per the spec and per the function (each output seen as a matrix: the last axis across,
    the others flattened down; grey: padding), and the elements that differ. A swapped half shows as two
    bands trading places, a shifted block as a band out of step. Needs matplotlib. None when nothing differs."""
    fail = result.first_failure
    if fail is None or not fail.mismatch:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = list(fail.mismatch.items())[:3]
    fig, axes = plt.subplots(len(items), 3, figsize=(12, 3.2 * len(items)), squeeze=False)
    for row, (name, (mask, spec_rows, fn_rows)) in zip(axes, items):
        def flat(t):
            return (t.reshape(-1, t.shape[-1]) if t.dim() > 1 else t.reshape(1, -1)).to(torch.float32)

        top = float(max(int(spec_rows.max()), int(fn_rows.max()), 1))
        cmap = plt.get_cmap("viridis").with_extremes(under="0.8")
        for ax, data, title in ((row[0], spec_rows, "input row read (spec)"),
                                (row[1], fn_rows, "input row read (function)")):
            im = ax.imshow(flat(data).numpy(), aspect="auto", cmap=cmap, vmin=0, vmax=top, interpolation="nearest")
            ax.set_title(f"{name}: {title}", fontsize=8)
        fig.colorbar(im, ax=row[1], fraction=0.04)
        row[2].imshow(flat(mask).numpy(), aspect="auto", cmap="Reds", vmin=0, vmax=1, interpolation="nearest")
        row[2].set_title(f"{int(mask.sum())} of {mask.numel()} elements differ (red)", fontsize=8)
        for ax in row:
            ax.tick_params(labelsize=7)
    fig.suptitle(f"{result.spec_name} vs {result.function} at {_fmt_dims(fail.dims)}: output elements "
                 f"(last axis across, others flattened down)", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
