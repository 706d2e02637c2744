"""A base: one Python process that loads function modules on request and serves them all.

The function-module provider (a virtual node per base) drives it:

  PUT    /modules/<ns>/<name>/<revision>   {"pod", "uid", "handler", "source", "timeoutSeconds"}
         loads the code as a module of its own (its own namespace, its own import), or adds the
         pod to the module already loaded for that revision; 200 {"loaded": true}, 422
         {"error": <Python's message>} when it does not import (nothing is kept), 409 when the
         base is full or serves another namespace.
  DELETE /modules/<ns>/<name>/<revision>?pod=<pod>  drops the pod; the module goes with its
         last pod.
  GET    /modules                          every module: pods, error, calls, failures.
  GET    /modules/<ns>/<name>/<revision>/logs   what the module printed ({"lines": [[t, s]]}).
  GET    /healthz                          200 while the process answers, with the namespaces
                                           whose modules it holds.
  POST   /<ns>/<name>/<revision> (or /<ns>/<name>: the newest revision loaded) invokes it, as
         POST / of a function pod: JSON in and out, 500 when the handler raises, 504 when it
         takes longer than its timeout (the base answers, the module's thread is abandoned).

Isolation is that of one Python process: each module has its own module object and globals,
and a module that raises or times out does not stop the others; a module that blocks the
whole interpreter makes /healthz stop answering, and the kubelet restarts the base.
"""

import collections
import inspect
import json
import os
import sys
import threading
import time
import traceback
import types
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

MAX_MODULES = int(os.environ.get("BASE_MAX_MODULES", "50"))
SHARE_NAMESPACES = os.environ.get("BASE_SHARE_NAMESPACES", "false") == "true"
MAX_BODY = 6 * 1024 * 1024
LOG_LINES = 1000

LOCK = threading.Lock()
MODULES = {}  # (ns, name, revision) -> Module
CURRENT = threading.local()  # the module whose code this thread runs


class Module:
    def __init__(self, ns, name, revision, handler, source, timeout):
        self.ns, self.name, self.revision = ns, name, revision
        self.handler, self.timeout = handler, timeout
        self.pods = {}
        self.logs = collections.deque(maxlen=LOG_LINES)
        self.partial = ""
        self.calls = 0
        self.failures = 0
        self.loaded_at = time.time()
        self.func, self.error = self.load(source)
        self.takes_context = False
        if self.func is not None:
            try:
                self.takes_context = len(inspect.signature(self.func).parameters) >= 2
            except (TypeError, ValueError):
                pass

    def load(self, source):
        """Runs the code in a module object of its own: (function, None) or (None, error)."""
        module_name, _, func_name = self.handler.rpartition(".")
        module_name = module_name or "main"
        path = f"/modules/{self.ns}/{self.name}/{self.revision}/{module_name.replace('.', '/')}.py"
        mod = types.ModuleType(f"{module_name}")
        mod.__file__ = path
        CURRENT.module = self
        try:
            exec(compile(source, path, "exec"), mod.__dict__)
            func = getattr(mod, func_name)
            if not callable(func):
                raise TypeError(f"{self.handler} is not callable")
            return func, None
        except BaseException as e:  # a SyntaxError, or anything the module raises on import
            return None, "".join(traceback.format_exception_only(type(e), e)).strip()
        finally:
            CURRENT.module = None

    def write(self, text):
        now = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1e9) % 1_000_000_000:09d}Z"
        text = self.partial + text
        lines = text.split("\n")
        self.partial = lines.pop()
        for line in lines:
            self.logs.append((now, line + "\n"))

    def describe(self):
        return {
            "namespace": self.ns, "name": self.name, "revision": self.revision,
            "pods": self.pods, "error": self.error, "calls": self.calls,
            "failures": self.failures, "loadedAt": self.loaded_at,
        }


class Output:
    """sys.stdout/sys.stderr: a module's prints go to its own log, the rest to the base's."""

    def __init__(self, real):
        self.real = real

    def write(self, text):
        module = getattr(CURRENT, "module", None)
        if module is None:
            return self.real.write(text)
        module.write(text)
        return len(text)

    def flush(self):
        self.real.flush()

    def __getattr__(self, name):
        return getattr(self.real, name)


