"""The weight-format table has one copy, the C core's (core_c/src/formats.c):
Python's view (app.engine.binding.FORMATS) is read from it at import and
equals it, and every format the converter can write or keep is in it."""
from __future__ import annotations

import math

import pytest

from app.convert import layout, quant, quant3
from app.convert.format_choices import EXPERT_CANDIDATES, TRUNK_CANDIDATES
from app.convert.sources import CORE_FORMATS
from app.engine._ferry_c import ffi, lib
from app.engine.binding import FORMATS, _profile_part
from app.convert import plan_config


def test_python_view_equals_the_c_table():
    n = lib.ferry_formats(ffi.NULL, 0)
    assert n == len(FORMATS) > 0
    rows = ffi.new("ferry_format_record[]", n)
    assert lib.ferry_formats(rows, n) == n
    assert list(FORMATS) == [ffi.string(r.name).decode() for r in rows]
    for code, (name, f) in enumerate(FORMATS.items()):
        assert f.code == code == rows[code].code == lib.ferry_format_code(name.encode())
        assert (f.block_elems, f.block_bytes) == (rows[code].block_elems, rows[code].block_bytes)
        cols = f.block_elems * 7
        assert f.row_bytes(cols) == lib.ferry_format_row_bytes(code, cols) == layout.stored_bytes(name, (cols,))
        assert f.bits_per_weight == f.block_bytes * 8 / f.block_elems
        if f.block_elems > 1:
            assert lib.ferry_format_row_bytes(code, cols + 1) == 0
            with pytest.raises(ValueError, match="whole number"):
                f.row_bytes(cols + 1)
    # The profile's arrays are indexed by format code.
    assert n <= lib.FERRY_PROFILE_FORMATS
    assert lib.ferry_format_code(b"no-such-format") == -1


def test_the_export_writes_only_what_the_caller_made_room_for():
    n = lib.ferry_formats(ffi.NULL, 0)
    rows = ffi.new("ferry_format_record[]", n)
    rows[n - 1].code = -7
    assert lib.ferry_formats(rows, n - 1) == n
    assert rows[n - 1].code == -7 and rows[n - 2].code == n - 2
    assert lib.ferry_formats(ffi.NULL, 5) == n


def test_every_format_the_converter_writes_or_keeps_is_in_the_table():
    choices = set(layout.ENCODABLE) | set(layout.FORMAT_CHOICES) | set(EXPERT_CANDIDATES) | set(TRUNK_CANDIDATES)
    assert choices - {"auto"} <= set(FORMATS)
    assert set(CORE_FORMATS) <= set(FORMATS) and quant3.NAME not in CORE_FORMATS
    assert layout.FORMAT_CODES == {name: f.code for name, f in FORMATS.items()}
    assert (quant3.BLOCK, quant3.BLOCK_BYTES) == (FORMATS[quant3.NAME].block_elems, FORMATS[quant3.NAME].block_bytes)
    # ggml's own table (the GGUF reader's) agrees wherever the names meet.
    for name in CORE_FORMATS:
        g = quant.FORMATS[name.upper()]
        assert (g.block_elems, g.block_bytes) == (FORMATS[name].block_elems, FORMATS[name].block_bytes)


def test_plan_config_costs_every_written_format_at_the_tables_bits():
    assert set(plan_config._BPW) == set(layout.ENCODABLE)
    for name, bpw in plan_config._BPW.items():
        assert bpw == FORMATS[name].bits_per_weight
    for bits, name in plan_config._BY_WIDTH.items():
        assert plan_config._fmt_of(bits, "expert", "ferry") == (name, FORMATS[name].bits_per_weight, True)
    assert plan_config._BY_WIDTH[4] == "q4_0" and plan_config._BY_WIDTH[3] == quant3.NAME
    assert plan_config._fmt_of(5, "expert", "ferry")[2] is False


def test_the_profile_names_products_by_the_tables_names():
    c = ffi.new("ferry_profile_part *")
    for f in FORMATS.values():
        c.matmul_calls[f.code] = f.code + 1
        c.matmul_seconds[f.code] = 0.5
    part = _profile_part(c)
    assert list(part["matmul"]) == list(FORMATS)
    assert math.isclose(sum(m["seconds"] for m in part["matmul"].values()), 0.5 * len(FORMATS))
