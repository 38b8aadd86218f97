"""The generated converters' launch of a layer kernel (runtime._launch): Triton's own launch on the
first call of a key, the compiled kernel it returned on later calls with the same key.

Triton's objects are stood in for by fakes that record how they were called: the CPU has no
compiled kernels, and the GPU run (benchmarks/gpu_bench.py parity: a warm call equals the first)
checks the real ones.
"""

from __future__ import annotations

import pytest
import torch

from layoutc.runtime import checks as runtime


class FakeArg:
    def __init__(self, dtype=torch.uint8, cuda=True, ptr=0x10000):
        self.dtype, self.is_cuda, self.ptr = dtype, cuda, ptr

    def data_ptr(self):
        return self.ptr


class FakeCompiled:
    function = object()

    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        return lambda *args: self.log.append(("direct", grid, args))


class FakeKernel:
    def __init__(self, arg_names, returns=True):
        self.arg_names, self.log, self.returns = arg_names, [], returns

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append(("triton", grid, args, kwargs))
            return FakeCompiled(self.log) if self.returns else None
        return launch


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    monkeypatch.setattr(runtime, "_LAUNCHES", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_second_call_of_a_key_launches_the_compiled_kernel_with_every_argument_in_order():
    k = FakeKernel(["_x0", "_y0", "E", "_G0"])
    x, y = FakeArg(), FakeArg()
    runtime._launch(k, 7, [x, y], {"E": 4, "_G0": 7}, 4)
    runtime._launch(k, 7, [x, y], {"E": 4, "_G0": 7}, 4)
    assert k.log[0] == ("triton", (7,), (x, y), {"E": 4, "_G0": 7, "num_warps": 4})
    assert k.log[1] == ("direct", (7, 1, 1), (x, y, 4, 7))
    assert len(k.log) == 2


@pytest.mark.parametrize("change", ["consts", "dtype", "device", "alignment"])
def test_a_new_key_goes_through_triton_again(monkeypatch, change):
    k = FakeKernel(["_x0", "_y0", "E", "_G0"])
    runtime._launch(k, 7, [FakeArg(), FakeArg()], {"E": 4, "_G0": 7}, 4)
    consts, args = {"E": 4, "_G0": 7}, [FakeArg(), FakeArg()]
    if change == "consts":
        consts = {"E": 8, "_G0": 14}
    elif change == "dtype":
        args = [FakeArg(torch.int32), FakeArg(torch.int32)]
    elif change == "alignment":  # Triton specialises pointers on 16-byte alignment
        args = [FakeArg(ptr=0x10004), FakeArg()]
    else:
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    runtime._launch(k, 14, args, consts, 4)
    assert [entry[0] for entry in k.log] == ["triton", "triton"]


@pytest.mark.parametrize("kernel, cuda", [
    (FakeKernel(["_x0", "_y0", "_G0", "E"]), True),  # constexprs in another order than the call's
    (FakeKernel(["_x0", "_y0", "E"]), True),  # a parameter missing
    (FakeKernel(["_x0", "_y0", "E", "_G0"], returns=False), True),  # launch returned nothing (interpreter)
    (FakeKernel(["_x0", "_y0", "E", "_G0"]), False),  # CPU tensors (Triton's interpreter)
])
def test_without_a_usable_compiled_kernel_every_call_takes_tritons_launch(kernel, cuda):
    for _ in range(3):
        runtime._launch(kernel, 7, [FakeArg(cuda=cuda), FakeArg(cuda=cuda)], {"E": 4, "_G0": 7}, 4)
    assert [entry[0] for entry in kernel.log] == ["triton"] * 3


def test_generated_layer_launchers_go_through_launch():
    import layoutc
    from layoutc.cli.demo import DEFAULT_SPEC

    src = layoutc.compile_file(DEFAULT_SPEC).source
    assert "_compiled = _launch(kernels['_k_layer_0'], total, _args, _consts, " in src
    assert "kernels['_k_layer_0'][" not in src


class RecordingCompiled:
    """A compiled kernel as Triton returns it: launched directly with (grid), every argument in order."""

    function = object()

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args: self.calls.append((grid, [a.data_ptr() if isinstance(a, torch.Tensor) else a
                                                        for a in args]))


@pytest.mark.parametrize("apart", [False, True])
def test_a_warm_call_of_the_same_shapes_allocates_and_launches_what_the_full_call_did(monkeypatch, apart):
    # The prepared launch (runtime._prepare) replays the full call's launch: the same grid, the inputs'
    # addresses where the full call passed its views, fresh outputs of the same shapes and dtypes, the
    # same constexpr values; tensors copied apart are copied again. Runs where a launch yields no
    # compiled kernel (the interpreter) never take it.
    import layoutc
    from layoutc.convert.synthckpt import synthetic_inputs
    from tests.helpers import SPECS

    spec = layoutc.compile_file(SPECS / "flashinfer_cutedsl_nvfp4.lyt", {"activation": "relu2"})
    m = spec.module
    compiled, full = RecordingCompiled(), []

    def launch(kernel, programs, args, consts, num_warps):
        full.append(((programs, 1, 1), [a.data_ptr() for a in args] + list(consts.values())))
        return compiled

    monkeypatch.setattr(m, "_launch", launch)
    monkeypatch.setattr(m, "_PREPARED", {})
    monkeypatch.setattr(m, "_COPY_APART_BYTES", 0 if apart else 1 << 62)
    x = synthetic_inputs(spec, {"E": 2, "I": 64, "H": 48}, seed=5)
    d, present = m._check_call(x, None, "convert", m.INPUTS, m._INPUT_SHAPES, m._INPUT_AXES, m.DIMS, m._CONDITIONS,
                               m._CONVERT_CHECKS)
    layer = m._LAYERS[("fused", present)]
    first = layer(x, d)
    second = layer(x, d)
    assert len(full) == 1 and len(compiled.calls) == 1  # the second call took the prepared launch
    grid, args = compiled.calls[0]
    firsts = [t.data_ptr() for t in first.values()]
    seconds = [t.data_ptr() for t in second.values()]
    assert grid == full[0][0]
    ins = [a for i, a in enumerate(args) if i < 2 * len(first) and i % 2 == 0]
    assert ins == [a for i, a in enumerate(full[0][1]) if i < 2 * len(first) and i % 2 == 0]
    assert args[1:2 * len(first):2] == seconds and not set(seconds) & set(firsts)  # fresh outputs
    assert args[2 * len(first):] == full[0][1][2 * len(first):]  # constexpr values
    assert [(t.shape, t.dtype) for t in first.values()] == [(t.shape, t.dtype) for t in second.values()]
    # allocated from prototypes (runtime._empty_proto): plain contiguous tensors with the full call's strides
    assert [(t.stride(), type(t), t.device, t.requires_grad) for t in second.values()] == \
        [(t.stride(), torch.Tensor, t.device, False) for t in first.values()]
    third = layer(x, d)
    assert not {t.data_ptr() for t in third.values()} & set(seconds)  # every warm call's outputs its own
    copied = [n for n, t in first.items() if t.dtype == x[n].dtype and t.shape == x[n].shape]
    for n in copied if apart else []:
        assert torch.equal(second[n], x[n])  # copied apart on the warm call too
    if apart:
        assert copied


@pytest.mark.parametrize("shape", [(2, 256, 128), (3,), (2, 1, 4, 1), (1, 1), (), (0, 4), (5, 0, 2)])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float8_e4m3fn, torch.int32])
def test_a_prepared_runs_prototype_allocates_what_torch_empty_does(shape, dtype):
    # torch.empty_like of the prototype where it gives torch.empty's tensor; torch.empty itself for shapes without
    # elements or dims (empty_like of an expanded tensor would give zero strides there)
    from layoutc.runtime import checks

    p = checks._empty_proto(shape, dtype, torch.device("cpu"))
    want = torch.empty(shape, dtype=dtype)
    if not shape or 0 in shape:
        assert p == (shape, dtype)
        return
    assert isinstance(p, torch.Tensor) and p.untyped_storage().nbytes() == p.element_size()  # one element held
    got = torch.empty_like(p)
    assert (got.shape, got.stride(), got.dtype, type(got), got.is_contiguous()) == \
        (want.shape, want.stride(), want.dtype, torch.Tensor, True)
    assert got.data_ptr() != p.data_ptr()


