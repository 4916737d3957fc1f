"""The most lenient backend we can think of, for tests/alias_differential.rs.

Every trick a mainstream server plays on a request, at once, so that any
alias lockstep lets through unversioned shows up as a lost write here:

* the path is percent-decoded in full (%2F, %2E, %3B, %5C included), then
  `\\` is read as `/`;
* `;params` are dropped from every segment;
* empty and `.` segments vanish, `..` is clamped at the root;
* the literal `articles` is compared without regard to case;
* the method is upper-cased, and `X-HTTP-Method-Override`, `X-HTTP-Method`,
  `X-Method-Override` and a `_method` query parameter override it.

Standard library only.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote_to_bytes

STORE = {}
LOCK = threading.Lock()
OVERRIDE_HEADERS = ("X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override")


def lenient_segments(raw_path):
    path = unquote_to_bytes(raw_path).decode("utf-8", "replace").replace("\\", "/")
    segments = []
    for seg in path.split("/"):
        seg = seg.split(";", 1)[0]
        if seg in ("", "."):
            continue
        if seg == "..":
            if segments:
                segments.pop()
            continue
        segments.append(seg)
    return segments


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; without this, Nagle and
    # delayed ACKs stall every kept-alive exchange by 40 ms.
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def answer(self, status, value=None):
        body = b"" if value is None else json.dumps(value).encode()
        self.send_response(status)
        if value is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            value = json.loads(raw) if raw else {}
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def handle_one_request(self):
        # BaseHTTPRequestHandler dispatches to do_<METHOD> with the method as
        # sent; route everything through one place instead.
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self.parse_request():
                return
            self.route()
            self.wfile.flush()
        except (ConnectionError, TimeoutError):
            self.close_connection = True

    def route(self):
        # Read the body whatever the route, so a kept-alive connection stays
        # in step.
        body = self.body()
        raw_path, _, query = self.path.partition("?")
        method = self.command.upper()
        for name in OVERRIDE_HEADERS:
            if self.headers.get(name):
                method = self.headers[name].strip().upper()
        override = parse_qs(query).get("_method")
        if override:
            method = override[0].strip().upper()

        if raw_path == "/_state":
            return self.state(method, body)
        segments = lenient_segments(raw_path)
        if not segments or segments[0].lower() != "articles" or len(segments) > 2:
            return self.answer(404, {"error": "no such route"})
        with LOCK:
            if len(segments) == 1:
                if method == "GET":
                    return self.answer(200, list(STORE.values()))
                if method == "POST":
                    if body is None:
                        return self.answer(400, {"error": "body is not a JSON object"})
                    item_id = str(body.get("id") or (len(STORE) + 1000))
                    STORE[item_id] = {**body, "id": item_id}
                    return self.answer(201, STORE[item_id])
                return self.answer(405, {"error": "method not allowed"})
            item_id = segments[1]
            if method == "GET":
                if item_id in STORE:
                    return self.answer(200, STORE[item_id])
                return self.answer(404, {"error": "no such item"})
            if method in ("PUT", "PATCH"):
                if body is None:
                    return self.answer(400, {"error": "body is not a JSON object"})
                if item_id not in STORE:
                    return self.answer(404, {"error": "no such item"})
                base = STORE[item_id] if method == "PATCH" else {}
                STORE[item_id] = {**base, **body, "id": item_id}
                return self.answer(200, STORE[item_id])
            if method == "DELETE":
                if STORE.pop(item_id, None) is None:
                    return self.answer(404, {"error": "no such item"})
                return self.answer(204)
            return self.answer(405, {"error": "method not allowed"})

    def state(self, method, body):
        with LOCK:
            if method == "GET":
                return self.answer(200, STORE)
            if method == "PUT":
                if body is None:
                    return self.answer(400, {"error": "body is not a JSON object"})
                STORE.clear()
                STORE.update(body)
                return self.answer(204)
        return self.answer(405, {"error": "method not allowed"})


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print(f"LISTENING 127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
