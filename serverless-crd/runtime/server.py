"""The minik8s Python function runtime: a small invocation server on the standard library.

POST / with a JSON body calls handler(event) (or handler(event, context) when the handler takes
two arguments; context has invocation_id and deadline) and answers its JSON result. A handler
exception is a 500 {"error", "traceback"}; a body that is not JSON is a 400; code that does not
import is a 502 {"error", "sourceReady": false} for every call, and GET /healthz says so too
(a 503 then, so that a readiness probe keeps the pod out of service).

With RUNTIME_MODE=base the server is a *base*: it runs no code of its own and loads function
modules on request, many per process (see base.py).
"""

import importlib
import inspect
import json
import os
import signal
import sys
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer

CODE_DIR = os.environ.get("FUNCTION_DIR", "/code")
HANDLER = os.environ.get("FUNCTION_HANDLER", "main.handler")
TIMEOUT = float(os.environ.get("FUNCTION_TIMEOUT_SECONDS", "60"))
MAX_BODY = 6 * 1024 * 1024


def load():
    """Imports the handler: (function, None) or (None, error text)."""
    sys.path.insert(0, CODE_DIR)
    module_name, _, func_name = HANDLER.rpartition(".")
    try:
        module = importlib.import_module(module_name or "main")
        func = getattr(module, func_name)
        if not callable(func):
            raise TypeError(f"{HANDLER} is not callable")
        return func, None
    except BaseException as e:  # a SyntaxError or anything the module raises on import
        return None, "".join(traceback.format_exception_only(type(e), e)).strip()


BASE_MODE = os.environ.get("RUNTIME_MODE") == "base"
if BASE_MODE:
    HANDLER_FN, LOAD_ERROR = None, None
else:
    HANDLER_FN, LOAD_ERROR = load()
TAKES_CONTEXT = False
if HANDLER_FN is not None:
    try:
        TAKES_CONTEXT = len(inspect.signature(HANDLER_FN).parameters) >= 2
    except (TypeError, ValueError):
        TAKES_CONTEXT = False


BUSY = False
STOPPING = False


def on_term(signum, frame):
    """Drains: exits now when idle, else once the request in hand is answered."""
    global STOPPING
    if not BUSY:
        os._exit(0)
    STOPPING = True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet: logs are the function's own prints
        pass

    def answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/healthz":
            code = 200 if LOAD_ERROR is None else 503
            self.answer(code, {"sourceReady": LOAD_ERROR is None, "error": LOAD_ERROR})
        else:
            self.answer(404, {"error": "not found"})

    def do_POST(self):
        global BUSY
        BUSY = True
        try:
            self.invoke()
        finally:
            BUSY = False
            if STOPPING:
                self.wfile.flush()
                os._exit(0)

    def invoke(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self.answer(413, {"error": f"request body over {MAX_BODY} bytes"})
            return
        raw = self.rfile.read(length) if length else b""
        if LOAD_ERROR is not None:
            self.answer(502, {"error": f"the function's source does not load: {LOAD_ERROR}", "sourceReady": False})
            return
        try:
            event = json.loads(raw) if raw.strip() else None
        except ValueError as e:
            self.answer(400, {"error": f"the request body is not JSON: {e}"})
            return
        context = {
            "invocation_id": self.headers.get("X-Invocation-Id") or str(uuid.uuid4()),
            "deadline": time.time() + TIMEOUT,
        }
        try:
            result = HANDLER_FN(event, context) if TAKES_CONTEXT else HANDLER_FN(event)
            body = json.dumps(result).encode()
        except Exception as e:
            self.answer(500, {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Server(HTTPServer):
    """HTTPServer without its reverse lookup of the bound address (socket.getfqdn), which
    waits for DNS timeouts in a pod without a resolver and delays the cold start."""

    def server_bind(self):
        import socketserver

        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_term)
    port = int(os.environ.get("PORT", "8080"))
    if BASE_MODE:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import base

        base.serve(port)
    else:
        Server(("0.0.0.0", port), Handler).serve_forever()