def test_no_prepared_launch_without_a_compiled_kernel_or_for_unaligned_inputs(monkeypatch):
    import layoutc
    from layoutc.convert.synthckpt import synthetic_inputs
    from tests.helpers import SPECS

    spec = layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt")
    m = spec.module
    monkeypatch.setattr(m, "_PREPARED", {})
    calls = []
    monkeypatch.setattr(m, "_launch", lambda *a: calls.append(a))  # returns None, as with the interpreter
    x = synthetic_inputs(spec, {"E": 2, "I": 128, "H": 256}, seed=5)
    d, present = m._check_call(x, None, "convert", m.INPUTS, m._INPUT_SHAPES, m._INPUT_AXES, m.DIMS, m._CONDITIONS,
                               m._CONVERT_CHECKS)
    layer = m._LAYERS[("fused", present)]
    layer(x, d)
    layer(x, d)
    assert len(calls) == 2 and not m._PREPARED
    assert m._prepared_key(layer, tuple(x.values()), d) is not None
    odd = dict(x, w13_weight=torch.empty(x["w13_weight"].numel() + 1, dtype=torch.uint8)[1:].view(
        x["w13_weight"].dtype).view(x["w13_weight"].shape))
    assert m._prepared_key(layer, tuple(odd.values()), d) is None  # copied by _aligned on every call
    assert m._prepared_key(layer, (x["w13_weight"].transpose(1, 2),), d) is None


