"""``ferry plan --config config.json``: what a model needs, from its config alone.

Covers the architectures whose config says enough to size them: the "kimi"
family (DeepSeek-V3 / Kimi-K2, Kimi-Linear, Kimi K3) exactly as `ferry
convert` would lay them out, and the "llama" family approximately. The
figures follow the engine's own accounting (core_c/src/arch_kimi.c):

* trunk: every resident matrix at the trunk format, the tensors the
  converter keeps in f32 (norms, biases, KDA conv/decay parameters, AttnRes
  weights, routers) at 4 bytes, each tensor 64-byte aligned;
* expert record: gate, up and down at the expert format, each 64-byte
  aligned after a 64-byte header, rounded up to 4096;
* state at ``ctx``: the MLA latent cache (kv_lora + rope floats per token per
  MLA layer), the KDA f32 state and conv inputs (context independent), or the
  llama K/V caches;
* scratch: the engine's per-chunk buffers (32 tokens a chunk, 128 for a model with experts) for ``threads`` threads,
  with the default 8-bit activations' buffer (``q8_bytes``: the layouts this CPU's kernels read for
  the stored formats, the engine's rule);
* cache policy: the expert cache's replacement state (the C core's own
  count, ferry_cache_policy_bytes: for Kimi K3 mostly the successor table of
  layers x experts^2 x 2 bytes), inside every budget;
* floor: trunk + state + scratch + one layer visit of expert records (top_k)
  + the policy state over them.

The formats are, unless asked, the ones `ferry check` recommends and `ferry
convert --trunk-format recommended --expert-format recommended` writes: the
same candidates and the same rule (app.convert.format_choices.pick,
trunk_fits, experts_fit) applied to the usable RAM of this machine (or
``ram``), "auto" meaning what the converter keeps for the source's dtype
(q8_0 for a float trunk; bf16 for MXFP4 experts, f32 for FP8 ones).
Bits map to formats the way `ferry convert` writes them: 32 f32, 16 bf16,
8 q8_0 (8.5 bits/weight), 4 q4_0 (4.5), 3 q3_nl (3.09), 2 q2_vq (2.28): B bits the smallest
q<B>_* format the converter writes (bits per weight from the C core's
table). Other widths (5, 6, ...) have no Ferry encoder; they are costed
as B bits plus one f16 scale per 32 weights (B + 0.5 bits/weight) and the
result says so. ``scheme="pure"`` costs every matrix at exactly B bits per
weight (no scales), the accounting published figures usually use.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from typing import Any

from app.convert.layout import ENCODABLE, row_format
from app.engine.binding import FORMATS, q8_buffer_bytes

GIB = 1024 ** 3
#: Tokens a prompt's forward pass evaluates together, as the engine chooses
#: them (core_c/src/model.h FE_CHUNK / FE_MOE_CHUNK, engine.c fe_prompt_chunk).
CHUNK = 32
MOE_CHUNK = 128
#: Bits per weight of the formats the converter writes (the C core's table).
_BPW = {name: FORMATS[name].bits_per_weight for name in ENCODABLE}


def _width_formats() -> dict[int, str]:
    """Nominal width in bits -> the format `ferry convert` writes for it: 32
    f32, 16 bf16, and for B the smallest q<B>_* format the converter writes
    (q8_0, q4_0, q3_nl, ...), widest first."""
    out = {32: "f32", 16: "bf16"}
    for name in sorted(_BPW, key=_BPW.get):
        m = re.fullmatch(r"q(\d+)_\w+", name)
        if m:
            out.setdefault(int(m.group(1)), name)
    return dict(sorted(out.items(), reverse=True))


_BY_WIDTH = _width_formats()
#: The 4.25-bit iq4_xs (not a q<B>_* name): a column of the trunk class table beside q4_0.
IQ4 = "iq4_xs"


def _fmt_of(bits: float, role: str, scheme: str) -> tuple[str, float, bool]:
    """(format name, bits per weight, a format `ferry convert` can write)."""
    if scheme == "pure":
        return f"{bits:g}-bit (pure)", float(bits), False
    if bits in _BY_WIDTH:
        name = _BY_WIDTH[bits]
        return name, _BPW[name], True
    return f"q{bits:g} (hypothetical: {bits:g} bits + f16 scale per 32)", bits + 0.5, False


def _align(n: float, a: int) -> int:
    return int(math.ceil(n / a) * a)


def _g(cfg: dict, *keys, default=None):
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def _parse_size(text: str) -> int:
    t = text.strip().upper().replace("IB", "").replace("B", "")
    mult = {"K": 1024, "M": 1024 ** 2, "G": GIB, "T": 1024 ** 4}
    if t and t[-1] in mult:
        return int(float(t[:-1]) * mult[t[-1]])
    return int(float(t))


class _Acc:
    """Sums tensors the way the layout does: matrices at a format, vectors f32,
    64-byte aligned; and by tensor class, so the plan can show what each class
    costs at every format (``classes``)."""

    def __init__(self, bpw: float, overrides: dict[str, tuple[str, float]] | None = None, fallback: float = 32.0,
                 fmt: str | None = None):
        """``overrides``: {plan class: (format, bits per weight)} stored instead of the trunk format
        ``fmt`` (``--trunk-class``); a matrix whose rows a format's blocks cannot hold is costed as
        the converter stores it (app.convert.layout.row_format): in the format's ROW_FALLBACK
        (iq4_xs: q4_0), else at ``fallback`` bits (the source's float format)."""
        self.bpw = bpw
        self.fmt = fmt
        self.over = overrides or {}
        self.fallback = fallback
        self.bytes = 0
        self.params = 0
        self.formats: set[str] = set()   #: the formats matrices are stored in (not the fixed ones)
        self.cls: dict[str, list[tuple[int, int, float | None]]] = {}
        self.cls_bytes: dict[str, int] = {}

    def mat(self, rows: int, cols: int, count: int = 1, f32: bool = False, cls: str = "other",
            fixed_bpw: float | None = None) -> None:
        """``fixed_bpw``: stored at that many bits whatever the trunk format (f32 = 32)."""
        n = rows * cols
        fixed = 32.0 if f32 else fixed_bpw
        bpw = fixed or self.bpw
        if not fixed and (cls in self.over or self.fmt):
            asked = self.over[cls][0] if cls in self.over else self.fmt
            stored = row_format(asked, cols)
            bpw = self._stored_bpw(stored)
            if stored:
                self.formats.add(stored)
        nbytes = count * _align(n * bpw / 8, 64)
        self.bytes += nbytes
        self.params += count * n
        self.cls.setdefault(cls, []).append((n, count, fixed, cols))
        self.cls_bytes[cls] = self.cls_bytes.get(cls, 0) + nbytes

    def _stored_bpw(self, stored: str | None) -> float:
        """Bits per weight of a matrix stored in ``stored`` (row_format's answer; None: the fallback)."""
        return _BPW[stored] if stored in _BPW else self.fallback

    def _row_bpw(self, fmt: str, cols: int) -> float:
        """Bits per weight of a matrix with rows of ``cols`` values asked in ``fmt``, as stored."""
        return self._stored_bpw(row_format(fmt, cols))

    def vec(self, n: int, count: int = 1, cls: str = "norms and vectors") -> None:
        self.mat(1, n, count, f32=True, cls=cls)

    def classes(self, formats: list[str]) -> dict[str, dict[str, Any]]:
        """{class: {"params", "bytes" (at the trunk format), "bytes_at": {format: bytes}}}."""
        out = {}
        for name, items in self.cls.items():
            def at(fmt: str) -> int:
                return sum(c * _align(n * (fx or self._row_bpw(fmt, cols)) / 8, 64) for n, c, fx, cols in items)
            out[name] = {"params": sum(n * c for n, c, _, _ in items), "bytes": self.cls_bytes[name],
                         "format": self.over[name][0] if name in self.over else None,
                         "bytes_at": {f: at(f) for f in formats},
                         "fixed_format": next((("f32" if fx == 32 else "bf16") for _, _, fx, _ in items if fx), None)}
        return out


#: The plan's trunk classes in each of the converter's --trunk-class classes (app.convert.layout.TRUNK_CLASSES).
CLASS_GROUPS = {"ffn": ("shared experts", "latent projections", "dense FFN layers"),
                "attention": ("attention (KDA layers)", "attention (MLA layers)", "attention"),
                "head": ("lm_head",)}


def _auto_formats(config: dict) -> tuple[str, str]:
    """What "auto" keeps, from the config's quantization: (trunk, experts)."""
    q = config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config") or {}
    method = str(q.get("quant_method") or "")
    if method == "fp8":                        # DeepSeek-V3 / Kimi-K2 block FP8: widened to f32
        return "f32", "f32"
    if method == "compressed-tensors" and "mxfp4" in str(q.get("format") or ""):
        return "q8_0", "bf16"                  # K3: bf16 trunk, MXFP4 experts stored exactly as bf16
    return "q8_0", "bf16" if str(config.get("torch_dtype") or "bfloat16") != "float32" else "f32"


def _format(name: str) -> tuple[str, float, bool]:
    if name not in _BPW:
        raise ValueError(f"unknown format '{name}' (known: {', '.join(_BPW)})")
    return name, _BPW[name], True


def recommended_formats(config: dict, ctx: int = 4096, ram: int | None = None,
                        threads: int = 8, speed=None) -> tuple[str, str, str]:
    """(trunk format, expert format, why): what `ferry check` would recommend
    for this model on a machine with ``ram`` usable bytes (default: this one),
    by format_choices' candidates and rule (``speed``: the kernels' bytes per
    second by format, default measured here)."""
    from app.convert.format_choices import (EXPERT_CANDIDATES, LOSSY, TRUNK_CANDIDATES, decode_tok_per_s,
                                            default_speed, experts_fit, pick, trunk_fits)

    speed = speed or default_speed

    def error(fmt: str, auto: str) -> float:
        return 0.0 if fmt == auto else LOSSY.get(fmt, ("", "", 1.0))[2]

    if ram is None:
        from app.memory.budget import machine_memory
        ram = machine_memory().usable
    t_auto, e_auto = _auto_formats(config)

    def cost(t: str, e: str) -> dict:
        return plan_from_config(config, ctx=ctx, threads=threads, trunk_format=t, expert_format=e)

    base = cost(t_auto, e_auto)
    moe = base["moe_layers"] > 0
    trunks = []
    for name in TRUNK_CANDIDATES:
        fmt = t_auto if name == "auto" else name
        plan = base if fmt == t_auto else cost(fmt, e_auto)
        if trunks and plan["trunk_bytes"] >= trunks[0][1]["trunk_bytes"]:
            continue
        trunks.append((fmt, plan))
    work = base["state_bytes"] + base["scratch_bytes"]
    t_fits = [trunk_fits(p["trunk_bytes"], work, ram, moe) for _, p in trunks]
    t = trunks[pick(t_fits, [p["trunk_bytes"] for _, p in trunks])[0]][0]
    if not moe:
        return t, e_auto, "dense"
    experts = []
    for name in EXPERT_CANDIDATES:
        fmt = e_auto if name == "auto" else name
        plan = cost(t, fmt)
        if experts and plan["cold_bytes_per_token"] >= experts[0][1]["cold_bytes_per_token"]:
            continue
        experts.append((fmt, plan))
    e_fits = [experts_fit(p["trunk_bytes"], p["experts_total_bytes"], work, ram) for _, p in experts]
    speeds = [decode_tok_per_s([(p["trunk_bytes"], t), (p["cold_bytes_per_token"], f)], speed) if ok else None
              for (f, p), ok in zip(experts, e_fits)]
    i, _ = pick(e_fits, [p["cold_bytes_per_token"] for _, p in experts], speeds,
                [error(f, e_auto) for f, _ in experts])
    return t, experts[i][0], "fits in RAM" if e_fits[i] else "streams from the disk"


def plan_from_config(config: dict, expert_bits: float | None = None, trunk_bits: float | None = None,
                     ctx: int = 4096, ram: int | None = None, disk_gbps: float | None = None, threads: int = 8,
                     scheme: str = "ferry", trunk_format: str | None = None,
                     expert_format: str | None = None, speed=None,
                     trunk_classes: dict[str, str] | None = None) -> dict[str, Any]:
    """Memory and disk figures of a model from its config.json (a dict). The
    formats: ``*_format`` by name, else ``*_bits``, else the recommended ones
    (recommended_formats) for ``ram`` (default: this machine's usable RAM).
    ``trunk_classes``: {"ffn" | "attention" | "head": format} stored instead
    of the trunk format, as `ferry convert --trunk-class` does."""
    archs = config.get("architectures") or []
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    kimi = any(a in ("DeepseekV3ForCausalLM", "KimiLinearForCausalLM", "KimiK3ForConditionalGeneration")
               for a in archs) or cfg.get("model_type") in ("kimi_linear", "deepseek_v3", "kimi_k2")
    deepseek = "DeepseekV3ForCausalLM" in archs or cfg.get("model_type") in ("deepseek_v3", "kimi_k2")
    chosen = None
    if scheme == "pure" and (trunk_bits is None or expert_bits is None):
        raise ValueError("the pure scheme costs bits, not formats: give both expert_bits and trunk_bits")
    if (trunk_format is None and trunk_bits is None) or (expert_format is None and expert_bits is None):
        chosen = recommended_formats(config, ctx, ram, threads, speed)
    if trunk_format is None and trunk_bits is None:
        trunk_format = chosen[0]
    if expert_format is None and expert_bits is None:
        expert_format = chosen[1]
    t_name, t_bpw, t_ok = _format(trunk_format) if trunk_format else _fmt_of(trunk_bits, "trunk", scheme)
    e_name, e_bpw, e_ok = _format(expert_format) if expert_format else _fmt_of(expert_bits, "expert", scheme)
    dim = int(cfg["hidden_size"])
    L = int(cfg["num_hidden_layers"])
    vocab = int(cfg["vocab_size"])
    tied = bool(cfg.get("tie_word_embeddings", False))
    E = int(_g(cfg, "n_routed_experts", "num_experts", "num_local_experts", default=0) or 0)
    K = int(_g(cfg, "num_experts_per_tok", "num_experts_per_token", default=0) or 0)
    eff = int(_g(cfg, "moe_intermediate_size", default=0) or cfg.get("intermediate_size") or 0)
    ffn = int(cfg.get("intermediate_size") or 0)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype")
                or config.get("dtype") or "bfloat16")
    overrides = {}
    for group, fmt in (trunk_classes or {}).items():
        if group not in CLASS_GROUPS:
            raise ValueError(f"unknown trunk class '{group}' (known: {', '.join(CLASS_GROUPS)})")
        for name in CLASS_GROUPS[group]:
            overrides[name] = _format(fmt)[:2]
    trunk = _Acc(t_bpw, overrides, 16.0 if dtype in ("bfloat16", "float16") else 32.0, t_name if t_ok else None)
    trunk.mat(vocab, dim, cls="embeddings (tied: also the head)" if tied else "embeddings")
    if not tied:
        trunk.mat(vocab, dim, cls="lm_head")
    trunk.vec(dim)
    # The router as the converter stores it: a bf16/f16 release's own values
    # (app/convert/layout.py: ROUTER_KEPT_FORMATS), else f32.
    router_bpw = 16.0 if dtype in ("bfloat16", "float16") else 32.0
    state = 64
    n_moe = 0
    router_bytes = 0
    lin = cfg.get("linear_attn_config") or {}
    ed = dim
    if kimi:
        first = int(_g(cfg, "first_k_dense_replace", default=3 if deepseek else 1))
        kda = set() if deepseek else {i - 1 for i in lin.get("kda_layers") or []}
        H = int(cfg["num_attention_heads"])
        nope, rope = int(cfg.get("qk_nope_head_dim") or 128), int(cfg.get("qk_rope_head_dim") or 64)
        vd, kvl, qlr = int(cfg.get("v_head_dim") or 128), int(cfg.get("kv_lora_rank") or 512), int(cfg.get("q_lora_rank") or 0)
        KH, hd = int(lin.get("num_heads") or H), int(lin.get("head_dim") or 128)
        HD, ck = KH * hd, int(lin.get("short_conv_kernel_size") or 4)
        latent = int(cfg.get("routed_expert_hidden_size") or 0)
        latent = 0 if latent == dim else latent
        ed = latent or dim
        shf = int(_g(cfg, "n_shared_experts", "num_shared_experts", default=0) or 0) * eff
        block = int(cfg.get("attn_res_block_size") or 0)
        for i in range(L):
            trunk.vec(dim, 2)
            if block:
                trunk.vec(dim, 4)
            if i in kda:
                a = "attention (KDA layers)"
                trunk.mat(HD, dim, 3, cls=a)
                trunk.vec(HD * ck, 3)
                trunk.mat(hd, dim, cls=a)
                trunk.mat(HD, hd, cls=a)
                trunk.vec(HD)
                trunk.vec(KH)
                trunk.mat(KH, dim, cls=a)
                if lin.get("use_full_rank_gate"):
                    trunk.mat(HD, dim, cls=a)
                else:
                    trunk.mat(hd, dim, cls=a)
                    trunk.mat(HD, hd, cls=a)
                trunk.vec(hd)
                trunk.mat(dim, HD, cls=a)
                state += _align((KH * hd * hd + 3 * HD * (ck - 1)) * 4, 64)
            else:
                a = "attention (MLA layers)"
                if qlr:
                    trunk.mat(qlr, dim, cls=a)
                    trunk.vec(qlr)
                    trunk.mat(H * (nope + rope), qlr, cls=a)
                else:
                    trunk.mat(H * (nope + rope), dim, cls=a)
                trunk.mat(kvl + rope, dim, cls=a)
                trunk.vec(kvl)
                trunk.mat(H * (nope + vd), kvl, cls=a)
                trunk.mat(dim, H * vd, cls=a)
                if cfg.get("mla_use_output_gate"):
                    trunk.mat(H * vd, dim, cls=a)
                state += _align(ctx * (kvl + rope) * 4, 64)
            moe = E > 0 and i >= first and i % int(cfg.get("moe_layer_freq") or 1) == 0
            if moe:
                n_moe += 1
                router_bytes += _align(E * dim * router_bpw / 8, 64)
                trunk.mat(E, dim, cls="routers", fixed_bpw=router_bpw)
                trunk.vec(E)
                if shf:
                    trunk.mat(shf, dim, 2, cls="shared experts")
                    trunk.mat(dim, shf, cls="shared experts")
                if latent:
                    trunk.mat(latent, dim, cls="latent projections")
                    trunk.mat(dim, latent, cls="latent projections")
                    trunk.vec(latent)
            else:
                trunk.mat(ffn, dim, 2, cls="dense FFN layers")
                trunk.mat(dim, ffn, cls="dense FFN layers")
        if block:
            trunk.vec(dim, 2)
        att_w = max(H * vd, HD)
        nb = -(-L // block) if block else 0
        cols = max(dim, qlr, kvl, H * vd, HD, hd, ffn, eff, shf, ed)
        chunk = MOE_CHUNK if n_moe else CHUNK
        floats = chunk * (4 * dim + nb * dim + qlr + H * (nope + rope) + kvl + rope + 2 * att_w + 4 * HD
                          + 2 * hd + KH + 2 * max(ffn, eff, shf) + 2 * E + 2 * K + K * ed + 3 * ed) + E
        floats += threads * (cols + ctx + max(2 * kvl, 5 * hd) + 16)
        scratch = int(floats * 4) + 64 * 36
    else:
        H = int(cfg["num_attention_heads"])
        kvh = int(cfg.get("num_key_value_heads") or H)
        hd = int(cfg.get("head_dim") or dim // H)
        moe_all = E > 0
        for _ in range(L):
            trunk.vec(dim, 2)
            trunk.mat(H * hd, dim, cls="attention")
            trunk.mat(kvh * hd, dim, 2, cls="attention")
            trunk.mat(dim, H * hd, cls="attention")
            if moe_all:
                n_moe += 1
                trunk.mat(E, dim, cls="routers")
            else:
                trunk.mat(ffn, dim, 2, cls="dense FFN layers")
                trunk.mat(dim, ffn, cls="dense FFN layers")
        state = 2 * _align(L * ctx * kvh * hd * 4, 64)
        cols = max(dim, H * hd, ffn, eff)
        chunk = MOE_CHUNK if n_moe else CHUNK
        scratch = int((chunk * (3 * dim + 2 * H * hd + 2 * kvh * hd + 2 * max(ffn, eff) + E + 2 * K + K * dim + dim)
                       + threads * (cols + ctx)) * 4)
    # The default's 8-bit activations: one prompt chunk in the layouts this CPU's kernels read for
    # the stored formats (the engine's own rule: ferry_q8_buffer_bytes), in scratch as `ferry plan` counts it.
    stored = {row_format(e_name, c) for c in (ed, eff)} if n_moe and e_ok else set()
    q8 = q8_buffer_bytes(sorted(trunk.formats | (stored - {None})), cols, chunk)
    scratch += q8
    record = 0
    if n_moe:
        off = 64
        for rows, cols_ in ((eff, ed), (eff, ed), (ed, eff)):
            off = _align(off, 64) + math.ceil(rows * cols_ * e_bpw / 8)
        record = _align(off, 4096)
    expert_params = 3 * eff * ed
    policy_floor = policy_all = 0
    if n_moe and record:
        from app.engine.cachesim import policy_bytes
        policy_floor = policy_bytes(L, E, K)
        policy_all = policy_bytes(L, E, E * n_moe)
    # The engine reads an untied embedding table's rows per token from
    # trunk.bin (docs/ARCHITECTURE.md, "Memory"): it is not resident.
    classes = trunk.classes(list(_BY_WIDTH.values())[:3] + [IQ4] + list(_BY_WIDTH.values())[3:])
    embedding = 0 if tied else classes["embeddings"]["bytes"]
    resident = trunk.bytes - embedding
    floor = resident + state + scratch + K * record + policy_floor
    cold = K * n_moe * record
    recommended = floor + cold   # room to keep one whole token's experts cached
    out: dict[str, Any] = {
        "arch": "kimi" if kimi else "llama",
        "ctx": ctx,
        "trunk_format": t_name, "trunk_bits_per_weight": t_bpw, "trunk_format_exists": t_ok,
        "expert_format": e_name, "expert_bits_per_weight": e_bpw, "expert_format_exists": e_ok,
        "trunk_params": trunk.params,
        "trunk_bytes": resident,
        "embedding_bytes": embedding,
        "trunk_classes": classes,
        "trunk_class_formats": dict(trunk_classes or {}),
        "state_bytes": state,
        "scratch_bytes": scratch,
        "q8_bytes": q8,
        "moe_layers": n_moe, "experts_per_layer": E, "top_k": K,
        "expert_params": expert_params,
        "expert_record_bytes": record,
        "experts_total_bytes": record * E * n_moe,
        "policy_bytes": policy_floor,
        "policy_all_bytes": policy_all,
        "floor_bytes": floor,
        "recommended_bytes": recommended,
        "cold_bytes_per_token": cold,
        "threads": threads,
        "formats_recommended": chosen is not None,
    }
    if disk_gbps:
        out["disk_gbps"] = disk_gbps
        out["tok_per_s_disk_bound"] = (disk_gbps * 1e9 / cold) if cold else None
    if ram is not None:
        out["ram_bytes"] = ram
        out["fits"] = ram >= floor
        out["cache_records"] = max(0, (ram - floor) // record + K) if record else 0
    out["router_bytes"] = router_bytes
    for k in [k for k in out if "_bytes" in k]:
        out[k.replace("_bytes", "_gib")] = round(out[k] / GIB, 3)
    return out


def class_table(plan: dict[str, Any]) -> str:
    """The trunk by tensor class: parameters, GiB at the planned trunk format (or
    the class's own, shown in brackets: --trunk-class) and
    at each format the converter writes (fixed-format classes: f32 norms and
    vectors, bf16/f32 routers, cost the same in every column)."""
    classes = plan["trunk_classes"]
    fmts = list(next(iter(classes.values()))["bytes_at"])
    head = f"{'trunk class':30s} {'params':>9s} {plan['trunk_format'] + ' GiB':>10s}" + "".join(f" {f:>7s}" for f in fmts)
    rows = [head]
    for name, c in sorted(classes.items(), key=lambda kv: -kv[1]["bytes"]):
        tag = f" ({c['fixed_format']})" if c["fixed_format"] else f" [{c['format']}]" if c.get("format") else ""
        where = " (on disk)" if name == "embeddings" and plan["embedding_bytes"] else ""
        rows.append(f"{(name + tag + where)[:30]:30s} {c['params'] / 1e9:8.3f}B {c['bytes'] / GIB:10.3f}"
                    + "".join(f" {c['bytes_at'][f] / GIB:7.3f}" for f in fmts))
    total = sum(c["bytes"] for c in classes.values())
    rows.append(f"{'all (embeddings included)':30s} {plan['trunk_params'] / 1e9:8.3f}B {total / GIB:10.3f}"
                + "".join(f" {sum(c['bytes_at'][f] for c in classes.values()) / GIB:7.3f}" for f in fmts))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ferry plan --config", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="a model's config.json")
    p.add_argument("--expert-bits", type=float, default=None,
                   help="cost the experts at this many bits (default: the recommended format)")
    p.add_argument("--trunk-bits", type=float, default=None,
                   help="cost the trunk at this many bits (default: the recommended format)")
    p.add_argument("--trunk-format", choices=sorted(_BPW), default=None,
                   help="the trunk format (default: what `ferry check` would recommend on this machine)")
    p.add_argument("--expert-format", choices=sorted(_BPW), default=None,
                   help="the expert format (default: what `ferry check` would recommend on this machine)")
    p.add_argument("--trunk-class", action="append", default=[], metavar="CLASS=F",
                   help="cost one class of trunk matrices (ffn, attention, head) in format F, as "
                        "`ferry convert --trunk-class` stores it (repeatable)")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--ram", type=_parse_size, default=None, help="e.g. 32G")
    p.add_argument("--disk-gbps", type=float, default=None, help="sustained read speed in GB/s")
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--scheme", choices=("ferry", "pure"), default="ferry")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    try:
        with open(a.config, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        print(f"ferry plan: cannot read {a.config}: {exc}", file=sys.stderr)
        return 2
    bits = lambda v: None if v is None else int(v) if float(v).is_integer() else v  # noqa: E731
    try:
        classes = dict(c.partition("=")[::2] for c in a.trunk_class)
        plan = plan_from_config(config, bits(a.expert_bits), bits(a.trunk_bits), a.ctx, a.ram, a.disk_gbps,
                                a.threads, a.scheme, a.trunk_format, a.expert_format, trunk_classes=classes)
    except (KeyError, TypeError, ValueError) as exc:
        print(f"ferry plan: {a.config} does not describe a model this plan knows: {exc}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(plan, indent=1))
        return 0
    per_class = "".join(f", {k} {v}" for k, v in plan["trunk_class_formats"].items())
    print(f"trunk {plan['trunk_gib']:.2f} GiB ({plan['trunk_format']}{per_class}), state {plan['state_gib']:.3f} GiB at "
          f"{a.ctx} tokens, scratch {plan['scratch_gib']:.3f} GiB")
    print(f"expert record {plan['expert_record_bytes'] / 2**20:.2f} MiB ({plan['expert_format']}), "
          f"cold reads {plan['cold_gib_per_token']:.2f} GiB per token")
    if plan["policy_bytes"]:
        print(f"expert cache policy state {plan['policy_bytes'] / 2**20:.1f} MiB (in the floor)")
    if plan["embedding_bytes"]:
        print(f"token embeddings {plan['embedding_gib']:.3f} GiB stay on disk (one row read per token)")
    print(f"floor {plan['floor_gib']:.2f} GiB, recommended {plan['recommended_gib']:.2f} GiB")
    print()
    print(class_table(plan))
    if plan.get("tok_per_s_disk_bound"):
        print(f"at {a.disk_gbps} GB/s with every expert read cold: {plan['tok_per_s_disk_bound']:.3f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
