//! The aggregation layer with the stock kubectl: an extension apiserver (a small TLS server
//! written for this test, serving `wardle.example.com/v1alpha1` flunders) behind a Service,
//! registered with an APIService. The apiserver checks it and marks it Available, merges its
//! group into discovery, authorizes requests itself and sends them on with the front-proxy
//! client certificate and `X-Remote-User`/`X-Remote-Group`, which the extension server
//! verifies against the CA published in `kube-system/extension-apiserver-authentication`.

use axum::extract::{Extension, Path};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use minik8s_apiserver::auth::PeerIdentity;
use minik8s_conformance::Cluster;
use minik8s_kubeconfig::{Pki, PkiOptions};
use serde_json::{Value, json};
use std::time::Duration;

/// Only the front proxy may call: its client certificate, verified by the TLS layer, must be
/// `front-proxy-client`.
fn front_proxy(peer: &PeerIdentity) -> Result<(), (StatusCode, String)> {
    match &peer.0 {
        Some(u) if u.name == "front-proxy-client" => Ok(()),
        other => Err((
            StatusCode::UNAUTHORIZED,
            format!("not the front proxy: {other:?}"),
        )),
    }
}

fn resources() -> Value {
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "wardle.example.com/v1alpha1",
        "resources": [{"name": "flunders", "singularName": "flunder", "namespaced": true, "kind": "Flunder",
            "verbs": ["get", "list"], "shortNames": ["fl"]}]})
}

/// A list of one flunder whose annotations say who the front proxy said was asking.
fn flunders(ns: &str, headers: &HeaderMap) -> Value {
    let all = |h: &str| {
        headers
            .get_all(h)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>()
            .join(",")
    };
    json!({"kind": "FlunderList", "apiVersion": "wardle.example.com/v1alpha1", "metadata": {"resourceVersion": "1"},
        "items": [{"kind": "Flunder", "apiVersion": "wardle.example.com/v1alpha1",
            "metadata": {"name": "seen", "namespace": ns, "creationTimestamp": "2026-01-01T00:00:00Z",
                "annotations": {"user": all("x-remote-user"), "groups": all("x-remote-group"),
                    "authorization": all("authorization")}}}]})
}

fn apiservice(ca: &str) -> String {
    json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1alpha1.wardle.example.com"},
        "spec": {"group": "wardle.example.com", "version": "v1alpha1", "caBundle": ca,
            "groupPriorityMinimum": 2000, "versionPriority": 200,
            "service": {"namespace": "wardle", "name": "api", "port": 443}}})
    .to_string()
}

