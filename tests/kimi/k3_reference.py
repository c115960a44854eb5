"""A numpy reference of the Kimi K3 text model, written from
/work/shared/spec/kimi-family.md alone. It shares no code with the C engine
or the converter: it reads the release-layout checkpoint itself (safetensors
shards through an index, MXFP4 experts decoded here), computes in float64,
and uses the *expanded* MLA (keys and values rebuilt from kv_b_proj for
every token) where the engine uses the absorbed form.

The KDA recurrence comes in two forms, `kda_sequential` (the decode step,
token by token) and `kda_chunked` (a chunk-parallel form derived from it:
inside a chunk the delta-rule updates are a unit lower-triangular system),
and the tests prove them equal.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def mxfp4_values(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """weight_packed u8 [out, in/2] (low nibble = even column), weight_scale u8
    [out, in/32] E8M0 -> float64 [out, in]: e2m1[nibble & 7] * sign(bit 3) * 2^(s-127)."""
    packed = packed.astype(np.int64)
    out, half = packed.shape
    nib = np.empty((out, half * 2), dtype=np.int64)
    nib[:, 0::2] = packed & 15
    nib[:, 1::2] = packed >> 4
    mag = np.array(E2M1, dtype=np.float64)[nib & 7]
    val = np.where(nib & 8, -mag, mag)
    group = (half * 2) // scale.shape[1]
    mult = np.power(2.0, scale.astype(np.float64) - 127.0)
    return val * np.repeat(mult, group, axis=1)


def load_release(ckpt: Path) -> tuple[dict, dict]:
    """(text_config, tensors by name as float64) from a K3 release-layout folder."""
    import torch
    from safetensors.torch import load_file

    top = json.loads((ckpt / "config.json").read_text())
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    raw = {}
    for shard in sorted(set(index["weight_map"].values())):
        raw.update(load_file(str(ckpt / shard)))
    tensors = {}
    for name, t in raw.items():
        if name.endswith(".weight_scale") and name[:-6] + "packed" in raw:
            continue
        if name.endswith(".weight_packed"):
            base = name[:-len("_packed")]
            tensors[base] = mxfp4_values(raw[name].numpy(), raw[base + "_scale"].numpy())
        else:
            tensors[name] = t.to(torch.float64).numpy()
    return top["text_config"], tensors


# ------------------------------------------------------------------ pieces

def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def situ(g, u, beta, lbeta):
    return (beta * np.tanh(g / beta) * sigmoid(g)) * (lbeta * np.tanh(u / lbeta))


def causal_conv(x, w):
    """Depthwise causal convolution: x [T, C], w [C, K] (w[:, K-1] meets the current input)."""
    T, C = x.shape
    K = w.shape[1]
    pad = np.concatenate([np.zeros((K - 1, C)), x])
    return sum(pad[j:j + T] * w[:, j] for j in range(K))


def l2norm(x, eps=1e-6):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def kda_sequential(q, k, v, log_a, beta, state=None):
    """Delta rule with per-key-channel decay; q, k [T, H, dk], v [T, H, dv],
    log_a [T, H, dk], beta [T, H]. q already scaled. Returns o [T, H, dv], S."""
    T, H, dk = k.shape
    dv = v.shape[-1]
    S = np.zeros((H, dk, dv)) if state is None else state.copy()
    o = np.zeros((T, H, dv))
    for t in range(T):
        S = S * np.exp(log_a[t])[:, :, None]
        u = beta[t][:, None] * (v[t] - np.einsum("hkv,hk->hv", S, k[t]))
        S = S + k[t][:, :, None] * u[:, None, :]
        o[t] = np.einsum("hkv,hk->hv", S, q[t])
    return o, S


def kda_chunked(q, k, v, log_a, beta, chunk=4, state=None):
    """The same recurrence, chunk-parallel. Inside a chunk with cumulative log
    decay G_t (from the chunk start), the updates u_t satisfy
        u_t + sum_{j<t} beta_t (k_t . (exp(G_t - G_j) k_j)) u_j = beta_t (v_t - S0^T (exp(G_t) k_t))
    (a unit lower-triangular system), then
        o_t = S0^T (exp(G_t) q_t) + sum_{j<=t} (q_t . (exp(G_t - G_j) k_j)) u_j
        S_end = exp(G_C) S0 + sum_j (exp(G_C - G_j) k_j) u_j^T."""
    T, H, dk = k.shape
    dv = v.shape[-1]
    S = np.zeros((H, dk, dv)) if state is None else state.copy()
    o = np.zeros((T, H, dv))
    for c0 in range(0, T, chunk):
        sl = slice(c0, min(T, c0 + chunk))
        qc, kc, vc, bc = q[sl], k[sl], v[sl], beta[sl]
        G = np.cumsum(log_a[sl], axis=0)             # [C, H, dk]
        n = qc.shape[0]
        for h in range(H):
            Gh, kh, qh = G[:, h], kc[:, h], qc[:, h]
            ratio = np.exp(Gh[:, None, :] - Gh[None, :, :])   # [t, j, dk], used for j <= t only
            kk = np.einsum("tc,tjc,jc->tj", kh, ratio, kh)
            qk = np.einsum("tc,tjc,jc->tj", qh, ratio, kh)
            A = np.tril(bc[:, h][:, None] * kk, -1) + np.eye(n)
            rhs = bc[:, h][:, None] * (vc[:, h] - (np.exp(Gh) * kh) @ S[h])
            U = np.linalg.solve(A, rhs)
            o[sl, h] = (np.exp(Gh) * qh) @ S[h] + np.tril(qk) @ U
            S[h] = np.exp(Gh[-1])[:, None] * S[h] + (np.exp(Gh[-1][None, :] - Gh) * kh).T @ U
    return o, S


def mla_expanded(x, t, pfx, cfg, nope, rope, vdim, heads, gate=True):
    """Gated NoPE MLA over a whole causal sequence x [T, dim], keys and values expanded."""
    T = x.shape[0]
    if pfx + "q_a_proj.weight" in t:
        qa = rmsnorm(x @ t[pfx + "q_a_proj.weight"].T, t[pfx + "q_a_layernorm.weight"], 1e-6)
        q = qa @ t[pfx + "q_b_proj.weight"].T
    else:
        q = x @ t[pfx + "q_proj.weight"].T
    q = q.reshape(T, heads, nope + rope)
    kv = x @ t[pfx + "kv_a_proj_with_mqa.weight"].T
    kvl = kv.shape[1] - rope
    c = rmsnorm(kv[:, :kvl], t[pfx + "kv_a_layernorm.weight"], 1e-6)
    kr = kv[:, kvl:]
    kvb = (c @ t[pfx + "kv_b_proj.weight"].T).reshape(T, heads, nope + vdim)
    keys = np.concatenate([kvb[:, :, :nope], np.broadcast_to(kr[:, None, :], (T, heads, rope))], axis=-1)
    vals = kvb[:, :, nope:]
    scores = np.einsum("thd,shd->hts", q, keys) * (nope + rope) ** -0.5
    scores = np.where(np.tril(np.ones((T, T), dtype=bool))[None], scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ctx = np.einsum("hts,shd->thd", p, vals).reshape(T, heads * vdim)
    if gate and pfx + "g_proj.weight" in t:
        ctx = ctx * sigmoid(x @ t[pfx + "g_proj.weight"].T)
    return ctx @ t[pfx + "o_proj.weight"].T


class K3Reference:
    def __init__(self, cfg: dict, tensors: dict, chunked: bool = False):
        self.cfg, self.t, self.chunked = cfg, tensors, chunked
        lin = cfg["linear_attn_config"]
        self.kda_layers = {i - 1 for i in lin["kda_layers"]}
        self.eps = cfg["rms_norm_eps"]

    def _kda(self, x, pfx):
        cfg, t = self.cfg, self.t
        lin = cfg["linear_attn_config"]
        H, dk = lin["num_heads"], lin["head_dim"]
        T = x.shape[0]
        qkv = []
        for w in "qkv":
            pre = x @ t[pfx + f"{w}_proj.weight"].T
            conv = t[pfx + f"{w}_conv1d.weight"].reshape(pre.shape[1], -1)
            qkv.append(silu(causal_conv(pre, conv)).reshape(T, H, dk))
        q, k, v = qkv
        q = l2norm(q) * dk ** -0.5
        k = l2norm(k)
        beta = sigmoid(x @ t[pfx + "b_proj.weight"].T)
        z = (x @ t[pfx + "f_a_proj.weight"].T) @ t[pfx + "f_b_proj.weight"].T + t[pfx + "dt_bias"].reshape(-1)
        A = t[pfx + "A_log"].reshape(-1)[:H]
        z = z.reshape(T, H, dk)
        lb = lin.get("gate_lower_bound")
        if lb is not None:
            log_a = lb * sigmoid(np.exp(A)[None, :, None] * z)
        else:
            log_a = -np.exp(A)[None, :, None] * np.logaddexp(0.0, z)
        core = kda_chunked if self.chunked else kda_sequential
        o, _ = core(q, k, v, log_a, beta)
        if lin.get("use_full_rank_gate"):
            g = x @ t[pfx + "g_proj.weight"].T
        else:
            g = (x @ t[pfx + "g_a_proj.weight"].T) @ t[pfx + "g_b_proj.weight"].T
        o = rmsnorm(o, t[pfx + "o_norm.weight"], self.eps) * sigmoid(g.reshape(T, H, dk))
        return o.reshape(T, H * dk) @ t[pfx + "o_proj.weight"].T

    def _ffn(self, x, pfx, layer):
        cfg, t = self.cfg, self.t
        b1, b2 = cfg["activation_situ_beta"], cfg["activation_situ_linear_beta"]
        if layer < cfg["first_k_dense_replace"]:
            m = pfx + "mlp."
            return situ(x @ t[m + "gate_proj.weight"].T, x @ t[m + "up_proj.weight"].T, b1, b2) @ t[m + "down_proj.weight"].T
        m = pfx + "block_sparse_moe."
        s = sigmoid(x @ t[m + "gate.weight"].T)
        choice = s + t[m + "gate.e_score_correction_bias"]
        K = cfg["num_experts_per_token"]
        z = x @ t[m + "routed_expert_down_proj.weight"].T
        u = np.zeros_like(z)
        for i in range(x.shape[0]):
            ids = np.argsort(-choice[i], kind="stable")[:K]
            w = s[i, ids] / (s[i, ids].sum() + 1e-20) * cfg["routed_scaling_factor"]
            for e, we in zip(ids, w):
                ex = m + f"experts.{e}."
                h = situ(t[ex + "w1.weight"] @ z[i], t[ex + "w3.weight"] @ z[i], b1, b2)
                u[i] += we * (t[ex + "w2.weight"] @ h)
        routed = rmsnorm(u, t[m + "routed_expert_norm.weight"], self.eps) @ t[m + "routed_expert_up_proj.weight"].T
        sh = m + "shared_experts."
        shared = situ(x @ t[sh + "gate_proj.weight"].T, x @ t[sh + "up_proj.weight"].T, b1, b2) @ t[sh + "down_proj.weight"].T
        return routed + shared

    def _mix(self, p, blocks, norm, proj):
        entries = blocks + [p]
        w = norm.reshape(-1) * proj.reshape(-1)
        scores = np.stack([(v @ w) / np.sqrt(np.mean(v * v, axis=-1) + self.eps) for v in entries])  # [E, T]
        a = np.exp(scores - scores.max(0))
        a /= a.sum(0)
        return sum(a[e][:, None] * entries[e] for e in range(len(entries)))

    def forward(self, tokens, embeds=None, use=None):
        """Stages (embedding, each layer's live sum, final norm) and logits, all [T, ...].
        With ``embeds`` [T, dim] and ``use`` [T] flags, the flagged positions
        take their row of ``embeds`` instead of their token's (an image's rows)."""
        cfg, t = self.cfg, self.t
        P = "language_model.model."
        B = cfg["attn_res_block_size"]
        p = t[P + "embed_tokens.weight"][tokens].copy()
        if embeds is not None:
            mask = np.asarray(use, dtype=bool)
            p[mask] = np.asarray(embeds, dtype=np.float64)[mask]
        stages, blocks = [p], []
        for i in range(cfg["num_hidden_layers"]):
            L = P + f"layers.{i}."
            h = self._mix(p, blocks, t[L + "self_attention_res_norm.weight"], t[L + "self_attention_res_proj.weight"]) if blocks else p
            fresh = i % B == 0
            if fresh:
                blocks.append(p)
            xin = rmsnorm(h, t[L + "input_layernorm.weight"], self.eps)
            if i in self.kda_layers:
                a = self._kda(xin, L + "self_attn.")
            else:
                a = mla_expanded(xin, t, L + "self_attn.", cfg, cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
                                 cfg["v_head_dim"], cfg["num_attention_heads"])
            p = a if fresh else p + a
            m = self._mix(p, blocks, t[L + "mlp_res_norm.weight"], t[L + "mlp_res_proj.weight"])
            p = p + self._ffn(rmsnorm(m, t[L + "post_attention_layernorm.weight"], self.eps), L, i)
            stages.append(p)
        h = self._mix(p, blocks, t[P + "output_attn_res_norm.weight"], t[P + "output_attn_res_proj.weight"])
        final = rmsnorm(h, t[P + "norm.weight"], self.eps)
        stages.append(final)
        return stages, final @ t["language_model.lm_head.weight"].T
