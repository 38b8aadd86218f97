"""Dynamic verification: run the converter on inputs that encode their own coordinates.

The static verifier reasons about index maps; this module checks the same claims with
an independent mechanism, the generated converter itself (the eager torch lowering):

1. *Encode.* Every input element carries its own position. Packed and one-byte data
   are probed bit by bit: in run ``d`` each input bit is bit ``d`` of its own bit index,
   so a bit-level permutation (the SM90 FP4 interleave) is traced exactly. Wider types
   (fp32 biases, possibly cast to bf16) carry base-256 digits of their element index,
   values 0..255 that survive the casts. Two extra runs with all-zero and all-one inputs
   tell real elements from padding.
2. *Decode.* Each run's outputs are taken back through the inverses of the tensor's
   physical packings (their eager implementations), which leaves the logical layout;
   the digits then spell, for every logical output element, the input element it holds.
3. *Compare.* Those sources must equal what the composed index maps say (a mismatch
   means a primitive's map and its implementation disagree), and the verifier's sync
   and contract checks run again on the probed maps; a verdict that differs from the
   static one is itself an error.
"""

from __future__ import annotations

import math

import torch

from ..api import CompiledSpec
from ..lang.compiler import Chain, Variant
from ..front.errors import Diagnostic
from ..algebra.indexmap import bits_to_bytes, bytes_to_bits, concrete_shape
from ..lang.ir import Program
from ..lower.eager import run as run_op
from ..lang.ops.base import Category
from ..lang.ops.conversion import known
from ..verify.rowmap import AxisMap, prefix_length, reduce_to_axes, static_sources
from ..verify.rules import Verifier, region_dims


def _numel(shape) -> int:
    return math.prod(shape) if shape else 1


_CARRIER = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _raw(t: torch.Tensor) -> torch.Tensor:
    """Each element's bits as a non-negative integer."""
    size = t.element_size()
    raw = t.contiguous().view(_CARRIER[size]).to(torch.int64)
    return raw & ((1 << (8 * size)) - 1) if size < 8 else raw


def _bit_field(chain: Chain) -> tuple[int, int, int] | None:
    """(step, shift, width) when the chain's first value step keeps a bit field of the source's
    elements (``extract_bits`` of fp32 scales): the probe's digits must then live in that field,
    where a digit stored as a value (its exponent and mantissa) would not survive. Read from what
    each value op declares it does to an element (its ``conversion()``)."""
    for i, step in enumerate(chain.steps):
        if step.op.facts.category is not Category.VALUE:
            continue
        conv = known(step.op.conversion())
        if conv.field() is not None:
            shift, width = conv.field()
            ok = step.in_type.elem == chain.source.elem and width >= 8
            return (i, shift, width) if ok else None
        if not conv.keeps_bits:
            return None  # a value step before any bit field: the digits are values from here on
    return None


def _lossy(chain: Chain) -> bool:
    """Whether a value step drops bits of the elements (a bit field, a cast that is not an exact
    widening), read from each op's declared ``conversion()``."""
    return any(known(s.op.conversion()).lossy(s.in_type.elem)
               for s in chain.steps if s.op.facts.category is Category.VALUE)


