"""The input checkpoint of ``layoutc convert``, scanned before anything is converted.

Reads the index (``model.safetensors.index.json``, when there is one) and every shard's header,
checks that the index names only plain shard files beside it and that every tensor is where it
says, groups the tensors into MoE layers by the name mapping, and checks every layer's dtypes and
shapes against the spec on meta tensors. Every malformed input fails here, as a LayoutError naming
the file and tensor, before any shard is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import attrs
import torch

from . import shardio
from ..api import CompiledSpec
from ..runtime.checks import LayoutError
from .namemap import NameRule
from .shardheader import TensorInfo, load_json, read_header, utf8_name
from ..front.text import display

INDEX = "model.safetensors.index.json"


def _plain_file_name(name: Any, where: str) -> str:
    """A shard file name from a checkpoint index: a plain name in the checkpoint's folder. A path
    (``../victim.safetensors``, ``/etc/x``) would read outside ``--in`` and write outside ``--out``;
    a hidden name (``.layoutc-run.json``, ``.x.safetensors.tmp``) or the index or manifest would have
    a converted shard renamed over layoutc's own bookkeeping in ``--out``."""
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name
            or "\0" in name or any(not c.isprintable() for c in name)):
        raise LayoutError(f"{where}: {name!r} is not a plain file name in the checkpoint's folder; "
                          f"an index may only name files beside it")
    if name.startswith(".") or not name.endswith(".safetensors"):  # the index and manifest end in .json
        raise LayoutError(f"{where}: {name!r} is not a shard name; an index may only name *.safetensors "
                          f"files whose names do not start with '.'")
    return name


@attrs.frozen
class _Scan:
    """What the input folder holds, read from its index and every shard's header before anything
    is converted: tensor -> shard for every tensor of every shard (the index's entries and those it
    leaves out), the tensors the index leaves out, and the index itself (None: no index)."""

    weight_map: dict[str, str]
    unindexed: tuple[str, ...]
    index: dict[str, Any] | None
    infos: dict[str, TensorInfo]  # every tensor's dtype and shape, from its header


def _shard_map(in_dir: Path) -> dict[str, str]:
    """Tensor name -> shard file name (checked: plain names inside ``in_dir``)."""
    return _scan(in_dir).weight_map


def _scan(in_dir: Path) -> _Scan:
    """Read and check the index and every shard's header (see :class:`_Scan`). Every malformed input
    is a LayoutError naming the file (and the tensor) here, before any shard is converted."""
    index_path = in_dir / INDEX
    index = None
    if index_path.is_file():
        where = display(str(index_path))
        try:
            text = index_path.read_bytes()
        except OSError as err:
            raise LayoutError(f"{where}: cannot read ({err.strerror or err})") from None
        index = load_json(text, where, "a valid index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise LayoutError(f"{where}: expected an object with a non-empty \"weight_map\" of tensor name -> file")
        if not isinstance(index.get("metadata", {}), dict):
            raise LayoutError(f"{where}: \"metadata\" must be an object (got {type(index['metadata']).__name__}); "
                              f"the converted index adds layoutc's provenance to it")
        listed = {}
        for tensor, file in weight_map.items():
            if not utf8_name(tensor):
                raise LayoutError(f"{where}: the tensor name {display(repr(tensor))} is not valid UTF-8 "
                                  f"(a lone surrogate)")
            listed[tensor] = _plain_file_name(file, f"{where}: the entry for {display(repr(tensor))}")
            if not (in_dir / file).is_file():
                raise LayoutError(f"{where}: names {display(repr(file))} for {display(repr(tensor))}, which is not a "
                                  f"file in {display(str(in_dir))}")
        files = sorted(set(listed.values()))
    else:
        listed = None
        files = sorted(p.name for p in in_dir.glob("*.safetensors") if p.is_file() and not p.name.startswith("."))
        if not files:
            raise LayoutError(f"{display(str(in_dir))}: no *.safetensors file and no {INDEX}")
    held: dict[str, str] = {}
    infos: dict[str, TensorInfo] = {}
    for f in files:
        for info in read_header(in_dir / f).tensors:
            name = info.name
            if name in held:
                raise LayoutError(f"{display(str(in_dir))}: the tensor {display(repr(name))} is in two shards, "
                                  f"{held[name]} and {f}; a loader would keep either")
            if info.dtype not in shardio.TORCH_DTYPES:  # valid safetensors, but not one torch reads as such
                raise LayoutError(f"{display(str(in_dir / f))}: tensor {display(repr(name))} has dtype {info.dtype}, "
                                  f"which layoutc convert cannot copy (it handles "
                                  f"{', '.join(sorted(shardio.TORCH_DTYPES))})")
            held[name] = f
            infos[name] = info
    if listed is None:
        return _Scan(held, (), None, infos)
    for tensor, file in listed.items():
        if held.get(tensor) != file:
            there = f" (it is in {held[tensor]})" if tensor in held else ""
            raise LayoutError(f"{display(str(index_path))}: names {file} for {display(repr(tensor))}, which that "
                              f"file does not hold{there}")
    # vLLM and transformers load every tensor of a shard: one the index leaves out is still part of
    # the model, so it is copied (and listed in the written index), never dropped
    unindexed = tuple(n for n in held if n not in listed)
    return _Scan(dict(listed) | {n: held[n] for n in unindexed}, unindexed, index, infos)


