"""Where every byte of a container goes, decided before anything is written.

The layout is a pure function of the source's shapes and formats and the
options, so a resumed conversion writes exactly the bytes an uninterrupted
one would. See docs/FORMAT.md for the on-disk format this produces.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.convert import iq4xs, quant, quant2, quant3
from app.convert.compressed import MXFP4
from app.convert.arch import LAYER_TENSORS, VECTOR_SUFFIXES
from app.convert.errors import SourceError
from app.convert.sources import CORE_FORMATS, Source
from app.engine.binding import FORMATS

FORMAT_VERSION = 1
TENSOR_ALIGN = 64
RECORD_ALIGN = 4096
RECORD_HEADER_BYTES = 64
BANK_HEADER_BYTES = 4096
#: Container spelling -> the C core's format code (the byte in bank and
#: record headers), from the core's own table.
FORMAT_CODES = {name: f.code for name, f in FORMATS.items()}
#: Formats the converter can encode floats into.
ENCODABLE = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", iq4xs.NAME, quant3.NAME, quant2.NAME)
#: A format whose 256-value blocks a row's length does not divide stores that
#: row in this one instead when it can (as llama.cpp does for IQ4_XS): the
#: 32-value q4_0, the nearest in bits, rather than the source's floats.
ROW_FALLBACK = {iq4xs.NAME: "q4_0"}
#: Accepted values of --trunk-format / --expert-format.
FORMAT_CHOICES = ("auto",) + ENCODABLE
#: What trunk format 'auto' stores a trunk converted from floats in (every
#: matrix of the source f32, f16 or bf16): q8_0, whose error is small and whose
#: extra bits cost little RAM next to the experts (docs/bench-log/2026-12-03.md, "Default
#: trunk format"). A trunk with any quantized matrix (e.g. a Q4_1 GGUF) keeps
#: its formats: converting it up gains nothing.
AUTO_FLOAT_TRUNK = "q8_0"
FLOAT_SOURCE_FORMATS = ("f32", "f16", "bf16")

def block_values(fmt: str) -> int:
    """Values per block of a stored format (1 for plain floats), from the core's table."""
    f = FORMATS.get(fmt)
    return f.block_elems if f is not None else 1


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def stored_bytes(fmt: str, shape: tuple[int, ...]) -> int:
    cols = shape[-1]
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    try:
        return rows * FORMATS[fmt].row_bytes(cols)
    except ValueError as exc:
        raise SourceError("layout", str(exc)) from None


def is_float_format(source_fmt: str) -> bool:
    """f32, f16 or bf16, whole or a slice of one (sources.py's "-slice")."""
    return source_fmt.removesuffix("-slice") in FLOAT_SOURCE_FORMATS


def trunk_auto_format(matrix_formats: list[str]) -> str:
    """What trunk format 'auto' means for a source whose trunk matrices are
    stored in `matrix_formats`: AUTO_FLOAT_TRUNK when all are floats, else
    'auto' (keep each tensor's own format)."""
    if matrix_formats and all(is_float_format(f) for f in matrix_formats):
        return AUTO_FLOAT_TRUNK
    return "auto"


def row_format(fmt: str, cols: int) -> str | None:
    """The format a matrix with rows of ``cols`` values is stored in when
    ``fmt`` is asked: ``fmt`` when its blocks divide the rows, else its
    ROW_FALLBACK when that one's do, else None (the caller keeps the source's)."""
    for f in (fmt, ROW_FALLBACK.get(fmt)):
        if f is not None and (f not in FORMATS or cols % FORMATS[f].block_elems == 0):
            return f
    return None


def choose_format(source_fmt: str, wanted: str, shape: tuple[int, ...], vector: bool) -> str:
    """The stored format of one tensor: vectors are f32; 'auto' keeps the source's
    format when the core computes with it (lossless), otherwise widens to f32."""
    if vector:
        return "f32"
    if wanted == "auto":
        if source_fmt in CORE_FORMATS:
            return source_fmt
        # e2m1 x 2^k has two significant bits and bf16 has f32's exponents: MXFP4
        # is exact in bf16 at half f32's bytes (docs/KIMI.md). Other codes widen to f32.
        return "bf16" if source_fmt == MXFP4 else "f32"
    stored = row_format(wanted, shape[-1])
    if stored is None:
        return "f32" if source_fmt not in CORE_FORMATS else source_fmt
    return stored


