"""OpenAI triton_kernels' matmul_ogs (the MoE GEMM behind vLLM's TRITON MXFP4 backend) computing with weights
converted by a layoutc-generated converter into the Hopper MXFP4 value and scale layouts.

Path A: triton_kernels converts the checkpoint itself (wrap_torch_tensor + convert_layout with the default Hopper
layouts, as vLLM's _swizzle_mxfp4 does), then matmul_ogs. Path B: the layoutc converter's outputs, wrapped as
triton_kernels tensors already in those layouts (triton_kernels converts nothing), then matmul_ogs. Compared
bitwise (B against A) and against a bf16-dequantised fp32 reference. Then a wrong conversion (the scales left
linear, the mistake `layoutc check` refuses) is fed to the kernel, and the converter's guard() is shown to refuse it.

Needs CUDA (an SM90 GPU: the Hopper layouts), torch and Triton, the converter module that
`layoutc compile specs/triton_kernels_mxfp4_hopper.lyt -o CONVERTER.py` writes, and OpenAI's triton_kernels source
of the Triton release that is installed (python/triton_kernels of the Triton repository at that release's tag; not
the PyPI package of that name). tools/gpu/triton_kernels_run.sh says how to bring both to the GPU machine.

Usage: python triton_kernels_moe.py --converter CONVERTER.py --tk-src PATH/python/triton_kernels --out DIR [--profile]
"""

import argparse
import hashlib
import importlib.util
import json
import os
import sys
import time

import torch

FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def load_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def checkpoint(E, I, H, seed, device):
    """gpt-oss MXFP4 checkpoint layout (vLLM's): w uint8 [E, N, K/2] (low nibble = even k), e8m0 [E, N, K/32]."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)

    def w(n, k):
        return torch.randint(0, 256, (E, n, k // 2), generator=g, device=device, dtype=torch.int32).to(torch.uint8)

    def s(n, k):  # exponents 2^-4 .. 2^3: no overflow in bf16, every bit of the byte varies
        return torch.randint(123, 131, (E, n, k // 32), generator=g, device=device, dtype=torch.int32).to(torch.uint8)

    return {"w13_weight": w(2 * I, H), "w13_weight_scale": s(2 * I, H), "w2_weight": w(H, I),
            "w2_weight_scale": s(H, I)}


def dequant(w, s):
    """[E, N, K/2] fp4x2 + [E, N, K/32] e8m0 -> [E, N, K] float32 (exact)."""
    lut = torch.tensor(FP4_VALUES, device=w.device, dtype=torch.float32)
    lo = lut[(w & 0xF).long()]
    hi = lut[(w >> 4).long()]
    v = torch.stack([lo, hi], dim=-1).flatten(-2)
    scale = torch.exp2(s.to(torch.float32) - 127.0)
    return (v.unflatten(-1, (-1, 32)) * scale[..., None]).flatten(-2)


def tk_convert(tk, w, s, num_warps=8):
    """triton_kernels' own conversion, exactly as vLLM's _swizzle_mxfp4 calls it (MX axis = dim 1)."""
    layout = tk["layout"]
    vl, vo = layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
    sl, so = layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=num_warps)
    wt = tk["convert_layout"](tk["wrap_torch_tensor"](w.transpose(-2, -1), dtype=tk["FP4"]), vl, **vo)
    st = tk["convert_layout"](tk["wrap_torch_tensor"](s.transpose(-2, -1)), sl, **so)
    return wt, st


def wrap_converted(tk, val, sc, K, N, num_warps=8):
    """layoutc's contiguous outputs ([E, N/4, 4*K/2] and [E, N/32, 32*K/32]) as triton_kernels tensors that are
    already in the Hopper layouts: matmul_ogs reads their .mT views; nothing is converted here."""
    layout = tk["layout"]
    E = val.shape[0]
    vlay = layout.HopperMXValueLayout([E, K // 2, N], mx_axis=1)
    slay = layout.HopperMXScaleLayout([E, K // 32, N], mx_axis=1, num_warps=num_warps)
    wt = tk["Tensor"](tk["Storage"](val.mT, vlay), dtype=tk["FP4"], shape=[E, K, N])
    st = tk["Tensor"](tk["Storage"](sc.mT, slay), dtype=torch.uint8, shape=[E, K // 32, N])
    return wt, st


def routing(tk, logits, n_act):
    """Top-k routing as triton_kernels' own tests build it (gather only: one output row per (token, expert))."""
    sl = tk["topk"](logits, n_act)
    dispatch = sl.mask_metadata.row_sorted_indx
    combine = sl.mask_metadata.col_sorted_indx
    meta = tk["make_ragged_tensor_metadata"](sl.mask_metadata.col_sum, dispatch.shape[0])
    rdata = tk["RoutingData"](None, meta.slice_sizes, logits.shape[-1], n_act, meta)
    return rdata, tk["GatherIndx"](combine, dispatch), sl.indx


