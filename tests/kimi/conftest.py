"""Fixtures of the Kimi tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def k3v(tmp_path_factory):
    """The tiny K3 with its tiny vision tower, loaded (shared by the image tests)."""
    from app.convert.convert import convert
    from app.model import LoadedModel
    from tests.kimi import tiny_k3

    root = tmp_path_factory.mktemp("k3img")
    tiny_k3.build(root / "ckpt", vision=True)
    model = LoadedModel(convert(root / "ckpt", root / "k3.ferry"))
    yield model
    model.close()