def test_the_switch_off_sends_every_call_through_triton(monkeypatch):
    monkeypatch.setattr(runtime, "_DIRECT_LAUNCH", False)
    k = FakeKernel(["_x0", "_y0", "E", "_G0"])
    for _ in range(2):
        runtime._launch(k, 7, [FakeArg(), FakeArg()], {"E": 4, "_G0": 7}, 4)
    assert [entry[0] for entry in k.log] == ["triton", "triton"]


def test_row_tiles_waste_the_fewest_lanes():
    tile = runtime._row_tile
    assert [tile(c, 1024) for c in (1, 3, 64, 384, 368, 1472, 1024, 2048, 1000)] == [1, 4, 64, 128, 128, 64, 1024, 1024, 1024]
    assert tile(1472, 256) == 64 and tile(4096, 256) == 256


def test_the_lowering_choice_is_remembered_but_not_one_an_environment_variable_allowed(monkeypatch):
    # runtime._choose_lowering remembers its answer per (table, lowering asked for, device), so a warm
    # call looks it up; a lowering allowed on this device only by an environment variable is asked
    # again every call (the variable may change), and errors are never remembered.
    table = (("fused", ("cuda",), ("cuda",), None, "LAYOUTC_TEST_SWITCH", "runs kernels that need CUDA tensors"),
             ("eager", None, (), None, None, "cannot run on these tensors"))
    x = {"w": torch.zeros(2)}
    monkeypatch.setattr(runtime, "_CHOSEN", {})
    monkeypatch.setenv("LAYOUTC_TEST_SWITCH", "1")
    assert runtime._choose_lowering("fused", x, table) == "fused"
    monkeypatch.delenv("LAYOUTC_TEST_SWITCH")
    with pytest.raises(runtime.LayoutError, match="set LAYOUTC_TEST_SWITCH=1"):
        runtime._choose_lowering("fused", x, table)
    with pytest.raises(runtime.LayoutError, match="lowering must be one of"):
        runtime._choose_lowering("fast", x, table)
    assert runtime._choose_lowering("auto", x, table) == "eager"
    assert runtime._choose_lowering("auto", x, table) == "eager"
    assert list(runtime._CHOSEN) == [(id(table), "auto", torch.device("cpu"))]


