"""Text to syntax tree: the Lark parser and the transformer into :mod:`layoutc.front.ast` nodes."""

from __future__ import annotations

import functools
import re
from importlib import resources

import lark
from lark import Lark, Token, Transformer, v_args

from . import ast
from ..algebra import expr as ex
from .errors import Diagnostic, SpecError, suggest
from ..limits import MAX_INT, MAX_INT_DIGITS, MAX_NESTING, MAX_STATEMENTS
from .source import normalize, sha256

_FRIENDLY = {
    "NAME": "a name",
    "INT": "an integer",
    "STRING": "a string",
    "VERSION": "a version number",
    "COMPARE": "a comparison (>=, <, ==, ...)",
    "OPTIONAL": "'?'",
    "$END": "end of file",
}

FUNCTIONS = {"round_up": ex.round_up, "ceil_div": ex.ceil_div}


@functools.lru_cache(maxsize=1)
def parser() -> Lark:
    grammar = resources.files("layoutc.front").joinpath("grammar.lark").read_text()
    return Lark(grammar, parser="lalr", lexer="contextual", propagate_positions=True, maybe_placeholders=True, strict=True)


def _pos(meta_or_token) -> ast.Pos:
    return ast.Pos(meta_or_token.line, meta_or_token.column, meta_or_token.end_line, meta_or_token.end_column)


class _Fail(Exception):
    def __init__(self, message: str, pos: ast.Pos, hint: str | None = None):
        super().__init__(message)
        self.diagnostic = Diagnostic("error", message, pos, hint)


def _integer(tok: Token) -> int:
    """An integer literal, refused past :data:`MAX_INT` (before Python parses a 100,000-digit one)."""
    text = str(tok)
    if len(text.lstrip("0")) > MAX_INT_DIGITS or int(text) > MAX_INT:
        shown = text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)"
        raise _Fail(f"integer {shown} is too large (at most {MAX_INT})", _pos(tok))
    return int(text)


class _Accepts:
    """The `accepts T, ...` attribute while a declaration is being assembled."""

    def __init__(self, names: tuple[ast.Name, ...], pos: ast.Pos):
        self.names, self.pos = names, pos


