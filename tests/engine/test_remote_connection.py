"""The remote engine's turns travel on one kept-alive connection, even when a
server ends its response body a moment after the stream's ``[DONE]``: a
server without API keys keeps prefix reuse per connection, so a second turn
sent at once on a new connection loses it (seen as a flaky "0 reused" in
``ferry chat URL`` under load)."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from app.chat.turn import TurnRequest
from app.engine.remote import RemoteEngine
from app.events import Text, TurnDone

#: how long the server waits between ``[DONE]`` and the end of the chunked body
TAIL_SECONDS = 0.5


class _SlowTail(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    peers: list[int] = []

    def log_message(self, *args):        # quiet
        pass

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).peers.append(self.client_address[1])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        doc = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
        self._chunk(b"data: " + json.dumps(doc).encode() + b"\n\n")
        self._chunk(b"data: [DONE]\n\n")
        time.sleep(TAIL_SECONDS)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def test_turns_sent_at_once_share_one_connection():
    _SlowTail.peers = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowTail)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    remote = RemoteEngine(f"http://127.0.0.1:{server.server_address[1]}/v1", "m")
    try:
        for _ in range(2):
            events = list(remote.generate(TurnRequest([{"role": "user", "content": "hello"}], max_tokens=4)))
            assert "".join(e.text for e in events if isinstance(e, Text)) == "hi"
            assert isinstance(events[-1], TurnDone) and events[-1].reason == "stop"
    finally:
        remote.close()
        server.shutdown()
        server.server_close()
    assert len(_SlowTail.peers) == 2 and _SlowTail.peers[0] == _SlowTail.peers[1]
