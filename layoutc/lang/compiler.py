"""From a resolved program to typed transform chains, one per tensor and presence variant.

For every combination of present optional inputs (a *variant*), each input gets
a :class:`Chain`: its statements bound to op instances, with the tensor type
before and after each step and the divisibility each step needs. Chains are what
the lowerings consume and what the verifier reasons about; ``Chain.composed_map``
collapses a whole chain into one index map (the fused lowering's input).

Divisibility requirements are classified here: proven from the spec's ``assume``
lines, impossible (a compile error), or left to a run-time check with a message
that names the tensor, the statement and the dims.
"""

from __future__ import annotations

import itertools
import math
from typing import Iterable

import attrs

from ..algebra import expr as ex
from ..front.ast import Pos
from ..front.errors import Diagnostic, Reporter, SpecError
from ..algebra.indexmap import IndexMap, compose_all, identity
from ..runtime.dimsolve import solve_order
from ..algebra.instances import classify, sample_dims
from ..limits import MAX_OPTIONAL_INPUTS, MAX_STEPS_PER_TENSOR
from .ir import Guard, Program, Statement, TensorSpec
from .expand import ExpandError, NeedCondition, PackingTag, statement_ops
from .ops import FAMILY_STATEMENTS, Op, OpTypeError, TensorType

#: Sizes from which output shapes are also compared (above any realistic padding multiple).
LARGE_SIZE = 1 << 14


