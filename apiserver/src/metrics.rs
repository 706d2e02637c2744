//! `metrics.k8s.io/v1beta1` (NodeMetrics, PodMetrics), as metrics-server serves it: each
//! request asks the kubelets of the Ready nodes for their `/stats/summary` and answers with
//! their CPU (nano-cores) and memory (working set). `kubectl top` and the HPA read it.

use crate::error::{ApiError, ApiResult};
use crate::handlers::{Ctx, json_response};
use crate::object;
use axum::http::StatusCode;
use axum::response::Response;
use minik8s_storage::Store;
use serde_json::{Value, json};
use std::time::Duration;

/// The metrics window reported (the kubelet's CPU rate spans the time between scrapes).
const WINDOW: &str = "10s";

fn usage(cpu: &Value, memory: &Value) -> Value {
    let cores = cpu
        .get("usageNanoCores")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let bytes = memory
        .get("workingSetBytes")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    json!({"cpu": format!("{cores}n"), "memory": format!("{}Ki", bytes / 1024)})
}

/// Every Ready node's summary: (node name, summary).
async fn summaries(ctx: &Ctx) -> ApiResult<Vec<(String, Value)>> {
    let Some(client) = ctx.api.kubelet.as_ref() else {
        return Err(ApiError::unavailable(
            "this apiserver has no kubelet client certificate",
        ));
    };
    let nodes = ctx
        .api
        .store
        .range(minik8s_storage::RangeRequest::prefix(
            "/registry/core/nodes/",
        ))
        .await?;
    let mut calls = Vec::new();
    for kv in &nodes.kvs {
        let node = object::from_store(kv)?;
        let ready = node
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
        let Ok((host, port)) = crate::kubelet::endpoint(&node) else {
            continue;
        };
        if !ready {
            continue;
        }
        let name = object::meta_str(&node, "name")
            .unwrap_or_default()
            .to_owned();
        calls.push(async move {
            let got = tokio::time::timeout(
                Duration::from_secs(5),
                client.json(&host, port, "/stats/summary", &ctx.api.tasks),
            )
            .await;
            match got {
                Ok(Ok(v)) => Some((name, v)),
                Ok(Err(e)) => {
                    tracing::warn!(node = %name, error = %e, "reading kubelet stats");
                    None
                }
                Err(_) => None,
            }
        });
    }
    Ok(futures::future::join_all(calls)
        .await
        .into_iter()
        .flatten()
        .collect())
}

fn node_metrics(name: &str, summary: &Value) -> Value {
    let node = &summary["node"];
    json!({
        "kind": "NodeMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
        "metadata": {"name": name, "creationTimestamp": object::now()},
        "timestamp": node["cpu"]["time"], "window": WINDOW,
        "usage": usage(&node["cpu"], &node["memory"]),
    })
}

fn pod_metrics(summary: &Value) -> Vec<Value> {
    summary["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let containers: Vec<Value> = p["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| json!({"name": c["name"], "usage": usage(&c["cpu"], &c["memory"])}))
                .collect();
            json!({
                "kind": "PodMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
                "metadata": {"name": p["podRef"]["name"], "namespace": p["podRef"]["namespace"],
                             "creationTimestamp": object::now()},
                "timestamp": p["startTime"], "window": WINDOW, "containers": containers,
            })
        })
        .collect()
}

/// All metrics of the request's kind (in its namespace, for pods).
async fn items(ctx: &Ctx) -> ApiResult<Vec<Value>> {
    let all = summaries(ctx).await?;
    let mut out: Vec<Value> = if ctx.res.plural == "nodes" {
        all.iter().map(|(n, s)| node_metrics(n, s)).collect()
    } else {
        all.iter().flat_map(|(_, s)| pod_metrics(s)).collect()
    };
    if let Some(ns) = ctx.namespace() {
        out.retain(|m| m["metadata"]["namespace"] == ns);
    }
    // A label selector applies to the pods' (or nodes') own labels, read from the store.
    if let Some(sel) = &ctx.params.label_selector {
        let sel = minik8s_types::selector::LabelSelector::parse(sel)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let prefix = match (ctx.res.plural.as_str(), ctx.namespace()) {
            ("nodes", _) => "/registry/core/nodes/".to_owned(),
            (_, Some(ns)) => format!("/registry/core/pods/{ns}/"),
            (_, None) => "/registry/core/pods/".to_owned(),
        };
        let stored = ctx
            .api
            .store
            .range(minik8s_storage::RangeRequest::prefix(prefix))
            .await?;
        let mut chosen = std::collections::HashSet::new();
        for kv in &stored.kvs {
            let obj = object::from_store(kv)?;
            if sel.matches_json(obj.pointer("/metadata/labels")) {
                chosen.insert((
                    object::meta_str(&obj, "namespace")
                        .unwrap_or_default()
                        .to_owned(),
                    object::meta_str(&obj, "name")
                        .unwrap_or_default()
                        .to_owned(),
                ));
            }
        }
        out.retain(|m| {
            let ns = m["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let name = m["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            chosen.contains(&(ns, name))
        });
    }
    out.sort_by_key(|m| {
        (
            m["metadata"]["namespace"].to_string(),
            m["metadata"]["name"].to_string(),
        )
    });
    Ok(out)
}

/// `GET …/nodes/{name}` or `…/namespaces/{ns}/pods/{name}`.
pub async fn get(ctx: Ctx) -> ApiResult<Response> {
    let name = ctx.name().to_owned();
    items(&ctx)
        .await?
        .into_iter()
        .find(|m| m["metadata"]["name"] == name.as_str())
        .map(|m| json_response(StatusCode::OK, &m, &[]))
        .ok_or_else(|| ApiError::not_found("metrics.k8s.io", &ctx.res.plural, &name))
}

/// `GET …/nodes` or `…/pods` (optionally in a namespace).
pub async fn list(ctx: Ctx) -> ApiResult<Response> {
    let items = items(&ctx).await?;
    let list = json!({
        "kind": ctx.res.list_kind, "apiVersion": "metrics.k8s.io/v1beta1",
        "metadata": {}, "items": items,
    });
    Ok(json_response(StatusCode::OK, &list, &[]))
}