class ProbeRun:
    """All converter runs for one spec variant on one set of dims."""

    def __init__(self, spec: CompiledSpec, variant: Variant, dims: dict, lowering: str = "eager",
                 inputs: dict | None = None):
        self.spec = spec
        #: input tensors by (tensor, its source type, dims, fill): converters never modify their inputs, so
        #: the variants and lowerings probed on the same sizes share them (built once, read many times)
        self._made = {} if inputs is None else inputs
        self._decoded: dict[tuple[str, int], tuple] = {}  # (tensor, upto) -> what :meth:`sources` found
        self.lowering = lowering
        self.variant = variant
        self.dims = dims
        self.shapes = {c.tensor: concrete_shape(c.source.shape, dims) for c in variant.chains}
        self.bitwise = {c.tensor: c.source.elem.bits == 8 for c in variant.chains}
        self.field = {c.tensor: None if self.bitwise[c.tensor] else _bit_field(c) for c in variant.chains}
        self.lossy = {c.tensor: _lossy(c) for c in variant.chains}
        digits = []
        for c in variant.chains:
            n = _numel(self.shapes[c.tensor])
            digits.append(max(1, math.ceil(math.log2(n * 8))) if self.bitwise[c.tensor] else max(1, math.ceil(math.log(max(n, 2), 256))))
        self.digits = max(digits)
        run = lambda x: spec.convert(x, dims, lowering)  # noqa: E731
        self.zero = run(self._inputs("zero"))
        self.one = run(self._inputs("one"))
        self.runs = [run(self._inputs(d)) for d in range(self.digits)]

    def _fill(self, name: str, n: int, which):
        """The values of input ``name`` (``n`` elements) in run ``which`` ('zero', 'one' or a digit)."""
        if which in ("zero", "one"):
            return int(which == "one")
        if self.bitwise[name]:  # bit b of byte j is bit ``which`` of its bit index 8*j + b, byte by byte:
            if which < 3:  # a bit of b: the same byte everywhere
                return torch.full((n,), sum(((b >> which) & 1) << b for b in range(8)), dtype=torch.uint8)
            j = torch.arange(n, dtype=torch.int64)  # a bit of j: every bit of the byte alike
            return (((j >> (which - 3)) & 1) * 0xFF).to(torch.uint8)
        return (torch.arange(n, dtype=torch.int64) >> (8 * which)) & 255

    def _inputs(self, which) -> dict:
        out = {}
        for c in self.variant.chains:
            shape, elem = self.shapes[c.tensor], c.source.elem
            key = (c.tensor, elem.name, tuple(shape), self.bitwise[c.tensor], self.field[c.tensor], which)
            if key not in self._made:
                self._made[key] = self._input(c, shape, elem, which)
            out[c.tensor] = self._made[key]
        return out

    def _input(self, c: Chain, shape, elem, which) -> torch.Tensor:
        n = _numel(shape)
        v = self._fill(c.tensor, n, which)
        if self.bitwise[c.tensor]:
            raw = v if isinstance(v, torch.Tensor) else torch.full((n,), 0xFF * v, dtype=torch.uint8)
            t = raw.reshape(shape).view(elem.torch_dtype)
        elif self.field[c.tensor] is not None:  # the digit as the bits the chain keeps
            _, shift, _ = self.field[c.tensor]
            values = v if isinstance(v, torch.Tensor) else torch.full((n,), v, dtype=torch.int64)
            size = torch.empty((), dtype=elem.torch_dtype).element_size()
            raw = values << shift
            if size < 8 and size > 1:
                raw = torch.where(raw >= 1 << (8 * size - 1), raw - (1 << (8 * size)), raw)
            t = raw.to(_CARRIER[size]).view(elem.torch_dtype).reshape(shape)
        else:
            values = v if isinstance(v, torch.Tensor) else torch.full((n,), v, dtype=torch.int64)
            t = values.to(elem.torch_dtype).reshape(shape)
        return t

    def _undo(self, chain: Chain, upto: int, x: torch.Tensor) -> torch.Tensor:
        """Take a converter output back through the inverses of steps ``upto..`` (eager)."""
        for step in reversed(chain.steps[upto:]):
            inv = step.op.inverse(step.in_type)
            if inv is None:
                raise NotDecodable.at(chain, step)
            x = run_op(inv, step.out_type, x, self.dims)
        return x

    def sources(self, chain: Chain, upto: int) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
        """(source linear index, valid) of every element after the first ``upto`` steps, as run."""
        name = chain.tensor
        for step in chain.steps:  # the probe reads positions from values: a value step it cannot undo (a
            # scaled cast) changes them at any prefix (a shard without inverse moves none: it stays probed)
            if step.op.facts.category is Category.VALUE and step.op.inverse(step.in_type) is None:
                raise NotDecodable.at(chain, step)
            conv = step.op.conversion() if step.op.facts.category is Category.VALUE else None
            if conv is not None and not conv.keeps_positions:  # declared by the conversion (map_bits' tables)
                raise NotDecodable.at(chain, step, "maps bit fields through a table (scrambling the position codes)")
        key = (name, upto)  # the rules and the agreement check ask for the same prefixes: decoded once
        if key not in self._decoded:
            self._decoded[key] = self._decode(chain, upto)
        return self._decoded[key]

    def _decode(self, chain: Chain, upto: int) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
        name = chain.tensor
        zero = self._undo(chain, upto, self.zero[name])
        one = self._undo(chain, upto, self.one[name])
        runs = [self._undo(chain, upto, r[name]) for r in self.runs]
        shape = tuple(zero.shape)
        if self.bitwise[name]:
            as_bits = lambda t: bytes_to_bits(t.contiguous().view(torch.uint8)).to(torch.int64)  # noqa: E731
            real = as_bits(zero) != as_bits(one)
            src_bit = torch.zeros(real.shape, dtype=torch.int64)
            for d, r in enumerate(runs):  # in place: one buffer, not a sum of temporaries
                src_bit.bitwise_or_(as_bits(r).bitwise_left_shift_(d))
            # a logical element is a whole byte read from one source byte, bit for bit
            byte = src_bit // 8
            if self.lossy[name]:
                # a value step drops bits (the sign in e4m3 -> f16 -> a bit field): the bits that
                # survive must still come from one source byte, each from its own position
                lo = torch.where(real, byte, torch.iinfo(torch.int64).max).amin(dim=-1)
                hi = torch.where(real, byte, -1).amax(dim=-1)
                same = (lo == hi) & torch.all(~real | (src_bit % 8 == torch.arange(8)), dim=-1)
                valid = torch.any(real, dim=-1)
                return torch.where(valid, lo, 0), valid & same, shape
            same = torch.all(byte == byte[..., :1], dim=-1) & torch.all(src_bit % 8 == torch.arange(8), dim=-1)
            valid = torch.all(real, dim=-1)
            return torch.where(valid, byte[..., 0], 0), valid & same, shape
        field = self.field[name]
        if field is not None:
            step, shift, width = field
            mask = (1 << width) - 1
            values = (lambda t: (_raw(t) >> shift) & mask) if upto <= step else (lambda t: _raw(t) & mask)  # noqa: E731
        else:
            values = lambda t: t.to(torch.float64).round().to(torch.int64)  # noqa: E731
        valid = values(zero) != values(one)
        src = torch.zeros(valid.shape, dtype=torch.int64)
        for d, r in enumerate(runs):
            src.bitwise_or_((values(r) & 255).bitwise_left_shift_(8 * d))
        return torch.where(valid, src, 0), valid, shape