#[test]
fn an_apiservice_sends_its_group_to_an_extension_apiserver_behind_a_service() {
    let c = Cluster::start();
    // Local APIServices for the built-in groups, metrics.k8s.io among them.
    let list = c.eventually(&["get", "apiservices"], |s| {
        s.contains("v1.apps") && s.contains("Local")
    });
    assert!(list.starts_with("NAME"), "{list}");
    for line in ["v1.apps", "v1beta1.metrics.k8s.io", "v1.", "v2.autoscaling"] {
        let row = list
            .lines()
            .find(|l| l.split_whitespace().next() == Some(line))
            .unwrap_or_else(|| panic!("no {line} in\n{list}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(&cells[1..3], ["Local", "True"], "{row}");
    }

    // A CRD's group gets a local APIService while a CRD serves it.
    let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gizmos.toys.example.com"},
        "spec": {"group": "toys.example.com", "scope": "Namespaced",
            "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}});
    let r = c.with_manifest(&["apply"], &crd.to_string());
    assert!(r.ok, "{}", r.stderr);
    c.eventually(&["get", "apiservice", "v1.toys.example.com"], |s| {
        s.contains("Local") && s.contains("True")
    });
    c.ok(&["delete", "crd", "gizmos.toys.example.com"]);
    c.eventually(&["get", "apiservices", "-o", "name"], |s| {
        !s.contains("toys.example.com")
    });

    // What extension apiservers read to trust the front proxy.
    let auth = c.ok(&[
        "get",
        "configmap",
        "-n",
        "kube-system",
        "extension-apiserver-authentication",
        "-o",
        "json",
    ]);
    let auth: Value = serde_json::from_str(&auth).unwrap();
    assert_eq!(
        auth["data"]["requestheader-allowed-names"],
        "[\"front-proxy-client\"]"
    );
    assert_eq!(
        auth["data"]["requestheader-username-headers"],
        "[\"X-Remote-User\"]"
    );
    assert!(
        auth["data"]["client-ca-file"]
            .as_str()
            .unwrap()
            .contains("BEGIN CERTIFICATE")
    );
    let front_ca = c.dir().join("front-proxy-ca.pem");
    std::fs::write(
        &front_ca,
        auth["data"]["requestheader-client-ca-file"]
            .as_str()
            .expect("requestheader CA"),
    )
    .unwrap();

    // The extension apiserver: its own CA and a serving certificate for api.wardle.svc.
    let ext = Pki::init(PkiOptions {
        dir: c.dir().join("wardle-pki"),
        cluster_name: "wardle".into(),
        server: "https://127.0.0.1:0".into(),
        hostnames: vec!["api.wardle.svc".into()],
        ips: vec![],
    })
    .unwrap();
    let serving = ext.issue_serving_cert().unwrap();
    let ca_bundle = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(ext.ca_pem())
    };
    let tls =
        minik8s_apiserver::serving::server::tls_config(&serving.cert, &serving.key, &front_ca)
            .unwrap();
    let app = axum::Router::new()
        .route(
            "/apis/wardle.example.com/v1alpha1",
            get(|Extension(peer): Extension<PeerIdentity>| async move {
                front_proxy(&peer)?;
                Ok::<_, (StatusCode, String)>(axum::Json(resources()))
            }),
        )
        .route(
            "/apis/wardle.example.com/v1alpha1/namespaces/{ns}/flunders",
            get(
                |Extension(peer): Extension<PeerIdentity>,
                 Path(ns): Path<String>,
                 headers: HeaderMap| async move {
                    front_proxy(&peer)?;
                    Ok::<_, (StatusCode, String)>(axum::Json(flunders(&ns, &headers)))
                },
            ),
        );
    let listener = c
        .block_on(async { tokio::net::TcpListener::bind("127.0.0.1:0").await })
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    c.spawn(minik8s_apiserver::serving::server::serve(
        listener,
        tls,
        app,
        c.shutdown_token(),
        tokio_util::task::TaskTracker::new(),
    ));

    // Its Service (no selector) and the EndpointSlice naming where it listens.
    c.ok(&["create", "namespace", "wardle"]);
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "api", "namespace": "wardle"},
        "spec": {"ports": [{"port": 443, "targetPort": port}]}});
    let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "api-1", "namespace": "wardle", "labels": {"kubernetes.io/service-name": "api"}},
        "addressType": "IPv4", "ports": [{"name": "", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}]});
    for obj in [&svc, &slice] {
        let r = c.with_manifest(&["apply"], &obj.to_string());
        assert!(r.ok, "{}", r.stderr);
    }

    // Registered, applied twice as users do; the check marks it Available.
    for _ in 0..2 {
        let r = c.with_manifest(&["apply"], &apiservice(&ca_bundle));
        assert!(r.ok, "{}", r.stderr);
    }
    let row = c.eventually_within(
        Duration::from_secs(30),
        &["get", "apiservice", "v1alpha1.wardle.example.com"],
        |s| s.contains("wardle/api") && s.contains(" True "),
    );
    assert!(row.contains("wardle/api"), "{row}");
    let reason = c.ok(&[
        "get",
        "apiservice",
        "v1alpha1.wardle.example.com",
        "-o",
        "jsonpath={.status.conditions[0].reason}",
    ]);
    assert_eq!(reason, "Passed");

    // Discovery includes the group: the resource, its short name, and /apis.
    let res = c.eventually(&["api-resources", "--api-group=wardle.example.com"], |s| {
        s.contains("flunders")
    });
    assert!(res.contains("fl ") && res.contains("Flunder"), "{res}");
    let group = c.ok(&["get", "--raw", "/apis/wardle.example.com"]);
    let group: Value = serde_json::from_str(&group).unwrap();
    assert_eq!(
        group["preferredVersion"]["groupVersion"],
        "wardle.example.com/v1alpha1"
    );

    // Requests reach it with the admin named by the front-proxy headers, and no credentials.
    let seen = c.ok(&[
        "get",
        "flunders",
        "-n",
        "default",
        "-o",
        "jsonpath={.items[0].metadata.annotations}",
    ]);
    let seen: Value = serde_json::from_str(&seen).unwrap();
    assert_eq!(seen["user"], "minik8s-admin", "{seen}");
    let groups = seen["groups"].as_str().unwrap();
    assert!(
        groups.contains("system:masters") && groups.contains("system:authenticated"),
        "{seen}"
    );
    assert_eq!(seen["authorization"], "", "credentials are not passed on");
    let short = c.ok(&["get", "fl", "-n", "default", "-o", "name"]);
    assert_eq!(short.trim(), "flunder.wardle.example.com/seen");

    // This apiserver authorizes first: a user without a role is refused here.
    let nobody = c.user_kubeconfig("nobody", &[]);
    let r = c.kubectl_as(&nobody, &["get", "flunders", "-n", "default"]);
    assert!(!r.ok);
    assert!(
        r.stderr.contains(
            "flunders.wardle.example.com is forbidden: User \"nobody\" cannot list resource \"flunders\" in API group \"wardle.example.com\" in the namespace \"default\""
        ),
        "{}",
        r.stderr
    );

    // Without endpoints it is unavailable, says why, and requests get 503.
    c.ok(&["delete", "endpointslice", "-n", "wardle", "api-1"]);
    c.eventually_within(
        Duration::from_secs(30),
        &["get", "apiservice", "v1alpha1.wardle.example.com"],
        |s| s.contains("False (MissingEndpoints)"),
    );
    let r = c.kubectl(&[
        "get",
        "--raw",
        "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders",
    ]);
    assert!(!r.ok);
    assert!(
        r.stderr.contains("ServiceUnavailable") || r.stderr.contains("503"),
        "{}",
        r.stderr
    );
    let described = c.ok(&["describe", "apiservice", "v1alpha1.wardle.example.com"]);
    assert!(
        described.contains("MissingEndpoints")
            && described.contains("endpoints for service/api in \"wardle\" have no addresses"),
        "{described}"
    );

    // Deleting the APIService removes the group.
    c.ok(&["delete", "apiservice", "v1alpha1.wardle.example.com"]);
    c.eventually(&["get", "--raw", "/apis"], |s| {
        !s.contains("wardle.example.com")
    });
}
