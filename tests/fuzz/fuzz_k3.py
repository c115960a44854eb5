"""atheris harness: the Kimi K3 chat format (app/chat/k3_format.py render_k3)
over hostile requests.

The input is a JSON request (as `ferry render-chat` and the server read
one); inputs that are not JSON are skipped. render_k3 may only raise
ValueError; when it renders, the segments are (str, bool) pairs, and every
markup segment is one of the format's control tokens or one of the request's
own image_prompts: nothing else from the request may become markup."""
from __future__ import annotations

import json

from fuzzlib import allowed, atheris, main

with atheris.instrument_imports(include=["app"]):
    from app.chat import k3_format
    from app.chat.k3_format import render_k3

CONTROL = {k3_format.OPEN, k3_format.CLOSE, k3_format.SEP, k3_format.END_OF_MSG}


def test_one(data: bytes) -> None:
    try:
        request = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return
    with allowed(ValueError):
        segments = render_k3(request)
        prompts = request.get("image_prompts") or []
        for text, is_markup in segments:
            assert isinstance(text, str) and isinstance(is_markup, bool)
            if is_markup:
                assert text in CONTROL or text in prompts, f"{text[:80]!r} became markup"


if __name__ == "__main__":
    main(test_one)
