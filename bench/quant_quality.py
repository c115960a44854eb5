"""Weight-format quality: relative weight error and relative output error.

    python bench/quant_quality.py [--candidates] [--layers 0 15 29] --json

Matrix sets, all measured in this one run:
  demo  the demo model's real FFN weights (SmolLM2-135M, dequantized from its
        Q4_1 GGUF), with real activations: the inputs of each layer's MLP and
        of its down projection, captured by transformers on ~256 tokens of text.
  k3mx  MXFP4-sourced matrices with Kimi K3's expert shapes (w1/w3 [3072, 3584],
        w2 [3584, 3072]): Student-t(5) weights with log-normal row and column
        scales, rounded to bf16, quantized to MXFP4 (group 32, E8M0), and the
        MXFP4 values taken as the source. Activations: Gaussian with log-normal
        per-channel scales (a few strong channels).
Errors: ||W - Q(W)|| / ||W|| and ||X W^T - X Q(W)^T|| / ||X W^T||.
q3_nl is quantized by the C core (ferry_q3_quantize_*); its quantizer throughput
per core is measured on the k3mx matrices. --candidates adds the numpy
experiments of docs/QUANTIZATION.md (grids, TCQ, residual VQ).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.convert import quant, quant3  # noqa: E402


def f16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


# ------------------------------------------------------------- baselines

def rtn3_asym(W, g=256):
    """Plain 3-bit round-to-nearest, groups of g, f16 min and step (3.125 bpw at g = 256)."""
    x = W.reshape(-1, g)
    lo = f16(x.min(1, keepdims=True))
    d = f16((x.max(1, keepdims=True) - lo) / 7)
    q = np.clip(np.round((x - lo) / np.where(d == 0, 1, d)), 0, 7)
    return (q * d + lo).reshape(W.shape), 3 + 32 / g


def q3k_like(W):
    """A Q3_K-style k-quant (3.4375 bpw): 256-blocks of 16 sub-blocks of 16, signed 6-bit sub-scales times
    an f16 scale, q in -4..3, each sub-block's scale chosen by a small least-squares search."""
    x = W.reshape(-1, 16, 16).astype(np.float32)
    am = np.abs(x).max(2, keepdims=True)
    sign = np.take_along_axis(x, np.abs(x).argmax(2)[..., None], 2)
    am = np.where(am == 0, 1.0, am)
    best_s, best_e = None, None
    for f in np.linspace(-0.6, 0.6, 13):
        s = -np.where(sign < 0, -am, am) / (4 + f)
        q = np.clip(np.round(x / s), -4, 3)
        qq = (q * q).sum(2, keepdims=True)
        s2 = np.where(qq > 0, (x * q).sum(2, keepdims=True) / np.maximum(qq, 1e-30), s)
        e = ((x - s2 * np.clip(np.round(x / s2), -4, 3)) ** 2).sum(2, keepdims=True)
        if best_e is None:
            best_s, best_e = s2, e
        else:
            m = e < best_e
            best_s, best_e = np.where(m, s2, best_s), np.minimum(e, best_e)
    sc = best_s[..., 0]
    i = np.abs(sc).argmax(1)
    d = f16(sc[np.arange(len(sc)), i] / -32)[:, None]
    qs = np.clip(np.round(sc / np.where(d == 0, 1, d)), -32, 31)
    s = (d * qs)[..., None]
    q = np.clip(np.round(x / np.where(s == 0, 1, s)), -4, 3)
    return (s * q).reshape(W.shape), 110 * 8 / 256


def ggml(fmt):
    def run(W):
        raw = quant.quantize(W.reshape(-1), fmt)
        return quant.dequantize(raw, fmt, W.size).reshape(W.shape), quant.FORMATS[fmt].block_bytes * 8 / 32
    return run


