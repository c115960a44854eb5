"""Two-bit expert formats: relative weight and output error, measured as
bench/quant_quality.py measures q3_nl (same matrix sets, same error
definitions), for issue 36's 2-bit expert format (target <= 2.3 bits/weight).

    python bench/quant2_quality.py [--k3-rows 384] [--layers 0 15 29] [--json]

(docs/QUANTIZATION.md's 2-bit table: --layers 15 --k3-rows 64, the machine
being loaded; the whole sets take about 40 CPU-minutes.)

Candidates, all encoded here, decoded where a reference decoder exists:
  q2_k        llama.cpp's Q2_K layout (2.625 bpw: 16 sub-blocks of 16 with a
              4-bit scale and a 4-bit min, f16 d and dmin per 256), bytes
              written by this script's encoder (a least-squares scale/min
              search, no imatrix) and DECODED BY gguf-py's reference
              Q2_K.dequantize (so the layout is the real one).
  iq2_xxs     llama.cpp's IQ2_XXS (2.0625 bpw: per 8 values an index into
              its 256-point E8-lattice grid and 7 sign bits, even parity; a
              4-bit scale per 32; f16 d per 256), bytes from this script's
              encoder (nearest grid point per candidate scale, least-squares
              sub-block scale), decoded by gguf-py's IQ2_XXS.dequantize.
  iq2_xs      the same with IQ2_XS's 512-point grid and a 4-bit scale per 16
              (2.3125 bpw), decoded by gguf-py.
  tq2_0       gguf-py's own ternary quantizer (2.0625 bpw), for reference.
  q2_vq-*     Ferry's vector candidate: per 8 values an index into a k-point
              codebook of magnitudes trained once by k-means on synthetic data
              outside these sets (k = 256: 8 bits, k = 512: 9 bits) and 7 sign
              bits (even parity, as IQ2); per G values a 4-bit log scale code
              under a u8 exponent per 256: k=512, G=16 is 2.281 bpw, k=256,
              G=32 2.031 bpw. Value-level model of the format.
  q2_nl-*     a q3_nl-like scalar 2-bit format: 2-bit indices into a fixed
              4-point non-uniform grid {-r, -1, 1, r} (r from a small search
              on these sets), a u8 block exponent per 256 and a 4-bit log
              scale code per group of G values (bench/quant_quality.py:nuq):
              G = 32 is 2.156 bpw, G = 16 is 2.281 bpw.
llama.cpp's own encoders (with their imatrix-free search) are not run here:
gguf-py has no Q2_K/IQ2 quantizer, and llama.cpp's is not built in this venv;
its encoders search harder than this script's, so the llama.cpp rows are an
upper bound of those formats' error.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

# The repository's root on the path, bench/ kept off it (a bench script named like a package would shadow
# it, as bench/kernels.py once did `kernels`): the shared measurement is bench.quant_quality.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from bench.quant_quality import demo_set, f16, k3_set, measure, nuq, summarize  # noqa: E402


# ------------------------------------------------------------------ Q2_K

def q2_k(W):
    """Q2_K bytes (84 per 256 values) from a least-squares search, decoded by gguf-py."""
    from gguf.quants import Q2_K
    x = W.reshape(-1, 16, 16).astype(np.float32)
    lo = np.minimum(x.min(2, keepdims=True), 0)
    hi = x.max(2, keepdims=True)
    best_e, best_s, best_m = None, None, None
    for f in np.linspace(0.7, 1.3, 13):
        for g in (1.0, 0.85, 0.7):
            m = lo * g
            s = np.maximum((hi - m) / 3 * f, 1e-30)
            q = np.clip(np.round((x - m) / s), 0, 3)
            # least squares for (s, m) given q: x ~ s q + m
            n = 16.0
            sq, sqq, sx, sqx = q.sum(2, keepdims=True), (q * q).sum(2, keepdims=True), x.sum(2, keepdims=True), (q * x).sum(2, keepdims=True)
            det = n * sqq - sq * sq
            s2 = np.where(det > 0, (n * sqx - sq * sx) / np.where(det > 0, det, 1), s)
            m2 = np.minimum(np.where(det > 0, (sx - s2 * sq) / n, m), 0)
            s2 = np.maximum(s2, 1e-30)
            q2 = np.clip(np.round((x - m2) / s2), 0, 3)
            e = ((x - (s2 * q2 + m2)) ** 2).sum(2, keepdims=True)
            if best_e is None:
                best_e, best_s, best_m = e, s2, m2
            else:
                k = e < best_e
                best_e, best_s, best_m = np.where(k, e, best_e), np.where(k, s2, best_s), np.where(k, m2, best_m)
    s, mn = best_s[..., 0], -best_m[..., 0]              # (blocks*16): scale > 0, min >= 0
    s, mn = s.reshape(-1, 16), mn.reshape(-1, 16)
    d = f16(s.max(1, keepdims=True) / 15)
    dm = f16(mn.max(1, keepdims=True) / 15)
    sc = np.clip(np.round(s / np.where(d == 0, 1, d)), 0, 15)
    mc = np.clip(np.round(mn / np.where(dm == 0, 1, dm)), 0, 15)
    ds, dmn = (d * sc)[..., None], (dm * mc)[..., None]
    xb = x.reshape(-1, 16, 16)
    q = np.clip(np.round((xb + dmn) / np.where(ds == 0, 1, ds)), 0, 3).astype(np.uint8)   # (nb, 16, 16)
    qv = q.reshape(-1, 256)
    nb = qv.shape[0]
    qs = np.zeros((nb, 64), np.uint8)
    for j in (0, 128):
        for k in range(4):
            qs[:, j // 4:j // 4 + 32] |= qv[:, j + 32 * k:j + 32 * k + 32] << (2 * k)
    scales = (sc.astype(np.uint8) | (mc.astype(np.uint8) << 4))
    raw = np.concatenate([scales, qs, d.astype(np.float16).view(np.uint8).reshape(nb, 2),
                          dm.astype(np.float16).view(np.uint8).reshape(nb, 2)], axis=1)
    assert raw.shape[1] == 84
    return Q2_K.dequantize_blocks(raw).reshape(W.shape).astype(np.float32), 84 * 8 / 256


# ------------------------------------------------------------------ IQ2

def _grid(cls):
    cls.init_grid()
    return np.asarray(cls.grid, np.float32).reshape(-1, 8)


def _iq2_codes(x, grid, sub):
    """For groups of 8 values x (n, 8) in sub-blocks of `sub` values: sign
    bits with even parity, grid indices and a per-sub-block scale."""
    sign = x < 0
    a = np.abs(x)
    odd = sign.sum(1) % 2 == 1
    flip = np.argmin(a, 1)                       # the cheapest sign to get wrong
    sign[np.arange(len(x))[odd], flip[odd]] ^= True
    gn = (grid * grid).sum(1)
    per = sub // 8
    A = a.reshape(-1, per, 8)
    am = np.maximum(A.max((1, 2)), 1e-30)
    best_e = best_idx = best_s = None
    for f in np.linspace(0.5, 1.2, 8):
        s = am / grid.max() * f                  # one scale per sub-block
        t = A / s[:, None, None]
        idx = np.argmin(gn[None, None] - 2 * (t @ grid.T), -1)
        G = grid[idx]
        s2 = (A * G).sum((1, 2)) / np.maximum((G * G).sum((1, 2)), 1e-30)
        e = ((A - s2[:, None, None] * G) ** 2).sum((1, 2))
        if best_e is None:
            best_e, best_idx, best_s = e, idx, s2
        else:
            k = e < best_e
            best_e, best_idx, best_s = np.where(k, e, best_e), np.where(k[:, None], idx, best_idx), np.where(k, s2, best_s)
    return sign, A, best_s


def _iq2_finish(A, s, grid, blocks_per_256):
    """Quantize the sub-block scales to 4 bits under an f16 d per 256 and
    re-pick each group's grid point with the stored scale."""
    s = s.reshape(-1, blocks_per_256)
    d = f16(s.max(1, keepdims=True) / (0.25 * 15.5))
    sc = np.clip(np.round(s / np.where(d == 0, 1, d) / 0.25 - 0.5), 0, 15)
    db = (d * (0.5 + sc) * 0.25).reshape(-1)
    gn = (grid * grid).sum(1)
    t = A / np.where(db == 0, 1, db)[:, None, None]
    idx = np.argmin(gn[None, None] - 2 * (t @ grid.T), -1)
    return d, sc.astype(np.uint32), idx


