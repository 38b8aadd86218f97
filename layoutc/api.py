"""The Python API: compile a spec once, convert many layers.

    spec = layoutc.compile_file("flashinfer_cutlass_bf16")   # a shipped spec by name, or a path
    out = spec.convert({"w13_weight": w13, ...})
    back = spec.inverse(out)

A compiled spec is cached on its identity (spec text, imported files, prelude, parameters),
like an einops recipe.
Its ``convert``/``inverse`` are those of the generated converter module (loaded
in memory), so the API and ``layoutc compile`` output behave identically.
"""

from __future__ import annotations

import collections
import functools
import linecache
import threading
import types
from pathlib import Path
from typing import Any, Mapping

import torch

from .lower import codegen, memo
from .front import progress
from .lower import registry
from .lang.compiler import Compiled, build
from .front.errors import Diagnostic, SpecError
from .algebra.indexmap import IndexMap
from .lang.ir import Program
from .lang.resolver import resolve
from .runtime.checks import LayoutError
from .front.parse import parse
from .front.source import read_spec
from .verify.rules import verify
from .lang.versions import check_requires


class CompiledSpec:
    """A checked spec with its converter. Build with :func:`compile_file` / :func:`compile_source`."""

    def __init__(self, compiled: Compiled, warnings: tuple[Diagnostic, ...]):
        self.compiled = compiled
        self.warnings = warnings
        self.source = codegen.generate(compiled)
        self.module = _load_module(self.source, compiled.program)

    @property
    def program(self) -> Program:
        return self.compiled.program

    @functools.cached_property
    def coverage(self):
        """(per-tensor coverage, warnings): what the verifier proved and what the spec leaves unchecked
        (:mod:`layoutc.verify.coverage`)."""
        from .verify.coverage import coverage

        return coverage(self.compiled)

    @property
    def name(self) -> str:
        return self.program.name

    @property
    def sha256(self) -> str:
        return self.program.sha256

    @property
    def params(self) -> dict[str, Any]:
        return self.program.param_values

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.program.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.program.outputs)

    @property
    def invertible(self) -> bool:
        return self.compiled.inverse_variants is not None

    def convert(
        self, tensors: Mapping[str, torch.Tensor], dims: Mapping[str, int] | None = None, lowering: str = "auto",
        chunk: int | None = None, inplace: bool = False, fingerprint: bool = True,
        out: Mapping[str, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Checkpoint tensors -> kernel layout. Inputs are never modified unless ``inplace``.

        ``lowering``: "auto" (the first registered lowering that runs on the tensors' device:
        generated Triton kernels on CUDA, torch gathers on the CPU) or a name from
        :func:`layoutc.lower.registry.names` ("eager": op by op, the reference). ``chunk=k``
        converts k experts at a time; ``inplace=True`` reuses the inputs' memory where the bytes
        per expert match. ``fingerprint=False`` skips fingerprinting the outputs' bytes (about a read of
        them on their device): the guard then accepts the outputs themselves but no copy of them.
        ``out={name: tensor}`` writes the outputs into the caller's tensors and returns those (no
        allocation; see the README, "Converting into your own buffers")."""
        first = lowering == "compiled" and self._first_compiled_call(tensors)
        try:
            if first:  # torch.compile on the first call for these shapes: tens of seconds, said while it runs
                with progress.working(f"{self.name}: torch.compile (first call for these shapes)"):
                    return self.module.convert(tensors, dims, lowering, chunk, inplace, fingerprint, out)
            return self.module.convert(tensors, dims, lowering, chunk, inplace, fingerprint, out)
        except self.module.LayoutError as err:
            raise LayoutError(str(err)) from None

    def _first_compiled_call(self, tensors: Mapping[str, torch.Tensor]) -> bool:
        try:
            key = tuple((k, tuple(t.shape), t.dtype, t.device.type) for k, t in tensors.items() if t is not None)
        except AttributeError:  # not tensors: the converter says what is wrong
            return False
        seen = self.__dict__.setdefault("_compiled_shapes", set())
        if key in seen:
            return False
        seen.add(key)
        return True

    def dims_of(self, tensors: Mapping[str, torch.Tensor | None]) -> dict[str, int]:
        """The dims (E, I, H, ...) that converting these checkpoint tensors binds. Padded layouts
        need them to invert: their outputs hold only the rounded-up sizes."""
        m = self.module
        try:
            return m.bind_dims(tensors)
        except m.LayoutError as err:
            raise LayoutError(str(err)) from None

    def inverse(self, tensors: Mapping[str, torch.Tensor], dims: Mapping[str, int] | None = None) -> dict[str, torch.Tensor]:
        """Kernel layout -> checkpoint tensors (where the spec is invertible)."""
        try:
            return self.module.inverse(tensors, dims)
        except self.module.LayoutError as err:
            raise LayoutError(str(err)) from None

    def composed_map(self, tensor: str, present: tuple[str, ...] = ()) -> IndexMap:
        """The whole chain of ``tensor`` as one index map (for the variant with ``present`` optionals)."""
        return self.compiled.variant(present).chain(tensor).composed_map()

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.source)
        return path

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"<CompiledSpec {self.name} ({params}) sha256={self.sha256[:12]}>"


def _load_module(source: str, program: Program) -> types.ModuleType:
    name = f"layoutc_generated_{program.name}_{program.sha256[:8]}"
    filename = f"<layoutc {program.filename}>"
    module = types.ModuleType(name)
    module.__file__ = filename
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


#: Compiled specs by identity (layoutc.lang.identity: spec text, imported files, prelude, parameters), the
#: name they were compiled under, and the options: a changed imported file is a new entry, never a hit.
_CACHE: "collections.OrderedDict[tuple, CompiledSpec]" = collections.OrderedDict()
_CACHE_SIZE = 64
_CACHE_LOCK = threading.Lock()


@functools.lru_cache(maxsize=64)
def _parsed(source: str, filename: str):
    return parse(source, filename)


def clear_cache() -> None:
    """Forget every compiled spec (a compile's warnings, such as a missing library, are part of it)."""
    with _CACHE_LOCK:
        _CACHE.clear()
    _parsed.cache_clear()
    memo.clear()  # code written per distinct chain


def _compile(program: Program, check_versions: bool, verify_spec: bool) -> CompiledSpec:
    filename, source = program.filename, program.source
    warnings: tuple[Diagnostic, ...] = ()
    if check_versions:
        version_diags = check_requires(program)
        errors = [d for d in version_diags if d.severity == "error"]
        if errors:
            raise SpecError(version_diags, filename, source)
        warnings = tuple(version_diags)
    compiled = build(program)
    findings = verify(compiled) if verify_spec else []
    if findings:
        raise SpecError(findings, filename, source)
    return CompiledSpec(compiled, warnings)


def compile_source(
    source: str, filename: str = "<spec>", params: Mapping[str, Any] | None = None, check_versions: bool = True,
    verify_spec: bool = True, tree: Any = None,
) -> CompiledSpec:
    """Compile spec text. Raises :class:`SpecError` listing every problem found.

    ``verify_spec=False`` skips the sync/contract verifier (review tools use it to compare a spec
    that fails verification; never convert weights with such a spec). Imports are read from
    ``tree`` (:mod:`layoutc.front.tree`; by default the folder of ``filename``), afresh on every call:
    the cache is keyed on the spec's identity, which holds their content."""
    program = resolve(_parsed(source, filename), dict(params or {}), tree)
    key = (program.sha256, filename, check_versions, verify_spec,
           registry.signature())  # a newly registered lowering gets new modules
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
    compiled = _compile(program, check_versions, verify_spec)
    with _CACHE_LOCK:
        _CACHE[key] = compiled
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return compiled


def compile_file(
    path: str | Path, params: Mapping[str, Any] | None = None, check_versions: bool = True
) -> CompiledSpec:
    """Compile a ``.lyt`` file, or a shipped spec by name (``compile_file("flashinfer_cutlass_bf16")``;
    see :func:`layoutc.shipped.locate`). See :func:`compile_source`."""
    from .shipped import locate

    path = locate(path)
    return compile_source(read_spec(path), str(path), params, check_versions)