def run_mm(tk, x, wt, st, rdata, gidx):
    pc = tk["PrecisionConfig"](weight_scale=st, flex_ctx=tk["FlexCtx"](rhs_data=tk["InFlexData"]()))
    y = tk["matmul_ogs"](x, wt, None, rdata, gather_indx=gidx, precision_config=pc)
    torch.cuda.synchronize()
    return y.reshape(-1, y.shape[-1])


def reference(x, wdq, gidx, indx, n_act):
    """fp32 reference: output row i = x[token] @ W[expert]^T for the i-th (token, expert) pair in expert order."""
    flat = gidx.src_indx.long()
    tok = flat // n_act
    exp = indx.flatten()[flat].long()
    xs = x.float()[tok]
    return torch.einsum("rk,rnk->rn", xs, wdq[exp]) if len(tok) <= 64 else torch.cat(
        [torch.einsum("rk,rnk->rn", xs[i:i + 64], wdq[exp[i:i + 64]]) for i in range(0, len(tok), 64)])


def rel_err(y, ref):
    return float(((y.float() - ref).norm() / ref.norm()).item())


def linear_scales_in_swizzled_shape(s, shape):
    """The mistake `layoutc check` refuses: scales left linear (convert_layout called on the weight only), their
    bytes placed where matmul_ogs expects HOPPER_SCALE storage of the same size (zero padded like the real one)."""
    E, rows, cols = shape  # [E, N_pad/32, 32*Kc_pad]
    N, Kc = s.shape[1], s.shape[2]
    npad, kpad = rows * 32, cols // 32
    p = torch.zeros((E, npad, kpad), dtype=s.dtype, device=s.device)
    p[:, :N, :Kc] = s
    return p.reshape(E, rows, cols)


def bytes_compare(a_storage, b_out):
    """A's storage (a .mT view of a contiguous buffer) against layoutc's contiguous output, which may pad more."""
    a = a_storage.mT.contiguous()
    rows, cols = a.shape[-2], a.shape[-1]
    same_shape = tuple(a.shape) == tuple(b_out.shape)
    overlap = b_out[..., :rows, :cols]
    extra = b_out.numel() - overlap.numel()
    extra_nonzero = int((b_out != 0).sum().item() - (overlap != 0).sum().item()) if extra else 0
    return {"tk_shape": list(a.shape), "layoutc_shape": list(b_out.shape), "same_shape": same_shape,
            "overlap_bytes_differ": int((overlap != a).sum().item()), "extra_padding_bytes": int(extra),
            "extra_padding_nonzero": extra_nonzero}


