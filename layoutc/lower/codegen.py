"""Standalone converter modules: readable Python that depends on torch alone.

The module a spec compiles to exposes::

    convert(tensors, dims=None, lowering='auto', ..., out=None) -> dict[str, Tensor]   checkpoint -> kernel layout
    inverse(tensors, dims=None) -> dict[str, Tensor]   kernel layout -> checkpoint layout
    bind_dims(tensors, dims=None) -> dict[str, int]    the dims (E, I, H, ...) convert would bind
    guard(tensors), provenance(tensor)                  the pre-kernel guard (layoutc.runtime.guard_rt)
    SPEC_NAME, SPEC_SHA256, PARAMS, REQUIRES, DIMS, INPUTS, OUTPUTS, INVERTIBLE, LOWERINGS
    LayoutError                                         raised for tensors that break the contract

It holds copies, whole, of the run-time modules (:mod:`layoutc.runtime.dimsolve`, :mod:`layoutc.runtime.checks`,
:mod:`layoutc.runtime.warm`,
:mod:`layoutc.runtime.guard_rt`), the eager functions the spec's ops use (:mod:`layoutc.lang.ops.torch_impl`,
or an op's own module), and what each registered lowering (:mod:`layoutc.lower.registry`) writes for
the spec's chains: so the module runs where layoutc is not installed. ``layoutc.compile_file`` loads
the same text in memory: the Python API and the generated file are one code path.
"""

from __future__ import annotations

import ast
import hashlib
import dis
import inspect
import textwrap
from typing import Any, Callable, Iterable

from ..runtime import dimsolve
from .._version import __version__
from ..algebra import expr as ex
from ..lang.compiler import Chain, Compiled, Constraint, Variant, shape_axes
from ..lang.ir import TensorSpec
from . import pywrap, registry
from ..runtime import cpu_kernels, fingerprint, guard_rt, warm, checks as runtime
from ..front.text import comment
from ..lang.versions import distribution

#: The run-time modules copied whole into every converter, in this order.
RUNTIME_MODULES = (dimsolve, runtime, warm, cpu_kernels, fingerprint, guard_rt)
#: What the copied modules may import (the converter imports these at its top).
RUNTIME_IMPORTS = frozenset({"ctypes", "difflib", "hashlib", "importlib.metadata", "importlib.util", "itertools",
                             "linecache", "os", "sys", "types", "fractions", "torch"})


def text_literal(text: str) -> str:
    """A Python literal for ``text``: a triple-quoted block where that denotes exactly ``text``
    (readable multi-line code and docs: no backslash, and no character of the chosen quote), else
    ``repr(text)``. Either way nothing in ``text`` can end the literal: text from a spec or a file
    name is data, never code."""
    if text.replace("\n", "").isprintable() and "\\" not in text:  # every character printable or a line break
        for quote in ('"', "'"):
            if quote not in text:
                return quote * 3 + text + quote * 3
    return repr(text)


def module_text(module) -> str:
    """The source of a run-time module, to be copied whole into a converter: without its docstring
    (a comment names the module), ``from __future__`` and its import lines (the converter imports
    the same modules at its top; relative imports name modules copied before it)."""
    source = inspect.getsource(module)
    tree = ast.parse(source)
    drop: set[int] = set()
    for i, node in enumerate(tree.body):
        docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module not in RUNTIME_IMPORTS | {"__future__"}:
            raise AssertionError(f"{module.__name__} imports {node.module}, which converters do not carry")
        if isinstance(node, ast.Import) and any(a.name not in RUNTIME_IMPORTS for a in node.names):
            raise AssertionError(f"{module.__name__} imports what converters do not carry")
        if docstring or isinstance(node, (ast.Import, ast.ImportFrom)):
            drop.update(range(node.lineno, node.end_lineno + 1))
    lines = [line for n, line in enumerate(source.splitlines(), 1) if n not in drop]
    return textwrap.dedent("\n".join(lines)).strip() + "\n"


def _source_of(obj: Any) -> str:
    return textwrap.dedent(inspect.getsource(obj)).rstrip() + "\n"


#: Module-level values an eager function may read besides functions: copied as literals.
_LITERALS = (int, float, str, bool, tuple, frozenset, type(None))


