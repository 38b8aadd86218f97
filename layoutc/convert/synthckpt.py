"""A synthetic checkpoint in the vLLM layout, for throughput runs and tests of ``layoutc convert``.

MoE layers under vLLM's FusedMoE names (``model.layers.{i}.mlp.experts.w13_weight``, ...) filled
by :func:`synthetic_inputs` (deterministic per layer), plus the tensors a real
checkpoint carries beside them and ``layoutc convert`` copies through (attention projections,
norms, the router, embeddings and the LM head, in bf16). Tensors are packed into shards of about
``shard_bytes`` (whole layers by default, or tensor by tensor as Hugging Face's writer does, which
splits layers across shards), written with :mod:`layoutc.convert.shardfile` and indexed by
``model.safetensors.index.json``. Generating on a GPU is fast; the bytes written are then limited by
the disk.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from ..algebra import expr as ex
from . import shardfile
from ..api import CompiledSpec

PREFIX = "model.layers.{}.mlp.experts"
INDEX = "model.safetensors.index.json"


def synthetic_inputs(spec: CompiledSpec, dims: Mapping[str, int], seed: int, device: str = "cpu") -> dict:
    """Deterministic tensors matching the spec's inputs: random bytes for packed and scale
    types, bf16-representable normals for float types (so casts round-trip exactly)."""
    # Generated on the target device (a CUDA generator there: deterministic, and fast for large layers).
    g = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for t in spec.program.inputs:
        shape = tuple(int(ex.evaluate(s, dims)) for s in t.shape)
        if t.elem.torch_dtype.is_floating_point and t.elem.bits >= 16:
            x = torch.randn(shape, generator=g, device=device).to(torch.bfloat16).to(t.elem.torch_dtype)
        elif t.elem.bits == 8:
            x = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g, device=device).view(t.elem.torch_dtype)
        elif not t.elem.torch_dtype.is_floating_point and shape:
            # wider integers (GPTQ's int32 words of eight 4-bit values): random bytes, every bit pattern
            nbytes = t.elem.bits // 8
            raw = torch.randint(0, 256, (*shape[:-1], shape[-1] * nbytes), dtype=torch.uint8, generator=g,
                                device=device)
            x = raw.view(t.elem.torch_dtype)
        else:
            raise ValueError(f"no synthetic data for {t.elem.name}")
        out[t.name] = x
    return out



def moe_layer_bytes(spec: CompiledSpec, dims: Mapping[str, int]) -> int:
    """Bytes of one MoE layer's checkpoint tensors (every input, optional ones included)."""
    total = 0
    for t in spec.program.inputs:
        numel = math.prod(int(ex.evaluate(s, dims)) for s in t.shape)
        total += numel * t.elem.torch_dtype.itemsize
    return total


