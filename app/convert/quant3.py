"""q3_nl, Ferry's 3-bit expert format: a numpy decoder (the reference for
tests, independent of the C core) and the C quantizer through the extension.

A block of 256 values takes 99 bytes (3.09375 bits per value): 96 bytes of
3-bit indices into the fixed 8-point grid LEVELS, one exponent byte e and
four 4-bit codes j (one per group of 64 values); a group's scale is
2^((e - j)/8 - 20), or 0 when e = 0. The 96 index bytes are three rows of
eight little-endian u32 words; lane l's three words form a 96-bit number
whose bits 3s..3s+2 index value 8s + l. See docs/FORMAT.md and
docs/QUANTIZATION.md (why this format).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from app.engine.binding import FORMATS

NAME = "q3_nl"
#: 256 values in 99 bytes: the block geometry from the C core's table.
BLOCK, BLOCK_BYTES = FORMATS[NAME].block_elems, FORMATS[NAME].block_bytes
#: The grid (identical to fe_q3_levels in core_c/src/formats.c).
LEVELS = np.array([-2.1959, -1.3138, -0.7133, -0.2161, 0.2301, 0.7209, 1.3177, 2.1983], dtype=np.float32)
_FRAC = np.array([1.0, 1.09050773, 1.18920712, 1.29683955, 1.41421356, 1.54221083, 1.68179283, 1.83400809],
                 dtype=np.float32)


def group_scales(blocks: np.ndarray) -> np.ndarray:
    """(n, 99) blocks -> (n, 4) float32 group scales, exactly as the core computes them."""
    e = blocks[:, 96].astype(np.int32)[:, None]
    codes = np.stack([blocks[:, 97] & 15, blocks[:, 97] >> 4, blocks[:, 98] & 15, blocks[:, 98] >> 4], axis=1)
    v = e - codes.astype(np.int32) + 16
    p2 = (((v >> 3) + 105).astype(np.uint32) << np.uint32(23)).view(np.float32)
    return np.where(e == 0, np.float32(0), _FRAC[v & 7] * p2).astype(np.float32)


def indices(blocks: np.ndarray) -> np.ndarray:
    """(n, 99) blocks -> (n, 256) grid indices in value order."""
    words = np.ascontiguousarray(blocks[:, :96]).view("<u4").reshape(-1, 3, 8).astype(np.uint64)
    lo = words[:, 0] | (words[:, 1] << np.uint64(32))       # (n, 8) bits 0..63 of each lane
    hi = words[:, 2]                                          # bits 64..95
    s = np.arange(32, dtype=np.uint64)[None, :, None]         # (1, 32, 1)
    bit = np.uint64(3) * s
    from_lo = (lo[:, None, :] >> np.minimum(bit, np.uint64(63))) & np.uint64(7)
    from_lo = np.where(bit < 64, from_lo, np.uint64(0))
    spill = np.where((bit < 64) & (bit + np.uint64(3) > 64),
                     hi[:, None, :] << (np.uint64(64) - np.minimum(bit, np.uint64(64))), np.uint64(0))
    from_hi = np.where(bit >= 64, hi[:, None, :] >> (np.maximum(bit, np.uint64(64)) - np.uint64(64)), np.uint64(0))
    idx = (from_lo | spill | from_hi) & np.uint64(7)          # (n, 32 steps, 8 lanes)
    return idx.reshape(-1, 256).astype(np.intp)


def decode_blocks(blocks: np.ndarray) -> np.ndarray:
    """(n, 99) uint8 blocks -> (n, 256) float32 values."""
    s = np.repeat(group_scales(blocks), 64, axis=1)
    return (s * LEVELS[indices(blocks)]).astype(np.float32)


def dequantize(raw: np.ndarray, n_elements: int) -> np.ndarray:
    data = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if n_elements % BLOCK or data.size != n_elements // BLOCK * BLOCK_BYTES:
        raise ValueError(f"{n_elements} q3_nl values need {n_elements // BLOCK * BLOCK_BYTES} bytes, got {data.size}")
    return decode_blocks(data.reshape(-1, BLOCK_BYTES)).reshape(n_elements)


# --------------------------------------------------------------------------
# The C quantizer


def _lib():
    from app.engine.binding import ffi, lib   # the compiled core only through its binding
    return ffi, lib


def default_threads() -> int:
    """Threads a conversion uses by default: one per core (the quantizers' row
    splits and the converter's record encoders)."""
    return max(1, min(os.cpu_count() or 1, 64))


def _run_rows(rows: int, fn, threads: int | None) -> None:
    """Call fn(r0, r1) over row slices on a thread pool (the C call releases the GIL)."""
    n = max(1, min(threads or default_threads(), rows))
    if n == 1:
        fn(0, rows)
        return
    cuts = [rows * i // n for i in range(n + 1)]
    with ThreadPoolExecutor(n) as pool:
        for f in [pool.submit(fn, cuts[i], cuts[i + 1]) for i in range(n) if cuts[i] < cuts[i + 1]]:
            f.result()


def quantize_rows(name: str, block: int, block_bytes: int, call, values: np.ndarray,
                  importance: np.ndarray | None, threads: int | None, out: np.ndarray | None) -> np.ndarray:
    """float32 [..., cols] -> the bytes of a block format whose C quantizer is
    ``call(src, rows, cols, importance pointer, dst) -> 0 or -1``, rows split over
    ``threads`` (blocks are independent: the bytes do not depend on the split)."""
    ffi, _ = _lib()
    src = np.ascontiguousarray(values, dtype=np.float32)
    cols = src.shape[-1] if src.ndim else 0
    rows = src.size // cols if cols else 0
    if cols == 0 or cols % block:
        raise ValueError(f"{name} needs rows of a multiple of {block} values, got {cols}")
    out = _out(out, rows * (cols // block) * block_bytes)
    imp_ptr, _keep = _importance(importance, cols)
    flat = src.reshape(rows, cols)
    rb = cols // block * block_bytes

    def part(r0: int, r1: int) -> None:
        if call(ffi.from_buffer("float[]", flat[r0:r1]), r1 - r0, cols, imp_ptr,
                ffi.from_buffer(out[r0 * rb:r1 * rb])) != 0:
            raise ValueError(f"cannot quantize non-finite values (or bad importance) to {name}")

    _run_rows(rows, part, threads)
    return out


def _impl() -> int:
    """The kernel implementation to quantize with: the engines' default
    (FERRY_KERNELS, else the best this CPU runs). Every one writes the same bytes."""
    from app.engine.binding import default_kernels
    ffi, lib = _lib()
    name = default_kernels()
    if name == "auto":
        return lib.ferry_kernels_best()
    if name == "avx512vnni":  # the q8-only set: everything exact, this quantizer included, is AVX2's
        if not lib.ferry_q8_kernels_available(lib.FERRY_KERNELS_AVX512VNNI):
            raise ValueError(f"FERRY_KERNELS={name}: this CPU cannot run the {name} kernels")
        return lib.FERRY_KERNELS_AVX2
    for impl in (lib.FERRY_KERNELS_SCALAR, lib.FERRY_KERNELS_AVX2, lib.FERRY_KERNELS_NEON):
        if ffi.string(lib.ferry_kernels_name(impl)).decode() == name:
            if not lib.ferry_kernels_available(impl):
                raise ValueError(f"FERRY_KERNELS={name}: this CPU cannot run the {name} kernels")
            return impl
    raise ValueError(f"FERRY_KERNELS={name!r} is not one of auto, scalar, avx2, avx512vnni, neon")


def _out(out, nbytes: int) -> np.ndarray:
    """Where the quantizer writes: ``out`` (uint8, contiguous, nbytes) or a new array."""
    if out is None:
        return np.zeros(nbytes, dtype=np.uint8)
    if out.dtype != np.uint8 or out.size != nbytes or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"out must be {nbytes} writable contiguous bytes")
    return out.reshape(-1)


def _importance(importance, cols):
    ffi, _ = _lib()
    if importance is None:
        return ffi.NULL, None
    imp = np.ascontiguousarray(importance, dtype=np.float32).reshape(-1)
    if imp.size != cols:
        raise ValueError(f"importance needs {cols} values, got {imp.size}")
    return ffi.from_buffer("float[]", imp), imp


def quantize(values: np.ndarray, importance: np.ndarray | None = None, threads: int | None = None,
             out: np.ndarray | None = None) -> np.ndarray:
    """float32 (or bfloat16 bits as uint16) [..., cols] -> q3_nl bytes (uint8, flat; into ``out`` if given)."""
    ffi, lib = _lib()
    src = np.ascontiguousarray(values)
    cols = src.shape[-1]
    rows = src.size // cols if cols else 0
    if cols == 0 or cols % BLOCK:
        raise ValueError(f"q3_nl needs rows of a multiple of {BLOCK} values, got {cols}")
    out = _out(out, rows * (cols // BLOCK) * BLOCK_BYTES)
    imp_ptr, _keep = _importance(importance, cols)
    if src.dtype == np.uint16:
        source, ctype = lib.FERRY_Q3_SOURCE_BF16, "uint16_t[]"
    else:
        src = np.ascontiguousarray(src, dtype=np.float32)
        source, ctype = lib.FERRY_Q3_SOURCE_F32, "float[]"
    flat = src.reshape(rows, cols)
    rb = cols // BLOCK * BLOCK_BYTES
    impl = _impl()

    def part(r0: int, r1: int) -> None:
        rc = lib.ferry_q3_quantize(impl, source, ffi.from_buffer(ctype, flat[r0:r1]), ffi.NULL, r1 - r0, cols,
                                   imp_ptr, ffi.from_buffer(out[r0 * rb:r1 * rb]))
        if rc != 0:
            raise ValueError("cannot quantize non-finite values (or bad importance) to q3_nl")

    _run_rows(rows, part, threads)
    return out


def quantize_mxfp4(packed: np.ndarray, scales: np.ndarray, importance: np.ndarray | None = None,
                   threads: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """MXFP4 (packed [rows, cols/2] u8, E8M0 scales [rows, cols/32] u8) -> q3_nl bytes."""
    ffi, lib = _lib()
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    scales = np.ascontiguousarray(scales, dtype=np.uint8)
    rows, cols = packed.shape[0], packed.shape[1] * 2
    if scales.shape != (rows, cols // 32) or cols % BLOCK:
        raise ValueError("MXFP4 blocks and scales do not match, or a row is not a multiple of 256 values")
    out = _out(out, rows * (cols // BLOCK) * BLOCK_BYTES)
    imp_ptr, _keep = _importance(importance, cols)
    rb = cols // BLOCK * BLOCK_BYTES
    impl = _impl()

    def part(r0: int, r1: int) -> None:
        rc = lib.ferry_q3_quantize(impl, lib.FERRY_Q3_SOURCE_MXFP4, ffi.from_buffer(packed[r0:r1]),
                                   ffi.from_buffer(scales[r0:r1]), r1 - r0, cols, imp_ptr,
                                   ffi.from_buffer(out[r0 * rb:r1 * rb]))
        if rc != 0:
            raise ValueError("cannot quantize these MXFP4 blocks to q3_nl")

    _run_rows(rows, part, threads)
    return out


E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)


def mxfp4_encode(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 [rows, cols] -> (packed nibbles, E8M0 scales) with scale 2^(floor(log2 absmax) - 2)
    and round-to-nearest e2m1 (for tests and benchmarks)."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // 32, 32).astype(np.float32)
    am = np.abs(g).max(-1)
    e = np.where(am > 0, np.floor(np.log2(np.maximum(am, 1e-38))) - 2, -127).astype(np.int32)
    e = np.clip(e, -127, 127)
    s = np.exp2(e.astype(np.float32))[..., None]
    idx = np.abs(np.abs(g / s)[..., None] - E2M1).argmin(-1).astype(np.uint8)
    nib = (idx | np.where(g < 0, 8, 0).astype(np.uint8)).reshape(rows, cols)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
    return packed, (e + 127).astype(np.uint8)


def mxfp4_decode(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    rows = packed.shape[0]
    nib = np.stack([packed & 15, packed >> 4], axis=-1).reshape(rows, -1)
    v = E2M1[nib & 7] * np.where(nib & 8, -1.0, 1.0).astype(np.float32)
    s = np.exp2(scales.astype(np.float32) - 127)
    return (v.reshape(rows, -1, 32) * s[..., None]).reshape(rows, -1).astype(np.float32)