#: Trunk matrix classes whose format can differ from the trunk's (`ferry convert --trunk-class CLASS=F`,
#: ``plan_layout(trunk_classes=...)``), by the canonical name's last part: the FFN-like matrices (dense
#: layers' MLPs, shared experts, K3's latent projections), every attention projection (llama, MLA,
#: KDA), and the untied output head. Vectors and routers keep their rules.
TRUNK_CLASSES = {
    "ffn": ("ffn_gate", "ffn_up", "ffn_down", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
            "ffn_latent_down", "ffn_latent_up"),
    "attention": ("attn_q", "attn_k", "attn_v", "attn_output", "attn_q_a", "attn_q_b", "attn_kv_a_mqa",
                  "attn_kv_b", "attn_gate", "kda_q", "kda_k", "kda_v", "kda_f_a", "kda_f_b", "kda_beta", "kda_g",
                  "kda_g_a", "kda_g_b", "kda_output"),
    "head": ("output",),
}


def trunk_class(name: str) -> str | None:
    """The TRUNK_CLASSES class of a canonical trunk tensor name, or None."""
    last = name.split(".")[-1]
    return next((c for c, parts in TRUNK_CLASSES.items() if last in parts), None)


def check_trunk_classes(trunk_classes: dict[str, str] | None) -> dict[str, str]:
    """``trunk_classes`` validated: known classes, formats the converter encodes."""
    for cls, fmt in (trunk_classes or {}).items():
        if cls not in TRUNK_CLASSES:
            raise SourceError("options", f"trunk class '{cls}' is not one of {', '.join(TRUNK_CLASSES)}")
        if fmt not in ENCODABLE:
            raise SourceError("options", f"trunk class format '{fmt}' is not one of {', '.join(ENCODABLE)}")
    return dict(trunk_classes or {})


#: A Kimi-family router (ffn_router) released in one of these is stored as
#: released: exact routing (the same sigmoid scores as the release computes)
#: at half the bytes of f32, whatever the trunk format (K3: 1.10 GiB instead of
#: 2.20). Routers in any other format stay f32.
ROUTER_KEPT_FORMATS = ("bf16", "f16")


#: The vision tower's vectors (norm weights): f32 like every trunk vector.
VISION_VECTOR_SUFFIXES = ("norm0", "norm1", "final_norm", "post_norm")


def is_vision_tensor(name: str) -> bool:
    """A tensor of the vision tower (``v.*``) or its projector (``mm.*``)."""
    return name.startswith(("v.", "mm."))


def vision_format(source_fmt: str, trunk_format: str) -> str:
    """The stored format of a vision-tower matrix: a float trunk format
    (f32, f16, bf16) when one is asked for, else the release's own float
    format (bf16: lossless); never a quantized one (docs/KIMI.md, "Images")."""
    if trunk_format in ("f32", "f16", "bf16"):
        return trunk_format
    return source_fmt if source_fmt in ("f32", "f16", "bf16") else "f32"


@dataclass
class TrunkEntry:
    name: str            #: canonical name
    source: str          #: source tensor name
    fmt: str             #: stored format
    shape: tuple[int, ...]
    offset: int = 0
    nbytes: int = 0
    layer: int = -1      #: which layer's segment it belongs to (-1 head, n_layers tail)


@dataclass
class BankLayout:
    layer: int
    file: str
    n_experts: int
    parts: dict[str, dict[str, Any]]   #: gate/up/down -> fmt, shape, offset, nbytes
    payload_size: int
    record_size: int

    @property
    def file_size(self) -> int:
        return BANK_HEADER_BYTES + self.n_experts * self.record_size


