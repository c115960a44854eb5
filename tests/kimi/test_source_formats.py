"""The quantized source formats of the Kimi / DeepSeek releases decode to the
values their definitions give (app/convert/compressed.py), read through a
real checkpoint folder; and `plan_from_config` on K3's real config."""
from __future__ import annotations

import json

import numpy as np
import pytest

from app.convert import compressed
from app.convert.safetensors_file import Checkpoint
from app.convert.plan_config import main as plan_main
from app.convert.plan_config import plan_from_config

K3_CONFIG = "/work/shared/spec/k3-config.json"


def test_mxfp4_bytes_by_hand():
    packed = np.array([[0x21, 0x9F] * 16], dtype=np.uint8)           # 32 values in one group
    scale = np.array([[128, 128]], dtype=np.uint8)                    # 2^(128-127) = 2, two groups of 32
    v = compressed.decode_mxfp4(packed, scale)
    assert v.shape == (1, 64)
    assert list(v[0, :4]) == [1.0, 2.0, -12.0, -1.0]                  # 0.5, 1, -6, -0.5 times 2
    assert np.isnan(compressed.e8m0_to_f32(np.array([255], dtype=np.uint8)))[0]


def _write(tmp_path, tensors, config):
    from safetensors.torch import save_file

    tmp_path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    return Checkpoint(tmp_path)


def test_int4_pack_quantized(tmp_path):
    import torch

    rng = np.random.default_rng(0)
    rows, cols, group = 6, 64, 32
    q = rng.integers(-8, 8, (rows, cols))
    scale = torch.tensor(rng.uniform(0.01, 0.1, (rows, cols // group)), dtype=torch.float32).to(torch.bfloat16)
    u = (q + 8).astype(np.uint64)
    words = np.zeros((rows, cols // 8), dtype=np.uint64)
    for i in range(8):
        words |= u[:, i::8] << np.uint64(4 * i)
    packed = torch.tensor(words.astype(np.uint32).view(np.int32))
    ck = _write(tmp_path, {"x.weight_packed": packed, "x.weight_scale": scale,
                           "x.weight_shape": torch.tensor([rows, cols], dtype=torch.int32)},
                {"quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                         "config_groups": {"g": {"weights": {"num_bits": 4, "group_size": group}}}}})
    ct = compressed.CompressedTensors(ck, json.loads((tmp_path / "config.json").read_text()))
    assert ct.kind("x.weight") == compressed.INT4_PACK and ct.shape("x.weight") == (rows, cols)
    want = q * np.repeat(scale.float().numpy(), group, axis=1)
    assert np.array_equal(ct.read_f32("x.weight"), want.astype(np.float32))


def test_fp8_block_scaled(tmp_path):
    import torch

    rng = np.random.default_rng(1)
    rows, cols = 200, 300                                             # not multiples of the 128 block
    w = torch.tensor(rng.standard_normal((rows, cols)), dtype=torch.float32).to(torch.float8_e4m3fn)
    s = torch.tensor(rng.uniform(0.5, 2.0, (2, 3)), dtype=torch.float32)
    ck = _write(tmp_path, {"x.weight": w, "x.weight_scale_inv": s},
                {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})
    ct = compressed.CompressedTensors(ck, json.loads((tmp_path / "config.json").read_text()))
    assert ct.kind("x.weight") == compressed.FP8_BLOCK
    want = w.float().numpy() * np.repeat(np.repeat(s.numpy(), 128, 0), 128, 1)[:rows, :cols]
    assert np.array_equal(ct.read_f32("x.weight"), want.astype(np.float32))


def test_plan_k3_against_published():
    config = json.load(open(K3_CONFIG))
    pure = plan_from_config(config, expert_bits=3, trunk_bits=4, ctx=4096, disk_gbps=7.0, scheme="pure")
    assert abs(pure["expert_record_bytes"] / 2**20 - 11.8) < 0.1       # published: ~11.8 MB
    assert abs(pure["cold_bytes_per_token"] / 2**30 - 17.0) < 0.1      # published: ~17 GB
    # Published: a 29.06 "GB" floor, 27.07 GiB if GB are 10^9 bytes; the pure
    # plan (embeddings read per token, bf16 routers) lies between the readings.
    assert 27.07 < pure["floor_gib"] < 29.06
    assert pure["embedding_bytes"] == 163840 * 7168 // 2 and pure["router_bytes"] == 92 * 896 * 7168 * 2
    classes = pure["trunk_classes"]
    assert sum(c["bytes"] for c in classes.values()) == pure["trunk_bytes"] + pure["embedding_bytes"]
    assert sum(c["params"] for c in classes.values()) == pure["trunk_params"]
    assert classes["routers"]["fixed_format"] == "bf16" and classes["lm_head"]["bytes"] == pure["embedding_bytes"]
    assert pure["moe_layers"] == 92 and pure["top_k"] == 16
    ferry = plan_from_config(config, expert_bits=3, trunk_bits=4, ctx=4096)
    assert ferry["trunk_format"] == "q4_0" and ferry["expert_format"] == "q3_nl"   # the converter's 4-bit trunk
    assert ferry["floor_bytes"] > pure["floor_bytes"]
    assert ferry["state_bytes"] == pure["state_bytes"] == 64 + 24 * 4096 * 576 * 4 + 69 * (96 * 128 * 128 + 3 * 12288 * 3) * 4


def test_plan_main_json(capsys):
    assert plan_main(["--config", K3_CONFIG, "--expert-bits", "3", "--trunk-bits", "4", "--ctx", "4096",
                      "--ram", "64G", "--disk-gbps", "7", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] is True and out["tok_per_s_disk_bound"] > 0
    # No formats asked: the ones `ferry check` recommends on a 64 GB Mac (format_choices' rule).
    assert plan_main(["--config", K3_CONFIG, "--ram", "64G", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["trunk_format"], out["expert_format"], out["formats_recommended"]) == ("iq4_xs", "q3_nl", True)


def test_plan_main_without_ram_uses_this_machine(capsys):
    # No --ram and no formats: the recommendation is made for this machine's
    # usable RAM (app.memory.budget.machine_memory), the path that crashed with
    # "No module named 'app.budget'".
    from app.memory.budget import machine_memory
    from app.convert.plan_config import recommended_formats

    assert plan_main(["--config", K3_CONFIG, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["formats_recommended"] is True and "fits" not in out
    t, e, _ = recommended_formats(json.load(open(K3_CONFIG)), ram=machine_memory().usable)
    assert (out["trunk_format"], out["expert_format"]) == (t, e)
    assert plan_main(["--config", K3_CONFIG]) == 0
    assert "floor" in capsys.readouterr().out
