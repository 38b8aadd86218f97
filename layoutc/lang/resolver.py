"""Resolving a parsed spec into a :class:`~layoutc.lang.ir.Program`.

:func:`resolve` turns a syntax tree plus parameter values into a :class:`Program`:
compile-time conditions (``if gated {...}``) are decided, conditions on optional
tensors (``if w13_bias {...}``) become *guards* kept for run time, and every name
is checked against its declaration. All errors found are reported together.
Also here: the ``-D name=value`` parsing (:func:`parse_param_value`, :func:`check_param_name`)
that the command line shares with the resolver. The data classes it builds are in :mod:`layoutc.lang.ir`.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

import attrs

from ..front import ast
from ..algebra import expr as ex
from . import families
from ..algebra.dtypes import ELEMENT_TYPES, EXACT_WIDENINGS, ElemType, widens_exactly
from ..front.errors import Reporter, SpecError
from .identity import spec_identity
from ..front.tree import FileTree
from ..limits import MAX_DIMS, MAX_INT, MAX_OPTIONAL_INPUTS, MAX_STATEMENTS, MAX_STRING
from ..front.names import identifier_problem
from .ops import generated_names
from ..front.args import ArgValue
from ..front.errors import suggest
from ..front.text import char_name, display, forbidden
from .ir import (Assumption, Guard, Program, RowLayout, SizeAssumption, SizeCondition, Statement, TensorSpec, Tie,
                 VersionPin, any_of, compare, comparison)

def _value_to_python(v: ast.Value) -> Any:
    """Parameter values: true/false, integers, identifiers and strings (as str), lists."""
    if isinstance(v, ast.BoolValue):
        return v.value
    if isinstance(v, ast.StrValue):
        return v.value
    if isinstance(v, ast.ListValue):
        return tuple(_value_to_python(i) for i in v.items)
    if isinstance(v, ast.EllipsisValue):
        return ...
    if isinstance(v.expr, ex.Const):
        return v.expr.value
    if isinstance(v.expr, ex.Var):
        return v.expr.name
    return v.text


def _arg_value(v: ast.Value) -> ArgValue:
    if isinstance(v, ast.ExprValue):
        return ArgValue("expr", v.expr, v.text)
    if isinstance(v, ast.StrValue):
        return ArgValue("str", v.value, v.text)
    if isinstance(v, ast.BoolValue):
        return ArgValue("bool", v.value, v.text)
    if isinstance(v, ast.EllipsisValue):
        return ArgValue("ellipsis", ..., v.text)
    return ArgValue("list", tuple(_arg_value(i) for i in v.items), v.text)


def parse_param_value(text: str) -> Any:
    """A ``-D name=value`` string as a parameter value (bool, int, or identifier/string).
    Raises ValueError for values no spec parameter can take (control characters, huge numbers)."""
    bad = next((c for c in text if forbidden(c) or c == "\n"), None)
    if bad is not None:
        raise ValueError(f"the value contains the character {char_name(bad)}")
    if len(text) > MAX_STRING:
        raise ValueError(f"the value is {len(text)} characters long (at most {MAX_STRING})")
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if re.fullmatch(r"\s*[+-]?(0[xob])?[0-9a-f_]+\s*", low):
        try:
            value = int(text, 0)
        except ValueError:
            pass
        else:
            if abs(value) > MAX_INT:
                raise ValueError(f"{value} is too large (at most {MAX_INT})")
            return value
    return text.strip().strip('"')


def check_param_name(name: str) -> None:
    """A ``-D`` name must be a name a spec can declare."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", name):
        raise ValueError(f"{name!r} is not a parameter name (letters, digits and '_')")


