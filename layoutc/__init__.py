"""layoutc: MoE weight layouts as declarative specs, verified index maps and generated converters."""

from ._version import __version__

# The public names load on first use (PEP 562), so that importing one low-level module
# (layoutc.algebra.expr, layoutc.algebra.indexmap) does not import the whole compiler.
_PUBLIC = {
    "CompiledSpec": "api", "compile_file": "api", "compile_source": "api",
    "Diagnostic": "front.errors", "SpecError": "front.errors", "LayoutError": "runtime.checks",
}

__all__ = [*_PUBLIC, "__version__"]


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        value = getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