class NotDecodable(ValueError):
    """A converter output the probe cannot take back to element positions (a step without an inverse,
    such as a scaled cast): that tensor's facts rest on the static maps alone, and the probe says so
    (``check --probe --strict`` refuses it, at the step's line)."""

    def __init__(self, message: str, tensor: str = "", pos=None):
        super().__init__(message)
        self.tensor, self.pos = tensor, pos

    @classmethod
    def at(cls, chain: Chain, step, why: str = "has no inverse") -> "NotDecodable":
        pos = step.statement.pos if step.statement is not None else chain.source.pos
        return cls(f"{chain.tensor}: {step.op.name} {why}, so the probe cannot decode it", chain.tensor, pos)


class ProbedSource:
    """The verifier's facts measured on the converter itself (the static rules, probed maps)."""

    def __init__(self, spec: CompiledSpec, samples_per_variant: int = 1, lowering: str = "eager",
                 inputs: dict | None = None):
        self.spec = spec
        self.inputs = {} if inputs is None else inputs  # shared by the lowerings probed (ProbeRun's inputs)
        self.compiled = spec.compiled
        self.program = spec.program
        self.lowering = lowering
        self.per_variant = samples_per_variant
        self.runs: dict[tuple, ProbeRun] = {}
        self._samples: dict[tuple, list[dict]] = {}
        #: tensor -> why the probe could not decode it (its facts are the static maps')
        self.undecoded: dict[str, NotDecodable] = {}

    def samples(self, program: Program, variant: Variant) -> list[dict]:
        """The first representatives of the variant's size region (:mod:`layoutc.algebra.regions`): small sizes
        with the region's truth values, so a branch taken only at ``I == 2944`` is probed there too."""
        key = (variant.present, program.name)
        if key not in self._samples:
            self._samples[key] = region_dims(program, variant)[0][: self.per_variant]
        return self._samples[key]

    def run_for(self, chain: Chain, dims: dict) -> ProbeRun:
        variant = next(v for v in self.compiled.variants if chain in v.chains)
        key = (variant.present, tuple(sorted(dims.items())))
        if key not in self.runs:
            self.runs[key] = ProbeRun(self.spec, variant, dims, self.lowering, self.inputs)
        return self.runs[key]

    def axis(self, chain: Chain, dims: dict, rows: bool = False) -> AxisMap:
        upto = prefix_length(chain, rows)
        try:
            linear, valid, shape = self.run_for(chain, dims).sources(chain, upto)
        except NotDecodable as why:
            self.undecoded[chain.tensor] = why
            linear, valid, shape = static_sources(chain, dims, upto)
        return reduce_to_axes(chain.source, dims, linear, valid, shape)

    def agreement(self, tick=lambda: None) -> list[Diagnostic]:
        """The probed logical maps must equal the index maps, element for element."""
        out = []
        for variant in self.compiled.variants:
            for dims in self.samples(self.program, variant):
                for chain in variant.chains:
                    for packing in (False, True):
                        tick()
                        upto = prefix_length(chain, packing)
                        s_lin, s_valid, s_shape = static_sources(chain, dims, upto)
                        try:
                            d_lin, d_valid, d_shape = self.run_for(chain, dims).sources(chain, upto)
                        except NotDecodable as why:
                            self.undecoded[chain.tensor] = why
                            continue
                        if s_shape != d_shape:
                            diff = f"the maps give shape {list(s_shape)}, the converter {list(d_shape)}"
                        else:
                            bad = (s_valid != d_valid) | (s_valid & (s_lin != d_lin))
                            if not bool(bad.any()):
                                continue
                            at = tuple(int(i) for i in bad.nonzero()[0])
                            src = lambda lin, ok: f"input element {int(lin[at])}" if bool(ok[at]) else "padding"  # noqa: E731
                            diff = (f"at logical element {list(at)} the index maps read {src(s_lin, s_valid)} but the "
                                    f"converter put {src(d_lin, d_valid)} there ({int(bad.sum())} elements differ)")
                        dims_text = ", ".join(f"{k}={v}" for k, v in dims.items())
                        steps = chain.steps[:upto]
                        pos = steps[-1].statement.pos if steps and steps[-1].statement else chain.source.pos
                        out.append(Diagnostic(
                            "error", f"{chain.tensor}: static and dynamic verification disagree "
                                     f"({self.lowering} lowering) with {dims_text}: {diff}",
                            pos, "a primitive's index map and its torch implementation differ; this is a layoutc bug",
                            (chain.tensor,),
                        ))
                        break
        return out