@v_args(meta=True)
class _ToAst(Transformer):
    def __init__(self, source: str):
        super().__init__()
        self.source = source

    def _text(self, meta) -> str:
        return self.source[meta.start_pos : meta.end_pos]

    def _expr_text(self, meta) -> str:
        """An expression as written, on one line and without comments (it is shown in shapes)."""
        return " ".join(re.sub(r"#[^\n]*", " ", self._text(meta)).split())

    def _name(self, tok: Token) -> ast.Name:
        return ast.Name(str(tok), _pos(tok))

    # -- expressions --
    def int(self, meta, children):
        (tok,) = children
        return ast.ExprValue(ex.Const(_integer(tok)), str(tok), _pos(tok))

    def name(self, meta, children):
        (tok,) = children
        return ast.ExprValue(ex.Var(str(tok)), str(tok), _pos(tok))

    def _binary(self, meta, children, fn, extra_division=False):
        a, b = children
        for side in (a, b):
            if not isinstance(side, ast.ExprValue):
                raise _Fail(f"{side.text} is not a number or size expression", side.pos)
        divisions = a.divisions + b.divisions
        multiples = a.multiples + b.multiples
        if extra_division:
            if isinstance(b.expr, ex.Const) and b.expr.value <= 0:
                raise _Fail(f"division by {b.expr.value}", b.pos)
            divisions += ((a.expr, b.expr),)
        return ast.ExprValue(fn(a.expr, b.expr), self._expr_text(meta), _pos(meta), divisions, multiples, (a, b))

    def add(self, meta, children):
        return self._binary(meta, children, ex.add)

    def sub(self, meta, children):
        return self._binary(meta, children, lambda a, b: ex.add(a, ex.mul(-1, b)))

    def mul(self, meta, children):
        return self._binary(meta, children, ex.mul)

    def div(self, meta, children):
        return self._binary(meta, children, ex.div, extra_division=True)

    def _integer_operator(self, meta, children, fn, what):
        a, b = children
        if isinstance(b, ast.ExprValue) and isinstance(b.expr, ex.Const) and b.expr.value <= 0:
            raise _Fail(f"{what} by {b.expr.value}: the right side must be a positive multiple", b.pos)
        return self._binary(meta, children, fn)

    def floordiv(self, meta, children):
        return self._integer_operator(meta, children, ex.floordiv, "floor division")

    def mod(self, meta, children):
        return self._integer_operator(meta, children, ex.mod, "modulo")

    def neg(self, meta, children):
        (a,) = children
        return ast.ExprValue(ex.mul(-1, a.expr), self._expr_text(meta), _pos(meta), a.divisions, a.multiples)

    def call(self, meta, children):
        fn_tok, *args = children
        fn = FUNCTIONS.get(str(fn_tok))
        if fn is None:
            raise _Fail(
                f"unknown function {str(fn_tok)!r} in an expression",
                _pos(fn_tok),
                f"functions: {', '.join(FUNCTIONS)}",
            )
        if len(args) != 2:
            raise _Fail(f"{fn_tok}() takes 2 arguments, got {len(args)}", _pos(meta))
        if isinstance(args[1].expr, ex.Const) and args[1].expr.value <= 0:
            raise _Fail(f"{fn_tok}(): the second argument must be a positive integer", args[1].pos)
        divisions = tuple(d for a in args for d in a.divisions)
        multiples = tuple(m for a in args for m in a.multiples)
        if not isinstance(args[1].expr, ex.Const):  # must be an integer parameter: checked once they are known
            multiples += ((args[1].expr, args[1].pos),)
        return ast.ExprValue(fn(args[0].expr, args[1].expr), self._expr_text(meta), _pos(meta), divisions, multiples)

    # -- other values --
    def string(self, meta, children):
        (tok,) = children
        return ast.StrValue(str(tok)[1:-1], str(tok), _pos(tok))

    def true(self, meta, children):
        return ast.BoolValue(True, "true", _pos(meta))

    def false(self, meta, children):
        return ast.BoolValue(False, "false", _pos(meta))

    def ellipsis(self, meta, children):
        return ast.EllipsisValue("...", _pos(meta))

    def list(self, meta, children):
        items = tuple(c for c in children if c is not None)
        return ast.ListValue(items, self._text(meta), _pos(meta))

    # -- declarations --
    def spec_name(self, meta, children):
        return ast.SpecName(self._name(children[0]), _pos(meta))

    def requires(self, meta, children):
        lib, op, version = children
        return ast.Requires(self._name(lib), str(op), str(version), _pos(meta))

    def dims(self, meta, children):
        return ast.Dims(tuple(self._name(t) for t in children), _pos(meta))

    def assume(self, meta, children):
        terms = tuple(children)
        if len(terms) == 1 and len(terms[0]) == 1:
            (cmp,) = terms[0]
            lhs, op, rhs = cmp.lhs, cmp.op, cmp.rhs
            if op in (">=", ">") and isinstance(lhs.expr, ex.Var):
                return ast.Assume(lhs, None, _pos(meta), op, rhs)
            zero = isinstance(rhs.expr, ex.Const) and rhs.expr.value == 0
            if op == "==" and zero and isinstance(lhs.expr, ex.Mod) and len(lhs.operands) == 2:
                value, multiple = lhs.operands
                return ast.Assume(value, multiple, _pos(meta))
        return ast.SizeAssume(terms, _pos(meta), self._expr_text(meta).removeprefix("assume").strip())

    def _compare(self, lhs, token, rhs) -> ast.Compare:
        op = str(token)
        if op == "~=":
            raise _Fail("'~=' compares versions; assume uses == != < <= > >=", _pos(token))
        for side in (lhs, rhs):
            if not isinstance(side, ast.ExprValue):
                raise _Fail(f"{side.text} is not a number or size expression", side.pos)
        return ast.Compare(lhs, op, rhs)

    def assume_cmp(self, meta, children):
        lhs, op, rhs = children
        return (self._compare(lhs, op, rhs),)

    def assume_chain(self, meta, children):
        a, op1, b, op2, c = children
        compares = (self._compare(a, op1, b), self._compare(b, op2, c))  # a '~=' is named before the direction
        ops = {str(op1), str(op2)}
        if not (ops <= {"<", "<="} or ops <= {">", ">="}):
            raise _Fail("a range compares in one direction: assume 1 <= N <= 65536", _pos(meta))
        return compares

    def assume_range(self, meta, children):
        value, low, high = children
        if not isinstance(value, ast.ExprValue):
            raise _Fail(f"{value.text} is not a size expression", value.pos)
        return (ast.Compare(value, ">=", low), ast.Compare(value, "<=", high))

    def param(self, meta, children):
        name, default, choices = children
        return ast.Param(self._name(name), default, choices, _pos(meta))

    def choices(self, meta, children):
        return children[0]

    def scales_attr(self, meta, children):
        weight, block, along = children
        rows, _, k = str(block).rpartition("x")
        for part in (rows, k):
            if len(part) > MAX_INT_DIGITS or (part and int(part) > MAX_INT):
                raise _Fail(f"scale block {str(block)} is too large", _pos(block))
        row_block, block_k = int(rows or 1), int(k)
        if row_block <= 0 or block_k <= 0:
            raise _Fail("a scale block must be a positive number of elements (32, or rows x K: 128x128)", _pos(block))
        return ast.ScaleTie(self._name(weight), block_k, _pos(meta), row_block,
                            self._name(along) if along is not None else None)

    def bias_attr(self, meta, children):
        return ast.BiasTie(self._name(children[0]), _pos(meta))

    def rows_attr(self, meta, children):
        return children[0]

    def stacked_rows(self, meta, children):
        return ast.StackedRows(tuple(self._name(t) for t in children), _pos(meta))

    def interleaved_rows(self, meta, children):
        a, b, group = children
        if group is not None and _integer(group) < 1:
            raise _Fail("an interleave group is at least 1 row", _pos(group))
        return ast.InterleavedRows((self._name(a), self._name(b)), _integer(group) if group is not None else 1, _pos(meta))

    def family_arg(self, meta, children):
        key, value = children
        if not isinstance(value, ast.ExprValue):
            raise _Fail(f"{value.text} is not an integer or size expression", value.pos)
        return self._name(key), value

    def family_args(self, meta, children):
        return tuple(children)

    def packing_family(self, meta, children):
        return self._name(children[0]), (children[1] if len(children) > 1 else ())

    def packing_attr(self, meta, children):
        families = [fam for fam, _ in children]
        args = tuple((fam.text, key, value) for fam, fam_args in children for key, value in fam_args)
        return ast.Packing(families[0], _pos(meta), tuple(families[1:]), args)

    def accepts_attr(self, meta, children):
        return _Accepts(tuple(self._name(c) for c in children), _pos(meta))

    def _decl(self, direction, meta, children):
        name, optional, elem, *rest = children
        shape, tie, rows, packing, accepts = [], None, None, None, None
        for item in rest:
            if item is None:
                continue
            if isinstance(item, _Accepts):
                if accepts is not None:
                    raise _Fail(f"{name} declares what it accepts twice", item.pos)
                accepts = item
                continue
            if isinstance(item, ast.ExprValue):
                shape.append(item)
            elif isinstance(item, (ast.ScaleTie, ast.BiasTie)):
                if tie is not None:
                    raise _Fail(f"{name} already has a tie ({'scales' if isinstance(tie, ast.ScaleTie) else 'bias'} ...)", item.pos)
                tie = item
            elif isinstance(item, (ast.StackedRows, ast.InterleavedRows)):
                if rows is not None:
                    raise _Fail(f"{name} declares its rows twice", item.pos)
                rows = item
            elif isinstance(item, ast.Packing):
                if packing is not None:
                    raise _Fail(f"{name} declares its packing twice", item.pos)
                packing = item
        return ast.TensorDecl(
            direction, self._name(name), optional is not None, self._name(elem), tuple(shape), tie, rows, packing, _pos(meta),
            accepts.names if accepts is not None else (),
        )

    def input_decl(self, meta, children):
        return self._decl("input", meta, children)

    def output_decl(self, meta, children):
        return self._decl("output", meta, children)

    # -- statements --
    def kwarg(self, meta, children):
        name, value = children
        return ast.Arg(self._name(name), value, _pos(meta))

    def posarg(self, meta, children):
        (value,) = children
        return ast.Arg(None, value, _pos(meta))

    def op_call(self, meta, children):
        op, *args = children
        return ast.Transform(self._name(op), tuple(a for a in args if a is not None), _pos(meta), self._text(meta))

    def _cond(self, kind, meta, children):
        name = children[0]
        value = children[1] if len(children) > 1 else None
        return ast.Condition(kind, self._name(name), value, _pos(meta), self._text(meta))

    def cond_true(self, meta, children):
        return self._cond("true", meta, children)

    def cond_not(self, meta, children):
        return self._cond("not", meta, children)

    def cond_in(self, meta, children):
        return self._cond("in", meta, children)

    def cond_cmp(self, meta, children):
        lhs, op, rhs = children
        if str(op) == "~=":
            raise _Fail("'~=' compares versions; a condition uses == != < <= > >=", _pos(op))
        if not isinstance(lhs, ast.ExprValue):
            raise _Fail(f"{lhs.text} cannot be compared", lhs.pos)
        name = ast.Name(lhs.expr.name, lhs.pos) if isinstance(lhs.expr, ex.Var) else None
        return ast.Condition("cmp", name, rhs, _pos(meta), self._text(meta), lhs, str(op))

    # -- families --
    def import_stmt(self, meta, children):
        (tok,) = children
        return ast.Import(ast.StrValue(str(tok)[1:-1], str(tok), _pos(tok)), _pos(meta))

    def family_param(self, meta, children):
        name, value = children
        return self._name(name), _integer(value)

    def family_params(self, meta, children):
        return tuple(children)

    def role_type(self, meta, children):
        return self._name(children[0])

    def axis_name(self, meta, children):
        return self._name(children[0])

    def axis_rest(self, meta, children):
        return None

    def role_axes(self, meta, children):
        axes = tuple(children)
        if axes.count(None) > 1 or (None in axes and axes[0] is not None):
            raise _Fail("'...' stands for the leading axes: write [..., R, C]", _pos(meta))
        return axes

    def role_def(self, meta, children):
        role, tensor, elem, axes, body = children
        return ast.RoleDef(self._name(role), self._name(tensor), elem, axes, body, _pos(meta))

    def family_def(self, meta, children):
        name, params, *roles = children
        return ast.FamilyDef(self._name(name), params or (), tuple(r for r in roles if r is not None), _pos(meta))

    def block(self, meta, children):
        return tuple(children)

    def if_stmt(self, meta, children):
        cond, then, other = children
        if isinstance(other, ast.If):
            other = (other,)
        return ast.If(cond, then, other or (), _pos(meta))

    def start(self, meta, children):
        return tuple(children)


