"""The lowerings, by name: what the CLI offers, what ``auto`` chooses from, and how each writes its
code into a generated converter.

A lowering is one :class:`Lowering`: its name, when it can run (device types, a module it imports,
an environment variable that lets it run on CPU tensors), the device types ``auto`` picks it for
(registry order breaks ties), and how it emits code: per tensor (a function ``(x, d) -> tensor``
for one chain), per layer (a function ``(tensors, d, outs) -> dict`` for every chain of a variant it can
take, e.g. one kernel launch) or inline (lines that convert ``x`` in place, written into
``convert`` and ``inverse`` themselves, with the functions they call copied into the converter).
The one inline lowering (``eager``, op by op) takes every chain: chains the others do not take run
it, and ``auto`` tries it last. A new lowering is a module that builds one and calls
:func:`register` (``tests/lower/test_registry.py`` registers one).
"""

from __future__ import annotations

from typing import Callable, Iterable

import attrs

from ..lang.compiler import Chain, Variant
from . import eager, memo, triton_emit, torch_emit
from .maptext import map_text
from .plan import Gather, Plan, Rows, Words, plan, tables
from ..algebra import expr as ex
from ..front.text import comment
from ..lang.ops.base import Category


class EmitContext:
    """What emitters share while one module is generated: its dims and spec file, the plans (one per
    chain), the module-level functions written so far (by name) and the Triton source."""

    def __init__(self, dims: tuple[str, ...], filename: str):
        self.dims = dims
        self.filename = filename
        self.defs: dict[str, str] = {}
        self.kernels: dict[str, str] = {}
        self.layers: dict[tuple, str] = {}
        self._plans: dict[tuple, Plan] = {}
        self._tags: dict[tuple, str] = {}
        self._keys: dict[tuple, tuple] = {}
        self._headers: dict[tuple, str] = {}

    def plan(self, chain: Chain) -> Plan:
        key = chain.signature()
        if key not in self._plans:
            self._plans[key] = memo.get("plan", self.key(chain), lambda: plan(chain))
        return self._plans[key]

    def key(self, chain: Chain) -> tuple:
        """The chain's content (:func:`layoutc.lower.memo.chain_key`): what its plan and code are kept by."""
        key = chain.signature()
        if key not in self._keys:
            self._keys[key] = memo.chain_key(chain)
        return self._keys[key]

    def header(self, chain: Chain, walk: bool = True) -> str:
        """:func:`triton_emit.header` of the chain: once per signature in this module (the statements it
        cites are the signature's), its map text once per distinct chain."""
        key = (chain.signature(), tuple(s.tag is not None for s in chain.steps), walk)
        if key not in self._headers:
            shape_text = chain.target.shape_text if chain.target is not None else ()
            p = self.plan(chain)
            mapped = memo.get("map", (self.key(chain), shape_text), lambda: map_text(chain, shape_text, planned=p))
            self._headers[key] = "\n".join(triton_emit.header(chain, p, self.filename, walk=walk, mapped=mapped))
        return self._headers[key]

    def body(self, chain: Chain, name: str) -> str:
        """:func:`triton_emit.body` of the chain's plan (once per distinct chain, name and dims)."""
        # the header's named terms come from the chain's map text, which reads its target's shape text too
        shape_text = chain.target.shape_text if chain.target is not None else ()
        return memo.get("body", (self.key(chain), shape_text, name, self.dims),
                        lambda: triton_emit.body(self.plan(chain), name, self.dims,
                                                 triton_emit.header_terms(chain, self.plan(chain))))

    def gather(self, chain: Chain, name: str) -> str:
        """:func:`torch_emit.gather_function` of the chain's plan (once per distinct chain, name and dims)."""
        shape_text = chain.target.shape_text if chain.target is not None else ()
        return memo.get("gather", (self.key(chain), shape_text, name, self.dims),
                        lambda: torch_emit.gather_function(self.plan(chain), name, self.dims,
                                                           triton_emit.header_terms(chain, self.plan(chain))))

    def tag(self, chain: Chain) -> str:
        """A short identifier for the chain, unique in the module: ``w13_weight_0``."""
        key = chain.signature()
        if key not in self._tags:
            self._tags[key] = f"{chain.tensor}_{len(self._tags)}"
        return self._tags[key]

    def define(self, name: str, source: str) -> str:
        if self.defs.setdefault(name, source) != source:
            raise AssertionError(f"two different definitions of {name} in one module")
        return name

    def kernel(self, name: str, source: str) -> str:
        if self.kernels.setdefault(name, source) != source:
            raise AssertionError(f"two different kernels named {name} in one module")
        return name