def invoke(module, event, context):
    """Calls the handler on a thread of its own: (code, body)."""
    result = {}

    def run():
        CURRENT.module = module
        try:
            value = module.func(event, context) if module.takes_context else module.func(event)
            result["ok"] = json.dumps(value).encode()
        except Exception as e:
            result["error"] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        finally:
            CURRENT.module = None

    worker = threading.Thread(target=run, daemon=True, name=f"{module.ns}/{module.name}")
    worker.start()
    worker.join(module.timeout)
    if worker.is_alive():
        module.failures += 1
        return 504, json.dumps({"error": f"function {module.ns}/{module.name} did not answer within {module.timeout} s"}).encode()
    if "ok" in result:
        return 200, result["ok"]
    module.failures += 1
    return 500, json.dumps(result["error"]).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def answer(self, code, body):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            return None
        return self.rfile.read(length) if length else b""

    def parts(self):
        url = urlsplit(self.path)
        return [p for p in url.path.split("/") if p], parse_qs(url.query)

    def do_GET(self):
        parts, _ = self.parts()
        if parts == ["healthz"]:
            with LOCK:
                n = len(MODULES)
                namespaces = sorted({m.ns for m in MODULES.values()})
            self.answer(200, {"ok": True, "modules": n, "capacity": MAX_MODULES,
                              "namespaces": namespaces, "shareNamespaces": SHARE_NAMESPACES})
        elif parts == ["modules"]:
            with LOCK:
                listed = [m.describe() for m in MODULES.values()]
            self.answer(200, {"modules": listed, "capacity": MAX_MODULES})
        elif len(parts) == 5 and parts[0] == "modules" and parts[4] == "logs":
            with LOCK:
                m = MODULES.get(tuple(parts[1:4]))
                lines = list(m.logs) if m else None
            if lines is None:
                self.answer(404, {"error": "no such module"})
            else:
                self.answer(200, {"lines": lines})
        else:
            self.answer(404, {"error": "not found"})

    def do_PUT(self):
        parts, _ = self.parts()
        raw = self.body()
        if len(parts) != 4 or parts[0] != "modules" or raw is None:
            self.answer(404, {"error": "not found"})
            return
        try:
            spec = json.loads(raw)
        except ValueError as e:
            self.answer(400, {"error": f"not JSON: {e}"})
            return
        key = tuple(parts[1:4])
        pod, uid = spec.get("pod", ""), spec.get("uid", "")
        with LOCK:
            m = MODULES.get(key)
            if m is not None:
                m.pods[pod] = uid
                if m.error:
                    self.answer(422, {"error": m.error})
                else:
                    self.answer(200, {"loaded": True})
                return
            pods = sum(len(x.pods) for x in MODULES.values())
            if pods >= MAX_MODULES:
                self.answer(409, {"error": f"the base is full ({MAX_MODULES} modules)"})
                return
            others = {x.ns for x in MODULES.values()} - {key[0]}
            if others and not SHARE_NAMESPACES:
                self.answer(409, {"error": f"the base serves namespace {sorted(others)[0]}"})
                return
            # Loaded under the lock: two pods of one revision load it once. Code that does not
            # import is not kept: its pod fails, and holds no room in the base.
            m = Module(*key, spec.get("handler") or "main.handler", spec.get("source") or "",
                       float(spec.get("timeoutSeconds") or 60))
            if not m.error:
                m.pods[pod] = uid
                MODULES[key] = m
        if m.error:
            self.answer(422, {"error": m.error})
        else:
            self.answer(200, {"loaded": True})

    def do_DELETE(self):
        parts, query = self.parts()
        if len(parts) != 4 or parts[0] != "modules":
            self.answer(404, {"error": "not found"})
            return
        key = tuple(parts[1:4])
        pod = (query.get("pod") or [""])[0]
        with LOCK:
            m = MODULES.get(key)
            if m is None or (pod and pod not in m.pods):
                self.answer(404, {"error": "no such module"})
                return
            m.pods.pop(pod, None)
            if not m.pods or not pod:
                del MODULES[key]
        self.answer(200, {"deleted": True})

    def do_POST(self):
        parts, _ = self.parts()
        raw = self.body()
        if raw is None:
            self.answer(413, {"error": f"request body over {MAX_BODY} bytes"})
            return
        with LOCK:
            if len(parts) == 3:
                m = MODULES.get(tuple(parts))
            elif len(parts) == 2:
                found = [x for k, x in MODULES.items() if k[:2] == tuple(parts)]
                m = max(found, key=lambda x: x.loaded_at) if found else None
            else:
                m = None
        if m is None:
            self.answer(404, {"error": f"no module {'/'.join(parts)} on this base"})
            return
        if m.error:
            self.answer(502, {"error": f"the function's source does not load: {m.error}", "sourceReady": False})
            return
        try:
            event = json.loads(raw) if raw.strip() else None
        except ValueError as e:
            self.answer(400, {"error": f"the request body is not JSON: {e}"})
            return
        m.calls += 1
        context = {
            "invocation_id": self.headers.get("X-Invocation-Id") or str(uuid.uuid4()),
            "deadline": time.time() + m.timeout,
        }
        code, body = invoke(m, event, context)
        self.answer(code, body)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self):
        import socketserver

        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


def serve(port):
    sys.stdout = Output(sys.stdout)
    sys.stderr = Output(sys.stderr)
    Server(("0.0.0.0", port), Handler).serve_forever()