class _Resolver:
    def __init__(self, spec: ast.Spec, overrides: Mapping[str, Any]):
        self.spec = spec
        self.overrides = dict(overrides)
        self.diags = Reporter()
        self.name: str | None = None
        self.params: dict[str, Any] = {}
        self.param_decls: dict[str, ast.Param] = {}
        self.dims: list[str] = []
        self.dim_pos: dict[str, ast.Pos] = {}
        self.assumptions: list[Assumption] = []
        self.size_assumptions: list[SizeAssumption] = []
        self.requires: list[VersionPin] = []
        self.inputs: dict[str, TensorSpec] = {}
        self.outputs: dict[str, TensorSpec] = {}
        self.conditional_outputs: list[TensorSpec] = []
        self.statements: list[Statement] = []
        self.conditions: dict[str, SizeCondition] = {}
        self.families: dict[str, Any] = {}
        self.imports: list[tuple[str, str]] = []  # (import as written, content sha256): part of the identity
        self.undeclared: dict[str, list[ast.Pos]] = {}  # dims used but not declared -> where (one error each)
        self.broken: set[str] = set()  # tensors whose declaration failed (no cascade of 'unknown tensor')

    def error(self, message: str, pos: ast.Pos | None, hint: str | None = None, tensors: Iterable[str] = ()) -> None:
        self.diags.error(message, pos, hint, tensors)

    # -- first pass: parameters, so conditions anywhere can use them --
    def collect_params(self, items: Iterable[Any]) -> None:
        for item in items:
            if isinstance(item, ast.Import):  # families first: declarations and statements name them
                self.import_families(item)
            elif isinstance(item, ast.FamilyDef):
                self.define_family(item)
            elif isinstance(item, ast.Param):
                name = item.name.text
                if name in self.param_decls:
                    self.error(f"parameter {name!r} is declared twice", item.name.pos)
                    continue
                self.param_decls[name] = item
                value = _value_to_python(item.default)
                choices = _value_to_python(item.choices) if item.choices else None
                if choices is not None and value not in choices:
                    self.error(f"default {value!r} of {name!r} is not one of its choices {list(choices)}",
                               item.default.pos)
                self.params[name] = value
            elif isinstance(item, ast.If):
                for branch in (item.then, item.other):
                    for inner in branch:
                        if isinstance(inner, ast.Param):
                            self.error("parameters are declared at top level, not inside 'if'", inner.pos)
        for name, value in self.overrides.items():
            decl = self.param_decls.get(name)
            if decl is None:
                known = ", ".join(self.param_decls) or "none"
                self.error(
                    f"unknown parameter {name!r} (set with -D or params=)",
                    None,
                    " ".join(filter(None, [suggest(name, list(self.param_decls)),
                                           f"parameters of this spec: {known}"])),
                )
                continue
            default = self.params[name]
            if isinstance(default, bool) != isinstance(value, bool) or (
                isinstance(default, int) and not isinstance(value, int)
            ):
                self.error(f"parameter {name!r} takes a {type(default).__name__}, got {value!r}", decl.pos)
                continue
            choices = _value_to_python(decl.choices) if decl.choices else None
            if choices is not None and value not in choices:
                self.error(f"parameter {name!r} must be one of {list(choices)}, got {value!r}", decl.pos)
                continue
            self.params[name] = value

    # -- conditions --
    def condition(self, cond: ast.Condition) -> bool | Guard | None:
        if cond.kind == "cmp" and cond.name is not None and cond.name.text in self.inputs:
            self.error(f"{cond.name.text} is a tensor; test its presence with 'if {cond.name.text}' or "
                       f"'if not {cond.name.text}'", cond.pos)
            return None
        if cond.kind == "cmp" and (cond.name is None or cond.name.text not in self.params):
            return self.size_condition(cond)
        name = cond.name.text
        if name in self.params:
            value = self.params[name]
            if cond.kind == "true":
                if not isinstance(value, bool):
                    self.error(f"'if {name}' needs a true/false parameter; {name} = {value!r}", cond.pos,
                               f"compare it: if {name} == ...")
                    return None
                return value
            if cond.kind == "not":
                if not isinstance(value, bool):
                    self.error(f"'if not {name}' needs a true/false parameter; {name} = {value!r}", cond.pos)
                    return None
                return not value
            other = _value_to_python(cond.value)
            if cond.kind == "cmp":
                if cond.op in ("==", "!="):
                    return (value == other) == (cond.op == "==")
                if type(value) is not int or type(other) is not int:
                    if type(value) is int and isinstance(cond.value, ast.ExprValue):
                        return self.size_condition(cond)
                    self.error(f"'{cond.op}' compares numbers; {name} = {value!r}", cond.pos)
                    return None
                return compare(value, cond.op, other)
            if not isinstance(other, tuple):
                self.error("'in' needs a list: if x in [a, b]", cond.value.pos)
                return None
            return value in other
        if name in self.inputs:
            spec = self.inputs[name]
            if cond.kind not in ("true", "not"):
                self.error(f"{name} is a tensor; test its presence with 'if {name}' or 'if not {name}'", cond.pos)
                return None
            if not spec.optional:
                self.error(
                    f"{name} is not optional, so 'if {'not ' if cond.kind == 'not' else ''}{name}' is always "
                    f"{'false' if cond.kind == 'not' else 'true'}",
                    cond.pos,
                    f"mark it optional: input {name}? : ...",
                )
                return None
            return Guard(name, cond.kind == "true")
        known = list(self.params) + list(self.inputs) + list(self.dims)
        self.error(f"unknown name {name!r} in condition", cond.name.pos,
                   suggest(name, known) or "conditions test parameters, optional inputs or sizes of the dims")
        return None

    def size_condition(self, cond: ast.Condition) -> bool | Guard | None:
        """``if I > 128``: decided now when parameters alone decide it, else per call from the dims."""
        if not isinstance(cond.value, ast.ExprValue):
            self.error(f"{cond.value.text} is not a number or size to compare with", cond.value.pos)
            return None
        lhs, rhs = self.constants(cond.lhs), self.constants(cond.value)
        for side in (lhs, rhs):
            unknown = sorted(ex.free_vars(side.expr) - set(self.dims))
            if unknown:
                self.error(f"unknown name {unknown[0]!r} in condition", side.pos,
                           suggest(unknown[0], list(self.dims) + list(self.params)) or
                           "a size condition compares expressions of the dims and integer parameters")
                return None
        if not (ex.free_vars(lhs.expr) | ex.free_vars(rhs.expr)):
            return compare(ex.evaluate(lhs.expr, {}), cond.op, ex.evaluate(rhs.expr, {}))
        label = f"{ex.to_str(lhs.expr, slash=True)} {cond.op} {ex.to_str(rhs.expr, slash=True)}"
        if label not in self.conditions:
            self.conditions[label] = SizeCondition(label, lhs.expr, cond.op, rhs.expr, cond.pos)
        return Guard(label, True)

    # -- walk --
    def walk(self, items: Iterable[Any], guards: tuple[Guard, ...], top: bool = True) -> None:
        for item in items:
            if isinstance(item, ast.SpecName):
                if guards:
                    self.error("'spec' cannot depend on an optional tensor", item.pos)
                elif self.name is not None:
                    self.error(f"spec name given twice (already {self.name!r})", item.pos)
                else:
                    self.name = item.name.text
            elif isinstance(item, ast.Requires):
                self.requires.append(VersionPin(item.library.text, item.op, item.version, item.pos))
            elif isinstance(item, ast.Dims):
                for n in item.names:
                    problem = identifier_problem(n.text, generated_names())
                    if n.text in self.dims:
                        self.error(f"dim {n.text!r} is declared twice", n.pos)
                    elif n.text in self.params:
                        self.error(f"{n.text!r} is both a dim and a parameter", n.pos, "rename one of them")
                    elif problem is not None:
                        self.error(f"{n.text!r} cannot be a dim: {problem}", n.pos,
                                   "rename it (dims are sizes: E, I, H, ...)")
                    elif len(self.dims) >= MAX_DIMS:
                        self.error(f"a spec declares at most {MAX_DIMS} dims", n.pos)
                    else:
                        self.dims.append(n.text)
                        self.dim_pos[n.text] = n.pos
            elif isinstance(item, ast.Assume):
                self.assume(item)
            elif isinstance(item, ast.SizeAssume):
                self.size_assume(item, guards)
            elif isinstance(item, ast.Param):
                pass  # handled in collect_params
            elif isinstance(item, ast.TensorDecl):
                on_tensor = next((g for g in guards if g.key not in self.conditions), None)
                if on_tensor is not None:
                    self.error(f"tensors cannot be declared under a condition on an optional tensor "
                               f"({on_tensor.key})", item.pos)
                elif guards and item.direction == "input":
                    self.error(f"inputs cannot be declared under a condition on a size ({guards[-1].key}): the "
                               f"checkpoint's tensors are the same whatever the sizes; declare the kernel's "
                               f"layout per size with 'output' under the condition", item.pos)
                else:
                    self.declare(item, guards)
            elif isinstance(item, ast.Transform):
                self.statement(item, guards)
            elif isinstance(item, (ast.FamilyDef, ast.Import)):
                if guards or not top:
                    self.error("families are defined and imported at top level", item.pos)
            elif isinstance(item, ast.If):
                decision = self.condition(item.cond)
                if decision is None:
                    continue
                if isinstance(decision, Guard):
                    self.walk(item.then, guards + (decision,), False)
                    self.walk(item.other, guards + (Guard(decision.key, not decision.present),), False)
                else:
                    self.walk(item.then if decision else item.other, guards, False)

    def add_family(self, fam, pos: ast.Pos) -> None:
        old = self.families.get(fam.name)
        if old is not None and old is not fam:
            where = "layoutc's prelude" if old.filename.startswith("<layoutc>") else old.filename
            self.error(f"family {fam.name} is already defined ({where})", pos, "give this one another name")
        else:
            self.families[fam.name] = fam

    def define_family(self, item: ast.FamilyDef) -> None:
        fam, problems = families.from_ast(item, self.spec)
        self.diags.extend(problems)
        self.add_family(fam, item.name.pos)

    def import_families(self, item: ast.Import) -> None:
        try:
            loaded, digest = families.load_import(item.path.value, self.tree)
            self.imports.append((item.path.value, digest))
            for fam in loaded:
                self.add_family(fam, item.path.pos)
        except ValueError as err:
            self.error(str(err), item.path.pos)
        except SpecError as err:
            first = err.diagnostics[0]
            at = f" ({display(err.filename)}:{first.pos.line}:{first.pos.column})" if first.pos else ""
            self.error(f"the imported file has errors{at}: {first.message}", item.path.pos)

    def assume(self, item: ast.Assume) -> None:
        e = item.value.expr
        if not isinstance(e, ex.Var):
            self.error("assume takes one dim: assume I % 64 == 0, assume I >= 128", item.value.pos)
        elif e.name not in self.dims:
            self.error(f"assume names {e.name!r}, which is not a declared dim", item.value.pos,
                       suggest(e.name, self.dims))
        elif item.multiple is None:
            b = self.constants(item.bound).expr
            if not isinstance(b, ex.Const):
                self.error(f"assume needs a number (or integer parameters), got {item.bound.text}", item.bound.pos)
            else:
                self.assumptions.append(Assumption(e.name, 1, item.pos, b.value + (1 if item.op == ">" else 0)))
        else:
            m = self.constants(item.multiple).expr
            if not isinstance(m, ex.Const) or m.value <= 0:
                self.error(f"assume needs a positive number (or integer parameters), got {item.multiple.text}",
                           item.multiple.pos)
            else:
                self.assumptions.append(Assumption(e.name, m.value, item.pos))

    def size_assume(self, item: ast.SizeAssume, guards: tuple[Guard, ...]) -> None:
        """``assume N != 96``, ranges and 'or': a condition on the dims, checked on every call and holding
        on every size the tools sample. A lower bound of one dim (``1 <= N``, ``N in 64..8192``) also
        starts the sampled sizes there, as ``assume N >= 64`` does."""
        if guards:
            self.error("assume is said at top level, not under a condition", item.pos)
            return
        alternatives = []
        for conj in item.alternatives:
            parts = []
            for cmp in conj:
                lhs, rhs = self.constants(cmp.lhs), self.constants(cmp.rhs)
                for side in (lhs, rhs):
                    unknown = sorted(ex.free_vars(side.expr) - set(self.dims))
                    if unknown:
                        self.error(f"assume names {unknown[0]!r}, which is not a declared dim", side.pos,
                                   suggest(unknown[0], self.dims))
                        return
                    if side.divisions:
                        self.error("assume compares sizes without '/': write 2*N <= 8192 rather than N/2 ...",
                                   side.pos)
                        return
                parts.append((lhs.expr, cmp.op, rhs.expr))
            alternatives.append(parts)
        if not any(ex.free_vars(a) | ex.free_vars(b) for conj in alternatives for a, _, b in conj):
            self.error(f"assume {item.text} names no dim", item.pos)
            return
        condition = any_of(ex.and_(*(comparison(a, op, b) for a, op, b in conj)) for conj in alternatives)
        if isinstance(condition, ex.Const):
            if not condition.value:
                self.error(f"assume {item.text} never holds", item.pos)
            return
        if len(alternatives) == 1:
            for a, op, b in alternatives[0]:
                if op in ("<", "<="):
                    a, op, b = b, {"<": ">", "<=": ">="}[op], a
                if op in (">", ">=") and isinstance(a, ex.Var) and isinstance(b, ex.Const):
                    self.assumptions.append(Assumption(a.name, 1, item.pos, b.value + (op == ">")))
        self.size_assumptions.append(SizeAssumption(item.text, condition, item.pos))

    def constants(self, value: ast.ExprValue) -> ast.ExprValue:
        """Integer parameters are constants inside expressions (``2*I/tp_size``, ``rank=tp_rank``)."""
        ints = {k: v for k, v in self.params.items() if type(v) is int}
        names = ex.free_vars(value.expr) & set(ints)
        sub = {n: ints[n] for n in names}
        for m, pos in value.multiples:
            m = ex.substitute(m, {n: ints[n] for n in ex.free_vars(m) & set(ints)})
            if not isinstance(m, ex.Const) or m.value <= 0:
                shown = ex.to_str(m)
                self.error(f"round_up()/ceil_div(): the second argument must be a positive integer (a number or an "
                           f"integer parameter), got {shown}", pos)
                return attrs.evolve(value, expr=ex.Const(1), divisions=(), multiples=())
        if not names:
            return value
        try:
            return attrs.evolve(
                value, expr=ex.substitute(value.expr, sub),
                divisions=tuple((ex.substitute(a, sub), ex.substitute(b, sub)) for a, b in value.divisions),
                multiples=(),
            )
        except (ValueError, ZeroDivisionError) as err:
            shown = ", ".join(f"{n} = {v}" for n, v in sorted(sub.items()))
            self.error(f"{value.text} is not a valid size with {shown}: {err}", value.pos)
            return attrs.evolve(value, expr=ex.substitute(value.expr, {n: 1 for n in names}), divisions=(),
                                multiples=())

    def arg(self, value: ast.Value) -> ArgValue:
        if isinstance(value, ast.ExprValue):
            return _arg_value(self.constants(value))
        if isinstance(value, ast.ListValue):
            return ArgValue("list", tuple(self.arg(i) for i in value.items), value.text)
        return _arg_value(value)

    def check_dims_in(self, value: ast.ExprValue, what: str) -> None:
        """Names a shape uses that are not dims: reported once per name by :meth:`report_undeclared`
        (a forgotten dim is one mistake, however many shapes use it)."""
        for name in sorted(ex.free_vars(value.expr) - set(self.dims)):
            self.undeclared.setdefault(name, []).append((value.pos, what))

    def report_undeclared(self) -> None:
        for name, uses in self.undeclared.items():
            pos, what = uses[0]
            lines = sorted({p.line for p, _ in uses if p is not None} - {pos.line if pos else None})
            also = f"; also used on line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines))}" if lines else ""
            close = suggest(name, self.dims)
            self.error(f"{what} uses {name!r}, which is not a declared dim{also}", pos,
                       f"{close} (or declare it: dims {', '.join(self.dims + [name])})" if close
                       else f"declare it: dims {', '.join(self.dims + [name])}")

    def declare(self, d: ast.TensorDecl, guards: tuple[Guard, ...] = ()) -> None:
        name = d.name.text
        table = self.inputs if d.direction == "input" else self.outputs
        first = table.get(name)
        if first is not None and not (guards and d.direction == "output" and self.exclusive(name, guards)):
            self.error(f"{d.direction} {name!r} is declared twice" +
                       (" under conditions that can hold together" if guards else ""), d.name.pos, tensors=[name])
            return
        elem = ELEMENT_TYPES.get(d.elem.text)
        if elem is None:
            self.error(f"unknown element type {d.elem.text!r}", d.elem.pos,
                       suggest(d.elem.text, list(ELEMENT_TYPES)) or f"types: {', '.join(ELEMENT_TYPES)}")
            if d.direction == "input":
                self.broken.add(name)
            return
        shape = [self.constants(v) for v in d.shape]
        for v in shape:
            self.check_dims_in(v, f"the shape of {name}")
        tie = None
        if d.tie is not None:
            if d.direction == "output":
                self.error("ties are declared on inputs (the checkpoint contract)", d.tie.pos)
            target = d.tie.weight.text
            if target not in self.inputs and target not in self.broken:
                self.error(f"{name} is tied to {target!r}, which is not a declared input (declare it first)",
                           d.tie.weight.pos, suggest(target, list(self.inputs)), tensors=[name])
            if isinstance(d.tie, ast.ScaleTie):
                tie = Tie("scales", target, d.tie.block, d.tie.pos, d.tie.row_block,
                          self.block_axis(d.tie, target, len(d.shape)))
            else:
                tie = Tie("bias", target, None, d.tie.pos)
        rows = None
        if d.rows is not None:
            kind = "stacked" if isinstance(d.rows, ast.StackedRows) else "interleaved"
            group = d.rows.group if isinstance(d.rows, ast.InterleavedRows) else 1
            rows = RowLayout(kind, tuple(n.text for n in d.rows.shards), group, d.rows.pos)
        packing = None
        if d.packing is not None:
            declared = []
            for fam in d.packing.families:
                if fam.text not in self.families and fam.text != "none":
                    known = sorted(self.families)
                    self.error(f"unknown packing family {fam.text!r}", fam.pos,
                               suggest(fam.text, known) or f"families: {', '.join(known)}")
                elif fam.text in declared:
                    self.error(f"packing {fam.text} is listed twice", fam.pos)
                declared.append(fam.text)
            if "none" in declared and len(declared) > 1:
                self.error("'packing none' cannot be combined with other families", d.packing.pos)
            packing = None if declared == ["none"] else "+".join(declared)
            for fam, key, value in d.packing.args:
                known = self.families.get(fam)
                if fam == "none":
                    self.error("'packing none' takes no parameters", key.pos)
                elif known is not None and key.text not in known.param_names:
                    self.error(f"family {fam} has no parameter {key.text!r}", key.pos,
                               suggest(key.text, list(known.param_names)) or
                               f"parameters of {fam}: {', '.join(known.param_names) or 'none'}")
        packing_args = tuple((fam, key.text, self.family_arg(value), key.pos)
                             for fam, key, value in d.packing.args) if d.packing else ()
        divisions = tuple((num, den, v.pos) for v in shape for num, den in v.divisions)
        accepts = self.accepted_types(d, elem)
        spec = TensorSpec(
            name, d.direction, elem, tuple(v.expr for v in shape),
            tuple(v.text if v is w else ex.to_str(v.expr, slash=True) for v, w in zip(shape, d.shape)),
            d.optional, tie, rows, packing, d.pos, divisions, packing_args, accepts, guards,
            tie is not None and tie.k_major,
        )
        if first is None:
            table[name] = spec
            return
        # One contract per output whatever the sizes: its type and shape (what the caller allocates and the
        # converter checks); the rows and packing are what a size condition may change.
        if spec.elem != first.elem or spec.optional != first.optional or len(spec.shape) != len(first.shape) \
                or not all(ex.same_value(a, b) for a, b in zip(spec.shape, first.shape)):
            self.error(f"output {name} is declared {spec.elem.name}{spec.shape_str()}{'?' * spec.optional} here but "
                       f"{first.elem.name}{first.shape_str()}{'?' * first.optional} on line {first.pos.line}: "
                       f"declarations under size conditions may change the rows and packing, not the type or shape",
                       d.pos, tensors=[name])
            return
        self.conditional_outputs.append(spec)

    def exclusive(self, name: str, guards: tuple[Guard, ...]) -> bool:
        """Whether an output declared under ``guards`` never holds together with an earlier declaration."""
        earlier = [self.outputs[name]] + [o for o in self.conditional_outputs if o.name == name]
        return all(any(Guard(g.key, not g.present) in o.guards for g in guards) for o in earlier)

    def block_axis(self, tie: ast.ScaleTie, weight: str, rank: int) -> bool:
        """``along K``: whether the block axis (the weight's axis whose size names K) is the one before the last
        (a K-major weight) rather than the last. The weight is marked K-major here, and must hold one value per
        element along K (a packed type packs along its last axis, the rows of a K-major weight)."""
        if tie.along is None:
            return False
        dim = tie.along.text
        w = self.inputs.get(weight)
        if dim not in self.dims:
            self.error(f"along {dim}: {dim!r} is not a declared dim", tie.along.pos, suggest(dim, self.dims))
            return False
        if w is None:
            return False
        axes = [i for i, e in enumerate(w.shape) if dim in ex.free_vars(e)]
        rank_w = len(w.shape)
        if len(axes) != 1 or axes[0] not in (rank_w - 1, rank_w - 2) or rank_w != rank or rank < 2:
            self.error(f"along {dim}: the block axis is the one axis of {weight}{w.shape_str()} whose size names "
                       f"{dim}, the last or the one before it, and {w.name} and its scales have the same rank",
                       tie.along.pos)
            return False
        k_major = axes[0] == rank_w - 2
        if k_major:
            if w.elem.values != 1:
                self.error(f"{weight} is K-major ({dim} is the axis before the last) but {w.elem.name} packs "
                           f"{w.elem.values} values per element along the last axis, its rows", tie.along.pos,
                           "declare K-major weights with one value per element (int8, e4m3, bf16, ...)")
                return False
            self.inputs[weight] = attrs.evolve(w, k_major=True)
        return k_major

    def family_arg(self, value: ast.ExprValue) -> int | ex.Expr:
        """``packing F(w=num_warps)``, ``F(g=K/32)``: an integer once integer parameters are substituted, or
        a size expression of the dims (the family is then read with that size on every call)."""
        v = self.constants(value)
        if isinstance(v.expr, ex.Const):
            return v.expr.value
        self.check_dims_in(v, "a family argument")
        return v.expr

    def accepted_types(self, d: ast.TensorDecl, elem: ElemType) -> tuple[ElemType, ...]:
        """`accepts T`: T must widen exactly into the declared type, and be told apart from it."""
        out: list[ElemType] = []
        for name in d.accepts:
            other = ELEMENT_TYPES.get(name.text)
            exact = sorted(n for n, w in EXACT_WIDENINGS if w == elem.name)
            if d.direction == "output":
                self.error("'accepts' is said of inputs: converters produce the declared type", name.pos)
            elif other is None:
                self.error(f"unknown element type {name.text!r}", name.pos,
                           suggest(name.text, list(ELEMENT_TYPES)) or f"types: {', '.join(ELEMENT_TYPES)}")
            elif other == elem or other in out:
                self.error(f"{d.name.text} accepts {other.name} twice", name.pos)
            elif not widens_exactly(other, elem):
                self.error(f"{d.name.text}: {other.name} does not convert exactly to {elem.name}", name.pos,
                           f"{elem.name} accepts {', '.join(exact)}" if exact else
                           f"no narrower type converts exactly to {elem.name}; declare the type the engine hands over")
            else:
                out.append(other)
        return tuple(out)

    def statement(self, t: ast.Transform, guards: tuple[Guard, ...]) -> None:
        if not t.args or t.args[0].name is not None:
            self.error(f"{t.op.text}() needs a tensor (or a list of tensors) as its first argument", t.pos)
            return
        first = t.args[0].value
        names: list[tuple[str, ast.Pos]] = []
        items = first.items if isinstance(first, ast.ListValue) else (first,)
        for v in items:
            if not (isinstance(v, ast.ExprValue) and isinstance(v.expr, ex.Var)):
                self.error(f"{v.text} is not a tensor name", v.pos)
                return
            names.append((v.expr.name, v.pos))
        ok = True
        for n, pos in names:
            if n in self.broken:  # its declaration has an error already: this statement is not checked
                ok = False
            elif n not in self.inputs:
                self.error(f"unknown tensor {n!r}", pos,
                           suggest(n, list(self.inputs)) or "tensors are declared with 'input'")
                ok = False
        if not ok:
            return
        positional, keywords, seen = [], [], set()
        for a in t.args[1:]:
            if a.name is None:
                if keywords:
                    self.error("positional argument after keyword arguments", a.pos)
                    return
                positional.append((self.arg(a.value), a.pos))
            else:
                if a.name.text in seen:
                    self.error(f"{a.name.text}= is given twice", a.name.pos)
                    return
                seen.add(a.name.text)
                keywords.append((a.name.text, self.arg(a.value), a.pos))
        self.statements.append(
            Statement(t.op.text, t.op.pos, tuple(names), tuple(positional), tuple(keywords), guards, t.text, t.pos)
        )

    def finish(self) -> Program:
        self.report_undeclared()
        if not self.inputs and not self.outputs and not self.diags:
            self.error("this spec declares no tensors", ast.Pos(1, 1, 1, 2),
                       "declare the checkpoint tensors with 'input NAME : TYPE[shape]' and the kernel's with 'output'")
        if len(self.statements) > MAX_STATEMENTS:
            self.error(f"the spec has {len(self.statements)} transform statements (at most {MAX_STATEMENTS})",
                       self.statements[MAX_STATEMENTS].pos)
        optional = [t.pos for t in self.inputs.values() if t.optional] + [c.pos for c in self.conditions.values()]
        if len(optional) > MAX_OPTIONAL_INPUTS:
            self.error(f"a spec has at most {MAX_OPTIONAL_INPUTS} optional inputs and size conditions together "
                       f"(each doubles the variants verified)", optional[MAX_OPTIONAL_INPUTS])
        if not self.dims:
            used = set()
            for spec in list(self.inputs.values()) + list(self.outputs.values()):
                for s in spec.shape:
                    used |= ex.free_vars(s)
            if used:
                self.error("no 'dims' declaration", None, f"add: dims {', '.join(sorted(used))}")
        if self.name is None:
            self.name = _default_name(self.spec.filename)
        self.diags.raise_if_errors(self.spec.filename, self.spec.source)
        k_major = {t.name for t in self.inputs.values() if t.k_major}  # an output keeps its input's axes
        if k_major:
            self.outputs = {n: attrs.evolve(o, k_major=n in k_major) for n, o in self.outputs.items()}
            self.conditional_outputs = [attrs.evolve(o, k_major=o.name in k_major) for o in self.conditional_outputs]
        return Program(
            self.name, self.spec.filename, self.spec.source, tuple(sorted(self.params.items())), tuple(self.dims),
            tuple(self.assumptions), tuple(self.requires), tuple(self.inputs.values()), tuple(self.outputs.values()),
            tuple(self.statements),
            spec_identity(self.spec.sha256, self.imports, families.prelude_sha256(), self.params),
            tuple(self.dim_pos[d] for d in self.dims), tuple(self.conditions.values()), tuple(self.families.values()),
            size_assumptions=tuple(self.size_assumptions), conditional_outputs=tuple(self.conditional_outputs),
            text_sha256=self.spec.sha256, imports=tuple(self.imports),
        )


def _default_name(filename: str) -> str:
    """A spec without a ``spec NAME`` line is named after its file, as a plain identifier: the
    name is shown and stamped on outputs, and a file name can hold any character."""
    base = filename.replace("\\", "/").rsplit("/", 1)[-1]
    base = base[:-4] if base.endswith(".lyt") else base
    name = re.sub(r"[^A-Za-z0-9_]+", "_", base).strip("_")[:64]
    return name if name and not name[0].isdigit() else f"spec_{name}"


def resolve(spec: ast.Spec, params: Mapping[str, Any] | None = None, tree: Any = None) -> Program:
    """The program of a parsed spec at these parameter values. Imports are read from ``tree``
    (:mod:`layoutc.front.tree`; by default the spec file's folder)."""
    r = _Resolver(spec, params or {})
    r.tree = tree if tree is not None else FileTree.beside(spec.filename)
    for fam in families.prelude():
        r.families[fam.name] = fam
    r.collect_params(spec.items)
    r.walk(spec.items, ())
    return r.finish()