def iq2_xxs(W):
    from gguf.quants import IQ2_XXS
    grid = _grid(IQ2_XXS)
    x = W.reshape(-1, 8).astype(np.float32)
    sign, A, s = _iq2_codes(x, grid, 32)
    d, sc, idx = _iq2_finish(A, s, grid, 8)
    nb = d.shape[0]
    sbits = np.packbits(sign.reshape(-1, 8), axis=1, bitorder="little")[:, 0].astype(np.uint32) & 0x7F
    sbits = sbits.reshape(nb, 8, 4)
    idx = idx.reshape(nb, 8, 4).astype(np.uint32)
    w0 = idx[..., 0] | idx[..., 1] << 8 | idx[..., 2] << 16 | idx[..., 3] << 24
    w1 = sbits[..., 0] | sbits[..., 1] << 7 | sbits[..., 2] << 14 | sbits[..., 3] << 21 | sc << 28
    qs = np.stack([w0, w1], -1).astype(np.uint32).reshape(nb, 16).view(np.uint8)
    raw = np.concatenate([d.astype(np.float16).view(np.uint8).reshape(nb, 2), qs], 1)
    assert raw.shape[1] == 66
    return IQ2_XXS.dequantize_blocks(raw).reshape(W.shape).astype(np.float32), 66 * 8 / 256