def _impl_closure(functions: Iterable[Callable[..., Any]]) -> list[str]:
    """Sources of the eager functions used (each op's ``impl``: in :mod:`layoutc.lang.ops.torch_impl` or
    in the op's own module), plus the module-level functions and constants they read."""
    chunks: dict[str, str] = {}
    origin: dict[str, Callable[..., Any]] = {}
    pending = list(functions)
    while pending:
        fn = pending.pop()
        if fn.__name__ in chunks:
            if origin[fn.__name__] is not fn:  # two modules' functions of one name would overwrite
                raise AssertionError(f"two eager functions are named {fn.__name__}: "
                                     f"{origin[fn.__name__].__module__} and {fn.__module__}")
            continue
        chunks[fn.__name__], origin[fn.__name__] = _source_of(fn), fn
        for name in _globals_read(fn):
            if name == "torch" or name in chunks or name not in fn.__globals__:
                continue
            value = fn.__globals__[name]
            if inspect.isfunction(value):
                pending.append(value)
            elif isinstance(value, _LITERALS):
                chunks[name] = f"{name} = {value!r}\n"
            else:  # a module, a class: a converter depends on torch alone
                raise AssertionError(f"eager function {fn.__module__}.{fn.__name__} reads {name}, "
                                     "which cannot be copied into a converter (torch, functions and literals only)")
    constants = [c for n, c in chunks.items() if not c.startswith("def ")]
    defs = [c for n, c in sorted(chunks.items()) if c.startswith("def ")]
    return constants + defs


def _chunk_dim(p) -> str | None:
    """The dim every input and output shape starts with, if there is one (the experts)."""
    firsts = {t.shape[0] for t in (*p.inputs, *p.outputs) if t.shape}
    if len(firsts) == 1:
        first = next(iter(firsts))
        if isinstance(first, ex.Var):
            return first.name
    return None


