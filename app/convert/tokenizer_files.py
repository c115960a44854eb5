"""The tokenizer and chat template a container carries, so it is self-contained.

From a Hugging Face checkpoint the tokenizer files are copied as they are.
From a GGUF file the embedded vocabulary becomes a ``tokenizer.json`` built
with the ``tokenizers`` library. Either way the manifest gets a ``tokenizer``
section naming the files and the special ids (BOS, the stop tokens).
"""
from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

from app.convert.config_check import check_config, check_tokenizer_config
from app.convert.errors import SourceError
from app.engine.container_files import MAX_TOKENIZER_BYTES

#: Files copied from a checkpoint when present.
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                      "tiktoken.model", "generation_config.json", "chat_template.jinja")

# GGUF token types (llama.cpp's enum): control and user-defined tokens are "added".
_GGUF_CONTROL, _GGUF_USER_DEFINED = 3, 4


def _as_list(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value])]


def _read_small(path: Path, limit: int = MAX_TOKENIZER_BYTES) -> bytes:
    """A tokenizer or config file of a checkpoint: a regular file (links are
    fine: Hugging Face's cache is made of them) no larger than ``limit``; a
    FIFO or ``/dev/zero`` in its place is refused, never read."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise SourceError(path, "is not a regular file")
        if st.st_size > limit:
            raise SourceError(path, f"has {st.st_size} bytes; the most Ferry reads for it is {limit}")
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise SourceError(path, f"cannot be read: {exc.strerror or exc}") from exc
    if len(data) > limit:
        raise SourceError(path, f"is larger than {limit} bytes")
    return data


def _read_json(path: Path) -> dict:
    from app.convert.errors import parse_json

    data = parse_json(path, _read_small(path), "file")
    if not isinstance(data, dict):
        raise SourceError(path, "is not a JSON object")
    return data


def from_hf(ckpt_dir: Path, config: dict) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest section and the files to copy from a checkpoint directory."""
    files = {name: _read_small(ckpt_dir / name) for name in HF_TOKENIZER_FILES if (ckpt_dir / name).exists()}
    if "tokenizer.json" not in files and "tiktoken.model" not in files:
        raise SourceError(ckpt_dir, "has no tokenizer.json or tiktoken.model")
    tok_cfg = check_tokenizer_config(_read_json(ckpt_dir / "tokenizer_config.json"), ckpt_dir / "tokenizer_config.json") \
        if "tokenizer_config.json" in files else {}
    gen_cfg = check_config(_read_json(ckpt_dir / "generation_config.json"), ckpt_dir / "generation_config.json") \
        if "generation_config.json" in files else {}
    template = tok_cfg.get("chat_template")
    if "chat_template.jinja" in files:
        try:
            template = files["chat_template.jinja"].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SourceError(ckpt_dir / "chat_template.jinja", f"is not UTF-8 text (byte {exc.start})") from None
    if isinstance(template, list):  # named templates: take the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if template:
        files["chat_template.jinja"] = template.encode("utf-8")
    text_cfg = config.get("text_config", config)
    eos = _as_list(gen_cfg.get("eos_token_id", text_cfg.get("eos_token_id")))
    bos = gen_cfg.get("bos_token_id", text_cfg.get("bos_token_id"))
    section = {
        "kind": "tiktoken" if "tiktoken.model" in files and "tokenizer.json" not in files else "hf-tokenizers",
        "file": "tiktoken.model" if "tokenizer.json" not in files else "tokenizer.json",
        "bos_id": int(bos) if bos is not None else None,
        "eos_ids": eos,
        "add_bos": bool(tok_cfg.get("add_bos_token", False)),
        "bos_token": _token_text(tok_cfg.get("bos_token")),
        "eos_token": _token_text(tok_cfg.get("eos_token")),
        "chat_template": "chat_template.jinja" if template else None,
    }
    return section, files


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _gguf_bpe_tokenizer(meta: dict, where: str) -> Tokenizer:
    tokens = meta.get("tokenizer.ggml.tokens")
    merges = meta.get("tokenizer.ggml.merges")
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens or [])
    if not tokens or merges is None:
        raise SourceError(where, "the GGUF vocabulary has no tokens or merges")
    if len(types) != len(tokens) or len(set(tokens)) != len(tokens):
        raise SourceError(where, "the GGUF vocabulary is inconsistent (duplicate tokens or type count)")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = []
    for m in merges:
        left, sep, right = m.partition(" ")
        if not sep:
            raise SourceError(where, f"GGUF merge rule {m!r} is not two tokens")
        pairs.append((left, right))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    pre = meta.get("tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact", "qwen2", "deepseek-llm"):
        # These vocabularies split digits one by one before the GPT-2 pattern.
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    special = [tokens[i] for i, t in enumerate(types) if t in (_GGUF_CONTROL, _GGUF_USER_DEFINED)]
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
    return tok


def from_gguf(meta: dict, where: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest section and files built from a GGUF file's metadata."""
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise SourceError(where, f"GGUF tokenizer model '{model}' is not supported yet (only 'gpt2' BPE)")
    tok = _gguf_bpe_tokenizer(meta, where)
    files = {"tokenizer.json": tok.to_str().encode("utf-8")}
    template = meta.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise SourceError(where, "GGUF metadata tokenizer.chat_template is not a string")
    if template:
        files["chat_template.jinja"] = template.encode("utf-8")
    tokens = meta["tokenizer.ggml.tokens"]
    eos = meta.get("tokenizer.ggml.eos_token_id")
    eos_ids = _as_list(eos)
    eot = meta.get("tokenizer.ggml.eot_token_id")
    if eot is not None and int(eot) not in eos_ids:
        eos_ids.append(int(eot))
    bos = meta.get("tokenizer.ggml.bos_token_id")
    section = {
        "kind": "hf-tokenizers",
        "file": "tokenizer.json",
        "bos_id": int(bos) if bos is not None else None,
        "eos_ids": eos_ids,
        "add_bos": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "bos_token": tokens[int(bos)] if bos is not None and 0 <= int(bos) < len(tokens) else None,
        "eos_token": tokens[eos_ids[0]] if eos_ids and 0 <= eos_ids[0] < len(tokens) else None,
        "chat_template": "chat_template.jinja" if template else None,
    }
    return section, files