ChainEmitter = Callable[[EmitContext, Chain], "str | None"]
LayerEmitter = Callable[[EmitContext, Variant], "tuple[str, tuple[str, ...]] | None"]
InlineEmitter = Callable[[Chain, str], "list[str]"]


@attrs.frozen
class Lowering:
    name: str
    doc: str  # one line: the CLI's help and the converter's docstring
    devices: tuple[str, ...] | None = None  # device types it runs on; None: any
    auto_on: tuple[str, ...] = ()  # device types 'auto' picks it for
    needs: str | None = None  # a module it imports at run time
    cpu_env: str | None = None  # this environment variable set to 1 lets it run on CPU tensors
    wrong_device: str = "cannot run on these tensors"  # the end of "lowering='x' ... (these are on cpu)"
    chain: ChainEmitter | None = None  # name of a module function (x, d) -> tensor, or None (not this chain)
    layer: LayerEmitter | None = None  # (function (tensors, d, outs) -> dict, the tensors it converts), or None
    # (chain, spec file) -> lines converting `x` in place, written inside convert and inverse: the one
    # lowering that takes every chain (the others fall back to it)
    inline: InlineEmitter | None = None
    brief: str | None = None  # what the converter's comment on its inline code calls it (default: doc)
    # chains -> the module-level functions its inline code calls, copied into the converter
    copies: Callable[[Iterable[Chain]], list[Callable]] | None = None

    def table_entry(self) -> tuple:
        """What the converter's run time needs to choose it (runtime._choose_lowering)."""
        return (self.name, self.devices, self.auto_on, self.needs, self.cpu_env, self.wrong_device)


_REGISTRY: dict[str, Lowering] = {}


def register(lowering: Lowering) -> Lowering:
    if not lowering.name.isidentifier() or lowering.name == "auto":
        raise ValueError(f"a lowering needs an identifier for a name other than 'auto', got {lowering.name!r}")
    # The doc goes into every converter's docstring: one printable line that cannot end it.
    if not lowering.doc.isprintable() or '"' in lowering.doc or "\\" in lowering.doc:
        raise ValueError(f"a lowering's doc is one printable line without quotes or backslashes, got {lowering.doc!r}")
    if (lowering.inline is None) != (lowering.copies is None) or (lowering.inline is None and lowering.brief):
        raise ValueError(f"lowering {lowering.name!r}: inline code comes with its copied functions and brief")
    if lowering.inline is not None and any(lw.inline is not None for k, lw in _REGISTRY.items() if k != lowering.name):
        raise ValueError(f"lowering {lowering.name!r} is inline, and {fallback().name!r} already is: "
                         "one lowering takes the chains no other does")
    _REGISTRY[lowering.name] = lowering
    return lowering


def unregister(name: str) -> None:
    if name in _REGISTRY and _REGISTRY[name].inline is not None:
        raise ValueError(f"the {name} lowering takes the chains no other does: it cannot be removed")
    _REGISTRY.pop(name, None)


def fallback() -> Lowering:
    """The inline lowering: it takes every chain, the others only those they can."""
    inline = [lw for lw in _REGISTRY.values() if lw.inline is not None]
    if len(inline) != 1:
        raise AssertionError(f"one inline lowering must be registered, not {len(inline)}")
    return inline[0]


def lowerings() -> tuple[Lowering, ...]:
    """Every registered lowering, in the order 'auto' tries them; the inline one last."""
    last = fallback()
    return tuple(lw for lw in _REGISTRY.values() if lw is not last) + (last,)


def names() -> tuple[str, ...]:
    """What a user can ask for: 'auto' and every registered lowering."""
    return ("auto",) + tuple(lw.name for lw in lowerings())


def signature() -> tuple:
    """Changes when the registry does (generated modules depend on it). Every lowering whose id went into
    a signature is kept alive (_SIGNED), so an id is never reused by another lowering that would then give a
    removed one's signature (and a compiled module cached under it)."""
    found = lowerings()
    for lw in found:
        _SIGNED.setdefault(id(lw), lw)
    return tuple((lw.name, id(lw)) for lw in found)


#: Lowerings whose id a signature holds, by id (a few per process: tests register and remove some).
_SIGNED: dict[int, Lowering] = {}


# ---------------------------------------------------------------------------
# the built-in lowerings


def _table_statement(chain: Chain, values: tuple[int, ...], filename: str) -> str:
    """Where a lookup table of the chain's composed map comes from: the spec line of the step whose map holds it."""
    for s in chain.steps:
        if s.op.category is Category.VALUE:
            continue
        m = s.op.index_map(s.in_type)
        stack = [*m.src, m.valid]
        while stack:
            e = stack.pop()
            if isinstance(e, ex.Table) and e.values == values:
                return f"{filename}:{s.statement.pos.line}: {s.statement.text}" if s.statement else str(s.op)
            stack.extend(ex.children(e))
    return "the composed map"