@dataclass
class Layout:
    model: dict[str, Any]
    trunk: list[TrunkEntry]
    trunk_size: int
    banks: list[BankLayout]
    #: segment index -> end offset of that segment in trunk.bin
    segment_ends: list[int] = field(default_factory=list)
    options: dict[str, str] = field(default_factory=dict)

    def total_bytes(self) -> int:
        return self.trunk_size + sum(b.file_size for b in self.banks)

    def expert_bytes(self) -> int:
        """Every expert record of every bank."""
        return sum(b.n_experts * b.record_size for b in self.banks)

    def cold_bytes_per_token(self, top_k: int) -> int:
        """What one token reads when none of its experts is cached."""
        return sum(b.record_size for b in self.banks) * top_k

    def digest(self, identity: dict) -> str:
        """A fingerprint of what this conversion will write, for safe resumes."""
        blob = json.dumps({"identity": identity, "model": self.model, "options": self.options,
                           "trunk": [(t.name, t.fmt, t.offset) for t in self.trunk],
                           "banks": [(b.layer, b.record_size) for b in self.banks]}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


def plan_layout(src: Source, trunk_format: str = "auto", expert_format: str = "auto",
                trunk_classes: dict[str, str] | None = None) -> Layout:
    """``trunk_classes``: {TRUNK_CLASSES class: format} stored instead of the trunk format."""
    classes = check_trunk_classes(trunk_classes)
    for opt, value in (("trunk format", trunk_format), ("expert format", expert_format)):
        if value not in FORMAT_CHOICES:
            raise SourceError("options", f"{opt} '{value}' is not one of {', '.join(FORMAT_CHOICES)}")
    spec = src.spec
    n_layers = spec.n_layers
    order: list[tuple[str, int]] = [("token_embd", -1)]
    for i in range(n_layers):
        order += [(f"blk.{i}.{s}", i) for s in LAYER_TENSORS if f"blk.{i}.{s}" in spec.trunk]
    order += [(n, n_layers) for n in ("output_norm", "output") if n in spec.trunk]
    order += [(n, n_layers) for n in spec.trunk if is_vision_tensor(n)]

    def is_vector(name: str) -> bool:
        return (name.split(".")[-1] in VECTOR_SUFFIXES or name == "output_norm"
                or (is_vision_tensor(name) and name.split(".")[-1] in VISION_VECTOR_SUFFIXES))

    trunk_wanted = trunk_format
    if trunk_format == "auto":
        trunk_wanted = trunk_auto_format([src.stored_format(spec.trunk[n]) for n, _ in order
                                          if not is_vector(n) and not is_vision_tensor(n)])
    entries, offset, segment_ends, current = [], 0, [], -1
    for name, layer in order:
        if layer != current and entries:
            segment_ends.append(offset)
        current = layer
        source = spec.trunk[name]
        shape = src.shape(source)
        fmt = choose_format(src.stored_format(source), classes.get(trunk_class(name) or "", trunk_wanted), shape,
                            is_vector(name))
        if is_vision_tensor(name) and not is_vector(name):
            fmt = vision_format(src.stored_format(source), trunk_format)
        if name.endswith(".ffn_router") and src.stored_format(source) in ROUTER_KEPT_FORMATS:
            fmt = src.stored_format(source)   # the released router's own values, at half f32's bytes
        offset = _align(offset, TENSOR_ALIGN)
        nbytes = stored_bytes(fmt, shape)
        entries.append(TrunkEntry(name, source, fmt, shape, offset, nbytes, layer))
        offset += nbytes
    segment_ends.append(offset)
    banks = [_plan_bank(src, layer, parts, expert_format) for layer, parts in sorted(spec.experts.items())]
    options = {"trunk_format": trunk_format, "expert_format": expert_format}
    if classes:   # only when asked: the layouts (and resumable partials) of every other conversion are unchanged
        options["trunk_classes"] = dict(sorted(classes.items()))
    return Layout(model=spec.model, trunk=entries, trunk_size=offset, banks=banks, segment_ends=segment_ends,
                  options=options)


def _plan_bank(src: Source, layer: int, experts: list[dict[str, str]], wanted: str) -> BankLayout:
    first = experts[0]
    formats = {}
    for part in ("gate", "up", "down"):
        shape = src.shape(first[part])
        formats[part] = (choose_format(src.stored_format(first[part]), wanted, shape, vector=False), shape)
    return bank_layout(layer, len(experts), formats)


def bank_layout(layer: int, n_experts: int, parts_of: dict[str, tuple[str, tuple[int, ...]]]) -> BankLayout:
    """The bank of ``n_experts`` records whose gate, up and down are stored as
    ``parts_of[part] = (format, shape)``: the parts' offsets in a record and
    the record's size (what the converter writes; bench/stream.py
    --true-shape writes K3's real records by it)."""
    parts, offset = {}, RECORD_HEADER_BYTES
    for part in ("gate", "up", "down"):
        fmt, shape = parts_of[part]
        offset = _align(offset, TENSOR_ALIGN)
        nbytes = stored_bytes(fmt, shape)
        parts[part] = {"dtype": fmt, "shape": list(shape), "offset": offset, "nbytes": nbytes}
        offset += nbytes
    payload = offset - RECORD_HEADER_BYTES
    return BankLayout(layer=layer, file=f"experts/layer_{layer:03d}.bin", n_experts=n_experts, parts=parts,
                      payload_size=payload, record_size=_align(offset, RECORD_ALIGN))


#: Quantize bf16 and MXFP4 sources to q3_nl from their stored bytes (the C
#: quantizer decodes them itself) instead of through float32 arrays; the bytes
#: written are the same either way (tests/convert/test_convert_speed.py).
NATIVE_Q3 = True


def encode(src: Source, name: str, fmt: str, threads: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """One source tensor in the stored format, as uint8 bytes. ``threads``: how
    many threads the q3_nl quantizer splits its rows over (None: one per core).
    ``out``: where q3_nl is written (the stored size in bytes; returned), else
    a new array."""
    if src.stored_format(name) == fmt:
        return np.ascontiguousarray(src.read_raw(name)).view(np.uint8).reshape(-1)
    if fmt == quant3.NAME and NATIVE_Q3:
        native = src.q3_input(name)
        if native is not None:
            return _q3_native(name, src.shape(name)[-1], native, threads, out)
    values = np.ascontiguousarray(src.read_f32(name), dtype=np.float32)
    if fmt == "f32":
        return values.view(np.uint8).reshape(-1)
    if fmt == "bf16":
        return quant.f32_to_bf16_bits(values).view(np.uint8).reshape(-1)
    if fmt == "f16":
        return quant.f32_to_f16_bits(values).view(np.uint8).reshape(-1)
    if fmt in ("q8_0", "q4_0", "q4_1"):
        return quant.quantize(values, fmt.upper())
    if fmt == quant3.NAME:
        if not np.isfinite(values).all():
            raise SourceError(name, "cannot quantize non-finite values to q3_nl")
        return quant3.quantize(values, threads=threads, out=out)
    if fmt == quant2.NAME:
        if not np.isfinite(values).all():
            raise SourceError(name, "cannot quantize non-finite values to q2_vq")
        return quant2.quantize(values, threads=threads, out=out)
    if fmt == iq4xs.NAME:
        if not np.isfinite(values).all():
            raise SourceError(name, "cannot quantize non-finite values to iq4_xs")
        return iq4xs.quantize(values, threads=threads, out=out)
    raise SourceError(name, f"cannot encode into {fmt}")


def _q3_native(name: str, cols: int, native: tuple, threads: int | None, out: np.ndarray | None = None) -> np.ndarray:
    """q3_nl from bf16 bits or MXFP4 nibbles and scales, as Source.q3_input gives them."""
    try:
        if native[0] == "bf16":
            return quant3.quantize(native[1].reshape(-1, cols), threads=threads, out=out)
        packed, scales = native[1:]
        return quant3.quantize_mxfp4(packed.reshape(-1, cols // 2), scales.reshape(-1, cols // 32), threads=threads,
                                     out=out)
    except ValueError:
        raise SourceError(name, "cannot quantize non-finite values to q3_nl") from None
