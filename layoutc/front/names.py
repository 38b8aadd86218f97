"""Which names from a spec may become identifiers in generated code.

Dims are the only spec names that generated converters use as Python identifiers (locals and
parameters holding sizes: ``2*I`` reads better than ``d['I']*2``); every other name from a
spec (tensors, parameters, the spec's own name) reaches generated code as a ``repr()`` literal,
except that tensor names also form the middle of generated function names (``_gather_<tensor>_3``,
``_b_<tensor>_0``): a prefix and a numbered suffix make those unique and unable to shadow anything.
The grammar already limits names to ``[A-Za-z_][A-Za-z0-9_]*``; a dim must also not shadow
a Python keyword or builtin, a name the generated module or its kernels use, or the index-map
coordinate variables ``o0, o1, ...``.

The names are of two kinds. The code generator's own (:data:`CODEGEN`: the modules, locals and kernel
arguments its emitters and the copied runtime write) are listed here. The eager function of every op
is not: each op class declares it (``Op.eager``) and :func:`layoutc.lang.ops.generated_names` adds
them from the registry, so a new op reserves its function's name by being registered.
``tests/security`` generates converters for every shipped spec and checks that every identifier they
use is reserved (or is a dim), so a new local in the code generator cannot silently become shadowable.
"""

from __future__ import annotations

import builtins
import keyword
import re

#: Identifiers the code generator writes into converter modules, their Triton kernels and the
#: runtime functions copied into them (module names, functions, locals, kernel arguments); the ops'
#: eager functions are the registry's (:func:`layoutc.lang.ops.generated_names`).
CODEGEN = frozenset("""
    torch triton tl importlib itertools linecache sys types Fraction math
    tensors dims lowering chunk inplace d present how out outs x y xs ys kernels total wide grid n
    start stop step flat zero src ok v r w byte compiled part full same_bytes name
    pid offs mask rows cols live inside j s p0 p1 BLOCK WIDE BR BC x_ptr y_ptr n_rows n_cols bc br
    t record tensor convert inverse guard provenance
    LayoutError SPEC_NAME SPEC_SHA256 PARAMS REQUIRES DIMS INVERTIBLE CHUNK_DIM INPUTS OUTPUTS
    words halves high low runs src_words index whole unread
""".split())

#: Numbered locals: index-map coordinates o0, o1, ... and the kernels' byte and word temporaries.
_NUMBERED = re.compile(r"(?:[obp]|ok)[0-9]+")
_SAFE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def identifier_problem(name: str, generated: frozenset[str] = CODEGEN) -> str | None:
    """Why ``name`` cannot be a dim (a sentence), or None when it can; ``generated`` is every name
    generated converters use (:func:`layoutc.lang.ops.generated_names`: this module's and the ops')."""
    if not _SAFE.fullmatch(name):
        return "dim names start with a letter and hold letters, digits and '_'"
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return f"{name!r} is a Python keyword"
    if name in dir(builtins):
        return f"{name!r} is a Python builtin, which generated converters use"
    if name in generated:
        return f"{name!r} is a name generated converters use"
    if _NUMBERED.fullmatch(name):
        return f"{name!r} is the name of an index-map coordinate or a kernel temporary (o0, b0, p0, ...)"
    return None
