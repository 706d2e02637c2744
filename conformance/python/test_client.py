"""The official Kubernetes Python client, written the way its users write it (typed models
without `kind`, watch streams, create_from_yaml, the dynamic client, kubernetes.stream), against
a minik8s cluster. KUBECONFIG names the cluster; the Rust test `user_paths.rs` runs this file."""

import base64
import os
import tempfile
import time
import uuid

import pytest
from kubernetes import client, config, dynamic, utils, watch
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream


@pytest.fixture(scope="session")
def api():
    config.load_kube_config()
    return client.ApiClient()


@pytest.fixture
def ns(api):
    v1 = client.CoreV1Api(api)
    name = "py-" + uuid.uuid4().hex[:8]
    v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    v1.delete_namespace(name)


def test_typed_models_without_kind_create_read_patch_replace_and_delete(api, ns):
    v1 = client.CoreV1Api(api)
    created = v1.read_namespace(ns)
    assert created.metadata.labels["kubernetes.io/metadata.name"] == ns
    cm = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="settings"), data={"a": "1"})
    out = v1.create_namespaced_config_map(ns, cm)
    assert out.kind == "ConfigMap" and out.api_version == "v1"
    assert v1.read_namespaced_config_map("settings", ns).data == {"a": "1"}
    patched = v1.patch_namespaced_config_map("settings", ns, {"data": {"b": "2"}})
    assert patched.data == {"a": "1", "b": "2"}
    # Patching with what is already there writes nothing: same resourceVersion.
    again = v1.patch_namespaced_config_map("settings", ns, {"data": {"b": "2"}})
    assert again.metadata.resource_version == patched.metadata.resource_version
    patched.data["c"] = "3"
    replaced = v1.replace_namespaced_config_map("settings", ns, patched)
    assert replaced.data["c"] == "3"
    ev = client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name="settings-"),
        involved_object=client.V1ObjectReference(kind="ConfigMap", name="settings", namespace=ns),
        reason="Checked", message="looked at it", type="Normal",
    )
    assert v1.create_namespaced_event(ns, ev).reason == "Checked"
    v1.delete_namespaced_config_map("settings", ns)
    with pytest.raises(ApiException) as e:
        v1.read_namespaced_config_map("settings", ns)
    assert e.value.status == 404


def test_reviews_and_token_requests_take_typed_models(api, ns):
    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(verb="list", resource="pods", namespace=ns)
        )
    )
    out = client.AuthorizationV1Api(api).create_self_subject_access_review(review)
    assert out.status.allowed is True
    assert out.kind == "SelfSubjectAccessReview"
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_service_account(ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="bot")))
    token = v1.create_namespaced_service_account_token(
        "bot", ns, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))
    )
    assert token.status.token


def test_secret_string_data_lands_in_data_and_is_not_kept(api, ns):
    v1 = client.CoreV1Api(api)
    s = client.V1Secret(metadata=client.V1ObjectMeta(name="creds"), string_data={"user": "admin"})
    out = v1.create_namespaced_secret(ns, s)
    assert out.string_data is None
    got = v1.read_namespaced_secret("creds", ns)
    assert got.string_data is None
    assert base64.b64decode(got.data["user"]) == b"admin"


def test_watch_streams_resume_from_a_resource_version(api, ns):
    v1 = client.CoreV1Api(api)
    start = v1.list_namespaced_config_map(ns).metadata.resource_version
    v1.create_namespaced_config_map(ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="one")))
    w = watch.Watch()
    seen = []
    last = None
    for event in w.stream(v1.list_namespaced_config_map, ns, resource_version=start, timeout_seconds=10):
        if event["object"].metadata.name == "one":
            seen.append(event["type"])
            last = event["object"].metadata.resource_version
            w.stop()
    assert seen == ["ADDED"]
    v1.create_namespaced_config_map(ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="two")))
    names = []
    w = watch.Watch()
    for event in w.stream(v1.list_namespaced_config_map, ns, resource_version=last, timeout_seconds=10):
        names.append((event["type"], event["object"].metadata.name))
        if event["object"].metadata.name == "two":
            w.stop()
    assert ("ADDED", "one") not in names
    assert names[-1] == ("ADDED", "two")


MANIFESTS = """
apiVersion: v1
kind: ConfigMap
metadata:
  name: app-config
data:
  mode: fast
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: app
spec:
  replicas: 1
  selector:
    matchLabels: {app: app}
  template:
    metadata:
      labels: {app: app}
    spec:
      containers:
      - name: app
        image: busybox
        command: ["sleep", "3600"]
---
apiVersion: v1
kind: Service
metadata:
  name: app
spec:
  selector: {app: app}
  ports:
  - port: 80
    targetPort: 8080
"""