def _groups(weight_map: Mapping[str, str], rules: Mapping[str, NameRule],
            spec: CompiledSpec) -> dict[str, dict[str, str]]:
    """Layer -> {spec input: checkpoint name}, for layers that have every required input."""
    regexes = {n: r.regex() for n, r in rules.items()}
    groups: dict[str, dict[str, str]] = {}
    for tensor in weight_map:
        matched = [(n, m.group("layer")) for n, rx in regexes.items() if (m := rx.match(tensor))]
        if len(matched) > 1:
            # two conversions would write this one output tensor: whichever ran last would win
            raise LayoutError(f"the name mapping maps spec inputs {' and '.join(n for n, _ in matched)} to one "
                              f"checkpoint tensor, {display(repr(tensor))}; give each input its own name (--names)")
        for n, layer in matched:
            groups.setdefault(layer, {})[n] = tensor
    required = [t.name for t in spec.program.inputs if not t.optional]
    if not groups:
        first = rules[required[0]].template if required else "?"
        seen = ", ".join(sorted(weight_map)[:3])
        raise LayoutError(f"no MoE layer matches the name mapping "
                          f"(e.g. {first!r} for {required[0] if required else '?'}); "
                          f"the checkpoint holds names like {seen}; check --names (vllm, gpt-oss or a JSON file)")
    incomplete = {layer: sorted(set(required) - set(g)) for layer, g in groups.items() if not set(required) <= set(g)}
    if incomplete:
        layer, missing = next(iter(incomplete.items()))
        raise LayoutError(f"layer {layer!r} has some MoE tensors but not {', '.join(missing)} "
                          f"({len(incomplete)} incomplete layer(s)); check --names")
    return groups


def _check_layers(spec: CompiledSpec, groups: Mapping[str, Mapping[str, str]], rules: Mapping[str, NameRule],
                  scan: _Scan) -> None:
    """Every MoE layer's dtypes and shapes (from the headers, as the name mapping loads them) against
    the spec's contract and divisibility checks, on meta tensors: a layer that would fail halfway
    through the run fails here, before any shard is converted."""
    module = spec.module
    for layer, group in groups.items():
        tensors = {}
        for n, name in group.items():
            info, rule = scan.infos[name], rules[n]
            shape = info.shape
            if rule.merge_last:
                if len(shape) < 2:
                    raise LayoutError(f"layer {display(repr(layer))} (shard {scan.weight_map[name]}): {n} is "
                                      f"{display(name)} with shape {list(shape)}; merge_last needs two axes to merge")
                shape = (*shape[:-2], shape[-2] * shape[-1])
            dtype = getattr(torch, rule.dtype) if rule.dtype else shardio.TORCH_DTYPES[info.dtype]
            tensors[n] = torch.empty(shape, dtype=dtype, device="meta")
        try:
            module._check_call(tensors, None, "convert", module.INPUTS, module._INPUT_SHAPES, module._INPUT_AXES,
                               module.DIMS, module._CONDITIONS, module._CONVERT_CHECKS)
        except module.LayoutError as err:
            shards = sorted({scan.weight_map[name] for name in group.values()})
            raise LayoutError(f"layer {display(repr(layer))} (shard {', '.join(shards)}): {err}") from None
