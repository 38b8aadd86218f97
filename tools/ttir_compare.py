"""Compare the Triton IR of two versions of generated converters (no GPU needed).

``python tools/ttir_compare.py BEFORE_DIR AFTER_DIR``: each directory holds generated converter
modules of the same names (``layoutc compile spec.lyt -o DIR/name.py``). Every kernel body of each
module is lowered to TTIR for the CUDA target (sm_90) at fixed dims, for every walk flag and pointer
type, and the IR after Triton's TTIR passes (inlining, canonicalisation, CSE) is compared with
locations stripped, as the multiset of its operations (operation, predicate, constant operands
and result type; SSA names and program order aside, as a named term is computed before its
first use). Equal multisets mean the kernels do the same arithmetic: a change of how the kernel
source is written (named terms, wrapped lines) does not change their work.
"""

from __future__ import annotations

import linecache
import re
import sys
from collections import Counter
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler.compiler import ASTSource
from triton._C.libtriton import ir

TARGET = GPUTarget("cuda", 90, 32)
POINTERS = ("*u8", "*i16", "*i32", "*i64", "*bf16", "*fp32")


def _kernels(path: Path) -> dict:
    text = path.read_text()
    source = re.search(r'^_TRITON_SOURCE = ("""|\'\'\')\n(.*?)^\1', text, flags=re.S | re.M).group(2)
    filename = f"{path}.triton"
    namespace = {"triton": triton, "tl": tl, "__name__": filename}
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # for Triton's getsource
    exec(compile(source, filename, "exec"), namespace)
    return {k: v for k, v in namespace.items() if k.startswith("_b_")}


def ttir(fn, pointer: str, dims: dict, alt: bool, wide: bool = False) -> str:
    """The TTIR of one tensor's body compiled as a kernel (x and y of type ``pointer``)."""
    signature, constexprs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in ("x_ptr", "y_ptr"):
            signature[name] = pointer
        elif name == "pid":
            signature[name] = "i32"
        else:
            signature[name] = "constexpr"
            constexprs[(i,)] = {"WIDE": wide, "_ALT": alt, "_T": 64, "_ASM": False}.get(name, dims.get(name))
    src = ASTSource(fn, signature, constexprs)
    backend = CUDABackend(TARGET)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(TARGET, options, backend.get_codegen_implementation(options), backend.get_module_map(),
                         context)
    stages = {}
    backend.add_stages(stages, options, src.language)
    out = stages["ttir"](module, {})
    return re.sub(r"\s*loc\(.*?\)$|^#loc.*$", "", str(out), flags=re.M)


def operations(text: str) -> Counter:
    """Each operation of the IR without SSA names: constants by value, others by kind and types."""
    consts = {}
    ops = Counter()
    for line in text.splitlines():
        m = re.match(r"\s*(%[\w.]+)(?::\d+)? = (.*)$", line)
        if m is None:
            if line.strip().startswith(("tt.", "scf.")):
                ops[re.sub(r"%[\w.]+", "%", line.strip())] += 1
            continue
        name, rest = m.groups()
        if rest.startswith("arith.constant"):
            consts[name] = rest
            ops[rest] += 1
            continue
        rest = re.sub(r"%[\w.]+", lambda k: f"<{consts[k.group(0)]}>" if k.group(0) in consts else "%", rest)
        ops[rest] += 1
    return ops


def main(before: Path, after: Path, dims: dict) -> int:
    bad = 0
    for path in sorted(before.glob("*.py")):
        a, b = _kernels(path), _kernels(after / path.name)
        for name in a:
            for pointer in POINTERS:
                for alt in (False, True):
                    for wide in (False,) if pointer != "*u8" else (False, True):
                        try:
                            x = ttir(a[name], pointer, dims, alt, wide)
                        except Exception as err:  # a pointer type this kernel's walks do not take
                            x = f"error {type(err).__name__}"
                        try:
                            y = ttir(b[name], pointer, dims, alt, wide)
                        except Exception as err:
                            y = f"error {type(err).__name__}"
                        same = x == y or operations(x) == operations(y)
                        bad += not same
                        status = "same" if same else "DIFFERENT"
                        kind = "ir" if not x.startswith("error") else x
                        print(f"{path.stem} {name} {pointer} alt={alt} wide={wide}: {status} ({kind})", flush=True)
    return bad


if __name__ == "__main__":
    sys.exit(1 if main(Path(sys.argv[1]), Path(sys.argv[2]), {"E": 2, "I": 256, "H": 512}) else 0)