def test_create_from_yaml_takes_a_multi_document_file(api, ns):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(MANIFESTS)
    try:
        utils.create_from_yaml(api, f.name, namespace=ns)
    finally:
        os.unlink(f.name)
    assert client.CoreV1Api(api).read_namespaced_config_map("app-config", ns).data == {"mode": "fast"}
    assert client.AppsV1Api(api).read_namespaced_deployment("app", ns).spec.replicas == 1
    assert client.CoreV1Api(api).read_namespaced_service("app", ns).spec.cluster_ip


def test_the_dynamic_client_serves_built_in_kinds(api, ns):
    dyn = dynamic.DynamicClient(api)
    cms = dyn.resources.get(api_version="v1", kind="ConfigMap")
    cms.create(body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dyn"}, "data": {"x": "1"}}, namespace=ns)
    assert cms.get(name="dyn", namespace=ns).data.x == "1"
    cms.patch(name="dyn", namespace=ns, body={"data": {"x": "2"}}, content_type="application/merge-patch+json")
    assert cms.get(name="dyn", namespace=ns).data.x == "2"
    names = [i.metadata.name for i in cms.get(namespace=ns).items]
    assert "dyn" in names
    cms.delete(name="dyn", namespace=ns)
    deploys = dyn.resources.get(api_version="apps/v1", kind="Deployment")
    assert deploys.get(namespace=ns).items == []


def test_invalid_objects_are_422_with_the_field_named(api, ns):
    hpa = client.V2HorizontalPodAutoscaler(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V2HorizontalPodAutoscalerSpec(
            scale_target_ref=client.V2CrossVersionObjectReference(api_version="apps/v1", kind="Deployment", name="web"),
            min_replicas=5, max_replicas=2,
        ),
    )
    with pytest.raises(ApiException) as e:
        client.AutoscalingV2Api(api).create_namespaced_horizontal_pod_autoscaler(ns, hpa)
    assert e.value.status == 422
    assert "spec.maxReplicas" in e.value.body


def busybox_pod(name, command):
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            containers=[client.V1Container(name="main", image="busybox", command=command)],
            termination_grace_period_seconds=1,
        ),
    )


def wait_running(v1, name, ns, limit=90):
    deadline = time.time() + limit
    while time.time() < deadline:
        pod = v1.read_namespaced_pod(name, ns)
        if pod.status.phase == "Running":
            return pod
        time.sleep(0.5)
    raise AssertionError(f"pod {name} never ran: {pod.status}")


def test_pod_spec_updates_are_refused_but_images_may_change(api, ns):
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(ns, busybox_pod("fixed", ["sleep", "3600"]))
    with pytest.raises(ApiException) as e:
        v1.patch_namespaced_pod("fixed", ns, {"spec": {"restartPolicy": "Never"}})
    assert e.value.status == 422
    assert "pod updates may not change fields" in e.value.body
    out = v1.patch_namespaced_pod("fixed", ns, {"spec": {"containers": [{"name": "main", "image": "busybox:latest"}]}})
    assert out.spec.containers[0].image == "busybox:latest"


def test_exec_through_kubernetes_stream(api, ns):
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(ns, busybox_pod("shell", ["sleep", "3600"]))
    wait_running(v1, "shell", ns)
    out = stream(v1.connect_get_namespaced_pod_exec, "shell", ns,
                 command=["sh", "-c", "echo hello from $(hostname)"],
                 stderr=True, stdin=False, stdout=True, tty=False)
    assert out == "hello from shell\n"
    # A malformed exec (no stream asked for) is a 400, not a server error.
    with pytest.raises(ApiException) as e:
        v1.connect_get_namespaced_pod_exec("shell", ns, command=["true"], stdout=False, stderr=False, stdin=False)
    assert e.value.status == 400