def _table_literals(ctx: EmitContext, chain: Chain, tag: str) -> list[str]:
    """Module-level literals of the chain's lookup tables (``_TABLE_<tag>_<k>``), each with the spec line it
    comes from; the names, in the order the kernel body takes them."""
    names = []
    for k, values in enumerate(tables(ctx.plan(chain))):
        name = f"_TABLE_{tag}_{k}"
        rows = [", ".join(str(v) for v in values[i:i + 16]) + "," for i in range(0, len(values), 16)]
        where = triton_emit.wrap_comment(comment(f"lookup table {k} of {chain.tensor}: "
                                                 f"{_table_statement(chain, values, ctx.filename)}"))
        ctx.define(name, "\n".join([*where, f"{name} = (", *(f"    {r}" for r in rows), ")"]) + "\n")
        names.append(name)
    if names:
        ctx.define("_table_on", triton_emit.TABLE_ON)
    return names


def _fused_layer(ctx: EmitContext, variant: Variant) -> tuple[str, tuple[str, ...]] | None:
    """One Triton kernel for every chain of the variant that has a one-pass plan."""
    entries, bodies, chains, lookups = [], [], [], {}
    for c in variant.chains:
        p = ctx.plan(c)
        if not p.one_pass:
            continue
        tag = ctx.tag(c)
        name = ctx.kernel(f"_b_{tag}", ctx.header(c) + "\n" + ctx.body(c, f"_b_{tag}"))
        entries.append((c.tensor, p))
        bodies.append(name)
        chains.append(tag)
        lookups[c.tensor] = _table_literals(ctx, c, tag)
    if not entries:
        return None
    if any(triton_emit.uses_transpose(p) for _, p in entries):
        ctx.kernel("_transpose4x4", triton_emit.TRANSPOSE.strip() + "\n")
    if any(lookups.values()):
        ctx.kernel("_lookup", triton_emit.LOOKUP.strip() + "\n")
    key = tuple(chains)
    if key not in ctx.layers:
        kernel = ctx.kernel(f"_k_layer_{len(ctx.layers)}", triton_emit.layer_kernel(
            f"_k_layer_{len(ctx.layers)}", bodies, ctx.dims, [len(lookups[t]) for t, _ in entries]))
        ctx.layers[key] = ctx.define(f"_fused_layer_{len(ctx.layers)}", triton_emit.launcher(
            f"_fused_layer_{len(ctx.layers)}", kernel, entries, ctx.dims, lookups))
    return ctx.layers[key], tuple(t for t, _ in entries)


def _gather_chain(ctx: EmitContext, chain: Chain) -> str | None:
    p = ctx.plan(chain)
    if not p.one_pass or not chain.steps:
        return None
    if tables(p):  # lookup tables are lowered to Triton kernels only: the CPU runs such a chain op by op
        return None
    name = f"_gather_{ctx.tag(chain)}"
    if isinstance(p, Words):  # the quads part and the byte run path permute words by the half-word tables
        ctx.define("_bit_tables", torch_emit.bit_tables_source())
    if isinstance(p, (Gather, Rows, Words)):
        ctx.define("_run_plan", torch_emit.runs_source())
        ctx.define("_nb", torch_emit.native_source())
    cite = ctx.header(chain, walk=False)  # the spec lines it computes
    return ctx.define(name, cite + "\n" + ctx.gather(chain, name))


def _compiled_chain(ctx: EmitContext, chain: Chain) -> str | None:
    gather = _gather_chain(ctx, chain)
    if gather is None:
        return None
    name = f"_compiled_{ctx.tag(chain)}"
    return ctx.define(name, torch_emit.compiled_function(name, gather))


FUSED = register(Lowering(
    "fused", "generated Triton kernels, one launch per layer (CUDA)", devices=("cuda",), auto_on=("cuda",),
    needs="triton", cpu_env="TRITON_INTERPRET", wrong_device="runs Triton kernels, which need CUDA tensors",
    layer=_fused_layer,
))
GATHER = register(Lowering(
    "gather", "one torch gather per tensor from the composed maps (any device)", auto_on=("cpu",),
    chain=_gather_chain,
))
COMPILED = register(Lowering(
    "compiled", "the gathers under torch.compile (one loop per tensor; compiles once per shape)",
    chain=_compiled_chain,
))
EAGER = register(Lowering(
    "eager", "op by op, the reference (any device)", brief="op by op, the reference",
    inline=eager.emit_chain, copies=eager.functions_used,
))


def describe(items: Iterable[Lowering] | None = None) -> str:
    """One line per lowering: for --help texts."""
    return "; ".join(f"{lw.name}: {lw.doc}" for lw in (items or lowerings()))
