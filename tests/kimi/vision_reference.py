"""A float64 numpy reference of Kimi K3's vision tower (MoonViT-V2 and the
patchmergerv2 projector), written from the release's modeling facts
(docs/KIMI.md, "Images"), independent of the C core. Used by the tests to
check the core layer by layer and end to end.

Input: one image's patches [gh * gw, 3 * p * p] (row-major over the patch
grid, each patch channel-major then row then column, values already
normalised), and the release's tensors by their release names."""
from __future__ import annotations

import math

import numpy as np


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def bilinear(table: np.ndarray, h: int, w: int) -> np.ndarray:
    """[H0, W0, D] resized to [h, w, D]: bilinear, half-pixel centres, no
    antialiasing, source coordinates below 0 clamped to 0 (what
    interpolate(mode="bilinear", align_corners=False) computes)."""
    H0, W0, _ = table.shape

    def axis(n_out: int, n_in: int):
        src = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
        src = np.maximum(src, 0.0)
        i0 = np.minimum(np.floor(src).astype(int), n_in - 1)
        i1 = np.minimum(i0 + 1, n_in - 1)
        return i0, i1, src - i0

    y0, y1, ly = axis(h, H0)
    x0, x1, lx = axis(w, W0)
    top = table[y0][:, x0] * (1 - lx)[None, :, None] + table[y0][:, x1] * lx[None, :, None]
    bot = table[y1][:, x0] * (1 - lx)[None, :, None] + table[y1][:, x1] * lx[None, :, None]
    return top * (1 - ly)[:, None, None] + bot * ly[:, None, None]


def rope_angles(gh: int, gw: int, head_dim: int, theta: float = 10000.0) -> np.ndarray:
    """[gh * gw, head_dim / 2] rotation angles: pair 2i turns by x * f_i and
    pair 2i + 1 by y * f_i, f_i = theta^(-4i / head_dim), i < head_dim / 4."""
    f = theta ** (-(np.arange(0, head_dim, 4)[: head_dim // 4]) / head_dim)
    ys, xs = np.divmod(np.arange(gh * gw), gw)
    ang = np.empty((gh * gw, head_dim // 2))
    ang[:, 0::2] = xs[:, None] * f[None]
    ang[:, 1::2] = ys[:, None] * f[None]
    return ang


def rotate(x: np.ndarray, ang: np.ndarray) -> np.ndarray:
    """x [N, heads, hd]: adjacent pairs (2j, 2j + 1) as complex numbers times e^(i ang[:, j])."""
    a, b = x[..., 0::2], x[..., 1::2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


class VisionReference:
    def __init__(self, vcfg: dict, tensors: dict[str, np.ndarray]):
        self.c = vcfg
        self.t = {k: np.asarray(v, dtype=np.float64) for k, v in tensors.items()
                  if k.startswith(("vision_tower.", "mm_projector."))}
        self.eps = float(np.finfo(np.float32).eps)   # nn.RMSNorm without eps, computed in f32

    def forward(self, patches: np.ndarray, gh: int, gw: int):
        """(stages, out): stages[0] the embedded patches, stages[1 + l] block
        l's output, stages[L + 1] the final norm, stages[L + 2] the merged
        [gh/2 * gw/2, 4 * hidden] rows; out [gh/2 * gw/2, text_hidden]."""
        c, t = self.c, self.t
        D, Q, H = c["vt_hidden_size"], c["qkv_hidden_size"], c["vt_num_attention_heads"]
        hd = Q // H
        N = gh * gw
        x = np.asarray(patches, np.float64) @ t["vision_tower.patch_embed.proj.weight"].reshape(D, -1).T
        pos = t["vision_tower.patch_embed.pos_emb.weight"]
        if (gh, gw) != pos.shape[:2]:
            pos = bilinear(pos, gh, gw)
        x = x + pos.reshape(N, D)
        stages = [x.copy()]
        ang = rope_angles(gh, gw, hd)
        for i in range(c["vt_num_hidden_layers"]):
            b = f"vision_tower.encoder.blocks.{i}."
            h = rmsnorm(x, t[b + "norm0.weight"], self.eps)
            qkv = (h @ t[b + "wqkv.weight"].T).reshape(N, 3, H, hd)
            q, k, v = rotate(qkv[:, 0], ang), rotate(qkv[:, 1], ang), qkv[:, 2]
            s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("hqk,khd->qhd", s, v).reshape(N, Q)
            x = x + o @ t[b + "wo.weight"].T
            h = rmsnorm(x, t[b + "norm1.weight"], self.eps)
            x = x + gelu_tanh(h @ t[b + "mlp.fc0.weight"].T) @ t[b + "mlp.fc1.weight"].T
            stages.append(x.copy())
        x = rmsnorm(x, t["vision_tower.encoder.final_layernorm.weight"], self.eps)
        stages.append(x.copy())
        kh, kw = c["merge_kernel_size"]
        m = x.reshape(gh // kh, kh, gw // kw, kw, D).transpose(0, 2, 1, 3, 4).reshape(-1, kh * kw * D)
        stages.append(m.copy())
        y = gelu_erf(m @ t["mm_projector.proj.0.weight"].T) @ t["mm_projector.proj.2.weight"].T
        out = rmsnorm(y, t["mm_projector.post_norm.weight"], float(c["projector_ln_eps"]))
        return stages, out