def test_hpas_take_typed_models_in_both_versions_and_report_upstream_conditions(api, ns):
    apps = client.AppsV1Api(api)
    v2 = client.AutoscalingV2Api(api)
    v1 = client.AutoscalingV1Api(api)
    container = client.V1Container(
        name="c", image="busybox", command=["sleep", "3600"],
        resources=client.V1ResourceRequirements(requests={"cpu": "50m"}),
    )
    deployment = client.V1Deployment(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V1DeploymentSpec(
            replicas=1,
            selector=client.V1LabelSelector(match_labels={"app": "web"}),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"app": "web"}),
                spec=client.V1PodSpec(containers=[container]),
            ),
        ),
    )
    apps.create_namespaced_deployment(ns, deployment)
    hpa = client.V2HorizontalPodAutoscaler(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V2HorizontalPodAutoscalerSpec(
            scale_target_ref=client.V2CrossVersionObjectReference(
                api_version="apps/v1", kind="Deployment", name="web"),
            min_replicas=2,
            max_replicas=3,
            metrics=[client.V2MetricSpec(
                type="Resource",
                resource=client.V2ResourceMetricSource(
                    name="cpu",
                    target=client.V2MetricTarget(type="Utilization", average_utilization=60),
                ),
            )],
        ),
    )
    created = v2.create_namespaced_horizontal_pod_autoscaler(ns, hpa)
    assert created.kind == "HorizontalPodAutoscaler" and created.api_version == "autoscaling/v2"
    # Below minReplicas: the controller raises the Deployment to 2 and says so.
    deadline = time.time() + 60
    while apps.read_namespaced_deployment_scale("web", ns).spec.replicas != 2:
        assert time.time() < deadline, "the HPA never raised the Deployment to minReplicas"
        time.sleep(0.5)
    deadline = time.time() + 30
    while True:
        got = v2.read_namespaced_horizontal_pod_autoscaler("web", ns)
        status = got.status or client.V2HorizontalPodAutoscalerStatus(desired_replicas=0)
        conditions = {c.type: c for c in (status.conditions or [])}
        if status.last_scale_time is not None and "AbleToScale" in conditions:
            break
        assert time.time() < deadline, f"no status: {got.status}"
        time.sleep(0.5)
    assert conditions["AbleToScale"].status == "True"
    # The same object read as autoscaling/v1: the CPU target as targetCPUUtilizationPercentage.
    old = v1.read_namespaced_horizontal_pod_autoscaler("web", ns)
    assert old.spec.target_cpu_utilization_percentage == 60
    assert old.spec.min_replicas == 2
    # A missing target: AbleToScale=False, FailedGetScale, with upstream's message.
    hpa.metadata = client.V1ObjectMeta(name="nothing")
    hpa.spec.scale_target_ref = client.V2CrossVersionObjectReference(
        api_version="apps/v1", kind="Deployment", name="nothing")
    v2.create_namespaced_horizontal_pod_autoscaler(ns, hpa)
    deadline = time.time() + 30
    while True:
        got = v2.read_namespaced_horizontal_pod_autoscaler("nothing", ns)
        conditions = {c.type: c for c in ((got.status and got.status.conditions) or [])}
        if "AbleToScale" in conditions:
            break
        assert time.time() < deadline, f"no condition: {got.status}"
        time.sleep(0.5)
    assert conditions["AbleToScale"].status == "False"
    assert conditions["AbleToScale"].reason == "FailedGetScale"
    assert 'deployments.apps "nothing" not found' in conditions["AbleToScale"].message


# API correctness round 2 (issue 33): what the client's own e2e tests drive.

def test_interactive_exec_delivers_output_the_status_channel_and_closes(api, ns):
    from kubernetes.stream.ws_client import ERROR_CHANNEL
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(ns, busybox_pod("sh", ["sleep", "3600"]))
    wait_running(v1, "sh", ns)
    for binary in (False, True):
        enc = (lambda s: s.encode()) if binary else (lambda s: s)
        resp = stream(v1.connect_post_namespaced_pod_exec, "sh", ns, command=["/bin/sh"],
                      stderr=True, stdin=True, stdout=True, tty=False, binary=binary,
                      _preload_content=False)
        resp.write_stdin(enc("echo test string 1\n"))
        assert resp.readline_stdout(timeout=5) == enc("test string 1")
        assert not resp.peek_stderr()
        resp.write_stdin(enc("echo test string 2 >&2\n"))
        assert resp.readline_stderr(timeout=5) == enc("test string 2")
        assert not resp.peek_stdout()
        resp.write_stdin(enc("exit\n"))
        resp.update(timeout=5)
        deadline = time.time() + 10
        line = resp.read_channel(ERROR_CHANNEL)
        while len(line) == 0 and time.time() < deadline:
            time.sleep(0.2)
            resp.update(timeout=1)
            line = resp.read_channel(ERROR_CHANNEL)
        import json
        assert json.loads(line)["status"] == "Success", line
        resp.update(timeout=5)
        assert not resp.is_open()
    # A non-zero exit reaches the client as its return code.
    resp = stream(v1.connect_post_namespaced_pod_exec, "sh", ns, command=["/bin/sh"],
                  stderr=True, stdin=True, stdout=True, tty=False, _preload_content=False)
    resp.write_stdin("exit 3\n")
    resp.run_forever(timeout=10)
    assert resp.returncode == 3


