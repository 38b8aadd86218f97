"""Issue 16: what a new user meets first -- installing, missing extras, readable output, diagnostics.

The wheel itself is built and installed into a fresh venv by tools/check_wheel.sh (tests/test_packaging.py,
slow set); here: what can be checked in process.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

import layoutc
from layoutc.algebra import expr as ex
from layoutc.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "flashinfer_cutlass_bf16.lyt"


@pytest.fixture
def runner():
    return CliRunner()


def _clean(result) -> None:
    text = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert "Traceback" not in text and "internal error" not in text, text


# -- 1. a wheel install is the whole product ---------------------------------------------------------


def test_the_wheel_carries_every_package_the_specs_and_the_data_files():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    setup = conf["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "layoutc").rglob("__init__.py")}
    assert on_disk <= set(setup["packages"]), f"add to [tool.setuptools] packages: {sorted(on_disk - set(setup['packages']))}"
    assert setup["package-dir"]["layoutc.specs"] == "specs"
    assert "*.lyt" in setup["package-data"]["layoutc.specs"]
    for name in ("front/grammar.lark", "lang/prelude.lyt"):  # read at run time with importlib.resources
        assert name in setup["package-data"]["layoutc"] and (ROOT / "layoutc" / name).exists()
    # torch's wheels do not require numpy, and `import torch` warns without it
    assert any(d.startswith("numpy") for d in conf["project"]["dependencies"])
    assert isinstance(conf["project"]["license"], str)  # SPDX string: a table is deprecated by setuptools


def test_shipped_specs_are_found_by_name_from_anywhere(runner, tmp_path, monkeypatch):
    from layoutc import shipped
    from layoutc.registry import DEFAULT

    assert len(shipped.names()) == 19 and shipped.find("flashinfer_cutlass_bf16") == SPEC.resolve()
    assert shipped.find("../specs/flashinfer_cutlass_bf16") is None and shipped.find("nope") is None
    assert all(path.exists() for path, _ in DEFAULT._entries.values())
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(main, ["explain", "flashinfer_cutlass_bf16", "--tensor", "w2_bias"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["compile", "nope"])
    assert result.exit_code == 2 and "no shipped spec has that name (shipped: aiter_fp8_block, aiter_mxfp4" in result.stderr


# -- 2. optional extras: name the extra, never "internal error" ----------------------------------------


def test_draw_without_matplotlib_names_the_extra(runner, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails as when it is not installed
    result = runner.invoke(main, ["draw", str(SPEC), "--tensor", "w13_weight", "-o", str(tmp_path / "x.png")])
    assert result.exit_code == 2
    _clean(result)
    assert "this command needs matplotlib, which is not installed: pip install 'layoutc[review]'" in result.stderr
    # --debug where users put it, after the subcommand: the traceback instead of the message
    result = runner.invoke(main, ["draw", "--debug", str(SPEC), "--graph", "-o", str(tmp_path / "x.png")])
    assert isinstance(result.exception, ImportError) and "No such option" not in result.output


def test_bench_on_the_cpu_without_flashinfer_times_the_converter(runner, monkeypatch):
    # issue 21: the anchor (the engine's sequence) needs FlashInfer's helpers; the converter does not
    for name in [m for m in sys.modules if m == "flashinfer" or m.startswith("flashinfer.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    result = runner.invoke(main, ["bench", str(SPEC), "--shape", "E=1,I=128,H=128", "--reps", "1"])
    assert result.exit_code == 0, result.output
    _clean(result)
    assert "anchor (vLLM-style)    skipped: flashinfer is not installed (pip install flashinfer-python)" in result.output


# -- 6. readable output ------------------------------------------------------------------------------


def test_sizes_print_as_written():
    i, h = ex.Var("I"), ex.Var("H")
    assert ex.to_str(ex.round_up(2 * i, 128)) == "round_up(2*I, 128)"
    assert ex.to_str(ex.ceil_div(ex.div(h, 16), 4)) == "ceil_div(H/16, 4)"
    assert ex.to_str(2 * ex.round_up(i, 128)) == "2*round_up(I, 128)"
    assert ex.to_str(ex.div(ex.round_up(h, 128), 2)) == "round_up(H, 128)/2"
    assert ex.to_str(ex.mod(ex.Var("r"), ex.round_up(i, 64))) == "r mod round_up(I, 64)"
    assert ex.to_python(ex.round_up(2 * i, 128)) == "128*((2*I + 127) // 128)"  # generated code is unchanged


def test_explain_prints_long_maps_with_named_parts(runner):
    result = runner.invoke(main, ["explain", str(ROOT / "specs/flashinfer_cutlass_nvfp4.lyt")])
    assert result.exit_code == 0, result.output
    assert "//128" not in result.stdout.replace(" ", "") or "+ 127) //" not in result.stdout
    assert "+ 127) //" not in result.stdout and "+ 3) //" not in result.stdout
    assert "round_up(2*I, 128)" in result.stdout or "2*round_up(I, 128)" in result.stdout
    maps = [line for line in result.stdout.splitlines() if line.startswith(("  map ", "           with ", "                "))]
    assert maps and max(len(line) for line in maps) <= 160, max(maps, key=len)


def test_named_parts_of_a_map_mean_the_same_map(bf16):
    from layoutc.lower.maptext import factor

    spec = layoutc.compile_file(ROOT / "specs/flashinfer_cutlass_nvfp4.lyt")
    chain = next(c for c in spec.compiled.variants[-1].chains if c.tensor == "w13_weight_scale")
    m = chain.composed_map()
    ranges = ex.coordinate_ranges(m.out_shape)
    exprs = [ex.simplify_symbolic(e, ranges) for e in (*m.src, m.valid)]
    coords = {f"o{k}" for k in range(len(m.out_shape))}
    named, defs = factor(exprs, lambda es: " ".join(map(str, es)), coords, width=60)
    assert defs, "a long map gets named parts"
    back = list(named)
    for name, value in reversed(defs):  # each definition uses only names before it
        back = [ex.substitute(e, {name: value}) for e in back]
    rng = random.Random(0)
    for _ in range(200):
        env = {"E": 2, "I": 128 * rng.randint(1, 4) + 32 * rng.randint(0, 3), "H": 64 * rng.randint(1, 8)}
        env.update({f"o{k}": rng.randint(0, 500) for k in range(len(m.out_shape))})
        assert [ex.evaluate(e, env) for e in back] == [ex.evaluate(e, env) for e in exprs]


def test_layout_picture_has_a_colour_bar_and_a_padding_legend():
    pytest.importorskip("matplotlib")
    from layoutc.cli.draw import layout_figure

    spec = layoutc.compile_file(ROOT / "specs/flashinfer_cutlass_mxfp4_padded.lyt")
    fig = layout_figure(spec, "w13_weight")
    panels = 3  # weight, scale, bias
    assert len(fig.axes) == 2 * panels + 1, "one colour bar"
    assert "input row" in fig.axes[-1].get_ylabel()
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["padding (no input element)"]


@pytest.mark.parametrize("name", ["flashinfer_cutedsl_nvfp4", "flashinfer_cutlass_mxfp4_padded", "flashinfer_trtllm_nvfp4"])
def test_graph_labels_fit_their_boxes_and_ties_cross_no_box(name):
    pytest.importorskip("matplotlib")
    from layoutc.cli.draw import BOX_H, BOX_W, graph_figure, graph_layout

    spec = layoutc.compile_file(ROOT / "specs" / f"{name}.lyt")
    g = graph_layout(spec)
    for tie in g["ties"]:
        (xa, _), (_, top), (xb, _), _ = tie["path"]
        assert top > BOX_H / 2, "a tie runs above the boxes"
        assert not [b for b in g["boxes"] if min(xa, xb) <= b["x"] <= max(xa, xb) and b["y"] + BOX_H / 2 > top]
    assert len({t["path"][1][1] for t in g["ties"]}) == len(g["ties"]), "each tie at its own height"
    fig = graph_figure(spec)
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    to_data = ax.transData.inverted()
    boxes = {(b["x"], b["y"]): b for b in g["boxes"]}
    for text in ax.texts:
        x, y = text.get_position()
        if (x, y) not in boxes:
            continue  # tie labels
        (x0, y0), (x1, y1) = to_data.transform(text.get_window_extent(renderer).get_points())
        assert x - BOX_W / 2 <= x0 and x1 <= x + BOX_W / 2, f"{text.get_text()!r} is wider than its box"
        assert y - BOX_H / 2 <= y0 and y1 <= y + BOX_H / 2, f"{text.get_text()!r} is taller than its box"


def test_bench_report_units_and_ratios():
    from layoutc.cli.bench import rate, report, times

    assert rate(412e3) == "412 kB/s" and rate(1.31e12) == "1.31 TB/s" and rate(86.4e6) == "86.4 MB/s"
    assert times(1968.4) == "1968x" and times(4.71) == "4.7x"
    r = {"spec": "s", "dims": {"E": 1}, "device": "cpu", "device_name": "x86_64", "torch": "2", "flashinfer": None,
         "triton": None, "date": "d", "bytes_read": 300_000, "bytes_written": 300_000, "copy_s": 1e-4,
         "copy_GBps": 6.0, "clone_s": 2e-4, "convert_s": 0.4, "convert_GBps": 0.0015, "fraction_of_copy": 0.00025,
         "convert_vs_clone": 1968.4, "lowering": "auto"}
    text = report(r)
    assert " 0 GB/s" not in text and "1.5 MB/s" in text and "1968x the time of a clone" in text
    assert "not a speed measurement" in text
    assert "back to back" not in text
    r.update(back_to_back=10, convert_b2b_s=2e-4, copy_b2b_s=1e-4, fraction_of_copy_b2b=0.5)
    assert "10 calls back to back     0.200 ms per call  50.0% of 10 copies back to back (0.100 ms each)" in report(r)


def test_timeit_back_to_back_times_calls_per_sample():
    from layoutc.cli.bench import timeit

    import time

    n = []
    per_call = timeit(lambda: (n.append(1), time.sleep(0.002)), "cpu", warmup=2, reps=3, calls=10)
    assert len(n) == 2 + 3 * 10 and 0.0019 < per_call < 0.01  # per call, not per sample of ten


def _git(cwd, *args):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True,
                   capture_output=True)


def test_diff_git_names_the_parameters_it_compared_at(runner, tmp_path, monkeypatch):
    _git(tmp_path, "init", "-q")
    (tmp_path / "s.lyt").write_text(SPEC.read_text())
    _git(tmp_path, "add", "s.lyt")
    _git(tmp_path, "commit", "-qm", "a")
    (tmp_path / "s.lyt").write_text(SPEC.read_text().replace("param tp_rank = 0", "param tp_rank = 0\nparam fast = true"))
    _git(tmp_path, "commit", "-qam", "b")
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(main, ["diff", "--git", "HEAD~1", "HEAD", "s.lyt"])
    assert result.exit_code == 0, result.output
    assert "no layout change at the parameter values below" in result.stdout
    assert "parameters: added fast (compared at fast=True)" in result.stdout


def test_review_outside_a_git_repository_is_one_line(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    result = runner.invoke(main, ["review", "HEAD~1..HEAD"])
    assert result.exit_code == 2
    assert result.stderr == f"error: {tmp_path.resolve()} is not inside a git repository\n"
    assert result.stdout == ""  # neither git's usage text nor click's
    _git(tmp_path, "init", "-q")
    result = runner.invoke(main, ["review", "HEAD~1..HEAD"])
    assert result.exit_code == 2 and result.stderr == "error: 'HEAD~1' is not a commit in this repository\n"


# -- 7. diagnostics that point at the mistake ----------------------------------------------------------


def _check(runner, tmp_path, text: str):
    path = tmp_path / "mistake.lyt"
    path.write_text(text)
    result = runner.invoke(main, ["check", str(path)])
    assert result.exit_code == 2, result.output
    _clean(result)
    return str(path), result.stderr


def _bf16(old: str, new: str) -> str:
    text = SPEC.read_text()
    assert old in text
    return text.replace(old, new, 1)


def test_a_forgotten_scale_tie_is_named(runner, tmp_path, check_points_at):
    text = _bf16("e8m0[E, 2*I, H/32]   scales w13_weight block 32", "e8m0[E, 2*I, H/32]")
    path, err = _check(runner, tmp_path, text)
    check_points_at(err, path, 37, 48, "interleave(w13_weight, sm90_mixed); interleave(w13_weight_scale, sm90_mixed)")
    assert ("error: w13_weight_scale declares no tie, so interleave(..., sm90_mixed) packs it as a weight; it is "
            "shaped like the scales of w13_weight (one per 32 values)") in err
    assert "note: declared here without a tie" in err
    assert "hint: declare the tie: input w13_weight_scale : e8m0[E, 2*I, H/32] scales w13_weight block 32" in err
    assert "is a weight" not in err and err.count("error:") == 1


def test_a_forgotten_tie_on_a_128x4_swizzled_scale(runner, tmp_path, check_points_at):
    spec = ROOT / "specs" / "flashinfer_cutlass_nvfp4.lyt"
    text = spec.read_text().replace("e4m3[E, 2*I, H/16]   scales w13_weight block 16", "e4m3[E, 2*I, H/16]")
    path, err = _check(runner, tmp_path, text)
    line = next(i for i, s in enumerate(text.splitlines(), 1) if s.startswith("interleave(w13_weight_scale, sf_128x4)"))
    check_points_at(err, path, line, 12)
    assert "w13_weight_scale declares no tie, so interleave(..., sf_128x4) packs it as a weight" in err
    assert "this tensor is a weight" not in err


def test_a_forgotten_128x128_block_tie(runner, tmp_path):
    spec = ROOT / "specs" / "flashinfer_trtllm_fp8_block.lyt"
    text = spec.read_text().replace("   scales w13_weight block 128x128", "", 1)
    _, err = _check(runner, tmp_path, text)
    assert ("hint: w13_weight_scale is shaped like the scales of w13_weight but declares no tie; declare it: input "
            "w13_weight_scale : ... scales w13_weight block 128x128") in err


def test_a_misspelt_keyword_is_named(runner, tmp_path, check_points_at):
    text = _bf16("output w2_bias?         : bf16[E, H]", "ouput w2_bias?         : bf16[E, H]")
    path, err = _check(runner, tmp_path, text)
    check_points_at(err, path, 46, 1, "ouput w2_bias?         : bf16[E, H]")
    assert "error: unknown statement 'ouput'" in err and "hint: did you mean 'output'?" in err
    assert "w2_bias" not in err.splitlines()[0]


def test_a_word_that_is_no_statement(runner, tmp_path, check_points_at):
    path, err = _check(runner, tmp_path, "dims E\nweights x : f32[E]\n")
    check_points_at(err, path, 2, 1, "weights x : f32[E]")
    assert "'weights' is not a statement: a statement starts with a keyword" in err


def test_one_missing_dim_is_one_error(runner, tmp_path, check_points_at):
    path, err = _check(runner, tmp_path, _bf16("dims E, I, H", "dims E, I"))
    check_points_at(err, path, 20, 41, "input w13_weight        : fp4x2[E, 2*I, H/2]   rows [w1; w3]")
    assert err.count("error:") == 1, err
    assert ("error: the shape of w13_weight uses 'H', which is not a declared dim; also used on lines 21, 23, 24, "
            "25, 41, 42, 44, 45, 46") in err
    assert "hint: declare it: dims E, I, H" in err and "unknown tensor" not in err


def test_a_dtype_typo_suggests_the_type_and_nothing_else(runner, tmp_path, check_points_at):
    path, err = _check(runner, tmp_path, _bf16("e8m0[E, 2*I, H/32]   scales", "e8m1[E, 2*I, H/32]   scales"))
    check_points_at(err, path, 21, 27, "input w13_weight_scale  : e8m1[E, 2*I, H/32]   scales w13_weight block 32")
    assert "error: unknown element type 'e8m1'" in err and "hint: did you mean 'e8m0'?" in err
    assert err.count("error:") == 1 and "w2_weight_scale" not in err, err


def test_dim_0_on_a_row_op_points_at_that_statement(runner, tmp_path, check_points_at):
    spec = ROOT / "specs" / "flashinfer_cutedsl_nvfp4.lyt"
    old = "  interleave_rows([w13_weight, w13_weight_scale], dim=1, group=64)"
    text = spec.read_text().replace(old, old.replace("dim=1", "dim=0"))
    line = text.splitlines().index(old.replace("dim=1", "dim=0")) + 1
    path, err = _check(runner, tmp_path, text)
    check_points_at(err, path, line, 51, old.replace("dim=1", "dim=0"))
    assert ("error: interleave_rows(..., dim=0) acts on dim 0, the expert axis: it moves data across experts, which "
            "no MoE kernel layout does") in err
    assert "hint: check the dim= of the transforms: rows are dim 1 of [E, rows, K]" in err
    assert err.count("error:") == 1 and not re.search(rf":{line - 1}:\d+: error", err)


# -- 4. a convert that fails leaves nothing of its own behind, and names the layer ---------------------


def _bad_checkpoint(folder: Path, bf16):
    """A one-shard checkpoint whose layer 1 has a w13_weight with one row too few."""
    from safetensors.torch import save_file

    from tests.convert.test_checkpoint import PREFIX, make_checkpoint

    tensors = make_checkpoint(folder, bf16, layers=2, shards=1, index=False)
    name = f"{PREFIX.format(1)}.w13_weight"
    tensors[name] = tensors[name][:, 1:].contiguous()
    save_file(tensors, str(folder / "model-00001-of-00001.safetensors"))


def test_a_failed_convert_into_a_new_folder_leaves_no_folder(tmp_path, bf16):
    from layoutc.convert.checkpoint import convert_checkpoint

    _bad_checkpoint(tmp_path / "in", bf16)
    with pytest.raises(layoutc.LayoutError) as err:
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "new" / "out")
    # the layer and the tensor, not only the shapes
    assert "layer 'model.layers.1.mlp.experts'" in str(err.value) and "w13_weight" in str(err.value)
    assert not (tmp_path / "new" / "out").exists()


def test_a_failed_convert_into_the_users_folder_removes_only_its_own_files(tmp_path, bf16):
    from layoutc.convert.checkpoint import convert_checkpoint

    _bad_checkpoint(tmp_path / "in", bf16)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / ".cache.tmp").write_text("mine too")  # a hidden .tmp of the user's is no leftover of layoutc's
    with pytest.raises(layoutc.LayoutError, match="w13_weight"):
        convert_checkpoint(bf16, tmp_path / "in", out)
    assert sorted(p.name for p in out.iterdir()) == [".cache.tmp", "notes.txt"]


def test_a_failed_resume_keeps_the_finished_shards_and_their_record(tmp_path, bf16):
    """A later failure must not throw away the work a resume would skip."""
    from safetensors.torch import load_file, save_file

    from layoutc.convert.checkpoint import convert_checkpoint
    from layoutc.convert.runfolder import DONE
    from tests.convert.test_checkpoint import PREFIX, make_checkpoint

    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2)
    convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    second = tmp_path / "in" / "model-00002-of-00002.safetensors"
    tensors = load_file(str(second))
    name = f"{PREFIX.format(1)}.w13_weight"
    tensors[name] = tensors[name][:, 1:].contiguous()
    save_file(tensors, str(second))
    with pytest.raises(layoutc.LayoutError, match=r"layer 'model.layers.1.mlp.experts' \(shard model-00002"):
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    assert (tmp_path / "out" / "model-00001-of-00002.safetensors").is_file()
    assert (tmp_path / "out" / DONE / "model-00001-of-00002.safetensors.json").is_file()


def test_cli_convert_failure_is_a_message_and_leaves_no_folder(runner, tmp_path, bf16):
    _bad_checkpoint(tmp_path / "in", bf16)
    result = runner.invoke(main, ["convert", "--spec", str(SPEC), "--in", str(tmp_path / "in"),
                                  "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    _clean(result)
    assert "model.layers.1.mlp.experts" in result.stderr and "w13_weight" in result.stderr
    assert not (tmp_path / "out").exists()


# -- 5, 6. what the README promises about extras and round trips --------------------------------------


def test_readme_prices_every_extra():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("### Installing, and what each extra costs"):]
    for extra in extras:
        assert f"| `layoutc[{extra}]`" in table, f"README: the install size of the {extra} extra"
    assert "--index-url https://download.pytorch.org/whl/cpu" in table


def _casting_specs() -> dict[str, list[str]]:
    """Per shipped spec, the tensors whose float element type the conversion changes."""
    from layoutc import shipped

    out = {}
    for name in shipped.names():
        spec = layoutc.compile_file(shipped.find(name))
        ins = {t.name: t.elem for t in spec.program.inputs}
        outs = {t.name: t.elem for t in spec.program.outputs}
        # a cast between numeric types changes values; e8m0 read as e4m3 bytes (not numeric) does not
        out[name] = sorted(n for n in ins if n in outs and ins[n].name != outs[n].name
                           and ins[n].numeric and outs[n].numeric)
    return out


def test_readme_names_the_specs_whose_biases_do_not_round_trip():
    casting = {name for name, tensors in _casting_specs().items() if tensors}
    readme = (ROOT / "README.md").read_text()
    start = readme.index("* `inverse(convert(x)) == x` bit for bit holds")
    from layoutc import shipped

    text = readme[start:readme.index("Relabellings that keep the bits", start)]
    said = set(re.findall(r"`(\w+)`", text)) & set(shipped.names())
    assert said == casting


def test_an_f32_bias_bf16_cannot_hold_comes_back_rounded_and_the_rest_exactly(bf16):
    from layoutc.convert.synthckpt import synthetic_inputs

    dims = {"E": 2, "I": 128, "H": 128}
    x = synthetic_inputs(bf16, dims, seed=0)
    x["w2_bias"] = x["w2_bias"] + 2.0 ** -20  # below bf16's precision at these magnitudes
    back = bf16.inverse(bf16.convert(x))
    assert not torch_equal(back["w2_bias"], x["w2_bias"])
    assert torch_equal(back["w2_bias"], x["w2_bias"].bfloat16().float())
    assert all(torch_equal(back[k], x[k]) for k in x if k != "w2_bias")


def torch_equal(a, b) -> bool:
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_readme_names_the_specs_moe_numerics_runs():
    source = (ROOT / "examples" / "moe_numerics.py").read_text()
    run_all = source[source.index("def run_all"):source.index('if __name__')]
    ran = set(re.findall(r'"(flashinfer_\w+)"', run_all))
    readme = (ROOT / "README.md").read_text()
    start = readme.index("`examples/moe_numerics.py` (run by")
    said = set(re.findall(r"`(flashinfer_\w+)`", readme[start:readme.index("kernel's declared order", start)]))
    assert ran and said == ran


def test_a_failed_convert_of_every_tp_slice_leaves_none_of_their_folders(tmp_path, bf16):
    """One read, several output folders (one per slice): each is cleaned up as a lone run's."""
    from layoutc.convert.checkpoint import convert_checkpoint

    _bad_checkpoint(tmp_path / "in", bf16)
    slices = [layoutc.compile_file(SPEC, {"tp_rank": r, "tp_size": 2}) for r in range(2)]
    (tmp_path / "tp1").mkdir()
    (tmp_path / "tp1" / "notes.txt").write_text("mine")
    with pytest.raises(layoutc.LayoutError, match="model.layers.1.mlp.experts"):
        convert_checkpoint(slices, tmp_path / "in", [tmp_path / "tp0", tmp_path / "tp1"])
    assert not (tmp_path / "tp0").exists()
    assert [p.name for p in (tmp_path / "tp1").iterdir()] == ["notes.txt"]