def iq2_xs(W):
    from gguf.quants import IQ2_XS
    grid = _grid(IQ2_XS)
    x = W.reshape(-1, 8).astype(np.float32)
    sign, A, s = _iq2_codes(x, grid, 16)
    d, sc, idx = _iq2_finish(A, s, grid, 16)
    nb = d.shape[0]
    sbits = np.packbits(sign.reshape(-1, 8), axis=1, bitorder="little")[:, 0].astype(np.uint16) & 0x7F
    qs = (idx.reshape(-1).astype(np.uint16) | (sbits << 9)).reshape(nb, 32).view(np.uint8)
    sc = sc.reshape(nb, 8, 2).astype(np.uint8)
    scales = sc[..., 0] | (sc[..., 1] << 4)
    raw = np.concatenate([d.astype(np.float16).view(np.uint8).reshape(nb, 2), qs, scales], 1)
    assert raw.shape[1] == 74
    return IQ2_XS.dequantize_blocks(raw).reshape(W.shape).astype(np.float32), 74 * 8 / 256


def tq2_0(W):
    from gguf.quants import TQ2_0
    raw = TQ2_0.quantize_blocks(W.reshape(-1, 256).astype(np.float32))
    return TQ2_0.dequantize_blocks(raw).reshape(W.shape).astype(np.float32), raw.shape[1] * 8 / 256


# ------------------------------------------------------------------ q2_vq

