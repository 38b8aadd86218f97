"""Generated converter modules: standalone (torch + standard library), self-describing, and the
same code path as the in-memory API."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import layoutc
from layoutc.lang.families import prelude_sha256
from layoutc.lang.identity import spec_identity
from tests.helpers import ROOT, SPECS, bits

SPEC = SPECS / "flashinfer_cutlass_bf16.lyt"
DIMS = {"E": 2, "I": 128, "H": 256}
ALLOWED_TOP_LEVEL = set(sys.stdlib_module_names) | {"torch"}




def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """``layoutc compile specs/flashinfer_cutlass_bf16.lyt -o X.py``, in process (test_cli.py runs the
    console script in a subprocess; here the compiled spec is shared with the API's cache)."""
    from click.testing import CliRunner

    from layoutc.cli.main import main

    out = tmp_path_factory.mktemp("gen") / "bf16_converter.py"
    result = CliRunner().invoke(main, ["compile", str(SPEC), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert out.exists()
    return out


@pytest.fixture(scope="module")
def module(written):
    return _load(written, "bf16_converter_under_test")


@pytest.fixture(scope="module")
def compiled():
    return layoutc.compile_file(SPEC)


def _imports(tree: ast.AST):
    """(module name, node, enclosing Try or None, enclosing function or None) for every import statement."""
    out = []

    def visit(node, try_node, fn):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                out.extend((alias.name, child, try_node, fn) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                assert child.level == 0, "relative import in a standalone module"
                out.append((child.module, child, try_node, fn))
            visit(child, child if isinstance(child, ast.Try) else try_node,
                  child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn)

    visit(tree, None, None)
    return out


def test_written_module_imports_only_torch_and_the_standard_library(written):
    source = written.read_text()
    tree = ast.parse(source)
    imports = _imports(tree)
    assert imports, "no imports at all?"
    assert any(name == "torch" and fn is None for name, _, _, fn in imports)
    for name, node, try_node, fn in imports:
        assert "layoutc" not in ast.unparse(node), f"imports layoutc: {ast.unparse(node)}"
        if name.split(".")[0] in ALLOWED_TOP_LEVEL:
            continue
        # Anything else may only be an optional, lazy extra: imported inside a function and
        # guarded by 'except ImportError' (the module must work where it is not installed; the
        # subprocess test below blocks these imports and converts).
        assert fn is not None, f"module-level import of {name}: {ast.unparse(node)}"
        assert try_node is not None, f"unguarded import of {name}: {ast.unparse(node)}"
        handlers = [h for h in try_node.handlers if h.type is not None and "ImportError" in ast.unparse(h.type)]
        assert handlers, f"import of {name} is not guarded by 'except ImportError'"
    # No dynamic imports either.
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            fn_name = ast.unparse(node.func)
            assert fn_name not in ("__import__", "importlib.import_module"), ast.unparse(node)
    assert "layoutc" not in "\n".join(line for line in source.splitlines() if "import" in line)


def test_written_module_describes_itself(module, written, compiled):
    assert callable(module.convert) and callable(module.inverse)
    assert module.SPEC_NAME == "flashinfer_cutlass_bf16"
    # the spec's identity: its text, imports (none), layoutc's prelude and the parameters
    assert module.SPEC_SHA256 == spec_identity(hashlib.sha256(SPEC.read_bytes()).hexdigest(), [],
                                               prelude_sha256(), module.PARAMS)
    assert module.INVERTIBLE is True
    assert module.PARAMS == {"tp_rank": 0, "tp_size": 1}
    assert module.DIMS == ("E", "I", "H")
    assert ("flashinfer", "flashinfer-python", ">=", "0.6.16") in module.REQUIRES
    p = compiled.program
    assert list(module.INPUTS) == [t.name for t in p.inputs]
    assert list(module.OUTPUTS) == [t.name for t in p.outputs]
    for table, specs in ((module.INPUTS, p.inputs), (module.OUTPUTS, p.outputs)):
        for t in specs:
            entry = table[t.name]
            assert entry["dtype"] == t.elem.name
            assert tuple(entry["shape"]) == t.shape_text
            assert entry["optional"] == t.optional
    assert module.INPUTS["w13_weight"]["dtype"] == "fp4x2"
    assert module.INPUTS["w13_weight"]["shape"] == ("E", "2*I", "H/2")
    assert module.INPUTS["w13_bias"]["optional"] is True
    assert module.OUTPUTS["w13_weight_scale"]["shape"] == ("E", "I/32", "H/128", "16", "16")  # tp_size resolved
    assert module.OUTPUTS["w13_bias"]["dtype"] == "bf16"
    assert issubclass(module.LayoutError, ValueError)
    assert set(module.__all__) >= {"convert", "inverse", "SPEC_NAME", "SPEC_SHA256", "INPUTS", "OUTPUTS", "INVERTIBLE"}


def test_written_file_is_the_api_source(written, compiled):
    assert written.read_text() == compiled.source
    assert compiled.module.SPEC_SHA256 == compiled.sha256 == spec_identity(
        hashlib.sha256(SPEC.read_bytes()).hexdigest(), [], prelude_sha256(), compiled.params)


@pytest.mark.parametrize("biases", [(), ("w13_bias",), ("w13_bias", "w2_bias")], ids=["none", "w13", "both"])
def test_written_module_converts_like_the_api(module, compiled, synthetic_inputs, biases):
    drop = [b for b in ("w13_bias", "w2_bias") if b not in biases]
    x = synthetic_inputs(compiled, DIMS, seed=1, drop=drop)
    got = module.convert(x)
    ref = compiled.convert(x)
    assert set(got) == set(ref) == set(x)
    for k in ref:
        assert got[k].dtype == ref[k].dtype and got[k].shape == ref[k].shape
        assert torch.equal(bits(got[k]), bits(ref[k])), k
    back = module.inverse(got)
    for k in x:
        assert torch.equal(bits(back[k]), bits(x[k])), k


def test_written_module_raises_its_own_layout_error(module, compiled, synthetic_inputs):
    x = synthetic_inputs(compiled, DIMS)
    del x["w2_weight"]
    with pytest.raises(module.LayoutError, match="missing tensor 'w2_weight'"):
        module.convert(x)
    with pytest.raises(ValueError):
        module.convert(x)


def test_written_module_runs_without_layoutc(written, compiled, synthetic_inputs, tmp_path):
    """Run the file in a fresh interpreter where layoutc (and its dependencies) cannot be imported."""
    x = synthetic_inputs(compiled, DIMS, seed=2)
    torch.save(x, tmp_path / "in.pt")
    script = textwrap.dedent(f"""
        import importlib.abc, importlib.util, sys
        BLOCKED = {{"layoutc", "lark", "click", "attrs", "packaging", "hypothesis", "triton"}}
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError("blocked for this test: " + name)
        sys.meta_path.insert(0, Block())
        for name in list(sys.modules):
            if name.split(".")[0] in BLOCKED:
                del sys.modules[name]
        import torch
        spec = importlib.util.spec_from_file_location("standalone", {str(written)!r})
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        x = torch.load({str(tmp_path / "in.pt")!r})
        out = m.convert(x)
        back = m.inverse(out)
        torch.save({{"out": out, "back": back}}, {str(tmp_path / "out.pt")!r})
        loaded = sorted(n for n in sys.modules if n.split(".")[0] in BLOCKED)
        print("LOADED", loaded)
    """)
    proc = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "LOADED []" in proc.stdout
    result = torch.load(tmp_path / "out.pt")
    ref = compiled.convert(x)
    for k in ref:
        assert torch.equal(bits(result["out"][k]), bits(ref[k])), k
        assert torch.equal(bits(result["back"][k]), bits(x[k])), k


def test_generated_code_cites_every_statement(compiled):
    p = compiled.program
    acting = {s.statement.pos for v in compiled.compiled.variants for c in v.chains for s in c.steps}
    for st in p.statements:
        if st.pos in acting:  # identities (one TP rank of one) leave no code to cite
            assert f"{p.short_filename}:{st.pos.line}: {st.text}" in compiled.source, st.text
    assert any(st.pos not in acting and st.op == "shard" for st in p.statements)
    sharded = layoutc.compile_file(p.filename, {"tp_size": 2})
    assert "shard(" in sharded.source
    compile(compiled.source, "generated.py", "exec")


@pytest.mark.parametrize(
    "path, params",
    [
        ("flashinfer_cutlass_mxfp8.lyt", {}),
        ("flashinfer_cutedsl_nvfp4.lyt", {"activation": "silu"}),
        ("flashinfer_cutedsl_nvfp4.lyt", {"activation": "relu2"}),
        ("flashinfer_cutedsl_nvfp4.lyt", {"activation": "silu", "tp_size": 2, "tp_rank": 1}),
        ("flashinfer_cutlass_bf16.lyt", {"tp_size": 2, "tp_rank": 0}),
    ],
)
def test_every_shipped_spec_generates_a_standalone_module(path, params, tmp_path, synthetic_inputs):
    spec = layoutc.compile_file(ROOT / "specs" / path, params)
    target = spec.write(tmp_path / "conv.py")
    module = _load(target, f"gen_{path[:-4]}_{'_'.join(map(str, params.values()))}")
    assert module.PARAMS == spec.params and params.items() <= module.PARAMS.items()
    assert module.SPEC_SHA256 == spec_identity(hashlib.sha256((ROOT / "specs" / path).read_bytes()).hexdigest(), [],
                                               prelude_sha256(), spec.params)
    for name, _, _, _ in _imports(ast.parse(target.read_text())):
        assert "layoutc" not in name
    x = synthetic_inputs(spec, DIMS if params.get("tp_size", 1) == 1 else {**DIMS, "I": 256})  # local I % 128
    got, ref = module.convert(x), spec.convert(x)
    for k in ref:
        assert torch.equal(bits(got[k]), bits(ref[k])), k


def test_non_invertible_spec(compile_text):
    spec = compile_text("dims E\ninput w : f32[E, 8]\ncrop(w, 1, size=4)\noutput w : f32[E, 4]\n")
    assert spec.module.INVERTIBLE is False and not spec.invertible
    w = torch.arange(16.0).reshape(2, 8)
    assert torch.equal(spec.convert({"w": w})["w"], w[:, :4])
    with pytest.raises(NotImplementedError):
        spec.module.inverse({"w": w[:, :4]})


def test_generated_module_checks_the_library_version_at_run_time(compile_text):
    spec = compile_text("requires flashinfer < 0.0.1\ndims E\ninput w : f32[E]\noutput w : f32[E]\n",
                        check_versions=False)
    try:
        import importlib.metadata as md

        md.version("flashinfer-python")
    except Exception:  # noqa: BLE001
        pytest.skip("flashinfer-python is not installed")
    with pytest.raises(layoutc.LayoutError, match="produces the layout of flashinfer < 0.0.1, but flashinfer .* is installed"):
        spec.convert({"w": torch.zeros(3)})


def test_comment_characters_in_statements_do_not_break_the_module(compile_text):
    spec = compile_text('dims E\ninput w : f32[E, 8]\nswap_halves(w) ; swap_halves(w)  # "quoted" \\ \noutput w : f32[E, 8]\n')
    w = torch.arange(16.0).reshape(2, 8)
    assert torch.equal(spec.convert({"w": w})["w"], w)


def test_statement_spanning_several_lines(compile_text):
    spec = compile_text("""
        dims E
        input w : f32[E, 8]
        interleave_rows(w,
                        group=2)
        output w : f32[E, 8]
    """)
    w = torch.arange(8.0).reshape(1, 8)
    assert spec.convert({"w": w})["w"].tolist() == [[0, 1, 4, 5, 2, 3, 6, 7]]


@pytest.mark.slow  # compiles two variants (~3 s on the 2-core machine)
def test_two_variants_of_a_spec_register_their_kernels_under_different_names():
    # Triton's interpreter reads a kernel's source back through linecache by the converter's _TRITON_FILE
    # when it first runs it: two variants of one spec in one process (activation=silu and relu2) under one
    # name overwrote each other's lines there, and the variant registered first then failed with
    # KeyError: '_k_layer_0' (seen in the digest test under xdist).
    import layoutc
    from tests.helpers import SPECS

    silu = layoutc.compile_file(SPECS / "flashinfer_cutedsl_nvfp4.lyt", {"activation": "silu"}).module
    relu2 = layoutc.compile_file(SPECS / "flashinfer_cutedsl_nvfp4.lyt", {"activation": "relu2"}).module
    assert silu._TRITON_SOURCE != relu2._TRITON_SOURCE
    assert silu._TRITON_FILE != relu2._TRITON_FILE
    assert silu._TRITON_FILE.startswith("<layoutc triton kernels of flashinfer_cutedsl_nvfp4 ")
