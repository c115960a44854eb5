"""Models known to work with Ferry, each with its plan on this machine
computed live (`ferry get --catalogue`, the wizard's download page).

The plans come from the configs below (the fields of each release's
config.json that size it: Kimi K3's is the spec's /work/shared k3-config,
the others written down from the published files) through `ferry plan
--config` (app.convert.plan_config): the formats `ferry check` would recommend here,
the RAM floor, the recommended budget and the bytes per token; the demo is
planned from its GGUF when installed. Nothing here uses the network: `ferry
get REPO --plan` reads the real repository for the exact plan.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

_K3_KDA = [i for i in range(1, 94) if i % 4 and i != 93]


def _k3() -> dict:
    return {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3", "text_config": {
        "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "attn_res_block_size": 12,
        "first_k_dense_replace": 1, "hidden_size": 7168, "intermediate_size": 33792, "kv_lora_rank": 512,
        "linear_attn_config": {"full_attn_layers": [i for i in range(4, 93, 4)] + [93], "head_dim": 128,
                               "kda_layers": _K3_KDA, "num_heads": 96, "short_conv_kernel_size": 4,
                               "use_full_rank_gate": True},
        "mla_use_output_gate": True, "moe_intermediate_size": 3072, "moe_layer_freq": 1, "num_attention_heads": 96,
        "num_experts": 896, "num_experts_per_token": 16, "num_hidden_layers": 93, "num_key_value_heads": 96,
        "num_shared_experts": 2, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "routed_expert_hidden_size": 3584, "tie_word_embeddings": False, "v_head_dim": 128, "vocab_size": 163840,
        "quantization_config": {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized"}}}


def _kimi_linear() -> dict:
    full = [4, 8, 12, 16, 20, 24, 27]
    return {"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "first_k_dense_replace": 1,
            "hidden_size": 2304, "intermediate_size": 9216, "kv_lora_rank": 512,
            "linear_attn_config": {"full_attn_layers": full, "head_dim": 128, "num_heads": 32,
                                   "kda_layers": [i for i in range(1, 28) if i not in full],
                                   "short_conv_kernel_size": 4},
            "moe_intermediate_size": 1024, "moe_layer_freq": 1, "num_attention_heads": 32, "num_experts": 256,
            "num_experts_per_token": 8, "num_hidden_layers": 27, "num_key_value_heads": 32, "num_shared_experts": 1,
            "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "tie_word_embeddings": False,
            "v_head_dim": 128, "vocab_size": 163840, "torch_dtype": "bfloat16"}


def _deepseek(experts: int, heads: int, vocab: int, dense: int) -> dict:
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "first_k_dense_replace": dense,
            "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512, "moe_intermediate_size": 2048,
            "moe_layer_freq": 1, "n_routed_experts": experts, "n_shared_experts": 1, "num_attention_heads": heads,
            "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": heads, "q_lora_rank": 1536,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "tie_word_embeddings": False, "v_head_dim": 128,
            "vocab_size": vocab, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}


def _llama(arch: str, **kw) -> dict:
    return {"architectures": [arch], "tie_word_embeddings": False, "torch_dtype": "bfloat16", **kw}


@dataclass
class Entry:
    name: str
    repo_id: str
    family: str
    note: str
    config: dict | None = None          #: None: planned some other way (the demo)
    source_bytes_per_weight: float = 2.0


ENTRIES = [
    Entry("Kimi K3", "moonshotai/Kimi-K3", "kimi", "2.78 T parameters, 896 experts of which 16 per token; "
          "MXFP4 experts", _k3(), 0.53),
    Entry("Kimi-Linear 48B-A3B", "moonshotai/Kimi-Linear-48B-A3B-Instruct", "kimi",
          "KDA linear attention with MLA every fourth layer", _kimi_linear()),
    Entry("Kimi-K2", "moonshotai/Kimi-K2-Instruct", "deepseek", "1 T parameters, 384 experts, block FP8",
          _deepseek(384, 64, 163840, 1), 1.0),
    Entry("DeepSeek-V3", "deepseek-ai/DeepSeek-V3", "deepseek", "671 B parameters, 256 experts, block FP8",
          _deepseek(256, 128, 129280, 3), 1.0),
    Entry("Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B", "qwen3_moe", "128 experts, 8 per token",
          _llama("Qwen3MoeForCausalLM", hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                 num_key_value_heads=4, head_dim=128, vocab_size=151936, intermediate_size=6144,
                 moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8)),
    Entry("Mixtral 8x7B", "mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral", "8 experts, 2 per token",
          _llama("MixtralForCausalLM", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=32000, intermediate_size=14336, num_local_experts=8,
                 num_experts_per_tok=2)),
    Entry("OLMoE 1B-7B", "allenai/OLMoE-1B-7B-0924-Instruct", "olmoe", "64 experts, 8 per token",
          _llama("OlmoeForCausalLM", hidden_size=2048, num_hidden_layers=16, num_attention_heads=16,
                 num_key_value_heads=16, vocab_size=50304, intermediate_size=1024, num_experts=64,
                 num_experts_per_tok=8)),
    Entry("Demo (SmolLM2-135M)", "demo", "llama", "built in: `ferry demo`, no download", None),
]


@dataclass
class Row:
    name: str
    repo_id: str
    note: str
    verdict: str
    reason: str
    trunk_format: str = ""
    expert_format: str = ""
    download_bytes: int = 0
    container_bytes: int = 0
    floor_bytes: int = 0
    recommended_budget: int = 0
    cold_bytes_per_token: int = 0
    expected_read_per_token: int = 0
    tok_per_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def _row_from_plan(e: Entry, plan) -> Row:
    return Row(e.name, e.repo_id, e.note, plan.verdict, plan.reason, plan.trunk_format, plan.expert_format,
               plan.download_bytes, plan.container_bytes, plan.floor_bytes, plan.recommended_budget,
               plan.cold_bytes_per_token, plan.expected_read_per_token, plan.tok_per_s)


def plan_entry(e: Entry, memory, disk_bps: float | None, kernel_bps_of) -> Row:
    """One entry planned on a machine with ``memory``, a disk reading
    ``disk_bps`` and kernels measured by ``kernel_bps_of(format)``."""
    from app.memory.budget import auto_budget
    from app.get.plan import GetPlan, estimate, judge
    from app.convert.plan_config import plan_from_config

    if e.config is None:
        return _demo_row(e, memory, disk_bps, kernel_bps_of)
    c = plan_from_config(e.config, ram=memory.usable, speed=kernel_bps_of)   # the same rule and kernels as check
    everything = (c["trunk_bytes"] + c["state_bytes"] + c["scratch_bytes"] + c["experts_total_bytes"]
                  + c["policy_all_bytes"])
    budget = auto_budget(c["floor_bytes"], c["cold_bytes_per_token"], everything, memory)
    params = c["trunk_params"] + c["expert_params"] * c["experts_per_layer"] * c["moe_layers"]
    plan = GetPlan(e.repo_id, "", "hf", architecture=e.family, trunk_format=c["trunk_format"],
                   expert_format=c["expert_format"], download_bytes=int(params * e.source_bytes_per_weight),
                   container_bytes=c["trunk_bytes"] + c["experts_total_bytes"], floor_bytes=c["floor_bytes"],
                   recommended_budget=budget.budget, everything_bytes=everything, usable_ram=memory.usable,
                   total_ram=memory.total, cold_bytes_per_token=c["cold_bytes_per_token"],
                   record_bytes=c["expert_record_bytes"], top_k=c["top_k"],
                   n_records=c["experts_per_layer"] * c["moe_layers"])
    # (the embedding, read one row a token, is counted in: a few % of these trunks)
    plan.compute_bytes_per_token = c["trunk_bytes"] + c["cold_bytes_per_token"]
    plan.disk_read_bytes_per_s = disk_bps
    fmt = c["expert_format"] if c["moe_layers"] else c["trunk_format"]
    plan.kernel_bytes_per_s = kernel_bps_of(fmt)
    if c["moe_layers"] and c["trunk_format"] != fmt:     # the trunk through its own format's kernels
        plan.trunk_kernel_bytes_per_s = kernel_bps_of(c["trunk_format"])
    estimate(plan, plan.recommended_budget, everything, plan.record_bytes, plan.top_k, plan.n_records, disk_bps,
             plan.kernel_bytes_per_s, plan.trunk_kernel_bytes_per_s)
    judge(plan)
    return _row_from_plan(e, plan)


def _demo_row(e: Entry, memory, disk_bps, kernel_bps_of) -> Row:
    from app import demo
    from app.convert.validate import validate_source
    from app.get.plan import GetPlan, _fill, finish_estimate, judge

    try:
        path = demo.gguf_path(install=False)
    except Exception as exc:        # the demo package is not installed
        return Row(e.name, e.repo_id, e.note, "unknown", f"the demo model is not installed ({exc})")
    report = validate_source(path, "recommended", "recommended", memory=memory, speed=kernel_bps_of)
    plan = GetPlan(e.repo_id, "", "gguf", file=path.name, download_bytes=0)
    _fill(plan, report, memory)
    plan.disk_read_bytes_per_s = disk_bps
    plan.kernel_bytes_per_s = kernel_bps_of(plan.kernel_format) if plan.kernel_format else None
    finish_estimate(plan)
    judge(plan)
    return _row_from_plan(e, plan)


def catalogue(memory=None, disk_bps: float | None = None, kernel_bps_of=None) -> list[Row]:
    """Every entry planned on this machine (measured here when not given)."""
    from app.memory.budget import machine_memory

    memory = memory or machine_memory()
    if disk_bps is None:
        from app.get.plan import _default_into, _measure_disk
        folder = _default_into()
        while not folder.exists():
            folder = folder.parent
        disk_bps = _measure_disk(folder)
    if kernel_bps_of is None:
        from app.engine.speed import kernel_bytes_per_s
        kernel_bps_of = kernel_bytes_per_s
    return [plan_entry(e, memory, disk_bps, kernel_bps_of) for e in ENTRIES]


def describe_catalogue(rows: list[Row]) -> str:
    from app.units import size

    lines = []
    for r in rows:
        tps = f"{r.tok_per_s:.1f} tok/s" if r.tok_per_s and r.verdict != "does not fit" else "? tok/s"
        lines.append(f"{r.name:22s} {r.repo_id}")
        if r.floor_bytes:
            lines.append(f"    {r.verdict}: {r.reason}")
            lines.append(f"    download ~{size(r.download_bytes)}, container {size(r.container_bytes)} "
                         f"(trunk {r.trunk_format}, experts {r.expert_format}); RAM floor "
                         f"{r.floor_bytes / 2**30:.1f} GiB, budget {r.recommended_budget / 2**30:.1f} GiB; "
                         f"~{tps}")
        else:
            lines.append(f"    {r.verdict}: {r.reason}")
    return "\n".join(lines) + ("\n(from configs: `ferry get REPO --plan` reads the real repository)"
                               if rows else "")

