"""Small conversion functions for ``layoutc equiv`` tests against tests/equiv/tiny.lyt (no FlashInfer)."""

from __future__ import annotations

import torch


def _swap(x: torch.Tensor) -> torch.Tensor:
    a, b = torch.chunk(x, 2, dim=1)
    return torch.cat([b, a], dim=1)


def good(t):
    out = {"w13_weight": _swap(t["w13_weight"]), "w13_weight_scale": _swap(t["w13_weight_scale"])}
    if t.get("w13_bias") is not None:
        out["w13_bias"] = _swap(t["w13_bias"]).to(torch.bfloat16)
    return out


def positional(w, s, b=None):
    return _swap(w), _swap(s), (_swap(b).to(torch.bfloat16) if b is not None else None)


def in_place(t):
    """Like an engine's process_weights_after_loading: replaces the layer's tensors, returns nothing."""
    t["w13_weight"] = _swap(t["w13_weight"])
    t["w13_weight_scale"] = _swap(t["w13_weight_scale"])
    if t.get("w13_bias") is not None:
        t["w13_bias"] = _swap(t["w13_bias"]).to(torch.bfloat16)


def truncating_cast(t):
    """The bias converted to bf16 by dropping the low 16 bits instead of rounding to nearest even."""
    out = good(t)
    if t.get("w13_bias") is not None:
        bits = _swap(t["w13_bias"]).contiguous().view(torch.int32)
        out["w13_bias"] = (bits >> 16).to(torch.int16).view(torch.bfloat16)
    return out


def nibbles_swapped(t):
    """The two FP4 values of every weight byte exchanged (a packer that puts element 2j in the high nibble)."""
    out = good(t)
    w = out["w13_weight"]
    out["w13_weight"] = ((w & 0x0F) << 4) | (w >> 4)
    return out


def shifted_block(t):
    """Scale rows [0, 8) of each expert read rows [8, 16): a block shifted by its size."""
    out = good(t)
    s = out["w13_weight_scale"].clone()
    s[:, 0:8] = out["w13_weight_scale"][:, 8:16]
    out["w13_weight_scale"] = s
    return out


def raises(t):
    raise ValueError("unsupported layout")


def returns_list(t):
    return list(good(t).values())


def returns_text(t):
    return "done"


def only_small_layers(t):
    """Works at I <= 32 only: equiv's other sampled shapes find it out."""
    if t["w13_weight"].shape[1] > 64:
        raise RuntimeError("I > 32 is not supported")
    return good(t)


EIGHTS = [5, 2, 7, 0, 3, 6, 1, 4]


def _shuffle_eights(x: torch.Tensor) -> torch.Tensor:
    e, r = x.shape[:2]
    return x.reshape(e, r // 8, 8, *x.shape[2:])[:, :, EIGHTS].reshape(x.shape)


def shuffled_eights(t):
    """Rows shuffled the same way within every group of eight: an order no short chain of registered
    ops gives (infer's table fallback)."""
    out = {"w13_weight": _shuffle_eights(t["w13_weight"]), "w13_weight_scale": _shuffle_eights(t["w13_weight_scale"])}
    if t.get("w13_bias") is not None:
        out["w13_bias"] = _shuffle_eights(t["w13_bias"]).to(torch.bfloat16)
    return out


def good_with_params(t, params=None):
    """``good``, taking the spec's parameters (as an engine's recipe reads activation=...)."""
    return good(t)


def raises_when_large(t):
    """``good`` at the given dims; at larger ones raises with control characters (bell, backspace) in its message."""
    if t["w13_weight"].shape[1] > 64:
        raise ValueError("too large\x07\x08")
    return good(t)
