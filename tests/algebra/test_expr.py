"""Tests of the integer index-expression algebra (:mod:`layoutc.algebra.expr`).

Every expression used in a property test is generated together with a *reference*:
a plain Python function that evaluates the same formula directly (``//`` and ``%``
with Python's floor semantics, exact division as a rational), never through
``layoutc.algebra.expr``. The simplifying constructors must not change the value.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layoutc.algebra import expr as ex
from layoutc.algebra.expr import Const, Var

VARS = ("a", "b", "c")
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---------------------------------------------------------------------------
# random expressions paired with a direct Python evaluation of the same formula


def _leaf(draw):
    if draw(st.booleans()):
        name = draw(st.sampled_from(VARS))
        return Var(name), (lambda env, n=name: env[n])
    c = draw(st.integers(-4, 12))
    return Const(c), (lambda env, c=c: c)


def _positive(draw, depth):
    """An expression that is >= 1 for every integer environment: (e mod k) + 1,
    or a product / floor quotient of such (so divisors print as products too)."""
    e, f = _int_expr(draw, depth)
    k = draw(st.integers(1, 7))
    base, fb = ex.add(ex.mod(e, k), 1), (lambda env: f(env) % k + 1)
    kind = draw(st.sampled_from(["base", "base", "product", "quotient"]))
    if kind == "product":
        other, fo = _positive(draw, max(depth - 1, 0))
        return ex.mul(base, other), (lambda env: fb(env) * fo(env))
    if kind == "quotient":
        # ((e mod k) + 1 + 2c) // 2 >= 1 for c >= 1 (it stays a floor division)
        c = draw(st.integers(1, 3))
        return ex.floordiv(ex.add(base, 2 * c), 2), (lambda env: (fb(env) + 2 * c) // 2)
    return base, fb


def _bool_expr(draw, depth):
    kind = draw(st.sampled_from(["lt", "lt", "and", "const"]))
    if kind == "const" or depth <= 0:
        v = draw(st.booleans())
        return ex.lt(0, 1) if v else ex.lt(1, 0), (lambda env, v=v: v)
    if kind == "lt":
        (x, fx), (y, fy) = _int_expr(draw, depth - 1), _int_expr(draw, depth - 1)
        return ex.lt(x, y), (lambda env: fx(env) < fy(env))
    (p, fp), (q, fq) = _bool_expr(draw, depth - 1), _bool_expr(draw, depth - 1)
    return ex.and_(p, q), (lambda env: bool(fp(env)) and bool(fq(env)))


def _int_expr(draw, depth):
    if depth <= 0:
        return _leaf(draw)
    kind = draw(
        st.sampled_from(
            ["leaf", "add", "add3", "sub", "neg", "mulc", "mul", "fdc", "fde", "modc", "mode", "where", "table",
             "ceil", "roundup", "opsugar"]
        )
    )
    sub = lambda: _int_expr(draw, depth - 1)  # noqa: E731
    if kind == "leaf":
        return _leaf(draw)
    if kind == "add":
        (x, fx), (y, fy) = sub(), sub()
        return ex.add(x, y), (lambda env: fx(env) + fy(env))
    if kind == "add3":
        (x, fx), (y, fy), (z, fz) = sub(), sub(), sub()
        return ex.add(x, y, z), (lambda env: fx(env) + fy(env) + fz(env))
    if kind == "sub":
        (x, fx), (y, fy) = sub(), sub()
        return x - y, (lambda env: fx(env) - fy(env))
    if kind == "neg":
        x, fx = sub()
        return -x, (lambda env: -fx(env))
    if kind == "mulc":
        x, fx = sub()
        k = draw(st.sampled_from([-3, -1, 0, 1, 2, 3, 4, 8, 16, 64]))
        if draw(st.booleans()):
            return ex.mul(k, x), (lambda env: k * fx(env))
        return x * k, (lambda env: fx(env) * k)
    if kind == "mul":
        (x, fx), (y, fy) = _int_expr(draw, min(depth - 1, 1)), _int_expr(draw, min(depth - 1, 1))
        return ex.mul(x, y), (lambda env: fx(env) * fy(env))
    if kind == "fdc":
        x, fx = sub()
        k = draw(st.sampled_from([1, 2, 3, 4, 8, 16, 64, 128]))
        return ex.floordiv(x, k), (lambda env: fx(env) // k)
    if kind == "fde":
        (x, fx), (d, fd) = sub(), _positive(draw, depth - 1)
        return ex.floordiv(x, d), (lambda env: fx(env) // fd(env))
    if kind == "modc":
        x, fx = sub()
        k = draw(st.sampled_from([1, 2, 3, 4, 8, 12, 16, 64]))
        return ex.mod(x, k), (lambda env: fx(env) % k)
    if kind == "mode":
        (x, fx), (d, fd) = sub(), _positive(draw, depth - 1)
        return ex.mod(x, d), (lambda env: fx(env) % fd(env))
    if kind == "where":
        (c, fc), (x, fx), (y, fy) = _bool_expr(draw, depth - 1), sub(), sub()
        return ex.where(c, x, y), (lambda env: fx(env) if fc(env) else fy(env))
    if kind == "table":
        values = tuple(draw(st.lists(st.integers(-5, 40), min_size=1, max_size=8)))
        x, fx = sub()
        n = len(values)
        return ex.table(values, ex.mod(x, n)), (lambda env: values[fx(env) % n])
    if kind == "ceil":
        x, fx = sub()
        k = draw(st.sampled_from([1, 2, 4, 5, 128]))
        return ex.ceil_div(x, k), (lambda env: -((-fx(env)) // k))
    if kind == "roundup":
        x, fx = sub()
        k = draw(st.sampled_from([1, 3, 4, 128]))
        return ex.round_up(x, k), (lambda env: -((-fx(env)) // k) * k)
    # operator sugar with a plain int on the left
    x, fx = sub()
    k = draw(st.integers(1, 9))
    op = draw(st.sampled_from(["radd", "rsub", "rmul", "rfloordiv", "rmod"]))
    if op == "radd":
        return k + x, (lambda env: k + fx(env))
    if op == "rsub":
        return k - x, (lambda env: k - fx(env))
    if op == "rmul":
        return k * x, (lambda env: k * fx(env))
    d, fd = _positive(draw, 0)
    if op == "rfloordiv":
        return k // d, (lambda env: k // fd(env))
    return k % d, (lambda env: k % fd(env))


@st.composite
def int_exprs(draw, max_depth=4):
    return _int_expr(draw, draw(st.integers(0, max_depth)))


envs = st.fixed_dictionaries({v: st.integers(0, 60) for v in VARS})
signed_envs = st.fixed_dictionaries({v: st.integers(-40, 60) for v in VARS})


# ---------------------------------------------------------------------------
# constructors keep values


@settings(max_examples=500, **SETTINGS)
@given(int_exprs(), envs)
def test_simplified_expression_evaluates_like_the_formula(pair, env):
    e, ref = pair
    assert ex.evaluate(e, env) == ref(env)


@settings(max_examples=150, **SETTINGS)
@given(int_exprs(), signed_envs)
def test_rules_hold_for_negative_values_too(pair, env):
    # the constructor rules are documented to hold for every integer
    e, ref = pair
    assert ex.evaluate(e, env) == ref(env)


@settings(max_examples=150, **SETTINGS)
@given(int_exprs(), signed_envs)
def test_to_python_round_trips_through_eval(pair, env):
    e, ref = pair
    src = ex.to_python(e)
    assert eval(src, {"__builtins__": {}}, dict(env)) == ref(env), src


@settings(max_examples=60, **SETTINGS)
@given(int_exprs(), st.integers(-6, 10), st.integers(-6, 10), st.integers(-6, 10))
def test_tensor_evaluation_is_elementwise_scalar_evaluation(pair, a0, b0, c0):
    e, ref = pair
    na, nb, nc = 4, 3, 5
    grids = {
        "a": torch.arange(a0, a0 + na).view(na, 1, 1),
        "b": torch.arange(b0, b0 + nb).view(1, nb, 1),
        "c": torch.arange(c0, c0 + nc).view(1, 1, nc),
    }
    got = torch.as_tensor(ex.evaluate(e, grids)).expand(na, nb, nc)
    for i, j, k in itertools.product(range(na), range(nb), range(nc)):
        env = {"a": a0 + i, "b": b0 + j, "c": c0 + k}
        assert int(got[i, j, k]) == ref(env)
        assert ex.evaluate(e, env) == ref(env)


@settings(max_examples=60, **SETTINGS)
@given(st.data())
def test_boolean_tensor_evaluation(data):
    draw = data.draw
    cond, fc = _bool_expr(draw, 3)
    grids = {v: torch.arange(-3, 9).view(*([1] * i), 12, *([1] * (2 - i))) for i, v in enumerate(VARS)}
    got = torch.as_tensor(ex.evaluate(cond, grids)).to(torch.bool).expand(12, 12, 12)
    for i, j, k in [(0, 0, 0), (11, 11, 11), (3, 7, 1), (5, 5, 5), (10, 2, 8), (1, 9, 4)]:
        env = {"a": i - 3, "b": j - 3, "c": k - 3}
        assert bool(got[i, j, k]) == bool(fc(env))


# ---------------------------------------------------------------------------
# floordiv / mod / div rules, structurally and numerically

x, y, z, I, H, r = (Var(n) for n in ("x", "y", "z", "I", "H", "r"))


def _check_equal_on(e1, e2, names, values=range(-70, 140, 7)):
    for vals in itertools.product(values, repeat=len(names)):
        env = dict(zip(names, vals))
        assert ex.evaluate(e1, env) == ex.evaluate(e2, env), env


def test_floordiv_pulls_out_multiples_of_the_divisor():
    e = ex.floordiv(64 * x + y, 64)
    assert e == ex.add(x, ex.floordiv(y, 64))
    _check_equal_on(e, Var("x") + Var("y") // 64, ["x", "y"])
    for xv, yv in itertools.product(range(-5, 6), range(-200, 200, 13)):
        assert ex.evaluate(e, {"x": xv, "y": yv}) == (64 * xv + yv) // 64


def test_floordiv_of_floordiv_merges():
    assert ex.floordiv(ex.floordiv(x, 4), 8) == ex.floordiv(x, 32)
    for v in range(-300, 300):
        assert ex.evaluate(ex.floordiv(ex.floordiv(x, 4), 8), {"x": v}) == (v // 4) // 8


def test_floordiv_constant_folding_and_identities():
    assert ex.floordiv(Const(-7), 2) == Const(-4)
    assert ex.floordiv(x, 1) == x
    assert ex.floordiv(x + I, x + I) == Const(1)
    assert ex.floordiv(128 * x + 64, 64) == 2 * x + 1
    with pytest.raises(ValueError):
        ex.floordiv(x, 0)
    with pytest.raises(ValueError):
        ex.floordiv(x, -2)


def test_mod_drops_multiples_of_the_modulus():
    assert ex.mod(64 * x + y, 64) == ex.mod(y, 64)
    assert ex.mod(64 * x + 128, 64) == Const(0)
    assert ex.mod(x, 1) == Const(0)
    assert ex.mod(Const(-7), 3) == Const(2)
    assert ex.mod(x * I, x * I) == Const(0)
    for xv, yv in itertools.product(range(-4, 5), range(-100, 100, 7)):
        assert ex.evaluate(ex.mod(64 * x + y, 64), {"x": xv, "y": yv}) == (64 * xv + yv) % 64
    with pytest.raises(ValueError):
        ex.mod(x, 0)


def test_mod_of_mod():
    assert ex.mod(ex.mod(x, 12), 4) == ex.mod(x, 4)
    inner_smaller = ex.mod(ex.mod(x, 4), 12)  # not a rule, must keep its value
    for v in range(-50, 50):
        assert ex.evaluate(inner_smaller, {"x": v}) == (v % 4) % 12
        assert ex.evaluate(ex.mod(ex.mod(x, 12), 4), {"x": v}) == (v % 12) % 4


def test_exact_division_rules():
    assert ex.div(2 * I, 64) == ex.div(I, 32)
    assert ex.div(ex.div(H, 2), 16) == ex.div(H, 32)
    assert ex.mul(64, ex.div(I, 32)) == 2 * I
    assert ex.mul(3, ex.div(I, 6)) == ex.div(I, 2)
    assert ex.div(Const(12), 4) == Const(3)
    assert ex.div(I, 1) == I
    assert ex.div(I * H, I * H) == Const(1)
    with pytest.raises(ValueError):
        ex.div(I, 0)
    # on multiples of the divisors, exact division evaluates to the rational value
    for v in range(0, 64 * 40, 64):
        assert ex.evaluate(ex.mul(64, ex.div(I, 32)), {"I": v}) == 64 * v // 32
        assert ex.evaluate(ex.div(ex.div(H, 2), 16), {"H": v}) == v // 32
        assert ex.evaluate(ex.div(2 * I + 6, 4), {"I": v + 1}) == (2 * (v + 1) + 6) // 4


def test_sum_and_product_normal_forms():
    assert ex.add(x, -x) == Const(0)
    assert ex.add(2 * x, 3 * x) == 5 * x
    assert ex.mul(0, x, y) == Const(0)
    assert ex.mul(2, x + I) == ex.add(2 * x, 2 * I)
    assert ex.add(x, y) == ex.add(y, x)
    assert ex.mul(x, y) == ex.mul(y, x)
    assert ex.add(x, 1, 2, -3) == x
    assert ex.add() == Const(0)
    assert ex.mul() == Const(1)
    assert ex.as_expr(True) == Const(1)
    with pytest.raises(TypeError):
        ex.as_expr(1.5)


def test_where_lt_and_table_folding():
    c = ex.lt(x, y)
    assert ex.lt(2, 3) == Const(1) and ex.lt(3, 2) == Const(0)
    assert ex.where(Const(1), x, y) == x and ex.where(Const(0), x, y) == y
    assert ex.where(c, x, x) == x
    assert ex.and_(Const(0), c) == Const(0)
    assert ex.and_(Const(1), c) == c
    assert ex.and_(c, c) == c
    assert ex.and_() == ex.TRUE
    assert ex.table((0, 1, 2, 3), x) == x
    assert ex.table((5, 6, 7), Const(2)) == Const(7)


def test_ceil_div_and_round_up():
    for v in range(-20, 300):
        assert ex.evaluate(ex.ceil_div(x, 128), {"x": v}) == -(-v // 128)
        assert ex.evaluate(ex.round_up(x, 4), {"x": v}) == -(-v // 4) * 4
    assert ex.round_up(Const(100), 128) == Const(128)
    assert ex.round_up(Const(256), 128) == Const(256)


def test_evaluate_missing_variable_raises():
    with pytest.raises(KeyError):
        ex.evaluate(x + y, {"x": 1})


# ---------------------------------------------------------------------------
# exact division and linear forms


def _lin_expr(draw, depth):
    """(expr, rational reference, all-exact reference) of a linear size expression."""
    if depth <= 0:
        if draw(st.booleans()):
            n = draw(st.sampled_from(VARS))
            return Var(n), (lambda env, n=n: (Fraction(env[n]), True))
        c = draw(st.integers(-3, 200))
        return Const(c), (lambda env, c=c: (Fraction(c), True))
    kind = draw(st.sampled_from(["add", "sub", "mul", "div", "div", "leaf"]))
    if kind == "leaf":
        return _lin_expr(draw, 0)
    x, fx = _lin_expr(draw, depth - 1)
    if kind == "mul":
        k = draw(st.sampled_from([-2, 1, 2, 3, 4, 32, 64, 128]))

        def f(env):
            v, ok = fx(env)
            return k * v, ok

        return ex.mul(k, x), f
    if kind == "div":
        k = draw(st.sampled_from([1, 2, 3, 4, 8, 16, 32, 64]))

        def f(env):
            v, ok = fx(env)
            return v / k, ok and v.denominator == 1 and v.numerator % k == 0

        return ex.div(x, k), f
    y, fy = _lin_expr(draw, depth - 1)
    sign = 1 if kind == "add" else -1

    def f(env):
        (a, oka), (b, okb) = fx(env), fy(env)
        return a + sign * b, oka and okb

    return (ex.add(x, y) if sign == 1 else x - y), f


@st.composite
def lin_exprs(draw):
    return _lin_expr(draw, draw(st.integers(0, 4)))


lin_envs = st.fixed_dictionaries(
    {v: st.builds(lambda k, m: k * m, st.integers(0, 50), st.sampled_from([1, 64, 4096])) for v in VARS}
)


def _eval_form(form, env):
    coefs, const = form
    return sum((c * env[k] for k, c in coefs.items()), Fraction(0)) + const


@settings(max_examples=250, **SETTINGS)
@given(lin_exprs(), lin_envs)
def test_linear_form_is_the_rational_value(pair, env):
    e, ref = pair
    form = ex.linear_form(e)
    assert form is not None, e
    value, _ = ref(env)
    assert _eval_form(form, env) == value
    assert all(c != 0 for c in form[0].values())


@settings(max_examples=250, **SETTINGS)
@given(lin_exprs(), lin_envs)
def test_exact_divisions_evaluate_exactly_when_they_divide(pair, env):
    # where every division written in the formula is exact, the simplified
    # expression (whose rewrites assume exactness) evaluates to the exact value
    e, ref = pair
    value, exact = ref(env)
    if exact:
        assert ex.evaluate(e, env) == value


@settings(max_examples=150, **SETTINGS)
@given(lin_exprs(), lin_envs)
def test_from_linear_form_round_trip(pair, env):
    e, ref = pair
    form = ex.linear_form(e)
    back = ex.from_linear_form(form)
    assert ex.linear_form(back) == form
    assert ex.same_value(back, e) is True


def test_linear_form_rejects_nonlinear_expressions():
    assert ex.linear_form(x * y) is None
    assert ex.linear_form(ex.floordiv(x, 2)) is None
    assert ex.linear_form(ex.mod(x, 2)) is None
    assert ex.linear_form(ex.div(x, y)) is None
    assert ex.linear_form(x + ex.mod(y, 3)) is None
    assert ex.linear_form(ex.lt(x, y)) is None


def test_linear_form_examples():
    assert ex.linear_form(ex.div(H, 32)) == ({"H": Fraction(1, 32)}, Fraction(0))
    assert ex.linear_form(2 * I + 3) == ({"I": Fraction(2)}, Fraction(3))
    assert ex.linear_form(I - I) == ({}, Fraction(0))
    assert ex.linear_form(ex.mul(3, ex.div(x + 1, 2))) == ({"x": Fraction(3, 2)}, Fraction(3, 2))


def test_same_value():
    assert ex.same_value(ex.div(2 * H, 4), ex.div(H, 2)) is True
    assert ex.same_value(2 * ex.div(H, 2), H) is True
    assert ex.same_value(H, I) is False
    assert ex.same_value(ex.floordiv(H, 2), ex.floordiv(H, 2)) is True
    assert ex.same_value(ex.floordiv(H, 2), ex.div(H, 2)) is None


# ---------------------------------------------------------------------------
# substitute


@settings(max_examples=200, **SETTINGS)
@given(int_exprs(), int_exprs(max_depth=2), int_exprs(max_depth=2), signed_envs)
def test_substitute_is_simultaneous_composition(pair, sub_a, sub_b, env):
    e, fe = pair
    (ea, fa), (eb, fb) = sub_a, sub_b
    s = ex.substitute(e, {"a": ea, "b": eb})
    inner = {"a": fa(env), "b": fb(env), "c": env["c"]}
    assert ex.evaluate(s, env) == fe(inner)
    assert ex.free_vars(s) <= set(VARS)


def test_substitute_examples():
    swapped = ex.substitute(x + 2 * y, {"x": y, "y": x})
    assert swapped == ex.add(y, 2 * x)
    assert ex.substitute(ex.floordiv(x, 4), {"x": 8 * y + z}) == 2 * y + ex.floordiv(z, 4)
    assert ex.substitute(x, {}) == x
    assert ex.substitute(x + 1, {"x": 3}) == Const(4)
    assert ex.rename(x + y, {"x": "q"}) == Var("q") + y
    assert ex.free_vars(ex.where(ex.lt(x, I), ex.table((1, 2), ex.mod(y, 2)), z)) == {"x", "I", "y", "z"}


# ---------------------------------------------------------------------------
# ranges: bounds are sound, simplify preserves values on the range


@st.composite
def ranges(draw):
    # small offsets, so the ranges of different variables often touch (boundary cases)
    out = {}
    for v in VARS:
        lo = draw(st.sampled_from([0, 0, 1, 2, 3, 4, 5, 8, 13, 20]))
        out[v] = (lo, lo + draw(st.sampled_from([0, 1, 2, 3, 4, 9])))
    return out


def _range_grids(rng):
    grids = {}
    for i, v in enumerate(VARS):
        lo, hi = rng[v]
        shape = [1, 1, 1]
        shape[i] = hi - lo + 1
        grids[v] = torch.arange(lo, hi + 1).view(shape)
    return grids


@settings(max_examples=200, **SETTINGS)
@given(int_exprs(), ranges())
def test_simplify_preserves_values_on_the_range(pair, rng):
    e, ref = pair
    s = ex.simplify(e, rng)
    for vals in itertools.product(*(range(rng[v][0], rng[v][1] + 1) for v in VARS)):
        env = dict(zip(VARS, vals))
        assert ex.evaluate(s, env) == ref(env)


@settings(max_examples=200, **SETTINGS)
@given(int_exprs(), ranges())
def test_bounds_contain_every_value_on_the_range(pair, rng):
    e, _ = pair
    lo, hi = ex.bounds(e, rng)
    vals = torch.as_tensor(ex.evaluate(e, _range_grids(rng))).to(torch.int64)
    if lo is not None:
        assert int(vals.min()) >= lo
    if hi is not None:
        assert int(vals.max()) <= hi


def test_simplify_uses_ranges():
    rng = {"r": (0, 7), "I": (8, 100)}
    assert ex.simplify(ex.floordiv(r, 8), rng) == Const(0)
    assert ex.simplify(ex.mod(r, 8), rng) == r
    assert ex.simplify(ex.floordiv(r, I), rng) == Const(0)
    assert ex.simplify(ex.mod(r + 8, 8), rng) == r
    assert ex.simplify(ex.lt(r, I), rng) == Const(1)
    assert ex.simplify(ex.lt(I, r), rng) == Const(0)
    assert ex.simplify(ex.where(ex.lt(r, 8), r, 5), rng) == r
    # ranges that touch decide nothing
    assert ex.simplify(ex.lt(r, I), {"r": (0, 8), "I": (8, 100)}) == ex.lt(r, I)
    assert ex.simplify(ex.lt(I, r), {"r": (0, 8), "I": (7, 100)}) == ex.lt(I, r)
    assert ex.simplify(ex.lt(I, r), {"r": (0, 8), "I": (8, 100)}) == Const(0)
    # r // 8 is not 0 without the range
    assert ex.simplify(ex.floordiv(r, 8), {}) == ex.floordiv(r, 8)
    assert ex.simplify(ex.floordiv(r, 8), {"r": (0, 8)}) == ex.floordiv(r, 8)


# ---------------------------------------------------------------------------
# printing


def test_printing_examples():
    assert ex.to_str(ex.div(H, 32)) == "H/32"
    assert ex.to_python(ex.div(H, 32)) == "H // 32"
    assert ex.to_str(ex.floordiv(H, 32), slash=True) == "H/32"
    assert ex.to_str(ex.mod(r, 8)) == "r mod 8"
    assert ex.to_python(ex.mod(r, 8)) == "r % 8"
    assert str(x - 3) == "x - 3"
    assert ex.to_str(ex.table((3, 1), ex.mod(x, 2))).startswith("T[")


def test_to_python_precedence_cases():
    cases = [
        ex.floordiv(x + y, 3),
        ex.mul(-1, ex.floordiv(x, 2)),
        ex.mod(-x, 3),
        x - ex.mod(y, 4),
        x - (y + z) * 2,
        ex.floordiv(x, ex.add(ex.mod(y, 3), 1)),
        ex.mul(ex.mod(x, 5), y),
        ex.where(ex.and_(ex.lt(x, y), ex.lt(y, z)), x - y, ex.mul(-2, z)),
        ex.mul(-1, x, ex.add(y, 1)),
        ex.floordiv(ex.floordiv(x, y + 100) * 3, 7),
        ex.floordiv(x, ex.mul(ex.mod(y, 3) + 1, ex.mod(z, 4) + 1)),
        ex.mod(x, ex.mul(ex.mod(y, 3) + 1, ex.mod(z, 4) + 1)),
        ex.floordiv(x, ex.floordiv(y * y + 10, 3)),
        ex.mod(x * 7, ex.mod(y, 5) + ex.mod(z, 2) + 1),
    ]
    for e in cases:
        src = ex.to_python(e)
        for vals in itertools.product(range(-9, 10, 3), repeat=3):
            env = dict(zip("xyz", vals))
            assert eval(src, {"__builtins__": {}}, env) == ex.evaluate(e, env), (src, env)