def cuda_time(fn, calls=10, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / calls


GUARD_NOTES = []


def guard(lc, tensors):
    """lc.guard(). A converter generated before the guard took the dims of the conversion from its record cannot
    bind I from these padded outputs (round_up hides it); for those, its provenance half (_guard_layer: spec
    hash, parameters, storage, shape, stride, version) -- and the run records that it did so."""
    try:
        return lc.guard(tensors)
    except lc.LayoutError as e:
        if "cannot infer dim" not in str(e):
            raise
        if not GUARD_NOTES:
            GUARD_NOTES.append(f"guard() cannot bind dims from these outputs ({e}); used _guard_layer")
        return lc._guard_layer(tensors, lc.SPEC_SHA256, lc.PARAMS, False, "guard")


def case(tk, lc, name, E, I, H, n_tokens, n_act, log):
    dev = "cuda"
    res = {"case": name, "E": E, "I": I, "H": H, "tokens": n_tokens, "top_k": n_act}
    ck = checkpoint(E, I, H, seed=1234 + E + I + H, device=dev)
    snap = {k: v.clone() for k, v in ck.items()}
    t0 = time.time()
    out = lc.convert(dict(ck), lowering="fused")
    torch.cuda.synchronize()
    res["convert_first_call_s"] = round(time.time() - t0, 3)
    res["inputs_unmodified"] = all(torch.equal(snap[k], ck[k]) for k in ck)
    guard(lc, out)  # must pass: one layer, straight from the converter
    res["guard_on_converter_output"] = "passed"
    g = torch.Generator(device=dev)
    g.manual_seed(7)
    for mat, N, K in (("w13", 2 * I, H), ("w2", H, I)):
        w, s = ck[f"{mat}_weight"], ck[f"{mat}_weight_scale"]
        wa, sa = tk_convert(tk, w, s)
        res[f"{mat}_value_bytes"] = bytes_compare(wa.storage.data, out[f"{mat}_weight"])
        res[f"{mat}_scale_bytes"] = bytes_compare(sa.storage.data, out[f"{mat}_weight_scale"])
        wb, sb = wrap_converted(tk, out[f"{mat}_weight"], out[f"{mat}_weight_scale"], K, N)
        x = (torch.randn((n_tokens, K), generator=g, device=dev) * 0.5).to(torch.bfloat16)
        logits = torch.randn((n_tokens, E), generator=g, device=dev)
        rdata, gidx, indx = routing(tk, logits, n_act)
        ya = run_mm(tk, x, wa, sa, rdata, gidx)
        yb = run_mm(tk, x, wb, sb, rdata, gidx)
        ref = reference(x, dequant(w, s), gidx, indx, n_act)
        diff = (yb.view(torch.int16) != ya.view(torch.int16))
        res[f"{mat}_outputs"] = int(yb.numel())
        res[f"{mat}_B_vs_A_wrong"] = int(diff.sum().item())
        res[f"{mat}_B_vs_A_max_abs"] = float((yb.float() - ya.float()).abs().max().item())
        res[f"{mat}_A_rel_err_vs_ref"] = rel_err(ya, ref)
        res[f"{mat}_B_rel_err_vs_ref"] = rel_err(yb, ref)
        res[f"{mat}_B_digest"] = hashlib.sha256(yb.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
        # the wrong conversion: right values, scales left linear in HOPPER_SCALE-shaped storage
        bad = linear_scales_in_swizzled_shape(s, tuple(out[f"{mat}_weight_scale"].shape))
        wbad, sbad = wrap_converted(tk, out[f"{mat}_weight"], bad, K, N)
        yw = run_mm(tk, x, wbad, sbad, rdata, gidx)
        tol = 0.05 * ref.abs().max()
        res[f"{mat}_wrong_not_bitwise_equal_pct"] = 100.0 * float((yw.view(torch.int16) != ya.view(torch.int16))
                                                                   .float().mean().item())
        res[f"{mat}_wrong_off_by_5pct_of_max_pct"] = 100.0 * float(((yw.float() - ref).abs() > tol)
                                                                    .float().mean().item())
        res[f"{mat}_wrong_rel_err_vs_ref"] = rel_err(yw, ref)
        log(f"[{name}] {mat}: B vs A wrong {res[f'{mat}_B_vs_A_wrong']}/{yb.numel()}, rel err A "
            f"{res[f'{mat}_A_rel_err_vs_ref']:.3e} B {res[f'{mat}_B_rel_err_vs_ref']:.3e}; wrong scales: "
            f"{res[f'{mat}_wrong_not_bitwise_equal_pct']:.1f}% differ, "
            f"rel err {res[f'{mat}_wrong_rel_err_vs_ref']:.3f}")
        log(f"[{name}] {mat} bytes: value {res[f'{mat}_value_bytes']} scale {res[f'{mat}_scale_bytes']}")
    # the guard stops the wrong conversion before the kernel
    wrong = dict(out)
    wrong["w13_weight_scale"] = linear_scales_in_swizzled_shape(ck["w13_weight_scale"],
                                                                tuple(out["w13_weight_scale"].shape))
    try:
        guard(lc, wrong)
        res["guard_on_wrong_scales"] = "NOT REFUSED"
    except lc.LayoutError as e:
        res["guard_on_wrong_scales"] = f"refused: {e}"
    edited = dict(out)
    edited["w2_weight_scale"] = out["w2_weight_scale"].clone()
    edited["w2_weight_scale"].view(-1)[0] ^= 1
    try:
        guard(lc, edited)
        res["guard_on_edited_copy"] = "NOT REFUSED"
    except lc.LayoutError as e:
        res["guard_on_edited_copy"] = f"refused: {e}"
    out["w13_weight"].view(-1)[0] ^= 1  # one byte changed in place after conversion
    try:
        guard(lc, out)
        res["guard_on_written_in_place"] = "NOT REFUSED"
    except lc.LayoutError as e:
        res["guard_on_written_in_place"] = f"refused: {e}"
    log(f"[{name}] guard: wrong scales -> {res['guard_on_wrong_scales'][:110]}")
    log(f"[{name}] guard: edited copy -> {res['guard_on_edited_copy'][:110]}")
    log(f"[{name}] guard: written in place -> {res['guard_on_written_in_place'][:110]}")
    return res, ck


def timing(lc, ck, name, log):
    """Converter (fused, 10 calls back to back) against a device copy of the same input bytes."""
    nbytes = sum(v.numel() * v.element_size() for v in ck.values())
    dst = {k: torch.empty_like(v) for k, v in ck.items()}

    def copy():
        for k, v in ck.items():
            dst[k].copy_(v)

    def conv():
        lc.convert(ck, lowering="fused")

    t_copy = cuda_time(copy)
    t_conv = cuda_time(conv)
    t_copy2 = cuda_time(copy)
    t_copy = min(t_copy, t_copy2)
    r = {"case": name, "input_bytes": nbytes, "copy_ms": t_copy, "convert_ms": t_conv,
         "fraction_of_copy": t_copy / t_conv, "copy_TBps": 2 * nbytes / t_copy / 1e9}
    log(f"[{name}] timing: {nbytes / 1e6:.1f} MB, copy {t_copy:.3f} ms ({r['copy_TBps']:.2f} TB/s r+w), "
        f"convert {t_conv:.3f} ms -> {100 * r['fraction_of_copy']:.1f}% of copy")
    return r


def profile(lc, ck, name, log, calls=5):
    """Where the converter's time goes: device kernels (torch profiler) against the host wall time of a call."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    lc.convert(ck, lowering="fused")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        lc.convert(ck, lowering="fused")
    host_ms = (time.perf_counter() - t0) * 1e3 / calls  # launches only: no synchronize inside the loop
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            lc.convert(ck, lowering="fused")
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        dev_us = getattr(ev, "device_time_total", None)
        if dev_us is None:
            dev_us = getattr(ev, "cuda_time_total", 0)
        if dev_us:
            rows.append((dev_us / calls, ev.count // calls, ev.key[:90]))
    rows.sort(reverse=True)
    log(f"[{name}] profile: host time per convert() call {host_ms:.3f} ms (launch side, unsynchronised)")
    for us, n, key in rows[:8]:
        log(f"[{name}] profile: {us / 1e3:.3f} ms/call in {n} launch(es): {key}")
    return {"case": name, "host_ms_per_call": host_ms,
            "device_ms_per_call": sum(r[0] for r in rows) / 1e3,
            "kernels": [{"ms_per_call": r[0] / 1e3, "launches_per_call": r[1], "name": r[2]} for r in rows[:8]]}


def goldens(tk, lc, out_dir, log):
    """Small CPU-checkable golden: a checkpoint and triton_kernels' own Hopper conversion of it (made here, on
    the GPU, by the library), for tests/goldens."""
    E, I, H = 2, 96, 160  # pads on every axis (I to 64-multiples, K/2 to 64, N to 256 rows)
    ck = checkpoint(E, I, H, seed=99, device="cuda")
    g = {"dims": torch.tensor([E, I, H])}
    for mat in ("w13", "w2"):
        w, s = ck[f"{mat}_weight"], ck[f"{mat}_weight_scale"]
        wa, sa = tk_convert(tk, w, s)
        g[f"{mat}_weight"] = w.cpu()
        g[f"{mat}_weight_scale"] = s.cpu()
        g[f"tk_{mat}_weight"] = wa.storage.data.mT.contiguous().cpu()
        g[f"tk_{mat}_weight_scale"] = sa.storage.data.mT.contiguous().cpu()
    path = os.path.join(out_dir, "triton_kernels_hopper_mxfp4.pt")
    torch.save(g, path)
    log(f"goldens: {path} " + ", ".join(f"{k}{list(v.shape)}" for k, v in g.items()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--converter", required=True)
    ap.add_argument("--tk-src", required=True, help="python/triton_kernels folder of the Triton release")
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument("--profile", action="store_true", help="also profile the converter at the real sizes")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    sys.path.insert(0, os.path.abspath(a.tk_src))
    import triton
    from triton_kernels.matmul_ogs import FlexCtx, GatherIndx, PrecisionConfig, RoutingData, matmul_ogs
    from triton_kernels.numerics import InFlexData
    from triton_kernels.tensor import (
        FP4,
        Storage,
        Tensor,
        convert_layout,
        make_ragged_tensor_metadata,
        wrap_torch_tensor,
    )
    from triton_kernels.tensor_details import layout
    from triton_kernels.topk import topk
    tk = {"FlexCtx": FlexCtx, "GatherIndx": GatherIndx, "PrecisionConfig": PrecisionConfig,
          "RoutingData": RoutingData, "matmul_ogs": matmul_ogs, "InFlexData": InFlexData, "FP4": FP4,
          "Storage": Storage, "Tensor": Tensor, "convert_layout": convert_layout,
          "make_ragged_tensor_metadata": make_ragged_tensor_metadata, "wrap_torch_tensor": wrap_torch_tensor,
          "layout": layout, "topk": topk}
    lc = load_module(a.converter, "layoutc_converter")
    logf = open(os.path.join(a.out, "run.log"), "w")  # noqa: SIM115 -- open for the whole run

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    env = {"torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
           "device": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
           "converter": getattr(lc, "SPEC_NAME", "?"), "converter_sha256": getattr(lc, "SPEC_SHA256", "?"),
           "params": getattr(lc, "PARAMS", {})}
    log(json.dumps(env))
    results = {"env": env, "cases": [], "timing": [], "profile": []}
    cases = [("small", 4, 192, 320, 8, 2), ("gpt-oss-20b", 32, 2880, 2880, 16, 4)]
    if not a.skip_large:
        cases.append(("gpt-oss-120b", 128, 2880, 2880, 32, 4))
    for name, E, I, H, T, k in cases:
        try:
            r, ck = case(tk, lc, name, E, I, H, T, k, log)
            results["cases"].append(r)
            if E >= 32:
                results["timing"].append(timing(lc, ck, name, log))
                if a.profile:
                    results["profile"].append(profile(lc, ck, name, log))
            del ck
            torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001 -- a GPU session is short: report what failed and go on
            import traceback
            log(f"[{name}] FAILED: {type(e).__name__}: {e}\n{traceback.format_exc()}")
            results["cases"].append({"case": name, "error": f"{type(e).__name__}: {e}"})
    try:
        goldens(tk, lc, a.out, log)
    except Exception as e:  # noqa: BLE001 -- as above
        log(f"goldens FAILED: {type(e).__name__}: {e}")
    results["guard_notes"] = GUARD_NOTES
    log(f"guard notes: {GUARD_NOTES}")
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    log("done")


if __name__ == "__main__":
    main()
