"""A real HTTP server on 127.0.0.1 for the tests of HTTP clients (a random free port, served from a
daemon thread): subclasses define their request handler and call `_serve` with it."""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackServer:
    release: threading.Event  # set at `close`: handlers that hang on purpose wait on it and end

    def _serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@contextlib.contextmanager
def chat_server(replies):
    """A loopback chat-completions server answering with ``replies`` in order (a str is the
    message content, a dict the whole message, ``{"status": N}`` an HTTP error N); yields the list of
    request bodies it received."""
    requests = []
    lock = threading.Lock()

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                requests.append(body)
                r = replies[min(len(requests), len(replies)) - 1]
            if isinstance(r, dict) and set(r) == {"status"}:   # an HTTP error reply
                status, data = r["status"], b'{"error": {"message": "scripted failure"}}'
            else:
                msg = {"role": "assistant", "content": r} if isinstance(r, str) else r
                status, data = 200, json.dumps({"choices": [{"index": 0, "message": msg, "finish_reason": "stop"}]}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield requests, f"http://127.0.0.1:{srv.server_address[1]}/v1"
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)