def _describe_expected(expected: set[str]) -> str:
    p = parser()
    names = []
    for term in sorted(expected):
        if term in _FRIENDLY:
            names.append(_FRIENDLY[term])
            continue
        try:
            pattern = p.get_terminal(term).pattern
        except KeyError:
            names.append(term)
            continue
        names.append(f"'{pattern.value}'" if pattern.type == "str" else term.lower())
    names = sorted(set(names))
    if len(names) > 8:
        names = names[:8] + ["..."]
    return ", ".join(names)


def _token_text(tok: Token) -> str:
    if tok.type == "$END":
        return "end of file"
    return repr(str(tok))


#: The words a statement can start with (everything else is an operation call, ``op(...)``).
KEYWORDS = ("spec", "requires", "dims", "assume", "param", "input", "output", "family", "import", "if")


def _misspelt_keyword(tok: Token, expected: set[str], source: str) -> Diagnostic | None:
    """``ouput w2_bias ...``: a word at the start of a statement, followed by something other than the
    ``(`` of an operation call, is a statement keyword written wrong. Say so at the word, rather than
    ``unexpected 'w2_bias'`` at what follows it."""
    if tok.type == "$END" or "LPAR" not in expected or not tok.line:
        return None
    line = source.split("\n")[tok.line - 1]
    before = line[: tok.column - 1]
    m = re.fullmatch(r"(.*?)([A-Za-z_][A-Za-z0-9_]*)\s+", before)
    if m is None or m.group(1).strip() not in ("", ";") and not m.group(1).rstrip().endswith((";", "{", "}")):
        return None
    word = m.group(2)
    start = len(m.group(1)) + 1
    pos = ast.Pos(tok.line, start, tok.line, start + len(word))
    close = suggest(word, list(KEYWORDS))
    if close is not None:
        return Diagnostic("error", f"unknown statement {word!r}", pos, close)
    return Diagnostic("error", f"{word!r} is not a statement: a statement starts with a keyword "
                               f"({', '.join(KEYWORDS)}) or is an operation call, {word}(tensor, ...)", pos)


