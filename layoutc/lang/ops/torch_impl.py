"""Eager torch implementations of the primitives: the reference lowering.

Every function here is self-contained (it uses only ``torch`` and module-level
constants defined next to it) because code generation copies the source of the
functions a spec uses into the standalone converter module. Each function takes
a tensor and plain Python values and returns a new tensor or a view; it never
writes to its input. The index map of the same primitive lives in the op's
module; tests check the two agree element for element.

``dim`` arguments are non-negative axis numbers; leading axes (experts) are batch.
"""

import torch


def swap_halves(x, dim):
    # [A; B] -> [B; A] along dim.
    dim = dim % x.dim()
    h = x.shape[dim] // 2
    return torch.cat([x.narrow(dim, h, h), x.narrow(dim, 0, h)], dim=dim)


def interleave_rows(x, dim, group):
    # [A; B] -> [A[0:g], B[0:g], A[g:2g], B[g:2g], ...] along dim.
    dim = dim % x.dim()
    n = x.shape[dim]
    y = x.unflatten(dim, (2, n // (2 * group), group)).transpose(dim, dim + 1)
    return y.flatten(dim, dim + 2)


def deinterleave_rows(x, dim, group):
    # [A[0:g], B[0:g], A[g:2g], ...] -> [A; B] along dim (inverse of interleave_rows).
    dim = dim % x.dim()
    n = x.shape[dim]
    y = x.unflatten(dim, (n // (2 * group), 2, group)).transpose(dim, dim + 1)
    return y.flatten(dim, dim + 2)


def swap_pairs(x, dim):
    # rows (2i, 2i+1) -> (2i+1, 2i).
    dim = dim % x.dim()
    n = x.shape[dim]
    return x.unflatten(dim, (n // 2, 2)).flip(dim + 1).flatten(dim, dim + 1)


def pad(x, dim, multiple, parts, value):
    # Split dim into `parts` equal parts and extend each with `value` to a multiple of `multiple`.
    # `value` is the fill's bit pattern (0x38 is E4M3 1.0), as in the fused lowerings.
    dim = dim % x.dim()
    n = x.shape[dim] // parts
    size = -(-n // multiple) * multiple
    chunks = x.unflatten(dim, (parts, n))
    shape = list(chunks.shape)
    shape[dim + 1] = size
    width = x.element_size()
    same_width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]
    fill = value - (1 << 8 * width) if 1 < width < 8 and value >= 1 << (8 * width - 1) else value
    out = torch.full(shape, fill, dtype=same_width, device=x.device).view(x.dtype)
    out.narrow(dim + 1, 0, n).copy_(chunks)
    return out.flatten(dim, dim + 1)


def crop(x, dim, size, parts):
    # Keep the first `size` entries of each of `parts` equal parts of dim.
    dim = dim % x.dim()
    n = x.shape[dim] // parts
    if size > n:
        raise ValueError(f"crop keeps {size} of each part along dim {dim}, but a part has only {n}")
    return x.unflatten(dim, (parts, n)).narrow(dim + 1, 0, size).flatten(dim, dim + 1)


def repeat_rows(x, dim, times):
    # Each entry of dim repeated `times` times in place: out[r] = in[r // times].
    return x.repeat_interleave(times, dim=dim % x.dim())


def shard(x, dim, rank, ranks, parts):
    # Keep slice `rank` of `ranks` of each of `parts` equal parts of dim (tensor parallelism).
    dim = dim % x.dim()
    part = x.shape[dim] // parts
    size = part // ranks
    return x.unflatten(dim, (parts, part)).narrow(dim + 1, rank * size, size).flatten(dim, dim + 1)


def block_major_k(x, block):
    # [.., R, K] -> [.., K/block, R, block] (FlashInfer convert_to_block_layout, per leading index)
    return x.unflatten(-1, (x.shape[-1] // block, block)).transpose(-3, -2)


def unblock_major_k(x):
    return x.transpose(-3, -2).flatten(-2)


def reshape(x, shape):
    return x.reshape(shape)


def transpose(x, dim0, dim1):
    return x.transpose(dim0, dim1)


def view_as(x, dtype):
    # Relabel the bits (same element size); no value changes.
    return x.view(dtype)


def rearrange(x, split, perm, out):
    # Reshape to the pattern's axes, put them in the right side's order, regroup.
    return x.reshape(split).permute(perm).reshape(out)


def permute_axis(x, dim, formula):
    # out[.., r, ..] = x[.., formula(r), ..] along dim.
    n = x.shape[dim]
    src = torch.as_tensor(formula(torch.arange(n, device=x.device), n, x.device), device=x.device)
    return x.index_select(dim, src.expand(n).contiguous())


def unpermute_axis(x, dim, formula):
    # The inverse of permute_axis: out[.., formula(r), ..] = x[.., r, ..].
    n = x.shape[dim]
    src = torch.as_tensor(formula(torch.arange(n, device=x.device), n, x.device), device=x.device)
    return x.index_select(dim, torch.argsort(src.expand(n).contiguous()))


def permute_bits(x, table):
    # Each little-endian word of len(table) bits (bytes along the last axis): out bit i = in bit table[i].
    # Bits that move by the same shift between the same byte pair go in one masked shift.
    w = len(table) // 8
    words = x.view(torch.uint8).reshape(*x.shape[:-1], x.shape[-1] // w, w)
    groups = {}
    for i, s in enumerate(table):
        key = (i // 8, s // 8, i % 8 - s % 8)
        groups[key] = groups.get(key, 0) | (1 << (s % 8))
    out = torch.zeros_like(words)
    for (dst, src, shift), mask in sorted(groups.items()):
        picked = words[..., src] & mask
        out[..., dst] |= (picked << shift) if shift >= 0 else (picked >> -shift)
    return out.reshape(x.shape).view(x.dtype)


def extract_bits(x, shift, width, dtype):
    # The bit field [shift, shift + width) of each element, as an unsigned integer stored in dtype's bits
    # (fp32 exponent -> E8M0 byte: shift 23, width 8).
    raw = x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]).to(torch.int64)
    field = (raw >> shift) & ((1 << width) - 1)
    size = torch.empty((), dtype=dtype).element_size()
    carrier = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
    if size < 8 and carrier != torch.uint8:
        field = torch.where(field >= 1 << (8 * size - 1), field - (1 << (8 * size)), field)
    return field.to(carrier).view(dtype)


def insert_bits(x, shift, width, dtype):
    # Each element's low `width` bits placed at [shift, shift + width) of a zero element of dtype.
    raw = x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]).to(torch.int64)
    size = torch.empty((), dtype=dtype).element_size()
    word = ((raw & ((1 << width) - 1)) << shift) & ((1 << (8 * size)) - 1)
    carrier = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
    if size < 8 and carrier != torch.uint8:
        word = torch.where(word >= 1 << (8 * size - 1), word - (1 << (8 * size)), word)
    return word.to(carrier).view(dtype)


def view_width(x, dtype):
    # Relabel the bytes of the last axis as elements of another width (4 x u8 <-> i32), little-endian.
    return x.contiguous().view(dtype)


def cast(x, dtype, exp=0):
    # Convert values: round to nearest even; every NaN becomes the target type's canonical quiet NaN
    # (torch's own conversion is device-dependent there: f32 -> bf16 gives 0xFFFF on the CPU).
    y = x.to(dtype)
    if x.is_floating_point() and y.is_floating_point() and x.dtype != dtype:
        y = torch.where(torch.isnan(x), torch.tensor(float("nan"), dtype=dtype, device=x.device), y)
    if exp:
        # then times 2**exp in the new type (vLLM's Marlin NVFP4 scales: x.to(half) * 2**7). A value of
        # the new type times 2**exp (0 <= exp <= 127) is exact in fp32, or inf: one result on every device.
        y = cast(y.to(torch.float32) * float(2 ** exp), dtype)
    return y