def probe_steps(spec: CompiledSpec, samples_per_variant: int = 1, lowerings: tuple[str, ...] = ("eager", "gather"),
                ) -> int:
    """How many times :func:`probe` calls its ``tick``: per lowering, two comparisons per chain and sample
    (logical and packed), then the verifier's rules."""
    source = ProbedSource(spec, samples_per_variant)
    per_lowering = sum(2 * len(v.chains) * len(source.samples(spec.program, v)) for v in spec.compiled.variants)
    return len(lowerings) * (per_lowering + 1)


def probe(spec: CompiledSpec, samples_per_variant: int = 1, lowerings: tuple[str, ...] = ("eager", "gather"),
          progress=None, tick=None, strict: bool = False) -> list[Diagnostic]:
    """Dynamic verification of a compiled (statically verified) spec; empty when both agree.

    Each lowering is probed: ``eager`` (the op-by-op torch implementations, independent of the
    index maps) and ``gather`` (the fused plan's code, generated from the composed maps).
    ``progress(text)`` hears of each lowering as it starts; ``tick()`` of each of :func:`probe_steps`'s steps
    as it ends (a progress bar). A tensor the probe cannot decode (:class:`NotDecodable`) is said through
    ``progress`` and left to the static maps; with ``strict`` it is an error at the step's line instead."""
    findings: list[Diagnostic] = []
    inputs: dict = {}
    undecoded: dict[str, NotDecodable] = {}
    for lowering in lowerings:
        if progress is not None:
            progress(f"{lowering} lowering: {len(spec.compiled.variants)} variant(s)")
        findings += _probe_one(spec, samples_per_variant, lowering, tick or (lambda: None), progress, inputs,
                               undecoded)
    if strict:
        findings += [Diagnostic(
            "error", f"{why}: its claims were not probed, only checked on the static maps (--strict)", why.pos,
            "without --strict the static verdict stands for this tensor; a step the probe can undo (an inverse "
            "the op declares) makes it probed", (why.tensor,)) for why in undecoded.values()]
    return findings


def _probe_one(spec: CompiledSpec, samples_per_variant: int, lowering: str, tick, progress=None,
               inputs: dict | None = None, undecoded: dict | None = None) -> list[Diagnostic]:
    source = ProbedSource(spec, samples_per_variant, lowering, inputs)
    findings = source.agreement(tick)
    verdict = Verifier(spec.compiled, source).run()
    tick()
    if undecoded is not None:
        undecoded.update(source.undecoded)
    if progress is not None:  # said, not hidden: these tensors' facts are the static verifier's alone
        for reason in sorted({str(why) for why in source.undecoded.values()}):
            progress(f"not probed, the static maps stand: {reason}")
    if verdict:
        findings.append(Diagnostic(
            "error",
            f"the probed converter breaks {len(verdict)} rule(s) that the static verifier accepted: "
            + "; ".join(d.message for d in verdict[:3]),
            verdict[0].pos, "the static and dynamic verdicts disagree; this is a layoutc bug",
            tuple(t for d in verdict for t in d.tensors),
        ))
        findings.extend(verdict)
    return findings


def probe_maps(spec: CompiledSpec, tensor: str, dims: dict, present=()) -> tuple[torch.Tensor, torch.Tensor]:
    """(source, valid) of the whole converter for one tensor (no decoding), for tests and tools."""
    variant = spec.compiled.variant(present)
    chain = variant.chain(tensor)
    lin, valid, _ = ProbeRun(spec, variant, dims, "eager").sources(chain, len(chain.steps))
    return lin, valid