def train_codebook(size: int, seed: int = 7, n: int = 1 << 16, iters: int = 12) -> np.ndarray:
    """A codebook of `size` non-negative 8-vectors (magnitudes; the signs are
    stored apart) trained by k-means once, like q3_nl's grid, on data that is
    NOT in the measured sets: Student-t(5) values with a log-normal spread of
    group scales (seed 7) and Gaussian ones, each group of 16 divided by its
    RMS, then frozen. Sorted by norm."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.standard_t(5, (n // 2, 16)), rng.standard_normal((n // 2, 16))]).astype(np.float32)
    x /= np.sqrt((x * x).mean(1, keepdims=True)) + 1e-12
    v = np.abs(x.reshape(-1, 8))
    C = v[rng.choice(len(v), size, replace=False)].copy()
    for _ in range(iters):
        a = np.argmin((C * C).sum(1)[None] - 2 * (v @ C.T), 1)
        cnt = np.bincount(a, minlength=size)
        S = np.zeros_like(C)
        np.add.at(S, a, v)
        C = np.where(cnt[:, None] > 0, S / np.maximum(cnt, 1)[:, None], C)
    return C[np.argsort((C * C).sum(1))].astype(np.float32)


def q2_vq(W, grid, sub=16, step=1 / 8, sub_bits=4):
    """Per 8 values: an index into `grid` (log2(len) bits) and 7 sign bits
    (even parity, the cheapest value's sign given up); per `sub` values a
    `sub_bits` log scale code (steps of `step` octave) under a u8 exponent per
    256 values. Value level (no bytes): the format's arithmetic."""
    x = W.reshape(-1, 8).astype(np.float32)
    sign, A, s = _iq2_codes(x, grid, sub)
    per = 256 // sub
    s = s.reshape(-1, per)
    top = np.exp2(np.ceil(np.log2(np.maximum(s.max(1, keepdims=True), 1e-30)) / step) * step)
    code = np.clip(np.round(-np.log2(np.maximum(s, 1e-30) / top) / step), 0, 2 ** sub_bits - 1)
    db = (top * np.exp2(-code * step)).reshape(-1)
    gn = (grid * grid).sum(1)
    idx = np.argmin(gn[None, None] - 2 * ((A / db[:, None, None]) @ grid.T), -1)
    vals = db[:, None, None] * grid[idx]
    out = np.where(sign.reshape(vals.shape), -vals, vals)
    return out.reshape(W.shape), float((np.log2(len(grid)) + 7) / 8 + (sub_bits + 8 * sub / 256) / sub)


# ------------------------------------------------------------------ q2_nl

def q2_nl(W, r, G, h=None):
    L = np.array([-r, -1.0, 1.0, r], np.float32)
    Wh, _ = nuq(W, L, 256, G, 4, 1 / 8, h=h, nsearch=16)
    return Wh, 2 + (8 + 4 * 256 // G) / 256


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, nargs="+", default=[0, 15, 29])
    ap.add_argument("--k3-rows", type=int, default=384, help="rows of each K3 matrix (0 = all)")
    ap.add_argument("--ratios", type=float, nargs="+", default=[4.5],
                    help="outer/inner level ratios r tried for q2_nl")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--ferry-only", action="store_true",
                    help="only Ferry's formats as the converter writes them (q2_vq and q3_nl, the C quantizers)")
    a = ap.parse_args(argv)
    t0 = time.time()
    sets = {k: (W, X) for k, (W, X) in demo_set(a.layers).items()}
    sets.update({k: (v[0], v[1]) for k, v in k3_set(a.k3_rows or None).items()})
    from app.convert import quant2, quant3

    def ferry_format(mod):
        def run(W, X):
            flat = W.reshape(-1, 256) if W.shape[-1] % 256 else W     # rows joined as the q3_nl table did
            back = mod.dequantize(mod.quantize(flat), flat.size).reshape(W.shape)
            return back, mod.BLOCK_BYTES * 8 / mod.BLOCK
        return run

    ferry = {"q2_vq (Ferry's C quantizer)": ferry_format(quant2), "q3_nl (Ferry's C quantizer)": ferry_format(quant3)}
    if a.ferry_only:
        formats = ferry
    else:
        formats = {**ferry, "q2_k (gguf-decoded)": lambda W, X: q2_k(W), "iq2_xxs (gguf-decoded)": lambda W, X: iq2_xxs(W),
               "iq2_xs (gguf-decoded)": lambda W, X: iq2_xs(W), "tq2_0 (gguf)": lambda W, X: tq2_0(W)}
    grids = {}
    for size, sub in (() if a.ferry_only else ((256, 32), (512, 16))):
        grid = grids.setdefault(size, train_codebook(size))
        formats[f"q2_vq k={size} G={sub}"] = lambda W, X, g=grid, sub=sub: q2_vq(W, g, sub)
    for r in (() if a.ferry_only else a.ratios):
        for G in (32, 16):
            formats[f"q2_nl r={r:g} G={G}"] = lambda W, X, r=r, G=G: q2_nl(W, r, G)
    table = measure(formats, sets, verbose=not a.json)
    summary = summarize(table)
    out = {"date": time.strftime("%Y-%m-%d"), "table": table, "summary": summary, "seconds": round(time.time() - t0, 1)}
    print(json.dumps(out, indent=1) if a.json else json.dumps({"summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