def _extras(layer: int, dims: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """Non-MoE tensors of one transformer layer (shapes roughly gpt-oss's)."""
    h, e = dims["H"], dims["E"]
    heads = max(1, h // 45)  # gpt-oss-120b: H = 2880, 64 query heads of 64, 8 KV heads
    p = f"model.layers.{layer}"
    return {f"{p}.input_layernorm.weight": (h,), f"{p}.post_attention_layernorm.weight": (h,),
            f"{p}.self_attn.q_proj.weight": (heads * 64, h), f"{p}.self_attn.k_proj.weight": (max(1, heads // 8) * 64, h),
            f"{p}.self_attn.v_proj.weight": (max(1, heads // 8) * 64, h), f"{p}.self_attn.o_proj.weight": (h, heads * 64),
            f"{p}.mlp.router.weight": (e, h)}


def plan(spec: CompiledSpec, dims: Mapping[str, int], layers: int, vocab: int) -> list[tuple[str, list[tuple[str, Any]]]]:
    """Units of tensors in file order: [(unit name, [(tensor name, shape or ("moe", layer)), ...])]."""
    units: list[tuple[str, list[tuple[str, Any]]]] = [("embed", [("model.embed_tokens.weight", (vocab, dims["H"]))])]
    for layer in range(layers):
        items: list[tuple[str, Any]] = list(_extras(layer, dims).items())
        items += [(f"{PREFIX.format(layer)}.{t.name}", ("moe", layer)) for t in spec.program.inputs]
        units.append((f"layer{layer}", items))
    units.append(("head", [("model.norm.weight", (dims["H"],)), ("lm_head.weight", (vocab, dims["H"]))]))
    return units


def write_checkpoint(
    folder: str | Path, spec: CompiledSpec, dims: Mapping[str, int], layers: int, shard_bytes: int,
    vocab: int = 1024, seed: int = 0, device: str = "cpu", split_layers: bool = False,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Write the checkpoint into ``folder`` (created; must not hold one). Returns a summary:
    shards, bytes, seconds, tensor names of MoE layers."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if any(folder.glob("*.safetensors")):
        raise FileExistsError(f"{folder} already holds safetensors files")
    t0 = time.perf_counter()
    units = plan(spec, dims, layers, vocab)
    moe_sizes = {}
    for t in spec.program.inputs:
        moe_sizes[t.name] = math.prod(int(ex.evaluate(s, dims)) for s in t.shape) * t.elem.torch_dtype.itemsize

    def nbytes(item) -> int:
        name, what = item
        if what[0] == "moe":
            return moe_sizes[name.rsplit(".", 1)[1]]
        return math.prod(what) * 2

    # Pack into shards: whole units, or tensor by tensor (a layer may then straddle two shards).
    shards: list[list[tuple[str, Any]]] = [[]]
    size = 0
    for _, items in units:
        groups = [[it] for it in items] if split_layers else [items]
        for g in groups:
            b = sum(nbytes(it) for it in g)
            if shards[-1] and size + b > shard_bytes:
                shards.append([])
                size = 0
            shards[-1].extend(g)
            size += b
    count = len(shards)
    weight_map, total = {}, 0
    cache: dict[int, dict[str, torch.Tensor]] = {}
    gen = torch.Generator(device=device)
    for s, items in enumerate(shards):
        file = f"model-{s + 1:05d}-of-{count:05d}.safetensors"
        tensors = {}
        for name, what in items:
            if what[0] == "moe":
                layer = what[1]
                if layer not in cache:
                    cache.clear()  # one MoE layer on the device at a time
                    cache[layer] = synthetic_inputs(spec, dims, seed=seed * 100003 + layer, device=device)
                t = cache[layer][name.rsplit(".", 1)[1]]
            else:
                gen.manual_seed(seed * 100003 + 7919 + len(weight_map))
                t = torch.randn(what, generator=gen, device=device, dtype=torch.float32).to(torch.bfloat16)
            tensors[name] = t.cpu()
            weight_map[name] = file
        shardfile.write(folder / file, tensors, {"format": "pt"})
        total += (folder / file).stat().st_size
        if log:
            log(f"  wrote {file}: {(folder / file).stat().st_size / 1e9:.2f} GB ({time.perf_counter() - t0:.1f} s)")
        del tensors
    cache.clear()
    (folder / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    return {"shards": count, "bytes": total, "seconds": time.perf_counter() - t0, "layers": layers,
            "dims": dict(dims), "files": [f"model-{s + 1:05d}-of-{count:05d}.safetensors" for s in range(count)]}


def sized(spec: CompiledSpec, size_bytes: int, dims: Mapping[str, int], vocab: int = 201088,
          min_layers: int = 4) -> tuple[dict[str, int], int, int]:
    """Dims, MoE layer count and vocabulary for a checkpoint of about ``size_bytes``: the given dims
    when ``min_layers`` layers fit, else fewer experts (and a smaller vocabulary) so they do."""
    dims = dict(dims)
    vocab = min(vocab, max(256, int(size_bytes * 0.07 / (2 * 2 * dims["H"]))))  # embeddings + head ~ <= 7%
    extra = 2 * vocab * dims["H"] * 2
    while dims["E"] > 1 and moe_layer_bytes(spec, dims) * min_layers > size_bytes - extra:
        dims["E"] = max(1, dims["E"] // 2)
    per = moe_layer_bytes(spec, dims) + sum(math.prod(s) * 2 for s in _extras(0, dims).values())
    layers = max(min_layers, math.ceil((size_bytes - extra) / per))
    return dims, layers, vocab
