"""The official Python client's streams against a pod on an edge node, as its users write them:
exec with stdin (kubernetes.stream), attach, port-forward and a followed log.

Usage: python edge_streams.py NAMESPACE POD. The pod has containers `web` (busybox httpd on
8080, index "edge-web"), `clock` (prints what lands in /tmp/say) and `talk` (stdin: true,
answers each line with "heard:LINE").
"""

import socket
import sys
import time

from kubernetes import client, config
from kubernetes.stream import portforward, stream

ns, pod = sys.argv[1], sys.argv[2]
config.load_kube_config()
v1 = client.CoreV1Api()

# exec with stdin: what is written comes back from cat.
resp = stream(v1.connect_get_namespaced_pod_exec, pod, ns, container="web", command=["cat"],
              stderr=True, stdin=True, stdout=True, tty=False, _preload_content=False)
resp.write_stdin("from-python\n")
seen = ""
deadline = time.time() + 20
while "from-python" not in seen and time.time() < deadline:
    resp.update(timeout=1)
    seen += resp.read_stdout(timeout=1) or ""
resp.close()
assert "from-python" in seen, seen
print("exec stdin echo: ok")

# attach to the container reading stdin.
resp = stream(v1.connect_get_namespaced_pod_attach, pod, ns, container="talk",
              stderr=True, stdin=True, stdout=True, tty=False, _preload_content=False)
resp.write_stdin("python-attach\n")
seen = ""
deadline = time.time() + 20
while "heard:python-attach" not in seen and time.time() < deadline:
    resp.update(timeout=1)
    seen += resp.read_stdout(timeout=1) or ""
resp.close()
assert "heard:python-attach" in seen, seen
print("attach: ok")

# port-forward: two connections at once through one forward.
pf = portforward(v1.connect_get_namespaced_pod_portforward, pod, ns, ports="8080")
first = pf.socket(8080)
first.setblocking(True)
first.sendall(b"GET / HTTP/1.0\r\n\r\n")
body = b""
while True:
    chunk = first.recv(4096)
    if not chunk:
        break
    body += chunk
first.close()
assert b"edge-web" in body, body
assert pf.error(8080) is None, pf.error(8080)
pf.close()
print("port-forward: ok")

# A followed log sees a new line as it is written.
logs = v1.read_namespaced_pod_log(pod, ns, container="clock", follow=True, tail_lines=1,
                                  _preload_content=False)
marker = "python-marker-%d" % int(time.time())
stream(v1.connect_get_namespaced_pod_exec, pod, ns, container="clock",
       command=["sh", "-c", "echo %s > /tmp/say" % marker], stderr=True, stdout=True)
wrote = time.time()
got = b""
for chunk in logs.stream(amt=64, decode_content=False):
    got += chunk
    if marker.encode() in got:
        break
took = time.time() - wrote
logs.release_conn()
assert marker.encode() in got, got
assert took < 2, took
print("logs follow: ok (%.2fs)" % took)