def test_dtype_widening_follows_the_contract_it_is_given():
    # runtime._widened works its table out once per contract: two contracts, two answers.
    x = {"b": torch.ones(3, dtype=torch.bfloat16), "w": torch.ones(2, dtype=torch.bfloat16)}
    wide = {"b": {"torch_dtypes": ["float32"], "widens": ["bfloat16"]}, "w": {"torch_dtypes": ["bfloat16"]}}
    plain = {"b": {"torch_dtypes": ["bfloat16"]}, "w": {"torch_dtypes": ["bfloat16"]}}
    for _ in range(2):
        got = runtime._widened(x, wide)
        assert got["b"].dtype == torch.float32 and got["w"] is x["w"] and x["b"].dtype == torch.bfloat16
        assert runtime._widened(x, plain)["b"] is x["b"]


def test_a_layer_called_with_out_launches_into_the_callers_tensors_first_and_warm(monkeypatch):
    # convert(..., out=) hands the caller's tensors to the layer function: the full call and the prepared
    # launch both pass their addresses to the kernel, allocate no output, and return them (as given on the
    # warm call; as the dtype the kernel writes, a view of the same memory, on the first).
    import layoutc
    from layoutc.convert.synthckpt import synthetic_inputs
    from tests.helpers import SPECS

    spec = layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt")
    m = spec.module
    compiled, full = RecordingCompiled(), []

    def launch(kernel, programs, args, consts, num_warps):
        full.append([a.data_ptr() for a in args])
        return compiled

    monkeypatch.setattr(m, "_launch", launch)
    monkeypatch.setattr(m, "_triton_kernels", lambda source, filename: {f"_k_layer_{i}": None for i in range(8)})
    monkeypatch.setattr(m, "_PREPARED", {})
    x = synthetic_inputs(spec, {"E": 2, "I": 128, "H": 256}, seed=5)
    d, present = m._check_call(x, None, "convert", m.INPUTS, m._INPUT_SHAPES, m._INPUT_AXES, m.DIMS, m._CONDITIONS,
                               m._CONVERT_CHECKS)
    layer = m._LAYERS[("fused", present)]
    shapes = {k: (tuple(f(**d)), getattr(torch, m.OUTPUTS[k]["torch_dtypes"][0])) for k, f in m._OUTPUT_SHAPES.items()}
    outs = {k: torch.empty(s, dtype=t) for k, (s, t) in shapes.items()}
    empties = []
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: empties.append(a) or real_empty(*a, **k))
    first = layer(x, d, outs)
    second = layer(x, d, outs)
    monkeypatch.setattr(torch, "empty", real_empty)
    assert not empties  # no output allocated, on either call
    assert len(full) == 1 and len(compiled.calls) == 1
    ptrs = {k: t.data_ptr() for k, t in outs.items()}
    assert {k: t.data_ptr() for k, t in first.items()} == {k: ptrs[k] for k in first}
    assert all(second[k] is outs[k] for k in second)
    assert full[0][1::2] == [ptrs[k] for k in first]  # the first call's outputs: the caller's memory
    assert compiled.calls[0][1][1:2 * len(first):2] == [ptrs[k] for k in second]  # and the warm call's
    assert layer(x, d) is not None and len(compiled.calls) == 2  # without outs: allocates, same prepared launch