def test_port_forward_through_kubernetes_stream(api, ns):
    from kubernetes.stream import portforward
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(ns, busybox_pod("web", ["httpd", "-f", "-p", "8080", "-h", "/www"]))
    wait_running(v1, "web", ns)
    deadline = time.time() + 30
    while True:
        pf = portforward(v1.connect_get_namespaced_pod_portforward, "web", ns, ports="8080")
        sock = pf.socket(8080)
        sock.settimeout(10)
        sock.sendall(b"GET / HTTP/1.0\r\nHost: web\r\n\r\n")
        data = b""
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        sock.close()
        error = pf.error(8080)
        pf.close()
        if data.startswith(b"HTTP/1.1 200") or time.time() > deadline:
            break
        time.sleep(0.5)
    assert data.startswith(b"HTTP/1.1 200"), (data, error)
    assert error is None


def test_create_from_yaml_then_apply_twice_is_idempotent(api, ns):
    apps = client.AppsV1Api(api)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write("""apiVersion: apps/v1
kind: Deployment
metadata: {name: nginx-app, labels: {app: nginx}}
spec:
  replicas: 3
  selector: {matchLabels: {app: nginx}}
  template:
    metadata: {labels: {app: nginx}}
    spec:
      containers:
      - name: nginx
        image: nginx:1.15.4
        ports:
        - containerPort: 80
""")
    utils.create_from_yaml(api, f.name, namespace=ns)
    for _ in range(2):
        utils.create_from_yaml(api, f.name, namespace=ns, apply=True)
    dep = apps.read_namespaced_deployment("nginx-app", ns)
    assert dep.spec.template.spec.containers[0].ports[0].container_port == 80
    assert dep.spec.template.spec.containers[0].ports[0].protocol == "TCP"
    managers = {m.manager for m in dep.metadata.managed_fields}
    assert "python-client" in managers, managers
    os.unlink(f.name)


def test_already_exists_body_is_byte_identical_to_upstreams(api, ns):
    v1 = client.CoreV1Api(api)
    svc = client.V1Service(metadata=client.V1ObjectMeta(name="mock-2"),
                           spec=client.V1ServiceSpec(ports=[client.V1ServicePort(port=80)]))
    v1.create_namespaced_service(ns, svc)
    with pytest.raises(ApiException) as e:
        v1.create_namespaced_service(ns, svc)
    assert e.value.status == 409
    assert e.value.body == (
        '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
        '"message":"services \\"mock-2\\" already exists","reason":"AlreadyExists",'
        '"details":{"name":"mock-2","kind":"services"},"code":409}\n'
    )


def test_apiservices_from_yaml_conflict_with_upstreams_body(api, ns):
    # The client's own e2e test_create_apiservice_from_yaml_with_conflict, with a unique name.
    name = "v1alpha1.wardle-%s.k8s.io" % ns
    doc = (
        "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata:\n  name: %s\n"
        "spec:\n  insecureSkipTLSVerify: true\n  group: wardle-%s.k8s.io\n  groupPriorityMinimum: 1000\n"
        "  versionPriority: 15\n  service:\n    name: api\n    namespace: wardle\n  version: v1alpha1\n"
    ) % (name, ns)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(doc)
    utils.create_from_yaml(api, f.name)
    reg = client.ApiregistrationV1Api(api)
    svc = reg.read_api_service(name=name)
    assert svc.metadata.name == name
    assert svc.spec.group == "wardle-%s.k8s.io" % ns
    assert svc.spec.version == "v1alpha1"
    with pytest.raises(utils.FailToCreateError) as cm:
        utils.create_from_yaml(api, f.name)
    assert str(cm.value) == (
        'Error from server (Conflict): {"kind":"Status","apiVersion":"v1","metadata":{},'
        '"status":"Failure","message":"apiservices.apiregistration.k8s.io \\"%s\\" already exists",'
        '"reason":"AlreadyExists","details":{"name":"%s","group":"apiregistration.k8s.io",'
        '"kind":"apiservices"},"code":409}\n' % (name, name)
    )
    # Its service does not exist: the check says so.
    deadline = time.time() + 30
    while time.time() < deadline:
        conds = reg.read_api_service(name=name).status.conditions or []
        if conds and conds[0].reason == "ServiceNotFound":
            break
        time.sleep(0.5)
    assert conds[0].type == "Available" and conds[0].status == "False", conds
    assert conds[0].message == 'service/api in "wardle" is not present'
    reg.delete_api_service(name=name, body={})
    os.unlink(f.name)


