"""Comparing one tensor's codes and explaining the differences in terms of the spec.

Steps 3 and 4 of :mod:`layoutc.equiv.compare`: :class:`_Compare` finds the output elements where the function's
sources differ from the spec's, follows the spec's path of each (the statements that moved it) and tries
hypotheses (one statement left out, one argument or family parameter changed) until the differences are
explained as :class:`Finding` s. The result types of one shape (:class:`ShapeResult`, :class:`TensorDiff`) live
here too. Kept apart from the driver because it is the largest single concept of ``equiv``.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import attrs
import torch

from ..algebra import expr as ex
from ..lang.compiler import Chain, Step
from ..algebra.dtypes import bit_view, torch_dtype_name
from ..algebra.indexmap import IndexMap, concrete_shape
from ..lang.ops.base import Category
from .encoding import UNEXPLAINED, Observed, Plan, _mode_map, const_code, map_codes, spec_codes


# ---------------------------------------------------------------------------
# comparison and findings


@attrs.frozen
class Element:
    """One output element that differs: where the spec and the function take it from."""

    index: tuple[int, ...]
    spec: str
    function: str
    path: str  # the statements that moved the spec's source here
    delta: tuple[int, ...] | None  # function source - spec source, same tensor


@attrs.frozen
class Finding:
    tensor: str
    summary: str
    statement: str  # "line 31: swap_halves(...)" or ""
    line: int | None
    count: int
    examples: tuple[Element, ...]
    detail: tuple[str, ...] = ()


@attrs.frozen
class TensorDiff:
    tensor: str
    differing: int
    total: int
    findings: tuple[Finding, ...]
    problem: str = ""  # missing output, shape or dtype mismatch: no element comparison


@attrs.frozen
class ShapeResult:
    dims: dict
    present: tuple[str, ...]
    diffs: tuple[TensorDiff, ...]
    note: str = ""
    seconds: float = 0.0
    mismatch: dict = attrs.field(factory=dict, eq=False, repr=False)  # tensor -> element mask (for --draw)

    @property
    def ok(self) -> bool:
        return not self.diffs


def _fmt_index(idx: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(i)) for i in idx) + "]"


def _fmt_dims(dims: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in dims.items())


def _stmt_label(step: Step | None, filename: str) -> str:
    if step is None or step.statement is None:
        return "no statement"
    st = step.statement
    return f"line {st.pos.line} `{st.text}`"


class _Compare:
    """Compare one tensor's codes and explain the differences."""

    def __init__(self, spec, chain: Chain, plan: Plan, observed: Observed, spec_random: Mapping,
                 max_examples: int = 3):
        self.spec = spec
        self.spec_random = spec_random
        self.chain = chain
        self.plan = plan
        self.obs = observed
        self.enc = plan.inputs[chain.tensor]
        self.max_examples = max_examples
        self.filename = spec.program.filename

    def run(self) -> tuple[TensorDiff | None, torch.Tensor | None]:
        name = self.chain.tensor
        target = self.chain.target
        out_shape = concrete_shape(self.chain.out_type.shape, self.plan.dims)
        out_elem = self.chain.out_type.elem
        if name not in self.obs.shapes:
            return TensorDiff(name, 0, 0, (), f"the function returned no {name} (the spec has output {name}"
                                                f"{'?' if target is not None and target.optional else ''} : "
                                                f"{out_elem.name}{list(out_shape)})"), None
        got_shape, got_dtype = self.obs.shapes[name], self.obs.dtypes[name]
        if got_shape != out_shape:
            return TensorDiff(name, 0, 0, (), f"{name}: the function returns shape {list(got_shape)}, the spec "
                                                f"{list(out_shape)} "
                                                f"({out_elem.name}{self.chain.out_type.shape_str()})"), None
        accepted = out_elem.accepted_torch_dtypes()
        if got_dtype not in accepted:
            names = ", ".join(torch_dtype_name(d) for d in accepted)
            return TensorDiff(name, 0, 0, (), f"{name}: the function returns {torch_dtype_name(got_dtype)}, "
                                                f"the spec {out_elem.name} (torch {names})"), None
        numel = math.prod(out_shape) if out_shape else 1
        if self.enc.mode == "opaque":
            return self.values_only(out_shape, numel)
        want = spec_codes(self.chain, self.plan)
        got = self.obs.codes[name]
        if want.shape != got.shape:  # element width differs from the input's (a view across widths)
            return TensorDiff(name, 0, numel, (), f"{name}: cannot compare bit by bit (output bits "
                                                  f"{list(got.shape)} vs map {list(want.shape)})"), None
        bad = want != got
        elem_bad = bad.reshape(*out_shape, -1).any(-1) if self.enc.mode == "bits" else bad
        if not bool(elem_bad.any()):
            return self.values_only(out_shape, numel)
        findings = self.explain(want, got, bad, elem_bad)
        picture = (elem_bad, self.rows_of(want), self.rows_of(got))
        return TensorDiff(name, int(elem_bad.sum()), numel, tuple(findings)), picture

    def rows_of(self, codes: torch.Tensor) -> torch.Tensor:
        """The input row each output element reads (its first bit's, in bits mode); -1 for constants and
        other tensors' elements."""
        enc = self.enc
        c = codes[..., 0] if enc.mode == "bits" else codes
        local = c - enc.offset
        if enc.mode == "bits":
            local = torch.div(local, enc.width, rounding_mode="floor")
        mine = (c >= 0) & (local >= 0) & (local < enc.numel)
        from ..verify.rowmap import row_axis

        ra = row_axis(self.chain.source, len(enc.shape))
        inner = math.prod(enc.shape[ra + 1:]) if ra + 1 < len(enc.shape) else 1
        rows = torch.div(local, inner, rounding_mode="floor") % max(1, enc.shape[ra])
        return torch.where(mine, rows, -1)

    def values_only(self, out_shape, numel) -> tuple[TensorDiff | None, torch.Tensor | None]:
        """Positions agree (or cannot be probed): compare values on the random run."""
        name = self.chain.tensor
        mine = self.spec_random[name]
        theirs = self.obs.random_out.get(name)
        if theirs is None or tuple(theirs.shape) != tuple(mine.shape) or theirs.element_size() != mine.element_size():
            return None, None
        a, b = bit_view(mine), bit_view(theirs)
        bad = a != b
        if not bool(bad.any()):
            return None, None
        idx = [tuple(int(i) for i in row) for row in bad.nonzero()[: self.max_examples]]
        ex_ = []
        for i in idx:
            src = self.spec_source_text(i)
            ex_.append(Element(i, f"{_value_text(mine[i])} (from {src})", _value_text(theirs[i]), "", None))
        value_steps = [s for s in self.chain.steps if s.op.category is Category.VALUE]
        step = value_steps[-1] if value_steps else (self.chain.steps[-1] if self.chain.steps else None)
        kind = "values differ where both read the same elements" if self.enc.mode != "opaque" else \
            "values differ (the spec computes bit fields here, so only values on random inputs are compared)"
        f = Finding(name, kind, _stmt_label(step, self.filename), step.statement.pos.line if step and step.statement
                    else None, int(bad.sum()), tuple(ex_))
        return TensorDiff(name, int(bad.sum()), numel, (f,)), bad

    # -- sources in words --
    def code_text(self, code: int, mode: str | None = None) -> str:
        mode = mode or self.enc.mode
        if code == UNEXPLAINED:
            return "no input element (not a copy)"
        if code < 0:
            return f"constant {-code - 1}" + (" (padding)" if code == -1 else "")
        loc = self.plan.locate(code, mode)
        if loc is None:
            return f"address {code}"
        name, idx, bit = loc
        return f"{name}{_fmt_index(idx)}" + (f" bit {bit}" if bit is not None else "")

    def element_text(self, codes: torch.Tensor) -> str:
        """An element's source in words: one input element (bit for bit), or its bits' sources."""
        codes = [int(c) for c in codes.reshape(-1)]
        if self.enc.mode != "bits":
            return self.code_text(codes[0])
        width = len(codes)
        locs = [self.plan.locate(c, "bits") if c >= 0 else None for c in codes]
        if all(lc is not None for lc in locs) and len({(lc[0], lc[1]) for lc in locs}) == 1 \
                and all(lc[2] == b for b, lc in enumerate(locs)):
            return f"{locs[0][0]}{_fmt_index(locs[0][1])}"
        if all(c == codes[0] for c in codes) and codes[0] < 0:
            return self.code_text(codes[0]) if codes[0] != const_code(0) else "constant 0 (padding)"
        if all(c < 0 and c != UNEXPLAINED for c in codes):
            value = sum((-c - 1) << b for b, c in enumerate(codes))
            return f"constant {value:#x}"
        # runs of bits from one element with consecutive bits
        parts, b = [], 0
        while b < width:
            c = codes[b]
            lc = locs[b]
            e = b + 1
            while e < width and lc is not None and locs[e] is not None and locs[e][:2] == lc[:2] \
                    and locs[e][2] == lc[2] + (e - b):
                e += 1
            if lc is None:
                while e < width and codes[e] == c:
                    e += 1
                parts.append(f"bits {b}-{e - 1}: {self.code_text(c)}" if e - 1 > b else f"bit {b}: {self.code_text(c)}")
            else:
                src = f"{lc[0]}{_fmt_index(lc[1])} bit{'s' if e - 1 > b else ''} {lc[2]}" + (
                    f"-{lc[2] + e - 1 - b}" if e - 1 > b else "")
                parts.append(f"bit{'s' if e - 1 > b else ''} {b}{f'-{e - 1}' if e - 1 > b else ''} from {src}")
            b = e
        return "; ".join(parts)

    def first_real(self, codes: torch.Tensor) -> tuple[str, tuple[int, ...], int | None] | None:
        for c in codes.reshape(-1).tolist():
            if c >= 0:
                return self.plan.locate(int(c), self.enc.mode)
        return None

    def spec_source_text(self, idx) -> str:
        want = spec_codes(self.chain, self.plan)
        return self.element_text(want[idx])

    # -- the spec's path --
    def path(self, idx: tuple[int, ...], bit: int | None) -> list[tuple[Step, tuple, tuple, bool]]:
        """(step, coordinates before, after, valid) for the spec's source of output element ``idx``,
        from the input side."""
        coords, b = list(idx), bit
        out = []
        for step in reversed(self.chain.steps):
            m = step.op.index_map(step.in_type)
            env = dict(self.plan.dims)
            full = coords + [b if b is not None else 0] if m.bit_level else coords
            env.update({f"o{k}": int(v) for k, v in enumerate(full)})
            valid = bool(ex.evaluate(m.valid, env))
            src = [int(ex.evaluate(e, env)) for e in m.src]
            if m.bit_level:
                before, nb = src[:-1], src[-1]
                after_full, before_full = tuple(full), tuple(src)
            else:
                before, nb = src, b
                after_full, before_full = tuple(coords), tuple(src)
            out.append((step, before_full, after_full, valid))
            if not valid:
                break
            coords, b = before, nb
        out.reverse()
        return out

    def path_text(self, path) -> str:
        moved, seen = [], set()
        for step, before, after, valid in path:
            st = step.statement
            if st is None:
                continue
            what = f"line {st.pos.line} {_op_words(step)}"
            if not valid:
                moved.append(f"made padding by {what}")
                continue
            if before != after and st.pos.line not in seen:
                seen.add(st.pos.line)
                moved.append(what)
        if not moved:
            return "copied as is"
        return moved[0] if moved[0].startswith("made") else "moved by " + ", ".join(moved)

    def attribute(self, path, spec_src, fn_src) -> Step | None:
        """The statement responsible for where the spec takes this element from."""
        if path and not path[-1][3]:
            return path[-1][0]  # the step that made it padding (path stops there)
        differ = None
        if spec_src is not None and fn_src is not None and spec_src[0] == fn_src[0]:
            differ = {a for a, (x, y) in enumerate(zip(spec_src[1], fn_src[1])) if x != y}
        first_moving = None
        for step, before, after, valid in path:
            if before == after:
                continue
            if first_moving is None:
                first_moving = step
            if len(before) != len(after):
                return step
            if differ is None or any(before[a] != after[a] for a in differ if a < len(before)):
                return step
        return first_moving

    # -- explanation --
    def explain(self, want, got, bad, elem_bad) -> list[Finding]:
        bits = self.enc.mode == "bits"
        bad_idx = elem_bad.nonzero()
        count = int(bad_idx.shape[0])
        hyp = self.hypothesis(want, got, bad)
        # the first differing elements, then a spread of the others: each is traced through the spec
        if count > 384:
            spread = torch.linspace(128, count - 1, 256).long().unique()
            rows = torch.cat([bad_idx[:128], bad_idx[spread]])
        else:
            rows = bad_idx
        groups: dict[tuple, list] = {}
        for row in rows.tolist():
            idx = tuple(row)
            w, g = want[idx], got[idx]
            spec_src, fn_src = self.first_real(w), self.first_real(g)
            first_bit = None
            if bits:
                wbits = w.reshape(-1)
                diff_bits = (wbits != g.reshape(-1)).nonzero()
                first_bit = int(diff_bits[0]) if diff_bits.numel() else 0
            path = self.path(idx, first_bit if bits else None)
            step = self.attribute(path, spec_src, fn_src)
            if spec_src is None and fn_src is not None:
                kind = "the spec pads where the function reads an input element"
            elif spec_src is not None and fn_src is None:
                kind = "the function writes a constant where the spec reads an input element"
            elif spec_src is None:
                kind = "the spec and the function write different constants"
            elif int(g.reshape(-1).min()) == UNEXPLAINED:
                kind = "the function's element is not a copy of an input element"
            elif bits and spec_src[:2] == fn_src[:2] and self._same_elements(w, g):
                kind = ("the function reads the same input element with its bits in other places"
                        + (" (the two FP4 values of a byte: element 2j is bits 0-3, 2j+1 bits 4-7)"
                           if self.chain.source.elem.name == "fp4x2" else ""))
                step = self.bit_step()
            else:
                kind = "the function reads other input elements than the spec"
            delta = None
            if spec_src is not None and fn_src is not None and spec_src[0] == fn_src[0]:
                delta = tuple(b - a for a, b in zip(spec_src[1], fn_src[1]))
            elif spec_src is not None and fn_src is not None:
                delta = ("tensor", fn_src[0])
            key = (kind, id(step) if step is not None else None)
            el = Element(idx, self.element_text(w), self.element_text(g), self.path_text(path),
                         delta if delta is None or delta[0] != "tensor" else None)
            groups.setdefault(key, []).append((el, step, delta))
        findings = []
        if hyp is not None:
            text, step = hyp
            examples = [el for grp in groups.values() for el, _, _ in grp]
            examples.sort(key=lambda e: e.index)
            findings.append(Finding(self.chain.tensor, text, _stmt_label(step, self.filename),
                                    step.statement.pos.line if step is not None and step.statement else None,
                                    count, tuple(examples[: self.max_examples]),
                                    self.delta_lines(self.all_deltas(want, got, elem_bad), count, count)))
            return findings
        ordered = sorted(groups.items(), key=lambda kv: kv[1][0][0].index)
        scale = count / max(1, len(rows))
        for (kind, _), grp in ordered:
            step = grp[0][1]
            n = round(len(grp) * scale)
            findings.append(Finding(self.chain.tensor, kind, _stmt_label(step, self.filename),
                                    step.statement.pos.line if step is not None and step.statement else None,
                                    n, tuple(el for el, _, _ in grp[: self.max_examples]),
                                    self.delta_lines(_count([d for _, _, d in grp]), len(grp), n)))
        return findings

    def _same_elements(self, w: torch.Tensor, g: torch.Tensor) -> bool:
        def elems(c):
            return {self.plan.locate(int(x), "bits")[:2] for x in c.reshape(-1).tolist() if x >= 0}

        return elems(w) == elems(g)

    def bit_step(self) -> Step | None:
        """The last step of the chain that moves bits within elements (None: the spec moves none)."""
        return next((s for s in reversed(self.chain.steps) if s.op.facts.bits), None)

    def all_deltas(self, want: torch.Tensor, got: torch.Tensor, elem_bad: torch.Tensor) -> dict[tuple, int]:
        """How many differing elements read at each offset (the function's input index minus the spec's),
        over all of them: the traced elements are a sample (for the examples), but a swapped half should
        read as two equal counts, not as two sampled ones."""
        mode = self.enc.mode
        mine = [e for e in self.plan.inputs.values() if e.mode == mode]

        def first(codes):  # the first code of each differing element that is an input address
            c = codes.reshape(*elem_bad.shape, -1)[elem_bad]
            real = self.plan.real(c, mode)
            pos = real.to(torch.int8).argmax(-1, keepdim=True)
            return torch.where(real.any(-1), c.gather(1, pos)[:, 0], -1)

        def decode(code):
            tid, local = torch.full_like(code, -1), torch.zeros_like(code)
            for i, e in enumerate(mine):
                m = (code >= e.offset) & (code < e.offset + e.size)
                here = code - e.offset
                if mode == "bits":
                    here = torch.div(here, e.width, rounding_mode="floor")
                tid[m], local[m] = i, here[m]
            return tid, local

        (tw, lw), (tg, lg) = decode(first(want)), decode(first(got))
        counts: dict[tuple, int] = {}
        for i, e in enumerate(mine):
            both = (tw == i) & (tg == i)
            if not bool(both.any()):
                continue
            a, b = lw[both], lg[both]
            axes = []
            for n in reversed(e.shape):  # unravel both indices, axis by axis from the last
                axes.append(b % n - a % n if n else torch.zeros_like(a))
                a, b = (a // n, b // n) if n else (a, b)
            rows, n = torch.unique(torch.stack(list(reversed(axes)), 1), dim=0, return_counts=True)
            for row, k in zip(rows.tolist(), n.tolist()):
                counts[tuple(row)] = counts.get(tuple(row), 0) + k
        return counts

    def delta_lines(self, counts: dict, sampled: int, total: int) -> tuple[str, ...]:
        offsets = sorted(((d, n) for d, n in counts.items() if d is not None and d[0] != "tensor" and any(d)),
                         key=lambda kv: -kv[1])
        if not offsets:
            return ()
        of = f" (of {sampled} sampled)" if sampled < total else ""
        words = [f"{_fmt_delta(d)} at {n}" for d, n in offsets[:4]]
        more = f" and {len(offsets) - 4} more offsets" if len(offsets) > 4 else ""
        return (f"input index read by the function minus the spec's: {', '.join(words)}{more}{of}",)

    def hypothesis(self, want, got, bad) -> tuple[str, Step | None] | None:
        """A change of one statement of the spec that gives exactly the function's sources."""
        flat_bad = bad.reshape(-1).nonzero().reshape(-1)
        flat_ok = (~bad).reshape(-1).nonzero().reshape(-1)
        g = torch.Generator().manual_seed(0)
        pick_bad = flat_bad[torch.randperm(flat_bad.numel(), generator=g)[:2048]]
        pick_ok = flat_ok[torch.randperm(flat_ok.numel(), generator=g)[:1024]]
        pick = torch.cat([pick_bad, pick_ok])
        coords = list(torch.unravel_index(pick, tuple(want.shape)))
        target = got.reshape(-1)[pick]
        out_shape = concrete_shape(self.chain.out_type.shape, self.plan.dims)
        for text, step, maps in self.alternatives():
            try:
                m = _mode_map(self.chain, self.enc.mode, maps)
                if concrete_shape(m.out_shape, self.plan.dims)[: len(out_shape)] != out_shape:
                    continue
                codes = map_codes(m, self.plan.dims, self.enc, coords)
            except Exception:  # noqa: BLE001 - an alternative that does not apply here is just not it
                continue
            if torch.equal(codes, target):
                return text, step
        return None

    def alternatives(self) -> Iterable[tuple[str, Step, list[IndexMap]]]:
        """The spec with one statement changed, as lists of maps: a statement left out, an argument of
        a primitive changed, a family parameter changed."""
        steps = list(self.chain.steps)
        maps = [s.op.index_map(s.in_type) for s in steps]
        dims = self.plan.dims
        name = self.chain.tensor
        # a whole statement left out (all its steps), when the shapes allow it
        by_statement: dict[int, list[int]] = {}
        for i, s in enumerate(steps):
            if s.statement is not None:
                by_statement.setdefault(id(s.statement), []).append(i)
        for ids in by_statement.values():
            first, last = steps[ids[0]], steps[ids[-1]]
            if concrete_shape(first.in_type.shape, dims) != concrete_shape(last.out_type.shape, dims):
                continue
            if all(steps[i].op.category is Category.VALUE for i in ids):
                continue
            keep = [m for i, m in enumerate(maps) if i not in ids]
            yield (f"as if line {first.statement.pos.line} were not applied to {name}: the function's elements are "
                   f"the spec's without `{first.statement.text}`", first, keep)
        # one argument of a primitive changed
        for i, s in enumerate(steps):
            if s.tag is not None or s.statement is None:
                continue
            for field in attrs.fields(type(s.op)):
                value = getattr(s.op, field.name)
                if field.metadata.get("kind") not in ("int",) or not isinstance(value, int) or isinstance(value, bool):
                    continue
                for v in _nearby(value):
                    try:
                        op = attrs.evolve(s.op, **{field.name: v})
                        inferred = op.infer(s.in_type)
                        if concrete_shape(inferred.type.shape, dims) != concrete_shape(s.out_type.shape, dims):
                            continue
                        alt = maps[:i] + [op.index_map(s.in_type)] + maps[i + 1:]
                    except Exception:  # noqa: BLE001
                        continue
                    arg = field.metadata.get("arg", field.name)
                    yield (f"as if line {s.statement.pos.line} were `{s.statement.text}` with {arg}={v} instead of "
                           f"{arg}={value} for {name}", s, alt)
        # a family parameter changed
        from ..lang.expand import family_chain

        apps: dict[tuple, list[int]] = {}
        for i, s in enumerate(steps):
            if s.tag is not None:
                apps.setdefault(s.tag.instance, []).append(i)
        for ids in apps.values():
            tag = steps[ids[0]].tag
            for key, value in tag.args:
                for v in _nearby(value):
                    params = dict(tag.args)
                    params[key] = v
                    try:
                        chain = family_chain(tag.family, tag.role, steps[ids[0]].in_type, params, set(dims),
                                             self.spec.program.families)
                        fam_maps = [a.op.index_map(a.in_type) for a in chain]
                    except Exception:  # noqa: BLE001
                        continue
                    alt = maps[: ids[0]] + fam_maps + maps[ids[-1] + 1:]
                    st = steps[ids[0]].statement
                    yield (f"as if line {st.pos.line} packed {name} with {tag.family}({key}={v}) instead of "
                           f"{key}={value}", steps[ids[0]], alt)


def _op_words(step: Step) -> str:
    if step.tag is not None:
        return f"{step.statement.op} {step.tag.family}" if step.statement is not None else step.tag.family
    return step.statement.op if step.statement is not None else step.op.name


def _nearby(value: int) -> list[int]:
    cands = {value * 2, value // 2 if value > 1 else None, 1, 2, 4, 16, 32, 64, 128, 256}
    return sorted(v for v in cands if v is not None and v != value and v >= 1)


def _count(items) -> dict:
    counts: dict = {}
    for d in items:
        counts[d] = counts.get(d, 0) + 1
    return counts


def _fmt_delta(d: tuple[int, ...]) -> str:
    return "[" + ", ".join(f"{v:+d}" if v else "0" for v in d) + "]"


def _value_text(t: torch.Tensor) -> str:
    bits = int(bit_view(t.reshape(1))[0]) & ((1 << (8 * t.element_size())) - 1)
    if t.dtype.is_floating_point:
        return f"{float(t.to(torch.float64)):g} ({bits:#0{2 + 2 * t.element_size()}x})"
    return f"{bits:#0{2 + 2 * t.element_size()}x}"
