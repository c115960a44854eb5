"""Issue 32: the JSON configs of a checkpoint from outside (config.json,
tokenizer_config.json, generation_config.json, the shard index) and a GGUF's
metadata. A bad type, an absurd number or deep nesting is a one-line problem
naming the file and the key -- in `ferry check`, `ferry convert` and `ferry
get --plan` -- never a traceback, a MemoryError or a billion-layer loop."""
from __future__ import annotations

import json
import shutil

import pytest

from app.get.hub import GetError
from app.get.plan import plan_repo
from tests.conftest import run_ferry
from tests.security.conftest import hub_env
from tests.security.test_hostile_hub import BIG
from tests.tiny_models import build

DEEP = '{"a":' * 100_000 + "1" + "}" * 100_000


def _set(file: str, key: str, value):
    def change(d):
        p = d / file
        c = json.loads(p.read_text()) if p.exists() else {}
        c[key] = value
        p.write_text(json.dumps(c))
    return change


def _write(file: str, text: str):
    return lambda d: (d / file).write_text(text)


PROBES = {
    "chat_template_list": (_set("tokenizer_config.json", "chat_template", ["x"]), "chat_template: [\"x\"]"),
    "chat_template_number": (_set("tokenizer_config.json", "chat_template", 5), "chat_template: 5"),
    "eos_nested": (_set("config.json", "eos_token_id", [[1]]), "eos_token_id: [[1]]"),
    "eos_nested_generation": (_set("generation_config.json", "eos_token_id", [[1]]),
                              "generation_config.json: eos_token_id"),
    "layers_float": (_set("config.json", "num_hidden_layers", 1e9), "num_hidden_layers: 1000000000.0 is not a whole"),
    "layers_huge": (_set("config.json", "num_hidden_layers", 10 ** 9), "num_hidden_layers: 1000000000 is out of range"),
    "hidden_string": (_set("config.json", "hidden_size", "64"), "hidden_size: \"64\" is not a whole number"),
    "architectures_string": (_set("config.json", "architectures", "LlamaForCausalLM"), "architectures"),
    "eps_nan": (_write("config.json", '{"architectures": ["LlamaForCausalLM"], "rms_norm_eps": NaN}'),
                "NaN is not a JSON number"),
    "bos_token_list": (_set("tokenizer_config.json", "bos_token", ["<s>"]), "bos_token"),
    "deep_config": (_write("config.json", DEEP), "config.json: file is nested too deeply"),
    "deep_tokenizer_config": (_write("tokenizer_config.json", "[" * 100_000 + "]" * 100_000),
                              "tokenizer_config.json: file is nested too deeply"),
}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile-configs") / "base"
    build("llama", d)
    return d


def _probe(llama, tmp_path, change):
    d = tmp_path / "tiny-llama"
    shutil.copytree(llama, d)
    change(d)
    return d


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_check_and_convert_name_the_key(llama, tmp_path, probe):
    change, expect = PROBES[probe]
    d = _probe(llama, tmp_path, change)
    for args in (["check", str(d)], ["convert", str(d), str(tmp_path / "out.ferry")]):
        res = run_ferry(*args, check=False, timeout=300)
        assert res.returncode != 0, (args, res.stdout, res.stderr)
        assert "Traceback" not in res.stderr and expect in res.stdout + res.stderr, (args, res.stdout, res.stderr)
    assert not (tmp_path / "out.ferry").exists()


@pytest.mark.parametrize("probe", ["chat_template_list", "eos_nested", "layers_float", "deep_config"])
def test_get_plan_names_the_key(llama, evil, tmp_path, probe):
    change, expect = PROBES[probe]
    evil.add("evil/configs", _probe(llama, tmp_path, change))
    try:
        plan = plan_repo("evil/configs", into=tmp_path / "into", memory=BIG, disk_bps=1e9, kernel_bps=1e9)
        said = " ".join(plan.problems)
        assert plan.verdict == "does not fit"
    except GetError as exc:
        said = str(exc)
    except Exception as exc:       # a SourceError from staging is a one-line refusal too
        from app.convert.errors import SourceError
        assert isinstance(exc, SourceError), repr(exc)
        said = str(exc)
    assert expect in said


def test_get_plan_cli_prints_one_line(llama, evil, tmp_path):
    evil.add("evil/configs", _probe(llama, tmp_path, PROBES["eos_nested"][0]))
    res = run_ferry("get", "evil/configs", "--plan", "--into", str(tmp_path / "into"), check=False,
                    env=hub_env(evil), timeout=300)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "eos_token_id: [[1]]" in res.stdout + res.stderr


def test_an_index_naming_a_shard_outside_the_folder_is_refused(llama, tmp_path):
    d = _probe(llama, tmp_path, lambda d: None)
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.embed_tokens.weight": "../../outside.safetensors"}}))
    res = run_ferry("check", str(d), check=False, timeout=300)
    assert res.returncode != 0 and "invalid shard file" in res.stdout + res.stderr


def test_gguf_metadata_with_an_absurd_layer_count_is_refused(tmp_path):
    from tests.get.tiny_gguf import write_tiny_gguf
    from app.convert.arch import spec_from_gguf
    from app.convert.errors import SourceError
    from app.convert.gguf_file import GGUFFile

    path = tmp_path / "t.gguf"
    write_tiny_gguf(path, "F32")
    g = GGUFFile(path)
    meta = dict(g.metadata)
    arch = meta["general.architecture"]
    for key, value, expect in ((f"{arch}.block_count", 10 ** 9, "block_count: 1000000000 is out of range"),
                               ("tokenizer.chat_template", ["x"], "tokenizer.chat_template"),
                               ("tokenizer.ggml.eos_token_id", -1, "tokenizer.ggml.eos_token_id")):
        bad = {**meta, key: value}
        with pytest.raises(SourceError, match=expect.replace("[", r"\[")):
            spec_from_gguf(bad, set(g.tensors), str(path))
