"""bench/convert.py's GGUF mode runs to its JSON when it made the source itself
(the source lives in a temporary directory that is gone when the rounds end)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gguf_moe_bench_without_kept_source(tmp_path: Path):
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "convert.py"), "--json", "--gguf-moe", "--layers", "1",
                          "--runs", "1", "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=600,
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout)
    assert out["mode"] == "gguf-moe" and out["source_bytes"] > 100 << 20
    assert out["convert_seconds"] > 0 and out["copy_seconds"] > 0 and out["ratio_to_copy"] > 0
    assert not list(tmp_path.iterdir())  # the temporary source went with its directory
