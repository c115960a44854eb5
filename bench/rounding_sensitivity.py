"""Which products of the tiny random K3 are sensitive to 8-bit rounding, in
the numpy reference (tests/kimi/k3_reference.py), no engine: each group of
products has either its input rounded as the default's 8-bit activations
round it (per 32 values, scale max|x| / 127, round to nearest), or its
weights rounded the same way (q8_0-like); printed: the logits' mean
KL(exact || rounded) and relative L2 over 24 random tokens.

    python bench/rounding_sensitivity.py [--kimi-linear]

``--kimi-linear``: the same on the tiny Kimi-Linear in transformers
(tests/kimi/tiny_kimi.py), each nn.Linear group's input rounded by a
forward pre-hook or its weight rounded (its routed experts are not
nn.Linear modules and are left exact).

Measured 2026-12-06 (docs/bench-log/2026-12-06.md, "Issue 31 items 1-2"): every trunk
group alone moves the tiny K3's logits by 12-66 % relative L2, whether its
inputs or its weights are rounded (all weights at 8 bits: KL 0.124), so the
model's own sensitivity, not the 8-bit-activation arithmetic, is what the
tiny K3's 0.086 of bench/activations_distance.py measures.
"""
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

from tests.kimi import k3_reference as ref, tiny_k3  # noqa: E402

root = Path(tempfile.mkdtemp(prefix="ferry-rounding-"))


def kimi_linear() -> None:
    import torch

    from tests.kimi import tiny_kimi

    model = tiny_kimi.build("kimi_linear", root / "kl").float().eval()
    mods = dict(model.named_modules())
    names = [n for n, m in mods.items() if isinstance(m, torch.nn.Linear)]

    def q8t(x):
        n = x.shape[-1]
        if n % 32:
            return x
        b = x.reshape(*x.shape[:-1], n // 32, 32)
        d = b.abs().amax(-1, keepdim=True) / 127.0
        safe = torch.where(d > 0, d, torch.ones_like(d))
        return (torch.where(d > 0, torch.round(b / safe), torch.zeros_like(b)) * d).reshape(x.shape)

    ids = torch.tensor([[int(t) for t in np.random.default_rng(5).integers(3, tiny_kimi.VOCAB, 24)]])

    def logits():
        with torch.no_grad():
            return model(ids, use_cache=False).logits[0].double()

    exact = logits()

    def kl_t(a, b):
        la, lb = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
        return float((la.exp() * (la - lb)).sum(-1).mean())

    pats = {"all": r".", "q/k/v": r"self_attn\.[qkv]_proj", "b_proj": r"b_proj", "f_a/f_b": r"f_[ab]_proj",
            "g_a/g_b": r"g_[ab]_proj", "o_proj": r"o_proj", "mla kv": r"kv_(a|b)_proj",
            "dense mlp": r"mlp\.(gate|up|down)_proj", "shared": r"shared_experts", "lm_head": r"lm_head"}
    for name, pat in pats.items():
        sel = [n for n in names if re.search(pat, n)]
        hooks = [mods[n].register_forward_pre_hook(lambda m, a: (q8t(a[0]),)) for n in sel]
        got = logits()
        for h in hooks:
            h.remove()
        saved = {n: mods[n].weight.data.clone() for n in sel}
        for n in sel:
            mods[n].weight.data = q8t(mods[n].weight.data)
        gw = logits()
        for n in sel:
            mods[n].weight.data = saved[n]
        rel = lambda g: float((g - exact).norm() / exact.norm())  # noqa: E731
        print(f"{name:10s} ({len(sel):2d}) inputs: KL {kl_t(exact, got):.4g} relL2 {rel(got):.3f} | "
              f"weights: KL {kl_t(exact, gw):.4g} relL2 {rel(gw):.3f}")


if "--kimi-linear" in sys.argv:
    kimi_linear()
    sys.exit(0)
tiny_k3.build(root / "ckpt")
cfg, tensors = ref.load_release(root / "ckpt")

def q8(x):
    x = np.asarray(x, dtype=np.float64)
    sh = x.shape; n = sh[-1]
    if n % 32: return x
    b = x.reshape(-1, n // 32, 32)
    d = np.abs(b).max(-1, keepdims=True) / 127.0
    q = np.where(d > 0, np.round(b / np.where(d > 0, d, 1)), 0)
    return (q * d).reshape(sh)

class W:
    __array_ufunc__ = None
    def __init__(self, a, T=False): self.a, self.Tf = a, T
    @property
    def T(self): return W(self.a, not self.Tf)
    def m(self): return self.a.T if self.Tf else self.a
    def __rmatmul__(self, x): return q8(x) @ self.m()
    def __matmul__(self, z): return self.m() @ q8(z)
    def __getitem__(self, i): return self.a[i]   # embedding rows: not a product

class T(dict):
    def __init__(self, base, pat): super().__init__(base); self.pat = pat
    def __getitem__(self, k):
        v = dict.__getitem__(self, k)
        if v.ndim == 2 and re.search(self.pat, k) and "embed_tokens" not in k: return W(v)
        return v

toks = np.array([int(t) for t in np.random.default_rng(5).integers(0, tiny_k3.VOCAB, 24)])
_, exact = ref.K3Reference(cfg, tensors).forward(toks)
def kl(a, b):
    la = a - a.max(-1, keepdims=True); la -= np.log(np.exp(la).sum(-1, keepdims=True))
    lb = b - b.max(-1, keepdims=True); lb -= np.log(np.exp(lb).sum(-1, keepdims=True))
    return float((np.exp(la) * (la - lb)).sum(-1).mean())
groups = {"all (weights only)": r".", "kda qkv": r"self_attn\.[qkv]_proj", "kda b_proj": r"b_proj", "kda f_a/f_b": r"f_[ab]_proj",
          "kda g": r"g_(a_|b_)?proj", "attn o_proj": r"o_proj", "mla": r"(q_a|q_b|kv_a|kv_b)_proj|q_proj",
          "res proj": r"res_proj", "ffn dense/shared": r"(mlp|shared_experts?)\.(gate|up|down)_proj",
          "router": r"mlp\.gate\.weight", "experts": r"experts\.\d+\.w[123]", "latent": r"routed_expert_(down|up)_proj",
          "lm_head": r"lm_head"}
print("--- each group's inputs rounded as the default's 8-bit activations round them:")
for name, pat in groups.items():
    try:
        _, lg = ref.K3Reference(cfg, T(tensors, pat)).forward(toks)
        print(f"{name:18s} KL {kl(exact, lg):.4g}  relL2 {np.linalg.norm(lg-exact)/np.linalg.norm(exact):.4f}")
    except Exception as e:
        print(f"{name:18s} (inputs: not emulated, the reference reshapes this weight: {e})")
print("--- the same rounding applied to the weights instead (q8_0-like, per 32 along each row):")
for name, pat in groups.items():
    tw = {k: (q8(v).astype(v.dtype) if v.ndim == 2 and re.search(pat, k) and "embed_tokens" not in k else v)
          for k, v in tensors.items()}
    _, lg = ref.K3Reference(cfg, tw).forward(toks)
    print(f"{name:18s} KL {kl(exact, lg):.4g}  relL2 {np.linalg.norm(lg-exact)/np.linalg.norm(exact):.4f}")