def test_controllers_scheduler_and_kubelet_report_events(api, ns):
    apps = client.AppsV1Api(api)
    v1 = client.CoreV1Api(api)
    dep = client.V1Deployment(
        metadata=client.V1ObjectMeta(name="bb"),
        spec=client.V1DeploymentSpec(
            replicas=2,
            selector=client.V1LabelSelector(match_labels={"app": "bb"}),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"app": "bb"}),
                spec=client.V1PodSpec(
                    containers=[client.V1Container(name="main", image="busybox", command=["sleep", "3600"])],
                    termination_grace_period_seconds=1,
                ),
            ),
        ),
    )
    apps.create_namespaced_deployment(ns, dep)
    v1.create_namespaced_pod(ns, client.V1Pod(
        metadata=client.V1ObjectMeta(name="missing"),
        spec=client.V1PodSpec(containers=[client.V1Container(name="main", image="nosuch/image:v1")]),
    ))

    def reasons(kind, name=None):
        sel = f"involvedObject.kind={kind}" + (f",involvedObject.name={name}" if name else "")
        return {(e.reason, e.message) for e in v1.list_namespaced_event(ns, field_selector=sel).items}

    deadline = time.time() + 60
    want = {"Scheduled", "Pulled", "Created", "Started"}
    while time.time() < deadline:
        pods = [p for p in v1.list_namespaced_pod(ns, label_selector="app=bb").items]
        got = {p.metadata.name: {r for r, _ in reasons("Pod", p.metadata.name)} for p in pods}
        bad = {r for r, _ in reasons("Pod", "missing")}
        if len(got) == 2 and all(want <= r for r in got.values()) and {"Failed", "BackOff"} <= bad:
            break
        time.sleep(1)
    assert len(got) == 2 and all(want <= r for r in got.values()), got
    assert {"Scheduled", "Pulling", "Failed", "BackOff"} <= bad, bad
    rs = reasons("ReplicaSet")
    assert [r for r, m in rs if r == "SuccessfulCreate" and m.startswith("Created pod: bb-")], rs
    assert len([r for r, _ in rs if r == "SuccessfulCreate"]) == 2, rs
    scaled = reasons("Deployment", "bb")
    assert [m for r, m in scaled if r == "ScalingReplicaSet" and m.startswith("Scaled up replica set bb-") and m.endswith("from 0 to 2")], scaled
    # Container events name the container; the source is the kubelet on the node.
    ev = [e for e in v1.list_namespaced_event(ns, field_selector="involvedObject.name=missing,reason=Failed").items]
    assert ev and ev[0].involved_object.field_path == "spec.containers{main}", ev
    assert ev[0].source.component == "kubelet" and ev[0].source.host, ev[0].source
    assert any(e.message.startswith('Failed to pull image "nosuch/image:v1": rpc error: code = NotFound') for e in ev), [e.message for e in ev]


def wait_terminated(v1, name, ns, limit=90):
    deadline = time.time() + limit
    while time.time() < deadline:
        pod = v1.read_namespaced_pod(name, ns)
        if pod.status.phase in ("Succeeded", "Failed"):
            return pod
        time.sleep(0.5)
    raise AssertionError(f"pod {name} never ended: {pod.status}")


