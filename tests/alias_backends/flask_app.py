"""A plain Flask app, for tests/alias_differential.rs: the routes a legacy
CRUD API would have, written the obvious way, served by Werkzeug.

What it brings is Werkzeug's reading of a request: WSGI hands the app a
percent-decoded PATH_INFO (so `/articles%2F42` is `/articles/42`) and the
method upper-cased (so `put` is PUT). Nothing here adds leniency of its own.
"""

import logging
import sys
import threading

from flask import Flask, jsonify, request
from werkzeug.serving import make_server

app = Flask(__name__)
STORE = {}
LOCK = threading.Lock()


def json_object():
    value = request.get_json(force=True, silent=True)
    return value if isinstance(value, dict) else None


@app.route("/_state", methods=["GET", "PUT"])
def state():
    with LOCK:
        if request.method == "GET":
            return jsonify(STORE)
        body = json_object()
        if body is None:
            return jsonify(error="body is not a JSON object"), 400
        STORE.clear()
        STORE.update(body)
        return "", 204


@app.route("/articles", methods=["GET", "POST"])
def articles():
    with LOCK:
        if request.method == "GET":
            return jsonify(list(STORE.values()))
        body = json_object()
        if body is None:
            return jsonify(error="body is not a JSON object"), 400
        item_id = str(body.get("id") or (len(STORE) + 1000))
        STORE[item_id] = {**body, "id": item_id}
        return jsonify(STORE[item_id]), 201


@app.route("/articles/<item_id>", methods=["GET", "PUT", "PATCH", "DELETE"])
def article(item_id):
    with LOCK:
        if item_id not in STORE:
            return jsonify(error="no such item"), 404
        if request.method == "GET":
            return jsonify(STORE[item_id])
        if request.method == "DELETE":
            del STORE[item_id]
            return "", 204
        body = json_object()
        if body is None:
            return jsonify(error="body is not a JSON object"), 400
        base = STORE[item_id] if request.method == "PATCH" else {}
        STORE[item_id] = {**base, **body, "id": item_id}
        return jsonify(STORE[item_id])


def main():
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    server = make_server("127.0.0.1", port, app, threaded=True)
    print(f"LISTENING 127.0.0.1:{server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
