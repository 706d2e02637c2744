//! The edgelet's in-process API: the kubelet's pod worker takes a `kube::Client`, and at the
//! edge that client is served from the local [`Store`] instead of an apiserver, as the
//! kubelet behind OpenYurt's YurtHub reads its cache. It answers exactly what the worker asks:
//!
//! - ConfigMaps and Secrets the cloud shipped for the edge's pods (`GET`);
//! - Services (`GET` list): those the cloud shipped for the namespace, for the service
//!   environment variables;
//! - service-account tokens (`POST …/token`): the token the cloud requested for the pod;
//! - the pod's status (`PATCH …/status`) and the end of its deletion (`DELETE`), which go to
//!   the store and from there to the cloud;
//! - events (`POST`, `PATCH`), kept for the cloud.
//!
//! Anything else is a 404 `Status` saying it is not served at the edge.

use crate::store::{Store, merge};
use bytes::Bytes;
use http_body_util::Full;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;

type Response = http::Response<Full<Bytes>>;

fn answer(code: u16, body: &Value) -> Response {
    http::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(body).unwrap_or_default(),
        )))
        .expect("a response")
}

fn status(code: u16, reason: &str, message: String) -> Response {
    answer(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code}),
    )
}

fn not_found(what: String) -> Response {
    status(404, "NotFound", format!("{what} not found"))
}

/// A `kube::Client` served by the store.
pub fn client(store: Arc<Store>) -> kube::Client {
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let store = store.clone();
        async move { Ok::<_, Infallible>(handle(&store, req).await) }
    });
    kube::Client::new(service, "default")
}

async fn handle(store: &Store, req: http::Request<kube::client::Body>) -> Response {
    let (parts, body) = req.into_parts();
    let body = match body.collect_bytes().await {
        Ok(b) => b,
        Err(e) => return status(400, "BadRequest", format!("reading the body: {e}")),
    };
    let path = parts.uri.path().to_owned();
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let method = parts.method.as_str();
    let parsed = || serde_json::from_slice::<Value>(&body);
    match (method, segs.as_slice()) {
        (
            "GET",
            [
                "api",
                "v1",
                "namespaces",
                ns,
                kind @ ("configmaps" | "secrets"),
                name,
            ],
        ) => match store.volume(kind, ns, name) {
            Some(obj) => answer(200, &obj),
            None => {
                let k = if *kind == "configmaps" {
                    "configmaps"
                } else {
                    "secrets"
                };
                not_found(format!("{k} \"{name}\""))
            }
        },
        ("GET", ["api", "v1", "namespaces", ns, "services"]) => answer(
            200,
            &json!({"kind": "ServiceList", "apiVersion": "v1", "metadata": {},
                    "items": store.objects("services", Some(ns))}),
        ),
        (
            "POST",
            [
                "api",
                "v1",
                "namespaces",
                ns,
                "serviceaccounts",
                sa,
                "token",
            ],
        ) => {
            let Ok(req) = parsed() else {
                return status(400, "BadRequest", "the token request is not JSON".into());
            };
            let pod = req["spec"]["boundObjectRef"]["name"]
                .as_str()
                .unwrap_or_default();
            match store.volume("tokens", ns, pod) {
                Some(t) if t["serviceAccount"] == *sa => answer(
                    201,
                    &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                            "metadata": {"name": sa, "namespace": ns},
                            "spec": req["spec"],
                            "status": {"token": t["token"], "expirationTimestamp": t["expirationTimestamp"]}}),
                ),
                _ => status(
                    403,
                    "Forbidden",
                    format!(
                        "no token for service account {ns}/{sa} and pod {pod} was shipped to this edge"
                    ),
                ),
            }
        }
        ("PATCH", ["api", "v1", "namespaces", ns, "pods", name, "status"]) => {
            let Ok(patch) = parsed() else {
                return status(400, "BadRequest", "the status patch is not JSON".into());
            };
            let uid = patch["metadata"]["uid"].as_str();
            match store.patch_status(ns, name, uid, &patch["status"]) {
                Ok(Some(pod)) => answer(200, &serde_json::to_value(pod).unwrap_or_default()),
                Ok(None) => not_found(format!("pods \"{name}\"")),
                Err(e) => status(500, "InternalError", e.to_string()),
            }
        }
        ("GET", ["api", "v1", "namespaces", ns, "pods", name]) => match store.pod(ns, name) {
            Some(pod) => answer(200, &serde_json::to_value(pod).unwrap_or_default()),
            None => not_found(format!("pods \"{name}\"")),
        },
        ("DELETE", ["api", "v1", "namespaces", ns, "pods", name]) => {
            // The kubelet deletes this very pod (a uid precondition).
            let body: Value = serde_json::from_slice(&body).unwrap_or_default();
            let uid = body["preconditions"]["uid"].as_str();
            match store.finish(ns, name, uid) {
                Ok(Some(pod)) => {
                    tracing::info!(pod = %format!("{ns}/{name}"), "pod deleted at the edge");
                    answer(200, &serde_json::to_value(pod).unwrap_or_default())
                }
                Ok(None) => not_found(format!("pods \"{name}\"")),
                Err(e) => status(500, "InternalError", e.to_string()),
            }
        }
        ("POST", ["api", "v1", "namespaces", _, "events"]) => match parsed() {
            Ok(event) => {
                store.push_event(event.clone());
                answer(201, &event)
            }
            Err(_) => status(400, "BadRequest", "the event is not JSON".into()),
        },
        ("PATCH", ["api", "v1", "namespaces", ns, "events", name]) => {
            let (Some(mut event), Ok(patch)) = (store.event(ns, name), parsed()) else {
                return not_found(format!("events \"{name}\""));
            };
            merge(&mut event, &patch);
            store.push_event(event.clone());
            answer(200, &event)
        }
        _ => not_found(format!("{method} {path} (not served at the edge)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
    use kube::Api;

    #[tokio::test]
    async fn the_worker_reads_and_writes_through_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let pod: Pod = serde_json::from_value(
            json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": [{"name": "c"}]}}),
        )
        .unwrap();
        store.put_pod(pod, 1, true).unwrap();
        store
            .put_volume(
                "configmaps",
                "ns",
                "cm",
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "cm", "namespace": "ns"}, "data": {"k": "v"}}),
                1,
            )
            .unwrap();
        let client = client(store.clone());
        let cm = Api::<ConfigMap>::namespaced(client.clone(), "ns")
            .get("cm")
            .await
            .unwrap();
        assert_eq!(cm.data.unwrap()["k"], "v");
        let missing = Api::<ConfigMap>::namespaced(client.clone(), "ns")
            .get("nope")
            .await;
        assert!(matches!(missing, Err(kube::Error::Api(s)) if s.code == 404));
        let svcs = Api::<Service>::namespaced(client.clone(), "ns")
            .list(&Default::default())
            .await
            .unwrap();
        assert!(svcs.items.is_empty());
        let pods: Api<Pod> = Api::namespaced(client.clone(), "ns");
        pods.patch_status(
            "p",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
        assert_eq!(
            store
                .pod("ns", "p")
                .unwrap()
                .status
                .unwrap()
                .phase
                .as_deref(),
            Some("Running")
        );
        minik8s_kubelet::pod::finish_deletion(&client, &store.pod("ns", "p").unwrap())
            .await
            .unwrap();
        assert!(store.pods().is_empty());
    }
}