def test_command_args_and_sub_path_exprs_expand_as_upstream(api, ns):
    v1 = client.CoreV1Api(api)
    env = [client.V1EnvVar(name="MSG", value="hello"),
           client.V1EnvVar(name="POD", value_from=client.V1EnvVarSource(
               field_ref=client.V1ObjectFieldSelector(field_path="metadata.name"))),
           client.V1EnvVar(name="ABS", value="/abs"),
           client.V1EnvVar(name="UP", value="../up")]

    def pod(name, command, args=None, sub=None):
        mounts = [client.V1VolumeMount(name="v", mount_path="/all")]
        if sub:
            mounts.append(client.V1VolumeMount(name="v", mount_path="/mine", sub_path_expr=sub))
        return client.V1Pod(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1PodSpec(
                restart_policy="Never",
                containers=[client.V1Container(name="main", image="busybox", command=command,
                                               args=args, env=env, volume_mounts=mounts)],
                volumes=[client.V1Volume(name="v", empty_dir=client.V1EmptyDirVolumeSource())],
            ))

    # $(VAR) expands defined variables only; $$ is a literal $.
    v1.create_namespaced_pod(ns, pod("args", ["echo"], ["$(MSG)", "$$(MSG)", "$(UNSET)", "$$$(MSG)"]))
    # A shell command in upstream's DNS test style: $$(…) reaches the shell as $(…).
    v1.create_namespaced_pod(ns, pod("shell", ["sh", "-c", "check=\"$$(echo ok)\"; echo $check"]))
    # subPathExpr: a folder per pod inside the volume.
    v1.create_namespaced_pod(ns, pod("sub", ["sh", "-c", "touch /mine/f && ls /all"], sub="logs-$(POD)"))
    for name, want in [("args", "hello $(MSG) $(UNSET) $hello\n"), ("shell", "ok\n"), ("sub", "logs-sub\n")]:
        assert wait_terminated(v1, name, ns).status.phase == "Succeeded", name
        # (raw: client 36 returns str() of the bytes for a "str" response)
        assert v1.read_namespaced_pod_log(name, ns, _preload_content=False).data.decode() == want, name
    # An absolute or escaping subPathExpr fails the container without starting it.
    for name, sub in [("abs", "$(ABS)"), ("up", "$(UP)")]:
        v1.create_namespaced_pod(ns, pod(name, ["true"], sub=sub))
    for name in ("abs", "up"):
        deadline = time.time() + 60
        reason = None
        while time.time() < deadline:
            st = v1.read_namespaced_pod(name, ns).status
            waiting = st.container_statuses and st.container_statuses[0].state.waiting
            reason = waiting and waiting.reason
            if reason == "CreateContainerConfigError":
                break
            time.sleep(0.5)
        assert reason == "CreateContainerConfigError", (name, st)
        assert st.phase == "Pending"


def test_metrics_utilities_see_a_pod_running_for_ten_seconds(api, ns):
    v1 = client.CoreV1Api(api)
    pod = busybox_pod("myapp-pod", ["sh", "-c", "while true; do :; done"])
    pod.metadata.labels = {"app": "myapp"}
    v1.create_namespaced_pod(ns, pod)
    wait_running(v1, "myapp-pod", ns)
    # As the client's own e2e test: ten seconds after Running, the pod has metrics.
    time.sleep(10)
    nodes = utils.get_nodes_metrics(api)
    assert nodes["items"] and "usage" in nodes["items"][0]
    names = [i["metadata"]["name"] for i in utils.get_pods_metrics(api, ns)["items"]]
    assert "myapp-pod" in names
    labelled = utils.get_pods_metrics(api, ns, "app=myapp")
    assert [i["metadata"]["name"] for i in labelled["items"]] == ["myapp-pod"]
    both = utils.get_pods_metrics_in_all_namespaces(api, [ns, "default"])
    assert ns in both and "error" not in both[ns]


def test_post_start_hooks_run_and_a_failing_one_kills_the_container(api, ns):
    v1 = client.CoreV1Api(api)

    def pod(name, hook):
        p = busybox_pod(name, ["sh", "-c", "sleep 3600"])
        p.spec.containers[0].lifecycle = client.V1Lifecycle(
            post_start=client.V1LifecycleHandler(_exec=client.V1ExecAction(command=["sh", "-c", hook])))
        return p

    v1.create_namespaced_pod(ns, pod("hooked", "echo started > /tmp/poststart"))
    v1.create_namespaced_pod(ns, pod("broken", "exit 3"))
    wait_running(v1, "hooked", ns)
    out = stream(v1.connect_get_namespaced_pod_exec, "hooked", ns, command=["cat", "/tmp/poststart"],
                 stderr=True, stdin=False, stdout=True, tty=False)
    assert out == "started\n"
    deadline = time.time() + 60
    reasons = set()
    while time.time() < deadline and "FailedPostStartHook" not in reasons:
        reasons = {e.reason for e in v1.list_namespaced_event(
            ns, field_selector="involvedObject.name=broken").items}
        time.sleep(0.5)
    assert "FailedPostStartHook" in reasons, reasons
    st = v1.read_namespaced_pod("broken", ns).status
    assert not st.container_statuses[0].ready


