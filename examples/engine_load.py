"""An engine's load path with the guard, end to end: convert ahead of time or at load, wrap the
tensors in parameters, move them to the device, guard before the kernel.

    python examples/engine_load.py [--device cuda]     # runs on the CPU by default

Path A (ahead of time): ``layoutc convert`` writes a converted checkpoint and a manifest with the
fingerprint of every converted tensor; the engine loads the shards as usual and calls
``trust_checkpoint`` once. Path B (at load): the engine converts each layer with the spec. Either
way the engine then copies the tensors where it wants them (here: preallocated parameters on the
device, filled with ``param.data.copy_``, as a weight loader does), calls the guard once in
``process_weights_after_loading`` (a copy is fingerprinted there, on its device, once) and before
every fused MoE call (a dict lookup per tensor). Last, what the guard rejects: a shard changed
after conversion, and a layer whose conversion was skipped (the lost layout).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

import layoutc
import layoutc.guard
from layoutc.convert.checkpoint import convert_checkpoint, finish
from layoutc.convert.synthckpt import synthetic_inputs

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "flashinfer_trtllm_mxfp4.lyt"  # a padded layout: I=192 is stored as 256
DIMS = {"E": 4, "I": 192, "H": 256}
LAYERS = 2
PREFIX = "model.layers.{}.mlp.experts"


def write_checkpoint(folder: Path, spec) -> None:
    """A small checkpoint in the layout the model was trained in (vLLM names), one shard."""
    folder.mkdir(parents=True)
    tensors = {}
    for layer in range(LAYERS):
        for name, t in synthetic_inputs(spec, DIMS, seed=layer).items():
            tensors[f"{PREFIX.format(layer)}.{name}"] = t
        tensors[f"model.layers.{layer}.self_attn.qkv.weight"] = torch.randn(8, 8)
    save_file(tensors, str(folder / "model.safetensors"))


class MoELayer(torch.nn.Module):
    """What an engine allocates before loading: parameters of the kernel layout, on the device."""

    def __init__(self, shapes: dict, device: str):
        super().__init__()
        for name, (shape, dtype) in shapes.items():
            self.register_parameter(name, torch.nn.Parameter(torch.empty(shape, dtype=dtype, device=device),
                                                             requires_grad=False))

    def tensors(self) -> dict:
        return dict(self.named_parameters())


def weight_loader(layer: MoELayer, loaded: dict) -> None:
    for name, t in loaded.items():
        getattr(layer, name).data.copy_(t)  # a copy onto the device: new storage, the same bytes


def process_weights_after_loading(layer: MoELayer, spec) -> None:
    # Once, after loading: every tensor of the layer is fingerprinted where it lies and matched
    # with what layoutc converted (or trusted); later checks are dict lookups.
    layoutc.guard.check(layer.tensors(), spec, same_call=True)


def fused_moe(layer: MoELayer, spec) -> None:
    layoutc.guard.check(layer.tensors(), spec)  # right before the kernel (microseconds)
    # ... flashinfer's trtllm_fp4_block_scale_moe(..., layer.w13_weight, ...) would run here ...


def layer_of(tensors: dict, i: int) -> dict:
    head = PREFIX.format(i) + "."
    return {k[len(head):]: v for k, v in tensors.items() if k.startswith(head)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    device = ap.parse_args().device
    spec = layoutc.compile_file(SPEC)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_checkpoint(tmp / "ckpt", spec)

        # -- path A: converted ahead of time (`layoutc convert --spec ... --in ckpt --out converted`)
        convert_checkpoint(spec, tmp / "ckpt", tmp / "converted")
        finish(spec, tmp / "ckpt", tmp / "converted", "vllm")
        loaded = load_file(str(tmp / "converted" / "model.safetensors"))  # as the engine loads any checkpoint
        trusted = layoutc.guard.trust_checkpoint(tmp / "converted", loaded, spec)
        print(f"A: {len(trusted)} converted tensors match the manifest's fingerprints")
        for i in range(LAYERS):
            mine = layer_of(loaded, i)
            layer = MoELayer({k: (tuple(v.shape), v.dtype) for k, v in mine.items()}, device)
            weight_loader(layer, mine)
            process_weights_after_loading(layer, spec)
            fused_moe(layer, spec)
            print(f"A: layer {i} on {device}: guarded (I={layoutc.guard.provenance(layer.w13_weight)['dims']['I']}, "
                  f"stored padded as {layer.w2_weight.shape[-1] * 2})")

        # -- path B: converted at load, on the CPU, then moved
        raw = load_file(str(tmp / "ckpt" / "model.safetensors"))
        for i in range(LAYERS):
            out = spec.convert(layer_of(raw, i))  # on the CPU here; on the GPU an engine converts there
            params = {k: torch.nn.Parameter(v.to(device, copy=True), requires_grad=False) for k, v in out.items()}
            del out  # the guard follows the bytes, not the CPU tensors
            layoutc.guard.check(params, spec, same_call=True)
            print(f"B: layer {i} converted on the CPU, moved to {device}: guarded")

        # -- what the guard rejects
        shard = tmp / "converted" / "model.safetensors"
        tampered = load_file(str(shard))
        tampered[f"{PREFIX.format(1)}.w2_weight"].view(-1)[7] ^= 1  # one bit of one byte, e.g. a bad re-save
        try:
            layoutc.guard.trust_checkpoint(tmp / "converted", tampered, spec)
        except layoutc.LayoutError as err:
            print("rejected:", err)
        lost = {k: torch.nn.Parameter(v.to(device), requires_grad=False) for k, v in layer_of(raw, 0).items()}
        try:  # the weights as trained, never converted: a dropped flag (AITER's is_shuffled) looks like this
            layoutc.guard.check(lost, spec)
        except layoutc.LayoutError as err:
            print("rejected:", err)


if __name__ == "__main__":
    main()
