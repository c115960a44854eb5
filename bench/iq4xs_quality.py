"""iq4_xs against q4_0: relative weight and output error, measured as
bench/quant_quality.py measures q3_nl (the same matrix sets and error
definitions: real SmolLM2 demo weights with their activations, and the
MXFP4-sourced K3-shaped stand-in), for issue 36's lower K3 floor.

    python bench/iq4xs_quality.py [--layers 0 15 29] [--k3-rows 384] [--json]

Rows:
  q4_0                      the converter's q4_0 (ggml's reference rounding)
  iq4_xs                    Ferry's C quantizer (app/convert/iq4xs.py), rows of
                            256-multiples; a matrix whose rows are not (the
                            demo's 576-column up/gate) is measured with its rows
                            joined, the format's own error
  iq4_xs (as converted)     what `ferry convert --trunk-format iq4_xs` stores:
                            such rows in q4_0 (layout.ROW_FALLBACK)
  iq4_xs (gguf-py decoded)  the same bytes decoded by gguf-py's reference
                            IQ4_XS dequantizer (an independent check of the layout)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from bench import quant_quality as qq  # noqa: E402  (the same sets and error definitions as quant2_quality)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, nargs="+", default=[0, 15, 29])
    ap.add_argument("--k3-rows", type=int, default=384, help="rows of each K3 matrix (0 = all)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from app.convert import iq4xs, quant
    from app.convert.layout import row_format

    t0 = time.time()
    sets = {k: (W, X) for k, (W, X) in qq.demo_set(a.layers).items()}
    sets.update({k: (v[0], v[1]) for k, v in qq.k3_set(a.k3_rows or None).items()})

    def q4_0(W, X):
        return quant.dequantize(quant.quantize(W, "Q4_0"), "Q4_0", W.size).reshape(W.shape), 4.5

    def iq4(W, X):
        flat = W.reshape(-1, 256) if W.shape[-1] % 256 else W
        return quant.dequantize(iq4xs.quantize(flat), "IQ4_XS", W.size).reshape(W.shape), 4.25

    def iq4_converted(W, X):
        if row_format(iq4xs.NAME, W.shape[-1]) == "q4_0":
            return q4_0(W, X)
        return iq4(W, X)

    def iq4_gguf(W, X):
        import gguf
        from gguf import quants
        flat = W.reshape(-1, 256) if W.shape[-1] % 256 else W
        raw = iq4xs.quantize(flat).reshape(-1, iq4xs.BLOCK_BYTES)
        return quants.dequantize(raw, gguf.GGMLQuantizationType.IQ4_XS).reshape(W.shape).astype(np.float32), 4.25

    formats = {"q4_0": q4_0, "iq4_xs": iq4, "iq4_xs (as converted)": iq4_converted,
               "iq4_xs (gguf-py decoded)": iq4_gguf}
    table = qq.measure(formats, sets, verbose=not a.json)
    out = {"date": time.strftime("%Y-%m-%d"), "table": table, "summary": qq.summarize(table),
           "seconds": round(time.time() - t0, 1)}
    print(json.dumps(out, indent=1) if a.json else json.dumps({"summary": out["summary"]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