def test_logs_over_websocket_in_binary_and_base64(api, ns):
    import base64
    import websocket
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(ns, busybox_pod("talker", ["sh", "-c", "echo one; echo two; sleep 3600"]))
    wait_running(v1, "talker", ns)
    deadline = time.time() + 30
    while "two" not in v1.read_namespaced_pod_log("talker", ns, _preload_content=False).data.decode():
        assert time.time() < deadline
        time.sleep(0.5)
    cfg = api.configuration
    url = cfg.host.replace("https://", "wss://") + f"/api/v1/namespaces/{ns}/pods/talker/log"
    sslopt = {"ca_certs": cfg.ssl_ca_cert}
    if cfg.cert_file:
        sslopt.update(certfile=cfg.cert_file, keyfile=cfg.key_file)
    header = []
    token = cfg.api_key.get("authorization")
    if token:
        header.append(f"Authorization: {token}")
    for proto, decode in [("binary.k8s.io", lambda d: d), ("base64.binary.k8s.io", base64.b64decode)]:
        ws = websocket.create_connection(url, sslopt=sslopt, subprotocols=[proto], header=header)
        assert ws.subprotocol == proto
        data = b""
        while True:
            op, frame = ws.recv_data(control_frame=True)
            if op == websocket.ABNF.OPCODE_CLOSE:
                break
            data += decode(frame)
        ws.close()
        assert data == b"one\ntwo\n", (proto, data)


def test_config_map_secret_and_downward_volumes_follow_updates(api, ns):
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_config_map(ns, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="settings"), data={"mode": "one"}))
    p = busybox_pod("reader", ["sleep", "3600"])
    p.metadata.labels = {"stage": "first"}
    p.spec.containers[0].volume_mounts = [
        client.V1VolumeMount(name="cm", mount_path="/etc/cm"),
        client.V1VolumeMount(name="info", mount_path="/etc/info"),
        client.V1VolumeMount(name="later", mount_path="/etc/later"),
    ]
    p.spec.volumes = [
        client.V1Volume(name="cm", config_map=client.V1ConfigMapVolumeSource(name="settings")),
        client.V1Volume(name="info", downward_api=client.V1DownwardAPIVolumeSource(items=[
            client.V1DownwardAPIVolumeFile(path="labels", field_ref=client.V1ObjectFieldSelector(
                field_path="metadata.labels"))])),
        client.V1Volume(name="later", projected=client.V1ProjectedVolumeSource(sources=[
            client.V1VolumeProjection(secret=client.V1SecretProjection(name="later", optional=True))])),
    ]
    v1.create_namespaced_pod(ns, p)
    wait_running(v1, "reader", ns)

    def cat(path):
        return stream(v1.connect_get_namespaced_pod_exec, "reader", ns, command=["cat", path],
                      stderr=True, stdin=False, stdout=True, tty=False)

    assert cat("/etc/cm/mode") == "one"
    assert cat("/etc/info/labels") == 'stage="first"'
    v1.patch_namespaced_config_map("settings", ns, {"data": {"mode": "two"}})
    v1.patch_namespaced_pod("reader", ns, {"metadata": {"labels": {"stage": "second"}}})
    v1.create_namespaced_secret(ns, client.V1Secret(
        metadata=client.V1ObjectMeta(name="later"), string_data={"token": "s3cret"}))
    deadline = time.time() + 60
    while time.time() < deadline:
        if (cat("/etc/cm/mode") == "two" and cat("/etc/info/labels") == 'stage="second"'
                and cat("/etc/later/token") == "s3cret"):
            break
        time.sleep(1)
    assert cat("/etc/cm/mode") == "two"
    assert cat("/etc/info/labels") == 'stage="second"'
    assert cat("/etc/later/token") == "s3cret"


def test_empty_dirs_are_world_writable_for_non_root_containers(api, ns):
    v1 = client.CoreV1Api(api)
    p = busybox_pod("nonroot", ["sh", "-c", "stat -c %A /data && echo hi > /data/f && cat /data/f"])
    p.spec.restart_policy = "Never"
    p.spec.security_context = client.V1PodSecurityContext(run_as_user=1001)
    p.spec.containers[0].volume_mounts = [client.V1VolumeMount(name="data", mount_path="/data")]
    p.spec.volumes = [client.V1Volume(name="data", empty_dir=client.V1EmptyDirVolumeSource())]
    v1.create_namespaced_pod(ns, p)
    assert wait_terminated(v1, "nonroot", ns).status.phase == "Succeeded"
    out = v1.read_namespaced_pod_log("nonroot", ns, _preload_content=False).data.decode()
    assert out == "drwxrwxrwx\nhi\n", out