def _syntax_error(err: lark.exceptions.UnexpectedInput, source: str) -> Diagnostic:
    line = getattr(err, "line", None) or 1
    column = getattr(err, "column", None) or 1
    if line < 1:  # Lark reports -1 for an empty file
        line, column = max(1, source.count("\n")), 1
    pos = ast.Pos(line, column, line, column + 1)
    if isinstance(err, lark.exceptions.UnexpectedCharacters):
        ch = source[err.pos_in_stream] if err.pos_in_stream < len(source) else "?"
        expected = _describe_expected(set(err.allowed or ()))
        return Diagnostic("error", f"unexpected character {ch!r}", pos, f"expected {expected}" if expected else None)
    if isinstance(err, lark.exceptions.UnexpectedToken):
        tok = err.token
        if tok.type != "$END" and tok.end_column:
            pos = ast.Pos(tok.line, tok.column, tok.end_line, tok.end_column)
        expected = _describe_expected(set(err.expected or ()))
        misspelt = _misspelt_keyword(tok, set(err.expected or ()), source)
        if misspelt is not None:
            return misspelt
        return Diagnostic("error", f"unexpected {_token_text(tok)}", pos, f"expected {expected}")
    if isinstance(err, lark.exceptions.UnexpectedEOF):
        expected = _describe_expected(set(err.expected or ()))
        return Diagnostic("error", "unexpected end of file", pos, f"expected {expected}")
    return Diagnostic("error", str(err).splitlines()[0], pos)  # pragma: no cover