def _globals_read(fn: Callable[..., Any]) -> set[str]:
    """Module-level names a function reads (not attribute names like ``x.reshape``)."""
    names = set()
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        codes += [c for c in code.co_consts if hasattr(c, "co_code")]
        names |= {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    return names


def _dims_lambda(program_dims: tuple[str, ...], body: str) -> str:
    return f"lambda {', '.join(program_dims)}: {body}"


def _contract(specs: Iterable[TensorSpec]) -> str:
    lines = ["{"]
    for s in specs:
        shape = ", ".join(repr(t) for t in s.shape_text)
        shape = f"({shape},)" if len(s.shape_text) == 1 else f"({shape})"
        accepts = tuple(n for n in s.elem.accepts)
        widens = tuple(t.canonical for t in getattr(s, "accepts", ()))
        lines.append(
            f"    {s.name!r}: {{'dtype': {s.elem.name!r}, 'torch_dtypes': {accepts!r}, 'widens': {widens!r}, "
            f"'shape': {shape}, 'optional': {s.optional!r}}},"
        )
    lines.append("}")
    return "\n".join(lines)


def _shapes(specs: Iterable[TensorSpec], dims: tuple[str, ...]) -> str:
    lines = ["{"]
    for s in specs:
        body = ", ".join(ex.to_python(e) for e in s.shape)
        body = f"({body},)" if len(s.shape) == 1 else f"({body})"
        lines.append(f"    {s.name!r}: {_dims_lambda(dims, body)},")
    lines.append("}")
    return "\n".join(lines)


def _axes(specs: Iterable[TensorSpec]) -> str:
    lines = ["["] + [f"    {entry!r}," for entry in shape_axes(specs)] + ["]"]
    return "\n".join(lines)


def _conditions(p, dims: tuple[str, ...]) -> str:
    """The spec's size conditions: (label, predicate of the dims), evaluated once per call."""
    lines = ["["]
    for c in p.conditions:
        test = f"({ex.to_python(c.lhs)}) {c.op} ({ex.to_python(c.rhs)})"
        lines.append(f"    ({c.label!r}, {_dims_lambda(dims, test)}),")
    lines.append("]")
    return "\n".join(lines)


def _checks(variants: tuple[Variant, ...], dims: tuple[str, ...], assumptions: list[str]) -> str:
    """Run-time divisibility checks, each with the variants it belongs to (None = all).
    ``assumptions`` are the spec's ``assume`` lines, checked whatever tensors are given."""
    by_key: dict[tuple, tuple[Constraint, set]] = {}
    tensor_variants: dict[str, set] = {}
    for v in variants:
        for c in v.chains:
            tensor_variants.setdefault(c.tensor, set()).add(v.present)
            for k in c.constraints:
                if k.status != "runtime":
                    continue
                key = (k.tensor, k.value, k.multiple, k.message())
                by_key.setdefault(key, (k, set()))[1].add(v.present)
    lines = ["["] + assumptions
    for (tensor, value, multiple, message), (_, where) in by_key.items():
        scope = None if where == tensor_variants[tensor] else sorted(where, key=sorted)
        scope_src = "None" if scope is None else "(" + ", ".join(f"frozenset({sorted(p)!r})" for p in scope) + ",)"
        pieces = _pieces(message, 96)  # one string, as adjacent literals of at most a line each
        lines.append(f"    ({tensor!r}, {_dims_lambda(dims, ex.to_python(value))}, {multiple},")
        lines += [f"     {piece!r}" for piece in pieces[:-1]] + [f"     {pieces[-1]!r}, {scope_src}),"]
    lines.append("]")
    return "\n".join(lines)


def _pieces(text: str, width: int) -> list[str]:
    """``text`` cut after spaces into pieces of at most about ``width`` characters (joined: ``text``)."""
    pieces, start = [], 0
    while len(text) - start > width:
        cut = text.rfind(" ", start, start + width)
        if cut <= start:
            break
        pieces.append(text[start:cut + 1])
        start = cut + 1
    return pieces + [text[start:]]


def _emit_direction(
    fn_name: str, doc: str, variants: tuple[Variant, ...], contract: str, shapes: str, axes: str, checks: str,
    tensors: Iterable[TensorSpec], dims: tuple[str, ...], filename: str, out_specs: dict[str, TensorSpec],
    passes: dict[tuple, tuple[str, list[str]]] | None = None,
    layers: dict[frozenset, list[tuple[str, str]]] | None = None,
) -> list[str]:
    """``convert`` (lowered: ``passes`` maps a chain's signature to the name of its table of one-pass
    functions and the lowerings in it,
    ``layers`` a variant to its layer functions) or ``inverse`` (eager)."""
    lowered = fn_name == "convert"
    if lowered:
        body = [
            "def convert(tensors, dims=None, lowering='auto', chunk=None, inplace=False, fingerprint=True, out=None):",
            textwrap.indent(f'"""{doc}', "    "),
            "",
            *textwrap.wrap("lowering: 'auto' or one of LOWERINGS: " + comment(registry.describe()) + ".", 116,
                           initial_indent="    ", subsequent_indent="    "),
            "    'auto' takes the first that runs on the tensors' device. chunk=k converts k experts at a",
            "    time (bounds the eager lowering's temporaries). inplace=True writes each output whose",
            "    bytes per expert equal its input's into the input's memory, one expert at a time, and",
            "    returns views of it: the inputs are overwritten, peak extra memory is about one expert.",
            "    fingerprint=False skips the fingerprint of the outputs' bytes (a pass over them, queued on their",
            "    device): the guard then accepts the outputs themselves but no copy of them.",
            "    out={name: tensor} writes the outputs into the caller's tensors (each output's dtype, shape and",
            "    device, contiguous, 16-byte aligned, sharing no memory with an input or another output; checked",
            "    once per set of addresses) and returns them, stamped for the guard as any output; no allocation.",
            '    """',
            "    _check_requires(REQUIRES, SPEC_NAME)",
            "    # A call with the key of one that passed every check skips the checks"
            " (runtime.warm: why that is sound).",
            "    warm = _warm_key(tensors, dims, lowering, out) if chunk is None and not inplace else None",
            "    hit = _warm_hit(warm) if warm is not None else None",
            "    if hit is not None:  # (check, dims, variant, lowering, out= key, prepared launch of the whole call)",
            "        res = _warm_run(hit[5], tensors, out) if hit[5] is not None else None",
            "        if res is None:",
            "            return _plain(_converted, tensors, hit[1], hit[2], hit[3], None, False, fingerprint, out,"
            " hit[4], True)",
            "        _stamp(res, SPEC_NAME, SPEC_SHA256, PARAMS, REQUIRES, hit[1], fingerprint, hit[4])",
            "        return res",
            f"    d, present = _check_call(tensors, dims, 'convert', {contract}, {shapes}, {axes}, DIMS, _CONDITIONS, {checks})",
            "    static = None  # out=: the key its check passed under (the stamp reuses its records)",
            "    if out is not None:",
            "        if chunk is not None or inplace:",
            "            raise LayoutError('convert: out= cannot be combined with chunk or inplace')",
            "        static = _check_out(out, tensors, d, present, OUTPUTS, _OUTPUT_SHAPES)",
            f"    given, tensors = tensors, _widened(tensors, {contract})"
            "  # inputs declared 'accepts T': exact conversion first",
            "    how = _choose_lowering(lowering, tensors, _LOWERINGS)",
            "    # Plain tensors out whatever the caller's mode (inference_mode, requires_grad inputs): no autograd",
            "    # graph, and version counters the guard can read.",
            "    res = _plain(_converted, tensors, d, present, how, chunk, inplace, fingerprint, out, static)",
            "    if warm is not None:",
            "        _warm_store(warm, d, present, how, static, _warm_widened(given, tensors),",
            "                    _warm_remembered(lowering, tensors, _LOWERINGS), tensors, res, _LAYERS)",
            "    return res",
            "",
            "",
            "def _converted(tensors, d, present, how, chunk, inplace, fingerprint, outs, static, warm=False):",
            "    if chunk is None and not inplace:",
            "        out = _convert(tensors, d, present, how, outs)",
            "    else:",
            "        out = _convert_in_chunks(_convert, tensors, d, present, how, 1 if chunk is None else chunk, inplace,"
            " _OUTPUT_SHAPES, CHUNK_DIM)",
            "    if not warm:  # a warm call's shapes are those its key's first call had (checked)",
            "        _check_outputs(out, _OUTPUT_SHAPES, d, 'convert')",
            "    if outs is not None:",
            "        out = _into(out, outs)",
            "    _stamp(out, SPEC_NAME, SPEC_SHA256, PARAMS, REQUIRES, d, fingerprint, static)",
            "    return out",
            "",
            "",
            "def _convert(tensors, d, present, how, outs=None):",
            "    # One call over the given tensors (all experts, or one chunk of them).",
        ]
    else:
        body = [
            f"def {fn_name}(tensors, dims=None):",
            textwrap.indent(f'"""{doc}"""', "    "),
            "    _check_requires(REQUIRES, SPEC_NAME)",
            f"    d, present = _check_call(tensors, dims, {fn_name!r}, {contract}, {shapes}, {axes}, DIMS, _CONDITIONS, {checks})",
            "    with torch.inference_mode(False), torch.no_grad():",
            "        return _inverse(tensors, d, present)",
            "",
            "",
            "def _inverse(tensors, d, present):",
        ]
    if dims:
        body.append(f"    {', '.join(dims)} = {', '.join(f'd[{n!r}]' for n in dims)}")
    if lowered and layers:
        body.append("    _layer = _LAYERS.get((how, present))")
        body.append("    out = _layer(tensors, d, outs) if _layer is not None else {}"
                    "  # a lowering that converts the whole layer at once")
    else:
        body.append("    out = {}")
    for spec in tensors:
        groups: dict[tuple, tuple[Chain, list[frozenset]]] = {}
        for v in variants:
            chain = next((c for c in v.chains if c.tensor == spec.name), None)
            if chain is None:
                continue
            groups.setdefault(chain.signature(), (chain, []))[1].append(v.present)
        if not groups:
            continue
        target = out_specs[spec.name]
        indent = "    "
        body.append("")
        body.append("    # " + comment(f"{spec.name}: {spec.elem.name}{spec.shape_str()} -> {target.elem.name}{target.shape_str()}"))
        taken = lowered and layers and any(spec.name in names for fns in layers.values() for _, names in fns)
        conds = ([f"{spec.name!r} in present"] if spec.optional else []) + ([f"{spec.name!r} not in out"] if taken else [])
        if conds:
            body.append(f"    if {' and '.join(conds)}:")
            indent = "        "
        for i, (chain, presents) in enumerate(groups.values()):
            inner = indent
            if len(groups) > 1:
                # one tuple of the variants the chain serves (wraps after its commas, however many there are)
                cond = f"present in ({', '.join(f'frozenset({sorted(p)!r})' for p in presents)},)"
                body.append(f"{indent}{'if' if i == 0 else 'elif'} {cond}:")
                inner = indent + "    "
            body.append(f"{inner}x = tensors[{spec.name!r}]")
            if len(spec.elem.accepts) > 1:  # same bits under another torch dtype: work on the canonical one
                body.append(f"{inner}x = x.view(torch.{spec.elem.canonical})")
            entry = (passes or {}).get(chain.signature()) if lowered else None
            inline = registry.fallback()  # the registered lowering that takes every chain, written here
            if entry is not None:
                table, names = entry
                body.append(f"{inner}if how in {table}:  # one pass: {', '.join(names)}")
                body.append(f"{inner}    x = {table}[how](x, d)")
                body.append(f"{inner}else:  # {inline.name}: {inline.brief or inline.doc}")
                body += [inner + "    " + line for line in inline.inline(chain, filename) or ["pass"]]
            else:
                body += [inner + line for line in inline.inline(chain, filename)]
            body.append(f"{inner}out[{spec.name!r}] = _owned(x, tensors)")
    body.append("    return out")
    return body



def _digest12(text: str) -> str:
    """The first 12 hex digits of ``text``'s sha256 (names a kernel source apart from its spec's others)."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]

def _lowered(compiled: Compiled) -> tuple[list[list[str]], dict[tuple, tuple[str, list[str]]],
                                           dict[frozenset, list[tuple[str, str]]]]:
    """What the registered lowerings write for the convert chains: module-level source (in parts of whole
    statements, :func:`pywrap.wrap_parts`), the pass table of each chain signature (its name and the
    lowerings in it), the layer functions of each variant."""
    p = compiled.program
    ctx = registry.EmitContext(p.dims, p.short_filename)
    passes: dict[tuple, list[tuple[str, str]]] = {}
    first_chain: dict[tuple, Chain] = {}  # a chain of each signature: its tag names the table
    layers: dict[frozenset, list[tuple[str, str, tuple[str, ...]]]] = {}
    for lw in registry.lowerings():
        for v in compiled.variants:
            if lw.layer is not None:
                made = lw.layer(ctx, v)
                if made is not None:
                    layers.setdefault(v.present, []).append((lw.name, made[0], made[1]))
            if lw.chain is not None:
                for c in v.chains:
                    first_chain.setdefault(c.signature(), c)
                    fn = lw.chain(ctx, c)
                    if fn is not None and (lw.name, fn) not in passes.setdefault(c.signature(), []):
                        passes[c.signature()].append((lw.name, fn))
    lines = ["_LOWERINGS = (  # name, devices, devices auto picks it for, module it needs, CPU switch, wrong-device text",
             *(f"    {lw.table_entry()!r}," for lw in registry.lowerings()), ")",
             "LOWERINGS = tuple(entry[0] for entry in _LOWERINGS)", ""]
    kernels = sorted(ctx.kernels.values(), key=lambda k: "def _k_layer_" in k)  # bodies first
    kernel_text = pywrap.wrap_parts(kernels, "\n\n")  # lines of at most 120 characters, the same kernels
    lines += [
        # one name per kernel text: Triton's interpreter reads a kernel's source back through linecache by
        # this name when it first runs it, and two variants of one spec (activation=silu, relu2) in one
        # process must not overwrite each other's lines there
        f"_TRITON_FILE = {f'<layoutc triton kernels of {p.name} {_digest12(kernel_text)}>'!r}",
        f"_TRITON_SOURCE = {text_literal(chr(10) + kernel_text) if kernel_text else repr('')}",
        "",
    ]
    parts = [lines] + [["", source] for source in ctx.defs.values()]
    lines = []
    tables: dict[tuple, tuple[str, list[str]]] = {}
    for sig, fns in passes.items():
        name = f"_PASS_{ctx.tag(first_chain[sig])}"
        tables[sig] = (name, [lw for lw, _ in fns])
        lines.append(f"{name} = {{{', '.join(f'{lw!r}: {fn}' for lw, fn in fns)}}}")
    entries = [f"    ({lw!r}, frozenset({sorted(present)!r})): {fn},"
               for present, fns in layers.items() for lw, fn, _ in fns]
    parts.append(lines + ["", "_LAYERS = {", *entries, "}"])
    return parts, tables, {k: [(fn, names) for _, fn, names in v] for k, v in layers.items()}


def generate(compiled: Compiled) -> str:
    """The converter module's source text."""
    p = compiled.program
    dims = p.dims
    chains = [c for v in compiled.variants for c in v.chains]
    if compiled.inverse_variants:
        chains += [c for v in compiled.inverse_variants for c in v.chains]
    inputs = {s.name: s for s in p.inputs}
    outputs = {s.name: s for s in p.outputs}
    params = dict(p.params)
    requires = tuple((r.library, distribution(r.library), r.op, r.version) for r in p.requires)
    assumptions = [
        f"    (None, {_dims_lambda(dims, a.dim)}, {a.multiple}, "
        f"{f'the spec assumes {a.dim} % {a.multiple} == 0 ({p.short_filename}:{a.pos.line})'!r}, None),"
        for a in p.assumptions if a.multiple > 1
    ] + [
        f"    (None, {_dims_lambda(dims, f'{a.dim} >= {a.minimum}')}, 0, "
        f"{f'the spec assumes {a.dim} >= {a.minimum} ({p.short_filename}:{a.pos.line})'!r}, None),"
        for a in p.assumptions if a.minimum > 1
    ] + [
        f"    (None, {_dims_lambda(dims, ex.to_python(a.condition))}, 0, "
        f"{f'the spec assumes {a.text} ({p.filename}:{a.pos.line})'!r}, None),"
        for a in p.size_assumptions
    ]
    doc = "\n".join([
        f"{p.name}: convert checkpoint MoE tensors into the kernel layout, and back.",
        "",
        f"Requires: {', '.join(str(r) for r in p.requires) or 'nothing'}",
        "",
        "    out = convert({'w13_weight': ..., ...})   # new tensors; inputs are never modified",
        "    back = inverse(out)                       # bit-exact round trip where INVERTIBLE",
    ])
    lines: list[str] = [
        f"# Generated by layoutc {__version__}. Do not edit: change the spec and recompile.",
        f"# Spec file: {comment(p.short_filename)} (sha256 {p.sha256[:16]}...)",
        f"# Parameters: {comment(', '.join(f'{k}={v!r}' for k, v in params.items()) or 'none')}",
        text_literal(doc),
        "",
        "import ctypes",
        "import difflib",
        "import hashlib",
        "import importlib.metadata",
        "import importlib.util",
        "import itertools",
        "import linecache",
        "import os",
        "import sys",
        "import types",
        "from fractions import Fraction",
        "",
        "import torch",
        "",
        f"SPEC_NAME = {p.name!r}",
        f"SPEC_SHA256 = {p.sha256!r}",
        f"PARAMS = {params!r}",
        f"REQUIRES = {requires!r}",
        f"DIMS = {dims!r}",
        f"INVERTIBLE = {compiled.inverse_variants is not None!r}",
        f"CHUNK_DIM = {_chunk_dim(p)!r}  # the expert axis every tensor starts with (chunked / in-place conversion)",
        f"INPUTS = {_contract(p.inputs)}",
        f"OUTPUTS = {_contract(p.outputs)}",
        "",
        "__all__ = ['convert', 'inverse', 'bind_dims', 'guard', 'provenance', 'LayoutError', 'SPEC_NAME', "
        "'SPEC_SHA256', 'PARAMS', 'REQUIRES', 'DIMS', 'INPUTS', 'OUTPUTS', 'INVERTIBLE', 'LOWERINGS']",
        "",
    ]
    # The copied run time (the same in every converter) comes last, in one marked section: a reviewer
    # reads the layout first. Nothing above runs it at import.
    # Parts of whole statements (pywrap.wrap_parts): the copied run time and the lowerings' functions recur
    # across specs, variants and parameter combinations, and are wrapped once.
    runtime = [["", "", "# " + "=" * 98,
                "# RUNTIME: copied from layoutc, the same in every converter (checks, dims, launch, guard).",
                "# Nothing below depends on the spec; the spec's own code is above.", "# " + "=" * 98]]
    for module in RUNTIME_MODULES:
        title = f"# -- {module.__name__} (copied whole) "
        runtime[-1] += ["", title + "-" * max(3, 99 - len(title)), ""]
        runtime.append([module_text(module)])
    runtime[-1] += ["", "# -- primitives (eager implementations of layoutc.lang.ops) " + "-" * 44, ""]
    for chunk in _impl_closure(f for lw in registry.lowerings() if lw.copies for f in lw.copies(chains)):
        runtime.append(["", chunk])
    lowered, passes, layers = _lowered(compiled)
    lines += [
        "",
        "# -- lowerings (layoutc.lower.registry) " + "-" * 60,
        "# Each registered lowering's code for this spec's chains: per layer (one call converts every",
        "# tensor it takes) or per tensor (a table from lowering name to a function of one tensor).",
        "# The Triton kernels are compiled on first use; each carries the statements it fuses and its map.",
        "",
    ]
    parts = [lines, *lowered]
    lines = []
    lines += [
        "",
        "# -- shapes and sizes " + "-" * 79,
        "",
        f"_INPUT_SHAPES = {_shapes(p.inputs, dims)}",
        f"_OUTPUT_SHAPES = {_shapes(p.outputs, dims)}",
        f"_INPUT_AXES = {_axes(p.inputs)}",
        f"_OUTPUT_AXES = {_axes(p.outputs)}",
        f"_CONDITIONS = {_conditions(p, dims)}",
        f"_CONVERT_CHECKS = {_checks(compiled.variants, dims, assumptions)}",
        f"_INVERSE_CHECKS = {_checks(compiled.inverse_variants or (), dims, assumptions)}",
        "",
        "",
    ]
    lines += _emit_direction(
        "convert",
        f"Checkpoint tensors -> {p.name} kernel layout (new tensors; inputs untouched).",
        compiled.variants, "INPUTS", "_INPUT_SHAPES", "_INPUT_AXES", "_CONVERT_CHECKS",
        p.inputs, dims, p.short_filename, outputs, passes, layers,
    )
    lines += ["", ""]
    if compiled.inverse_variants is not None:
        lines += _emit_direction(
            "inverse",
            f"{p.name} kernel layout -> checkpoint tensors (undoes convert; padding is cropped).",
            compiled.inverse_variants, "OUTPUTS", "_OUTPUT_SHAPES", "_OUTPUT_AXES", "_INVERSE_CHECKS",
            p.outputs, dims, p.short_filename, inputs,
        )
    else:
        lines += [
            "def inverse(tensors, dims=None):",
            f"    raise NotImplementedError({p.name + ': some transform has no inverse, so this layout cannot be undone'!r})",
        ]
    parts += [lines + ["", ""], PUBLIC_FUNCTIONS, *runtime]
    texts = ["\n".join(part) for part in parts]
    texts[-1] = texts[-1].rstrip() + "\n"  # the module's end (the last part is code, never blank)
    return pywrap.wrap_parts(texts)


PUBLIC_FUNCTIONS = [
    "def bind_dims(tensors, dims=None):",
    '    """The dims (E, I, H, ...) that converting these checkpoint tensors binds, read off their shapes',
    "    (and ``dims``, checked). Padded layouts need them to invert: their outputs hold only the",
    '    rounded-up sizes."""',
    "    given = {k: v for k, v in tensors.items() if v is not None}",
    "    return _solve_dims(given, _INPUT_AXES, dims, DIMS, 'convert', LayoutError)[0]",
    "",
    "",
    "def guard(tensors, same_call=False, dims=None, rehash=False):",
    '    """Right before the kernel: assert that these outputs (one layer) all come from this spec,',
    "    with these parameters, unmodified since conversion, with the contract's names, dtypes and shapes",
    "    (for the dims of the conversion, or ``dims``). A copy of converted tensors is fingerprinted once,",
    "    where it lies, and accepted when its bytes are those converted; later calls cost microseconds.",
    '    rehash=True fingerprints every tensor again (sees .data edits). Returns the provenance record."""',
    "    record = _guard_layer(tensors, SPEC_SHA256, PARAMS, same_call, 'guard', rehash)",
    "    _check_tensors(tensors, OUTPUTS, _OUTPUT_SHAPES, _OUTPUT_AXES, dims if dims is not None else record.get('dims'),",
    "                   DIMS, 'guard')",
    "    return record",
    "",
    "",
    "def provenance(tensor):",
    '    """The record of the converter run that produced ``tensor`` (None if it was not)."""',
    "    return _provenance(tensor)",
]
