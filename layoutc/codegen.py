"""Standalone converter modules: readable Python that depends on torch alone.

The module a spec compiles to exposes::

    convert(tensors, dims=None) -> dict[str, Tensor]   checkpoint layout -> kernel layout
    inverse(tensors, dims=None) -> dict[str, Tensor]   kernel layout -> checkpoint layout
    SPEC_NAME, SPEC_SHA256, PARAMS, REQUIRES, DIMS, INPUTS, OUTPUTS, INVERTIBLE
    LayoutError                                         raised for tensors that break the contract

The functions it calls are copied from the ops' eager implementations
(:mod:`layoutc.ops.torch_impl`, or an op's own module) and :mod:`layoutc.lower.runtime`
(the contract checks), so the
module runs where layoutc is not installed. ``layoutc.compile_file`` loads the
same text in memory: the Python API and the generated file are one code path.
"""

from __future__ import annotations

import dis
import inspect
import textwrap
from typing import Any, Callable, Iterable

from ._version import __version__
from . import expr as ex
from .compiler import Chain, Compiled, Constraint, Variant
from .ir import TensorSpec
from .lower import eager, fused, guard_rt, runtime
from .text import comment
from .versions import distribution

RUNTIME_NAMES = (
    "LayoutError",
    "_convert_in_chunks",
    "_triton_kernels",
    "_choose_lowering",
    "_compiled",
    "_aligned",
    "_fmt_dims",
    "_fmt_shape",
    "_check_outputs",
    "_widened",
    "_bind_dims",
    "_check_tensors",
    "_check_divisibility",
    "_holding",
    "_owned",
    "_version_ok",
    "_check_requires",
)


GUARD_NAMES = ("_provenance_registry", "_installed", "_stamp", "_provenance", "_guard_layer")


def text_literal(text: str) -> str:
    """A Python literal for ``text``: a triple-quoted block where that denotes exactly ``text``
    (readable multi-line code and docs), else ``repr(text)``. Either way nothing in ``text`` can
    end the literal: text from a spec or a file name is data, never code."""
    block = all(c.isprintable() or c == "\n" for c in text) and "\\" not in text and '"' not in text
    return f'"""{text}"""' if block else repr(text)


def _source_of(obj: Any) -> str:
    return textwrap.dedent(inspect.getsource(obj)).rstrip() + "\n"


#: Module-level values an eager function may read besides functions: copied as literals.
_LITERALS = (int, float, str, bool, tuple, frozenset, type(None))