class RunnerCompiled:
    """Triton's CompiledKernel as far as _direct reads it: a runner in the checked convention."""

    function, packed_metadata = 1234, ("meta",)

    def __init__(self):
        self.runs, self.runner_calls = [], []
        self.run = lambda *args: self.runs.append(args)

    def __getitem__(self, grid):
        def runner(*args, stream=None):
            self.runner_calls.append(args)
            launch_metadata = self.launch_metadata(grid, stream, *args)
            self.run(grid[0], grid[1], grid[2], stream, self.function, self.packed_metadata, launch_metadata,
                     knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *args)  # noqa: F821
        return runner


def test_the_prepared_launch_calls_tritons_launcher_itself_unless_a_hook_is_set(monkeypatch):
    triton = pytest.importorskip("triton")
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 777 + device, raising=False)
    monkeypatch.setattr(runtime, "_RUNNER_CHECKED", {})
    chain = getattr(triton.knobs, "HookChain", None)
    for hook in [None] + ([chain()] if chain else []):  # no hook: none, or an empty chain of hooks
        monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", hook)
        monkeypatch.setattr(triton.knobs.runtime, "launch_exit_hook", hook)
        c = RunnerCompiled()
        launch = runtime._direct(c, 9)
        launch("x0", "y0", 4, 7)
        assert c.runs == [(9, 1, 1, 777, 1234, ("meta",), None, None, None, "x0", "y0", 4, 7)] and not c.runner_calls
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda *a: None)
    c.launch_metadata = lambda *a: None
    with pytest.raises(NameError):  # the runner of this fake reads `knobs`, as Triton's does: it was taken
        launch("x0", "y0", 4, 7)
    assert c.runner_calls == [("x0", "y0", 4, 7)]


def test_the_prepared_launch_hands_its_tensors_to_the_launcher_as_addresses(monkeypatch):
    # Triton's launcher calls data_ptr of a tensor and asks the driver about the address, one driver call per
    # tensor before the launch; an integer it takes as it is. The leading `pointers` arguments go as addresses,
    # the rest as they are; Triton's own runner (a hook set) still gets the tensors.
    triton = pytest.importorskip("triton")
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 777 + device, raising=False)
    monkeypatch.setattr(runtime, "_RUNNER_CHECKED", {})
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", None)
    monkeypatch.setattr(triton.knobs.runtime, "launch_exit_hook", None)
    x, y = torch.arange(6, dtype=torch.int32), torch.empty(6, dtype=torch.int32)
    c = RunnerCompiled()
    launch = runtime._direct(c, 9, 2)
    launch(x, y, 4, 7)
    assert c.runs == [(9, 1, 1, 777, 1234, ("meta",), None, None, None, x.data_ptr(), y.data_ptr(), 4, 7)]
    assert all(type(a) is int for a in c.runs[0][9:])
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda *a: None)
    c.launch_metadata = lambda *a: None
    with pytest.raises(NameError):  # Triton's runner (this fake's reads `knobs`): the tensors themselves
        launch(x, y, 4, 7)
    assert c.runner_calls[0][0] is x and c.runner_calls[0][1] is y


def test_a_prepared_run_launches_with_every_input_and_output_as_an_address(monkeypatch):
    # _prepare binds the launch to the 2 * outputs leading arguments (input, output, input, output, ...).
    bound = []
    monkeypatch.setattr(runtime, "_direct", lambda compiled, programs, pointers=0: bound.append(pointers)
                        or (lambda *a: None))
    x = {"a": torch.zeros(4), "b": torch.zeros(8)}
    out = {"a": torch.empty(4), "b": torch.empty(8)}
    args = [x["a"], out["a"], x["b"], out["b"]]
    runtime._prepare(("k-addresses",), object(), 3, {"C": 5}, out, args, [])
    try:
        assert bound == [4]
    finally:
        runtime._PREPARED.pop(("k-addresses",), None)


def test_a_runner_of_another_convention_is_used_as_it_is(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setattr(runtime, "_RUNNER_CHECKED", {})
    c = RecordingCompiled()
    launch = runtime._direct(c, 9)
    launch(1, 2)
    assert c.calls == [((9, 1, 1), [1, 2])]
