"""A real HTTP server on 127.0.0.1 for webhook tests: it records each POST (path, headers, JSON
body) and answers with the status the test sets for a path (200 by default)."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def webhook_server() -> Iterator[dict]:
    """Yields ``{"url", "port", "posts": [...], "status": {path: code}}``; stops after."""
    posts: list[dict] = []
    status: dict[str, int] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet: the test reads ``posts``
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
            posts.append({"path": self.path, "headers": dict(self.headers), "raw": body, "json": parsed})
            code = status.get(self.path, 200)
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {
            "url": f"http://127.0.0.1:{server.server_port}",
            "port": server.server_port,
            "posts": posts,
            "status": status,
        }
    finally:
        server.shutdown()
        server.server_close()