def test_containers_get_service_link_variables(api, ns):
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_service(ns, client.V1Service(
        metadata=client.V1ObjectMeta(name="fooservice"),
        spec=client.V1ServiceSpec(selector={"name": "x"}, ports=[client.V1ServicePort(port=8765)])))
    ip = v1.read_namespaced_service("fooservice", ns).spec.cluster_ip
    p = busybox_pod("envs", ["sh", "-c", "env | sort"])
    p.spec.restart_policy = "Never"
    v1.create_namespaced_pod(ns, p)
    assert wait_terminated(v1, "envs", ns).status.phase == "Succeeded"
    out = v1.read_namespaced_pod_log("envs", ns, _preload_content=False).data.decode().splitlines()
    for want in [f"FOOSERVICE_SERVICE_HOST={ip}", "FOOSERVICE_SERVICE_PORT=8765",
                 f"FOOSERVICE_PORT=tcp://{ip}:8765", "FOOSERVICE_PORT_8765_TCP_PROTO=tcp",
                 f"FOOSERVICE_PORT_8765_TCP_ADDR={ip}", "KUBERNETES_SERVICE_PORT=443"]:
        assert want in out, (want, out)


def test_termination_messages_come_from_the_file_or_the_log_as_upstream(api, ns):
    v1 = client.CoreV1Api(api)
    # From the file at the default path.
    ok = busybox_pod("msg-file", ["sh", "-c", "echo -n OK > /dev/termination-log"])
    ok.spec.restart_policy = "Never"
    # From the log, when the container fails and wrote no file.
    logs = busybox_pod("msg-logs", ["sh", "-c", "echo DONE; exit 1"])
    logs.spec.restart_policy = "Never"
    logs.spec.containers[0].termination_message_policy = "FallbackToLogsOnError"
    # A non-root user writing at a path of its choosing.
    custom = busybox_pod("msg-custom", ["sh", "-c", "echo -n DEFAULT > /dev/termination-custom-log"])
    custom.spec.restart_policy = "Never"
    custom.spec.containers[0].termination_message_path = "/dev/termination-custom-log"
    custom.spec.security_context = client.V1PodSecurityContext(run_as_user=1000)
    for p in (ok, logs, custom):
        v1.create_namespaced_pod(ns, p)
    want = {"msg-file": ("Succeeded", "OK"), "msg-logs": ("Failed", "DONE\n"),
            "msg-custom": ("Succeeded", "DEFAULT")}
    for name, (phase, message) in want.items():
        pod = wait_terminated(v1, name, ns)
        assert pod.status.phase == phase, (name, pod.status)
        term = pod.status.container_statuses[0].state.terminated
        assert term.message == message, (name, term)


def test_a_failed_init_container_fails_the_pod_and_keeps_app_containers_initializing(api, ns):
    v1 = client.CoreV1Api(api)
    p = busybox_pod("init-fails", ["sh", "-c", "echo never"])
    p.spec.restart_policy = "Never"
    p.spec.init_containers = [
        client.V1Container(name="init1", image="busybox", command=["false"]),
        client.V1Container(name="init2", image="busybox", command=["true"]),
    ]
    v1.create_namespaced_pod(ns, p)
    pod = wait_terminated(v1, "init-fails", ns)
    assert pod.status.phase == "Failed", pod.status
    app = pod.status.container_statuses[0]
    assert app.state.waiting is not None and app.state.waiting.reason == "PodInitializing", app
    init = {c.type: c for c in pod.status.conditions}["Initialized"]
    assert (init.status, init.reason) == ("False", "ContainersNotInitialized"), init
    assert init.message == "containers with incomplete status: [init1 init2]", init
    ready = {c.type: c for c in pod.status.conditions}["Ready"]
    assert ready.status == "False", ready


def test_an_updated_active_deadline_fails_the_pod_with_deadline_exceeded(api, ns):
    v1 = client.CoreV1Api(api)
    p = busybox_pod("deadline", ["sleep", "3600"])
    p.spec.active_deadline_seconds = 600
    p.spec.termination_grace_period_seconds = 1
    v1.create_namespaced_pod(ns, p)
    wait_running(v1, "deadline", ns)
    v1.patch_namespaced_pod("deadline", ns, {"spec": {"activeDeadlineSeconds": 5}})
    pod = wait_terminated(v1, "deadline", ns)
    assert pod.status.phase == "Failed", pod.status
    assert pod.status.reason == "DeadlineExceeded", pod.status
    assert pod.status.message == "Pod was active on the node longer than the specified deadline"