def q3_nl(W, h=None):
    raw = quant3.quantize(W.reshape(-1, 256 * (W.shape[-1] // 256)) if W.shape[-1] % 256 == 0 else W.reshape(-1, 2304),
                          importance=None if h is None else np.tile(h, 2304 // h.size if W.shape[-1] % 256 else 1))
    return quant3.dequantize(raw, W.size).reshape(W.shape), quant3.BLOCK_BYTES * 8 / quant3.BLOCK


# ------------------------------------------------------------ candidates

GAUSS_LM = np.array([-2.152, -1.344, -0.756, -0.245, 0.245, 0.756, 1.344, 2.152], np.float32)


def _nearest(v, L):
    return np.searchsorted((L[1:] + L[:-1]) / 2, v)


def nuq(W, L, B=256, G=64, sub_bits=4, step=1 / 8, h=None, super_f16=False, nsearch=12):
    """A non-uniform 8-point grid L with per-G-group scales: a 2^sub_bits code (log steps `step`) under a
    per-B exponent byte (or an f16 when super_f16). Importance-weighted scale search."""
    x = W.reshape(-1, B // G, G).astype(np.float32)
    hw = np.ones_like(x) if h is None else np.tile(h, W.size // h.size).reshape(x.shape).astype(np.float32)
    am = np.abs(x).max(2, keepdims=True)
    am = np.where(am == 0, 1e-30, am)
    bs, be = None, None
    for f in np.linspace(0.6, 1.1, nsearch):
        s = am / np.abs(L).max() * f
        c = L[_nearest(x / s, L)]
        s2 = (hw * x * c).sum(2, keepdims=True) / np.maximum((hw * c * c).sum(2, keepdims=True), 1e-30)
        c = L[_nearest(x / s2, L)]
        e = (hw * (x - s2 * c) ** 2).sum(2, keepdims=True)
        if be is None:
            bs, be = s2, e
        else:
            m = e < be
            bs, be = np.where(m, s2, bs), np.minimum(e, be)
    codes = (2.0 ** (-np.arange(2 ** sub_bits) * step)).astype(np.float32)
    top = bs.max(1, keepdims=True)
    d = f16(top) if super_f16 else np.exp2(np.ceil(np.log2(np.maximum(top, 1e-30)) / step) * step).astype(np.float32)
    best, beste = None, None
    for cf in codes:
        s = d * cf
        v = s * L[_nearest(x / np.where(s == 0, 1, s), L)]
        e = (hw * (x - v) ** 2).sum(2, keepdims=True)
        if best is None:
            best, beste = v, e
        else:
            m = e < beste
            best, beste = np.where(m, v, best), np.minimum(e, beste)
    return best.reshape(W.shape), 3 + ((16 if super_f16 else 8) + sub_bits * (B // G)) / B


def tcq(W, B=256, nsearch=6):
    """8-state trellis-coded quantization (Ungerboeck trellis, 16-point uniform union codebook in 4 subsets,
    3 bits per value) with an f16 scale per B values (3.0625 bpw); Viterbi search."""
    x = W.reshape(-1, B).astype(np.float64)
    U = np.arange(16) - 7.5
    subs = [U[np.arange(16) % 4 == k] for k in range(4)]
    nxt = np.array([[(2 * s + b) & 7 for b in range(2)] for s in range(8)])
    sub = np.array([[(s & 1) + 2 * (b ^ ((s >> 1) & 1) ^ ((s >> 2) & 1)) for b in range(2)] for s in range(8)])
    am = np.maximum(np.abs(x).max(1, keepdims=True), 1e-30)
    best, beste = None, None
    nb = x.shape[0]
    for f in np.linspace(0.75, 1.25, nsearch):
        delta = f16(am / 7.5 * f * 0.75)
        cost = np.full((nb, 8), np.inf)
        cost[:, 0] = 0
        back = np.zeros((B, nb, 8), np.int8)
        val = np.zeros((B, nb, 8))
        for t in range(B):
            v = x[:, t] / delta[:, 0]
            sv = np.stack([S[np.clip(np.round((v - S[0]) / 4), 0, 3).astype(int)] for S in subs], 1)
            se = (v[:, None] - sv) ** 2
            new = np.full((nb, 8), np.inf)
            frm = np.zeros((nb, 8), np.int8)
            nv = np.zeros((nb, 8))
            for s in range(8):
                for b in range(2):
                    ns, k = nxt[s, b], sub[s, b]
                    c = cost[:, s] + se[:, k]
                    m = c < new[:, ns]
                    new[:, ns] = np.where(m, c, new[:, ns])
                    frm[:, ns] = np.where(m, s, frm[:, ns])
                    nv[:, ns] = np.where(m, sv[:, k], nv[:, ns])
            cost, back[t], val[t] = new, frm, nv
        st = cost.argmin(1)
        out = np.zeros_like(x)
        for t in range(B - 1, -1, -1):
            out[:, t] = val[t][np.arange(nb), st]
            st = back[t][np.arange(nb), st]
        out *= delta
        e = ((x - out) ** 2).sum(1, keepdims=True)
        if best is None:
            best, beste = out, e
        else:
            m = e < beste
            best, beste = np.where(m, out, best), np.minimum(e, beste)
    return best.reshape(W.shape).astype(np.float32), 3 + 16 / B


def rvq(W, dim=8, bits=12, stages=2, iters=8):
    """Residual vector quantization: rows scaled by their RMS (f16), `stages` k-means codebooks of
    2^bits dim-vectors trained on this matrix (codebook bytes not counted: 3 bpw + codebooks)."""
    import torch
    x = W.astype(np.float32)
    r = f16(np.sqrt((x ** 2).mean(1, keepdims=True)) + 1e-30)
    X = torch.from_numpy((x / r).reshape(-1, dim).copy())
    R, out = X.clone(), torch.zeros_like(X)

    def assign(V, C):
        cn = (C * C).sum(1)
        return torch.cat([(cn[None] - 2 * V[i:i + 65536] @ C.T).argmin(1) for i in range(0, len(V), 65536)])

    g = torch.Generator().manual_seed(0)
    for _ in range(stages):
        sample = R[torch.randperm(len(R), generator=g)[:100000]]
        C = sample[torch.randperm(len(sample), generator=g)[:2 ** bits]].clone()
        for _ in range(iters):
            a = assign(sample, C)
            s = torch.zeros_like(C).index_add_(0, a, sample)
            cnt = torch.bincount(a, minlength=2 ** bits).float()[:, None]
            C = torch.where(cnt > 0, s / cnt.clamp(min=1), C)
        q = C[assign(R, C)]
        out += q
        R -= q
    return out.numpy().reshape(x.shape) * r, 3.0


# ------------------------------------------------------------ matrix sets

def demo_set(layers):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from app import demo
    from app.convert.gguf_file import GGUFFile
    p = demo.gguf_path(install=True)
    g = GGUFFile(p)
    m = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "FORMAT.md").read_text() + (root / "README.md").read_text()
    ids = tok(text, return_tensors="pt").input_ids[:, :256]
    acts, hooks = {}, []
    for l in layers:
        mlp = m.model.layers[l].mlp
        hooks.append(mlp.register_forward_pre_hook(lambda mod, a, l=l: acts.__setitem__((l, "in"), a[0][0].numpy().copy())))
        hooks.append(mlp.down_proj.register_forward_pre_hook(
            lambda mod, a, l=l: acts.__setitem__((l, "down"), a[0][0].numpy().copy())))
    with torch.no_grad():
        m(ids)
    out = {}
    for l in layers:
        for part in ("up", "gate", "down"):
            W = g.read_f32(f"blk.{l}.ffn_{part}.weight").astype(np.float32)
            out[f"demo.blk{l}.{part}"] = (W, acts[(l, "down" if part == "down" else "in")])
    return out


def k3_weights(shape, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_t(5, size=shape).astype(np.float32) * 0.02
    w *= np.exp(rng.normal(0, 0.25, (shape[0], 1))).astype(np.float32)
    w *= np.exp(rng.normal(0, 0.25, (1, shape[1]))).astype(np.float32)
    return quant.bf16_bits_to_f32(quant.f32_to_bf16_bits(w)).reshape(shape)


def k3_set(rows=None):
    rng = np.random.default_rng(0)
    out = {}
    for i, (name, shape) in enumerate([("w1", (3072, 3584)), ("w3", (3072, 3584)), ("w2", (3584, 3072))]):
        packed, scales = quant3.mxfp4_encode(k3_weights(shape, i))
        if rows:
            packed, scales = packed[:rows], scales[:rows]
        W = quant3.mxfp4_decode(packed, scales)
        X = (rng.standard_normal((64, shape[1])) * np.exp(rng.normal(0, 0.7, shape[1]))).astype(np.float32)
        out[f"k3mx.{name}"] = (W, X, packed, scales)
    return out


def errors(W, Wh, X):
    W64, Wh64 = W.astype(np.float64), Wh.astype(np.float64)
    Y = X.astype(np.float64) @ W64.T
    return (float(np.linalg.norm(W64 - Wh64) / np.linalg.norm(W64)),
            float(np.linalg.norm(Y - X.astype(np.float64) @ Wh64.T) / np.linalg.norm(Y)))


def measure(formats, sets, verbose=False) -> list[dict]:
    """One row per (format, matrix): bits per weight and both errors."""
    table = []
    for fname, fn in formats.items():
        for sname, (W, X) in sets.items():
            t = time.time()
            Wh, bpw = fn(W, X)
            Wr = W[:Wh.shape[0]]
            we, oe = errors(Wr, Wh, X)
            table.append({"format": fname, "matrix": sname, "set": sname.split(".")[0], "shape": list(Wr.shape),
                          "bits_per_weight": round(bpw, 4), "weight_rel_err": round(we, 5),
                          "output_rel_err": round(oe, 5), "seconds": round(time.time() - t, 2)})
            if verbose:
                print(table[-1], flush=True)
    return table


def summarize(table: list[dict]) -> dict:
    """Mean errors per (format, set)."""
    summary = {}
    for r in table:
        s = summary.setdefault(f"{r['format']} / {r['set']}", {"bits_per_weight": r["bits_per_weight"], "w": [], "o": []})
        s["w"].append(r["weight_rel_err"])
        s["o"].append(r["output_rel_err"])
    return {k: {"bits_per_weight": v["bits_per_weight"], "weight_rel_err_mean": round(float(np.mean(v["w"])), 4),
                "output_rel_err_mean": round(float(np.mean(v["o"])), 4)} for k, v in summary.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, nargs="+", default=[0, 15, 29])
    ap.add_argument("--candidates", action="store_true", help="also the numpy candidates (slow: TCQ, RVQ)")
    ap.add_argument("--k3-rows", type=int, default=0, help="use only this many rows of each K3 matrix")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    t0 = time.time()
    sets = {k: (W, X) for k, (W, X) in demo_set(a.layers).items()}
    k3 = k3_set(a.k3_rows or None)
    sets.update({k: (v[0], v[1]) for k, v in k3.items()})
    imp = lambda X: (X.astype(np.float64) ** 2).mean(0).astype(np.float32)  # noqa: E731
    formats = {
        "q3_nl": lambda W, X: q3_nl(W),
        "q3_nl+act-importance": lambda W, X: q3_nl(W, imp(X)),
        "rtn3_g256_asym": lambda W, X: rtn3_asym(W, 256),
        "q3_k-style": lambda W, X: q3k_like(W),
        "q4_0": lambda W, X: ggml("Q4_0")(W),
        "q4_1": lambda W, X: ggml("Q4_1")(W),
        "q8_0": lambda W, X: ggml("Q8_0")(W),
    }
    if a.candidates:
        L = quant3.LEVELS
        formats.update({
            "cand:nuq-gaussgrid-b256-f16+2bit": lambda W, X: nuq(W, GAUSS_LM, 256, 64, 2, 0.3, super_f16=True),
            "cand:nuq-b256-f16+2bit": lambda W, X: nuq(W, L, 256, 64, 2, 0.3, super_f16=True),
            "cand:nuq-b256-f16-only": lambda W, X: nuq(W, L, 256, 256, 0, 0, super_f16=True),
            "cand:nuq-b512-f16+4bit": lambda W, X: nuq(W, L, 512, 64, 4, 0.125, super_f16=True),
            "cand:nuq-b256-g32-u8+2bit": lambda W, X: nuq(W, L, 256, 32, 2, 1 / 8),
            "cand:nuq-b256-u8+4bit-log12": lambda W, X: nuq(W, L, 256, 64, 4, 1 / 12),
            "cand:tcq8-b256": lambda W, X: tcq(W[:512]) if W.shape[0] > 512 else tcq(W),
            "cand:rvq-8d-2x12bit": lambda W, X: rvq(W[:512]) if W.shape[0] > 512 else rvq(W),
        })
    table = measure(formats, sets, verbose=not a.json)
    summary = summarize(table)
    # Quantizer throughput, one core, from each source kind, on the K3 matrices.
    speed = {}
    for src in ("f32", "bf16", "mxfp4"):
        n, dt = 0, 0.0
        for W, X, packed, scales in k3.values():
            bits = quant.f32_to_bf16_bits(W)
            t = time.perf_counter()
            if src == "f32":
                quant3.quantize(W, threads=1)
            elif src == "bf16":
                quant3.quantize(bits, threads=1)
            else:
                quant3.quantize_mxfp4(packed, scales, threads=1)
            dt += time.perf_counter() - t
            n += W.size
        speed[src] = {"weights_per_s_per_core": round(n / dt / 1e6, 1),
                      "source_mb_per_s_per_core": round(n * {"f32": 4, "bf16": 2, "mxfp4": 17 / 32}[src] / dt / 1e6, 1)}
    speed["unit"] = "weights_per_s in millions"
    out = {"date": time.strftime("%Y-%m-%d"), "table": table, "summary": summary, "q3_nl_quantizer": speed,
           "seconds": round(time.time() - t0, 1)}
    print(json.dumps(out, indent=1) if a.json else json.dumps({"summary": summary, "q3_nl_quantizer": speed}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