def _check_size(tree: lark.Tree, filename: str, source: str) -> None:
    """Refuse trees deeper than :data:`MAX_NESTING` (before anything walks them recursively) and specs
    with more than :data:`MAX_STATEMENTS` transforms (before anything resolves them)."""
    stack = [(tree, 1)]
    statements = []
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            raise SpecError([Diagnostic("error", f"the spec nests more than {MAX_NESTING} levels deep here "
                                                 "(unary minus or 'if' blocks)", _meta_pos(node.meta),
                                        "write it flatter")], filename, source)
        if node.data == "op_call":
            statements.append(node)
        stack.extend((c, depth + 1) for c in node.children if isinstance(c, lark.Tree))
    if len(statements) > MAX_STATEMENTS:
        later = sorted(statements, key=lambda n: (n.meta.line, n.meta.column))[MAX_STATEMENTS]
        raise SpecError([Diagnostic("error", f"the spec has {len(statements)} transform statements (at most "
                                             f"{MAX_STATEMENTS})", _meta_pos(later.meta))], filename, source)


def _meta_pos(meta) -> ast.Pos | None:
    return None if meta.empty else ast.Pos(meta.line, meta.column, meta.end_line, meta.end_column)


def parse(source: str, filename: str = "<spec>") -> ast.Spec:
    """Parse spec text; raises :class:`SpecError` with a positioned diagnostic.

    The text is normalised first (:mod:`layoutc.front.source`: line ends, forbidden characters); the
    tree keeps the normalised text and the hash of the text as given."""
    digest = sha256(source)
    source = normalize(source, filename)
    try:
        tree = parser().parse(source)
    except lark.exceptions.UnexpectedInput as err:
        raise SpecError([_syntax_error(err, source)], filename, source) from None
    _check_size(tree, filename, source)
    try:
        items = _ToAst(source).transform(tree)
    except lark.exceptions.VisitError as err:
        if isinstance(err.orig_exc, _Fail):
            raise SpecError([err.orig_exc.diagnostic], filename, source) from None
        raise
    return ast.Spec(items, source, filename, digest)