def _impl_closure(functions: Iterable[Callable[..., Any]]) -> list[str]:
    """Sources of the eager functions used (each op's ``impl``: in :mod:`layoutc.ops.torch_impl` or
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
    lines = ["["]
    for s in specs:
        for axis, (e, text) in enumerate(zip(s.shape, s.shape_text)):
            form = ex.linear_form(e)
            if form is None or not form[0]:
                continue
            coefs = {k: (v.numerator, v.denominator) for k, v in form[0].items()}
            const = (form[1].numerator, form[1].denominator)
            lines.append(f"    ({s.name!r}, {axis}, {coefs!r}, {const!r}, {text!r}),")
    lines.append("]")
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
        lines.append(
            f"    ({tensor!r}, {_dims_lambda(dims, ex.to_python(value))}, {multiple}, {message!r}, {scope_src}),"
        )
    lines.append("]")
    return "\n".join(lines)


def _emit_direction(
    fn_name: str, doc: str, variants: tuple[Variant, ...], contract: str, shapes: str, axes: str, checks: str,
    tensors: Iterable[TensorSpec], dims: tuple[str, ...], filename: str, out_specs: dict[str, TensorSpec],
    fused_names: dict | None = None,
) -> list[str]:
    lowered = fn_name == "convert"
    if lowered:
        body = [
            "def convert(tensors, dims=None, lowering='auto', chunk=None, inplace=False):",
            textwrap.indent(f'"""{doc}', "    "),
            "",
            "    lowering: 'auto' (generated Triton kernels on CUDA, one torch gather per tensor on the CPU),",
            "    'fused', 'gather' or 'eager' (op by op, the reference). chunk=k converts k experts at a",
            "    time (bounds the eager lowering's temporaries). inplace=True writes each output whose",
            "    bytes per expert equal its input's into the input's memory, one expert at a time, and",
            "    returns views of it: the inputs are overwritten, peak extra memory is about one expert.",
            '    """',
            "    _check_requires(REQUIRES, SPEC_NAME)",
            f"    d, present = _check_tensors(tensors, {contract}, {shapes}, {axes}, dims, DIMS, 'convert')",
            f"    tensors = _widened(tensors, {contract})  # inputs declared 'accepts T': exact conversion first",
            "    present = present | _holding(_CONDITIONS, d)  # size conditions ('if I > 128') choose branches too",
            f"    _check_divisibility({checks}, d, {{k for k in tensors if tensors[k] is not None}}, present)",
            "    how = _choose_lowering(lowering, tensors)",
            "    # Plain tensors out whatever the caller's mode (inference_mode, requires_grad inputs): no autograd",
            "    # graph, and version counters the guard can read.",
            "    with torch.inference_mode(False), torch.no_grad():",
            "        if chunk is None and not inplace:",
            "            out = _convert(tensors, d, present, how)",
            "        else:",
            "            out = _convert_in_chunks(_convert, tensors, d, present, how, 1 if chunk is None else chunk, inplace, _OUTPUT_SHAPES, CHUNK_DIM)",
            "        _check_outputs(out, _OUTPUT_SHAPES, d, 'convert')",
            "        _stamp(out, SPEC_NAME, SPEC_SHA256, PARAMS, REQUIRES, d)",
            "    return out",
            "",
            "",
            "def _convert(tensors, d, present, how):",
            "    # One call over the given tensors (all experts, or one chunk of them).",
        ]
    else:
        body = [
            f"def {fn_name}(tensors, dims=None):",
            textwrap.indent(f'"""{doc}"""', "    "),
            "    _check_requires(REQUIRES, SPEC_NAME)",
            f"    d, present = _check_tensors(tensors, {contract}, {shapes}, {axes}, dims, DIMS, {fn_name!r})",
            "    present = present | _holding(_CONDITIONS, d)",
            f"    _check_divisibility({checks}, d, {{k for k in tensors if tensors[k] is not None}}, present)",
            "    with torch.inference_mode(False), torch.no_grad():",
            "        return _inverse(tensors, d, present)",
            "",
            "",
            "def _inverse(tensors, d, present):",
        ]
    if dims:
        body.append(f"    {', '.join(dims)} = {', '.join(f'd[{n!r}]' for n in dims)}")
    if lowered:
        body.append("    kernels = _triton_kernels(_TRITON_SOURCE, _TRITON_FILE) if how == 'fused' else None")
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
        if spec.optional:
            body.append(f"    if {spec.name!r} in present:")
            indent = "        "
        for i, (chain, presents) in enumerate(groups.values()):
            inner = indent
            if len(groups) > 1:
                cond = " or ".join(f"present == frozenset({sorted(p)!r})" for p in presents)
                body.append(f"{indent}{'if' if i == 0 else 'elif'} {cond}:")
                inner = indent + "    "
            body.append(f"{inner}x = tensors[{spec.name!r}]")
            if len(spec.elem.accepts) > 1:  # same bits under another torch dtype: work on the canonical one
                body.append(f"{inner}x = x.view(torch.{spec.elem.canonical})")
            if lowered and fused_names is not None and chain.steps and chain.signature() in fused_names:
                launch, gather_fn = fused_names[chain.signature()]
                body.append(f"{inner}if how == 'fused':")
                body.append(f"{inner}    x = {launch}(x, d, kernels)")
                body.append(f"{inner}elif how in ('gather', 'compiled'):")
                body.append(f"{inner}    x = {gather_fn}(x, {', '.join(dims)}, compiled=how == 'compiled')")
                body.append(f"{inner}else:")
                body += [inner + "    " + line for line in eager.emit_chain(chain, filename) or ["pass"]]
            else:
                body += [inner + line for line in eager.emit_chain(chain, filename)]
            body.append(f"{inner}out[{spec.name!r}] = _owned(x, tensors)")
    body.append("    return out")
    return body


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
        f"{f'the spec assumes {a.dim} % {a.multiple} == 0 ({p.filename}:{a.pos.line})'!r}, None),"
        for a in p.assumptions if a.multiple > 1
    ] + [
        f"    (None, {_dims_lambda(dims, f'{a.dim} >= {a.minimum}')}, 0, "
        f"{f'the spec assumes {a.dim} >= {a.minimum} ({p.filename}:{a.pos.line})'!r}, None),"
        for a in p.assumptions if a.minimum > 1
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
        f"# Spec file: {comment(p.filename)} (sha256 {p.sha256[:16]}...)",
        f"# Parameters: {comment(', '.join(f'{k}={v!r}' for k, v in params.items()) or 'none')}",
        text_literal(doc),
        "",
        "import importlib.metadata",
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
        "__all__ = ['convert', 'inverse', 'guard', 'provenance', 'LayoutError', 'SPEC_NAME', 'SPEC_SHA256', "
        "'PARAMS', 'REQUIRES', 'DIMS', 'INPUTS', 'OUTPUTS', 'INVERTIBLE']",
        "",
        "",
        "# -- contract checks (layoutc.lower.runtime) " + "-" * 40,
        "",
        "_REQUIRES_CHECKED = []",
        "_KERNELS = {}",
        "_COMPILE_ABOVE_BYTES = 1 << 28  # auto on the CPU: compiled gathers for layers above 256 MiB",
        "",
    ]
    for name in RUNTIME_NAMES:
        lines.append("")
        lines.append(_source_of(getattr(runtime, name)))
    lines += ["", "# -- provenance and the pre-kernel guard (layoutc.lower.guard_rt) " + "-" * 17, ""]
    for name in GUARD_NAMES:
        lines.append("")
        lines.append(_source_of(getattr(guard_rt, name)))
    lines += ["", "# -- primitives (eager implementations of layoutc.ops) " + "-" * 28, ""]
    for chunk in _impl_closure(eager.functions_used(chains)):
        lines.append("")
        lines.append(chunk)
    plans: dict[tuple, tuple[str, str]] = {}
    kernel_sources, fused_defs = [], []
    for v in compiled.variants:
        for c in v.chains:
            if c.signature() in plans:
                continue
            pl = fused.plan(c)
            if not pl.is_fused:
                continue
            tag = f"{c.tensor}_{len(plans)}"
            kernel_sources.append(fused.triton_kernel(pl, f"_k_{tag}", dims))
            fused_defs.append(fused.launcher(pl, f"_fused_{tag}", f"_k_{tag}", dims))
            fused_defs.append(fused.torch_function(pl, f"_gather_{tag}", dims))
            plans[c.signature()] = (f"_fused_{tag}", f"_gather_{tag}")
    kernel_text = "\n\n".join(kernel_sources)
    lines += [
        "",
        "# -- fused lowering (layoutc.lower.fused): one pass per tensor " + "-" * 20,
        "# On CUDA, the Triton kernels below (compiled on first use); on the CPU, one torch",
        "# gather per tensor computed from the same composed index maps.",
        "",
        f"_TRITON_FILE = {f'<layoutc triton kernels of {p.name}>'!r}",
        f"_TRITON_SOURCE = {text_literal(chr(10) + kernel_text)}",
        "",
    ]
    for chunk in fused_defs:
        lines.append("")
        lines.append(chunk)
    lines += [
        "",
        "# -- shapes and sizes " + "-" * 62,
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
        p.inputs, dims, p.filename, outputs, plans,
    )
    lines += ["", ""]
    if compiled.inverse_variants is not None:
        lines += _emit_direction(
            "inverse",
            f"{p.name} kernel layout -> checkpoint tensors (undoes convert; padding is cropped).",
            compiled.inverse_variants, "OUTPUTS", "_OUTPUT_SHAPES", "_OUTPUT_AXES", "_INVERSE_CHECKS",
            p.outputs, dims, p.filename, inputs,
        )
    else:
        lines += [
            "def inverse(tensors, dims=None):",
            f"    raise NotImplementedError({p.name + ': some transform has no inverse, so this layout cannot be undone'!r})",
        ]
    lines += ["", "", *GUARD_FUNCTIONS]
    return "\n".join(lines).rstrip() + "\n"


GUARD_FUNCTIONS = [
    "def guard(tensors, same_call=False):",
    '    """Right before the kernel: assert that these outputs (one layer) all come from this spec,',
    "    with these parameters, unmodified since conversion, with the contract's names, dtypes and shapes.",
    '    Returns the provenance record. Costs microseconds (no device work)."""',
    "    record = _guard_layer(tensors, SPEC_SHA256, PARAMS, same_call, 'guard')",
    "    _check_tensors(tensors, OUTPUTS, _OUTPUT_SHAPES, _OUTPUT_AXES, None, DIMS, 'guard')",
    "    return record",
    "",
    "",
    "def provenance(tensor):",
    '    """The record of the converter run that produced ``tensor`` (None if it was not)."""',
    "    return _provenance(tensor)",
]