def looks_like_scales_of(t: TensorSpec, program: Program) -> tuple[TensorSpec, str] | None:
    """(weight, block) when ``t`` has a weight's leading sizes and rows (or whole row blocks of them) and
    a whole fraction of its K values: the shape of block scales. Sizes are compared on large instances."""
    if t.tie is not None:
        return None
    samples = [{d: 1 << (12 + 3 * i) for i, d in enumerate(program.dims)},  # dims of different sizes, so
               {d: 1 << (22 - 2 * i) for i, d in enumerate(program.dims)}]  # that only true ratios are constant

    def ratio(big, small):
        values = set()
        for env in samples:
            a, b = int(ex.evaluate(big, env)), int(ex.evaluate(small, env))
            if b <= 0 or a % b:
                return None
            values.add(a // b)
        return values.pop() if len(values) == 1 else None

    for w in program.inputs:
        if w is t or w.tie is not None or len(w.shape) != len(t.shape) or len(t.shape) < 2:
            continue
        if not all(ex.same_value(a, b) for a, b in zip(w.shape[:-2], t.shape[:-2])):
            continue
        k = ratio(ex.mul(w.shape[-1], w.elem.values), t.shape[-1])
        rows = ratio(w.shape[-2], t.shape[-2])
        if k is None or rows is None or k < 2 or rows not in (1, k):
            continue
        return w, f"{rows}x{k}" if rows > 1 else str(k)
    return None


@attrs.frozen
class Step:
    op: Op
    statement: Statement | None  # None for steps synthesised by inversion
    in_type: TensorType
    out_type: TensorType
    tag: PackingTag | None = None  # set when the step is part of a family's packing

    @property
    def packing(self) -> bool:
        return self.tag is not None

    @property
    def where(self) -> str:
        return f"{self.statement.pos.line}" if self.statement else "?"


@attrs.frozen
class Constraint:
    """``value % multiple == 0`` for one tensor, with what to say when it fails."""

    tensor: str
    value: ex.Expr
    multiple: int
    what: str  # the op's name for the quantity ("rows"), or "" when the value is the name
    context: str  # "interleave(w13_weight_scale, sm90_mixed) at x.lyt:25"
    pos: Pos | None
    status: str  # "proven" | "runtime" | "impossible"
    why: str = ""  # the reason, where it is not the op's own arithmetic
    everywhere: bool = False  # a condition the op needs on every accepted size (a reshape's element count)

    def message(self) -> str:
        if self.multiple == 0:
            return f"{self.tensor}: {self.context} needs {self.what}" + (f" ({self.why})" if self.why else "")
        value = ex.to_str(self.value, slash=True)
        if self.what and self.what != value:
            need = f"{self.what} % {self.multiple} == 0, where {self.what} = {value}"
        else:
            need = f"{value} % {self.multiple} == 0"
        dividend = _dividend_multiple(self.value, self.multiple)
        if dividend is not None:  # said of the dim the user gives, not of a quotient they never see
            need += f" (so {ex.to_str(dividend[0], slash=True)} must be a multiple of {dividend[1]})"
        return f"{self.tensor}: {self.context} needs {need}" + (f" ({self.why})" if self.why else "")


def _dividend_multiple(value: ex.Expr, multiple: int) -> tuple[ex.Expr, int] | None:
    """``H/32`` needed a multiple of 4 is ``H`` a multiple of 128: the exact division's own check
    (``H % 32 == 0``) is separate, so together they say this of the dividend."""
    if isinstance(value, ex.Div) and isinstance(value.den, ex.Const) and multiple > 0:
        return value.num, value.den.value * multiple
    return None


@attrs.frozen
class Chain:
    tensor: str
    source: TensorSpec
    target: TensorSpec | None
    steps: tuple[Step, ...]
    constraints: tuple[Constraint, ...]
    # Family applications that gave this tensor no step (a family's ``if`` on sizes): applied all the same.
    empty_packings: tuple[PackingTag, ...] = ()
    # The spec's ``assume dim % m == 0`` lines as (dim, m): the planner checks a walk again on sizes that obey them
    # where its small samples refuse it (W4A8 at tp_size 2: I % 512, else an atom straddles w1 and w3).
    assumed: tuple[tuple[ex.Expr, int], ...] = ()
    # signature(), once: code generation asks for it thousands of times in a spec with many variants.
    _signature: tuple | None = attrs.field(default=None, init=False, eq=False, repr=False)

    @property
    def in_type(self) -> TensorType:
        return TensorType(self.source.elem, self.source.shape)

    @property
    def out_type(self) -> TensorType:
        return self.steps[-1].out_type if self.steps else self.in_type

    def maps(self) -> list[IndexMap]:
        return [s.op.index_map(s.in_type) for s in self.steps]

    def composed_map(self) -> IndexMap:
        """The whole chain as one gather (values ops contribute the identity map)."""
        maps = self.maps()
        return compose_all(maps) if maps else identity(self.in_type.shape)

    def signature(self) -> tuple:
        """Equal for chains that convert the same tensor the same way (shared across variants).
        The tensor is part of it: a weight and its bias can take the very same statements."""
        if self._signature is None:
            object.__setattr__(self, "_signature", (self.tensor,) + tuple(
                (repr(s.op), s.statement.pos if s.statement else None) for s in self.steps))
        return self._signature

    def packings(self) -> tuple[str, ...]:
        """The kernel families whose packing the chain applies, in order."""
        tags = [s.tag for s in self.steps if s.tag is not None] + list(self.empty_packings)
        return tuple(dict.fromkeys(t.family for t in sorted(tags, key=lambda t: t.instance)))


@attrs.frozen
class Variant:
    present: frozenset[str]
    chains: tuple[Chain, ...]

    def chain(self, tensor: str) -> Chain:
        return next(c for c in self.chains if c.tensor == tensor)


def _where(program: Program, pos: Pos | None) -> str:
    return f"{program.short_filename}:{pos.line}" if pos else program.short_filename


# ---------------------------------------------------------------------------


def _block_rows_reason(spec: TensorSpec, op, t: TensorType) -> str:
    """Why a row transform of 2-D block scales has a size rule: its rows stand for blocks of weight rows."""
    tie = spec.tie
    if tie is None or tie.row_block <= 1 or op.axis(t) != t.rank - 2:
        return ""
    return (f"each row of {spec.name} scales {tie.row_block} rows of {tie.weight}, so {op.name} keeps the "
            f"scale blocks whole only when this holds")


class _Builder:
    def __init__(self, program: Program):
        self.program = program
        self.diags = Reporter()
        self.assumptions: dict[str, int] = {}
        for a in program.assumptions:  # several lines on one dim (a multiple and a lower bound): all hold
            self.assumptions[a.dim] = math.lcm(self.assumptions.get(a.dim, 1), a.multiple)
        self.dims = set(program.dims)

    def assumed(self) -> tuple[tuple[ex.Expr, int], ...]:
        """The ``assume`` lines' multiples, (dim, m), one per dim (lower bounds and conditions are left out: the
        planner's small samples would rarely meet them)."""
        return tuple((ex.Var(d), m) for d, m in sorted(self.assumptions.items()) if m > 1)

    def error(self, message, pos, hint=None, tensors=(), related=()):
        self.diags.error(message, pos, hint, tensors, related)

    def constraint(self, tensor: str, value: ex.Expr, multiple: int, what: str, context: str, pos,
                   why: str = "", everywhere: bool = False) -> Constraint:
        status = classify(value, multiple, self.assumptions)
        c = Constraint(tensor, value, multiple, what, context, pos, status, why, everywhere)
        if status == "impossible":
            self.error(f"{c.message()}, which can never hold ({ex.to_str(value)} is fixed)", pos, tensors=[tensor])
        return c

    def untied_scale(self, spec: TensorSpec, st: Statement) -> tuple | None:
        """``interleave(s, F)`` on a tensor that declares no tie but is shaped like a weight's scales, with a
        family that packs scales: the tie was forgotten (a tensor without one is packed as a weight). Say
        that, rather than what follows from packing it as a weight. (message, pos, hint, related) or None."""
        if st.op not in FAMILY_STATEMENTS or spec.tie is not None or spec.role != "weight" or not st.positional:
            return None
        arg = st.positional[0][0]
        family = self.program.family(arg.value.name) if arg.kind == "expr" and isinstance(arg.value, ex.Var) else None
        if family is None or family.role("scale") is None:
            return None
        guess = looks_like_scales_of(spec, self.program)
        if guess is None:
            return None
        weight, block = guess
        return (f"{spec.name} declares no tie, so interleave(..., {family.name}) packs it as a weight; it is shaped "
                f"like the scales of {weight.name} (one per {block} values)",
                next(pos for name, pos in st.tensors if name == spec.name),
                f"declare the tie: input {spec.name} : {spec.elem.name}{spec.shape_str()} scales {weight.name} "
                f"block {block}",
                (("declared here without a tie", spec.pos),))

    def input_constraints(self, spec: TensorSpec) -> list[Constraint]:
        out = []
        for num, den, pos in spec.divisions:
            if not isinstance(den, ex.Const):
                self.error(f"{spec.name}: only division by a constant is supported in shapes", pos, tensors=[spec.name])
                continue
            out.append(self.constraint(spec.name, num, den.value, "", f"the shape {spec.shape_str()}", pos))
        return out

    def chain(self, spec: TensorSpec, present: frozenset[str]) -> Chain | None:
        t = TensorType(spec.elem, spec.shape)
        steps: list[Step] = []
        empty: list[PackingTag] = []
        constraints = self.input_constraints(spec)
        for st in self.program.statements:
            if not st.applies(present) or spec.name not in {n for n, _ in st.tensors}:
                continue
            current = [t]
            untied = self.untied_scale(spec, st)
            if untied is not None:
                message, pos, hint, related = untied
                self.error(message, pos, hint, tensors=[spec.name], related=related)
                return None
            try:
                for op, tag in statement_ops(st, lambda: current[0], spec.role, self.dims, self.program, present):
                    if op is None:  # a family that leaves tensors of these sizes as they are
                        empty.append(tag)
                        continue
                    inferred = op.infer(current[0])
                    context = f"{st.text} at {_where(self.program, st.pos)}"
                    why = _block_rows_reason(spec, op, current[0])
                    for r in inferred.requires:
                        what = (tag.axis_name(r.value) if tag is not None else None) or r.what
                        constraints.append(self.constraint(spec.name, r.value, r.multiple, what, context, st.pos, why,
                                                           r.everywhere))
                    if not op.is_identity:
                        if len(steps) >= MAX_STEPS_PER_TENSOR:
                            self.error(f"{spec.name} takes more than {MAX_STEPS_PER_TENSOR} transforms; its chain is "
                                       f"composed into one index map, and layoutc bounds its length", st.pos,
                                       tensors=[spec.name])
                            return None
                        steps.append(Step(op, st, current[0], inferred.type, tag))
                    current[0] = inferred.type
            except ExpandError as err:
                pos = st.op_pos
                if isinstance(err.arg, int) and err.arg < len(st.positional):
                    pos = st.positional[err.arg][1]
                elif isinstance(err.arg, str):
                    pos = next((p for k, _, p in st.keywords if k == err.arg), pos)
                self.error(f"{err.message}", pos, err.hint, tensors=[spec.name])
                return None
            except OpTypeError as err:
                self.error(f"{spec.name}: {err.message}", st.pos, err.hint, tensors=[spec.name])
                return None
            t = current[0]
        target = self.program.output_for(spec.name, present)
        return Chain(spec.name, spec, target, tuple(steps), tuple(constraints), tuple(empty), self.assumed())

    def check_output(self, chain: Chain, samples: list[dict], present: frozenset[str] = frozenset()) -> None:
        spec, out = chain.source, chain.target
        last = chain.steps[-1].statement.pos if chain.steps and chain.steps[-1].statement else spec.pos
        related = (("the last statement on this tensor", last),) if chain.steps else ()
        if out is None and any(o.name == spec.name for o in self.program.outputs):
            where = " and ".join(str(Guard(c.label, c.label in present)) for c in self.program.conditions)
            self.error(f"{spec.name} has no output declaration for these sizes ({where})", spec.pos,
                       f"declare output {spec.name} in every branch of the size condition", tensors=[spec.name])
            return
        if out is None:
            self.error(f"input {spec.name} has no output declaration", spec.pos,
                       f"declare the kernel contract: output {spec.name} : {chain.out_type}", tensors=[spec.name])
            return
        got = chain.out_type
        if got.elem != out.elem:
            conv = "cast" if got.elem.numeric and out.elem.numeric else "view"
            self.error(
                f"{spec.name}: the transforms produce {got.elem.name} but the output declares {out.elem.name}",
                out.pos, f"add {conv}({spec.name}, {out.elem.name})", tensors=[spec.name], related=related,
            )
        witness = shapes_differ(got.shape, out.shape, samples)
        if witness is not None:
            example = ""
            if witness:
                at = ", ".join(f"{k}={v}" for k, v in witness.items())
                g = [ex.evaluate(x, witness) for x in got.shape]
                o = [ex.evaluate(x, witness) for x in out.shape]
                example = f" (with {at}: {g} vs {o})"
            widths = [s for s in chain.steps if s.op.facts.bits and s.in_type.elem.bits != s.out_type.elem.bits
                      and s.statement is not None]
            if widths:  # a view across widths changed the shape: the view is the likely mistake
                name = widths[0].out_type.elem.name
                self.error(
                    f"{spec.name}: the transforms produce shape {got.shape_str()} but the output declares "
                    f"{out.shape_str()}{example}: {widths[0].statement.text} reads the bytes as elements of "
                    f"another width ({widths[0].in_type.elem.name} -> {name})",
                    widths[0].statement.pos, f"to convert values use cast({spec.name}, {name})", tensors=[spec.name],
                    related=[("the output declares the shape here", out.pos)])
            else:
                self.error(
                    f"{spec.name}: the transforms produce shape {got.shape_str()} but the output declares "
                    f"{out.shape_str()}{example}",
                    out.pos, tensors=[spec.name], related=related,
                )
        applied = chain.packings()
        region = f" (where {' and '.join(str(g) for g in out.guards)})" if out.guards else ""
        for fam in out.packings:
            if fam not in applied:
                self.error(f"{spec.name}: the output declares packing {fam} but no {fam} packing is applied{region}",
                           out.pos, tensors=[spec.name], related=related)
        for fam, key, value, pos in out.packing_args:
            uses = {s.tag.instance: s for s in chain.steps if s.tag is not None and s.tag.family == fam}
            for s in uses.values():
                used = dict(s.tag.args).get(key)
                if not _same_arg(used, value):
                    self.error(
                        f"{spec.name}: the kernel reads the {fam} packing with {key}={value}, but "
                        f"{s.statement.text if s.statement else fam} applies it with {key}={used}",
                        s.statement.pos if s.statement else out.pos, f"use {key}={value}", tensors=[spec.name],
                        related=[("the output declares it here", pos)],
                    )
        for fam in applied:
            if fam not in out.packings:
                declared = "packing " + " + ".join(out.packings) if out.packings else "no packing"
                self.error(
                    f"{spec.name}: a {fam} packing is applied but the output declares {declared}{region}",
                    out.pos, f"declare it: output {spec.name} : ... packing {' + '.join(out.packings + (fam,))}",
                    tensors=[spec.name], related=related,
                )

    def check_everywhere(self, chains: list[Chain], present: frozenset[str], known: list) -> None:
        """A condition an op needs on every size (a reshape's element count), broken at a size the spec accepts
        in this variant, is an error at the statement, with that size: the converter would refuse it on every
        call (LayoutError), so the spec does not describe the layout there."""
        pending = [k for c in chains for k in c.constraints if k.everywhere and k.status == "runtime"]
        if not pending:
            return
        conditions = self.program.conditions

        def accepted(env: dict) -> bool:
            return all(c.holds(env) == (c.label in present) for c in conditions)

        # The sizes the variant accepts, without the conditions being checked (sampling keeps to conditions).
        own = {(k.value, k.multiple) for k in pending}
        known = [rule for rule in known if rule not in own]
        tries = sample_dims(self.program.dims, known)
        for base in (5, 100, 1000, LARGE_SIZE):
            minimum = {d: base + 37 * i for i, d in enumerate(self.program.dims)}
            tries += sample_dims(self.program.dims, known, per_dim=2, minimum=minimum)
        envs = [env for env in tries if accepted(env)]
        reported = set()
        for k in pending:
            if (k.pos, k.message()) in reported:
                continue
            bad = next((env for env in envs if not ex.evaluate(k.value, env)), None)
            if bad is not None:
                reported.add((k.pos, k.message()))
                at = ", ".join(f"{d}={v}" for d, v in bad.items())
                self.error(f"{k.message()}, which fails at {at}, a size the spec accepts", k.pos,
                           "make the sizes agree for every size (or assume the sizes it holds for)", tensors=[k.tensor])

    def inverse_chain(self, chain: Chain) -> Chain | None:
        """Steps that take the output back to the input, or None where an op has no inverse."""
        if chain.target is None:
            return None
        steps: list[Step] = []
        # Typed from what the transforms produce; that the output declares the same is checked elsewhere.
        t = chain.out_type
        constraints: list[Constraint] = self.input_constraints(chain.target)
        for s in reversed(chain.steps):
            inv = s.op.inverse(s.in_type)
            if inv is None:
                return None  # e.g. a tensor-parallel slice: the other ranks' rows are gone
            try:
                inferred = inv.infer(t)
            except OpTypeError:
                return None
            context = f"inverse of {s.statement.text if s.statement else s.op} at {_where(self.program, s.statement.pos if s.statement else None)}"
            for r in inferred.requires:
                constraints.append(self.constraint(chain.tensor, r.value, r.multiple, r.what, context,
                                                   s.statement.pos if s.statement else None))
            steps.append(Step(inv, s.statement, t, inferred.type, s.tag))
            t = inferred.type
        return Chain(chain.tensor, chain.target, chain.source, tuple(steps), tuple(constraints), (), chain.assumed)

    def check_dims_inferable(self) -> None:
        # The same fixpoint the converters run on real shapes (dimsolve.py), on the required inputs.
        required = {t.name for t in self.program.inputs if not t.optional}
        known = {d for d, _ in solve_order(shape_axes(self.program.inputs), required)}
        for d in self.program.dims:
            if d not in known:
                self.error(f"dim {d} cannot be inferred from the shapes of the required inputs",
                           self.program.dim_position(d), f"use {d} linearly in some input shape, e.g. [{d}, ...], "
                           f"or remove it from 'dims'")


def _same_arg(a, b) -> bool:
    """A family argument as applied and as declared: equal integers, or size expressions equal for all dims."""
    if isinstance(a, int) and isinstance(b, int) or a is None or b is None:
        return a == b
    return ex.same_value(ex.as_expr(a), ex.as_expr(b)) is True


def shape_axes(specs: Iterable[TensorSpec]) -> list[tuple]:
    """Every axis of these tensors whose size is linear in the dims, as :mod:`layoutc.runtime.dimsolve` reads
    them: ``(tensor, axis, {dim: (num, den)}, (num, den), size as written)``."""
    out = []
    for s in specs:
        for axis, (e, text) in enumerate(zip(s.shape, s.shape_text)):
            form = ex.linear_form(e)
            if form is None or not form[0]:
                continue
            coefs = {k: (v.numerator, v.denominator) for k, v in form[0].items()}
            out.append((s.name, axis, coefs, (form[1].numerator, form[1].denominator), text))
    return out


def shapes_differ(a: tuple[ex.Expr, ...], b: tuple[ex.Expr, ...], samples: list[dict]) -> dict | None:
    """None when the shapes agree (provably for linear sizes, else on every sample);
    otherwise a dims binding where they differ (empty when nothing could be decided)."""
    if len(a) != len(b):
        return {}
    undecided = []
    for x, y in zip(a, b):
        same = ex.same_value(x, y)
        if same is False:
            return samples[0] if samples else {}
        if same is None:
            undecided.append((x, y))
    if not undecided:
        return None
    if not samples:
        return {}
    for env in samples:
        if any(ex.evaluate(x, env) != ex.evaluate(y, env) for x, y in undecided):
            return env
    return None


@attrs.frozen
class Compiled:
    program: Program
    variants: tuple[Variant, ...]
    inverse_variants: tuple[Variant, ...] | None  # None when some op has no inverse
    warnings: tuple[Diagnostic, ...] = ()

    def variant(self, present: Iterable[str]) -> Variant:
        """The variant for these present optional inputs and holding size conditions (by label)."""
        key = frozenset(present) & frozenset(self.program.variant_keys)
        return next(v for v in self.variants if v.present == key)


def presence_sets(program: Program) -> list[frozenset[str]]:
    """Every variant key: a set of present optional inputs and holding size conditions."""
    opt = program.variant_keys
    return [frozenset(c) for r in range(len(opt) + 1) for c in itertools.combinations(opt, r)]


def build(program: Program) -> Compiled:
    """Type every chain of every variant; raise :class:`SpecError` with all problems found.

    A family's ``if`` on the sizes its role binds (``if rows >= 32``) becomes a size condition of the spec
    when first met: it is added to the program and the chains are built again (so the compiled program
    can have more conditions than the resolved one)."""
    while True:
        try:
            return _build(program)
        except NeedCondition as need:
            if len(program.variant_keys) >= MAX_OPTIONAL_INPUTS:
                raise SpecError([Diagnostic("error", f"a spec has at most {MAX_OPTIONAL_INPUTS} optional inputs and "
                                                     f"size conditions together, counting its families' conditions "
                                                     f"on sizes ({need.condition.label})", None)],
                                program.filename, program.source) from None
            program = attrs.evolve(program, conditions=program.conditions + (need.condition,))


def _build(program: Program) -> Compiled:
    b = _Builder(program)
    b.check_dims_inferable()
    for o in program.outputs:
        if not any(i.name == o.name for i in program.inputs):
            b.error(f"output {o.name} has no input of the same name (outputs are the inputs after the transforms)",
                    o.pos, tensors=[o.name])
        elif any(i.name == o.name and i.optional != o.optional for i in program.inputs):
            b.error(f"{o.name} is optional on one side only; mark both input and output with '?'", o.pos,
                    tensors=[o.name])
    variants, inverses, invertible = [], [], True
    for present in presence_sets(program):
        chains, inv_chains = [], []
        for spec in program.inputs:
            if spec.optional and spec.name not in present:
                continue
            c = b.chain(spec, present)
            if c is None:
                continue
            chains.append(c)
            inv = b.inverse_chain(c)
            if inv is None:
                invertible = False
            else:
                inv_chains.append(inv)
        known = [(k.value, k.multiple) for c in chains for k in c.constraints]
        known += program.assumed
        # Shapes are cheap to compare, so they are also compared on large sizes: round_up and
        # padding hide a missing division (a forgotten shard) on sizes below the padding multiple.
        samples = sample_dims(program.dims, known) + sample_dims(
            program.dims, known, per_dim=2, minimum={d: LARGE_SIZE for d in program.dims})
        for c in chains:
            b.check_output(c, samples, present)
        b.check_everywhere(chains, present, known)
        variants.append(Variant(present, tuple(chains)))
        inverses.append(Variant(present, tuple(inv_chains)))
    b.diags.raise_if_errors(program.filename, program.source)
    return Compiled(program, tuple(variants), tuple(inverses) if invertible else None)
