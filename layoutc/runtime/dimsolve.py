"""Dims from tensor shapes: the one fixpoint that the compiler and every converter use.

An input declared ``w13_weight : fp4x2[E, 2*I, H/2]`` says that axis 1 is ``2*I`` and axis 2 is
``H/2``: each axis whose size is linear in the dims, ``sum(coef[v] * v) + const``, determines a dim
once every other dim in it is known. Repeating that until nothing changes solves the dims in an
order; the compiler asks whether the required inputs reach every dim (:func:`solve_order`), a
converter computes their values from real shapes along the same order (:func:`_solve_dims`).

Copied whole into every generated converter, so it imports nothing but the standard library; the
caller passes the exception class to raise (a converter's own ``LayoutError``).
An axis is ``(tensor, axis, coefs, const, text)``: ``coefs`` maps dims to ``(numerator,
denominator)`` pairs, ``const`` is one such pair, ``text`` is the size as the spec wrote it.
"""

from fractions import Fraction


def solve_order(axes, present, known=()):
    # The fixpoint: [(dim, axis entry)] in the order the axes of the `present` tensors determine the
    # dims not in `known`; a dim that never appears cannot be solved from these tensors.
    solved = set(known)
    order = []
    progress = True
    while progress:
        progress = False
        for entry in axes:
            if entry[0] not in present:
                continue
            unknown = [v for v in entry[2] if v not in solved]
            if len(unknown) != 1:
                continue
            solved.add(unknown[0])
            order.append((unknown[0], entry))
            progress = True
    return order


def _fmt_shape_of(shape):
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _solve_dims(tensors, axes, given, all_dims, what, error):
    # The dims of a call: given ones checked, the others read off the shapes along solve_order.
    # Returns the dims and, for messages, where each one was read.
    d, origin = {}, {}
    for k, v in dict(given or {}).items():
        if k not in all_dims:
            raise error(f"{what}: dims={{{k!r}: ...}} is not a dim of this spec ({', '.join(all_dims)})")
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise error(f"{what}: dim {k} must be a positive integer, got {v!r}")
        d[k] = v
        origin[k] = "given"
    present = {name for name, t in tensors.items() if t is not None}
    for v, (name, axis, coefs, const, text) in solve_order(axes, present, d):
        actual = tensors[name].shape[axis]
        rest = Fraction(*const) + sum(Fraction(*c) * d[k] for k, c in coefs.items() if k != v)
        value = (actual - rest) / Fraction(*coefs[v])
        if value.denominator != 1 or value < 1:
            raise error(
                f"{name}: axis {axis} has size {actual}, but the spec says {text}, "
                f"which no positive integer {v} gives (shape {_fmt_shape_of(tensors[name].shape)})"
            )
        d[v] = int(value)
        origin[v] = f"{name}.shape[{axis}] = {text}"
    missing = [k for k in all_dims if k not in d]
    if missing:
        raise error(f"{what}: cannot infer dim {missing[0]} from the given tensors; pass dims={{'{missing[0]}': ...}}")
    return {k: d[k] for k in all_dims}, origin
