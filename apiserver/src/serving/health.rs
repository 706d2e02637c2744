//! `/healthz`, `/livez` and `/readyz` as upstream serves them: named checks, each also at
//! `/<endpoint>/<check>`; `?verbose` lists every check as `[+]name ok`; `?exclude=name`
//! skips one; a failing check makes the answer a 500 that names it.

use crate::Api;
use crate::error::{ApiError, ApiResult};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use minik8s_storage::Store;

/// The checks of an endpoint, in upstream's order.
fn checks(endpoint: &str) -> &'static [&'static str] {
    match endpoint {
        "readyz" => &[
            "ping",
            "log",
            "etcd",
            "etcd-readiness",
            "informer-sync",
            "shutdown",
        ],
        _ => &["ping", "log", "etcd"],
    }
}

/// Runs one check; `Err` with the reason it failed.
async fn run(api: &Api, check: &str) -> Result<(), String> {
    match check {
        "etcd" | "etcd-readiness" => api
            .store
            .current_revision()
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "shutdown" if api.shutdown.is_cancelled() => Err("process is shutting down".to_owned()),
        _ => Ok(()),
    }
}

fn text(code: StatusCode, body: String) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

/// Answers `/<endpoint>[/<check>]` with the request's query.
pub async fn serve(
    api: &Api,
    endpoint: &str,
    check: Option<&str>,
    query: Option<&str>,
) -> ApiResult<Response> {
    let all = checks(endpoint);
    if let Some(one) = check {
        if !all.contains(&one) {
            return Err(ApiError::no_route(&format!("/{endpoint}/{one}")));
        }
        return Ok(match run(api, one).await {
            Ok(()) => text(StatusCode::OK, "ok".into()),
            Err(why) => {
                tracing::warn!(check = one, reason = %why, "{endpoint} check failed");
                text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal server error: reason withheld\n".into(),
                )
            }
        });
    }
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(query.unwrap_or_default()).unwrap_or_default();
    let verbose = pairs.iter().any(|(k, _)| k == "verbose");
    let excluded: Vec<&str> = pairs
        .iter()
        .filter(|(k, _)| k == "exclude")
        .map(|(_, v)| v.as_str())
        .collect();
    let mut lines = Vec::new();
    let mut failed = false;
    for c in all {
        if excluded.contains(c) {
            lines.push(format!("[+]{c} excluded: ok"));
            continue;
        }
        match run(api, c).await {
            Ok(()) => lines.push(format!("[+]{c} ok")),
            Err(why) => {
                tracing::warn!(check = c, reason = %why, "{endpoint} check failed");
                failed = true;
                lines.push(format!("[-]{c} failed: reason withheld"));
            }
        }
    }
    if failed {
        lines.push(format!("{endpoint} check failed"));
        return Ok(text(
            StatusCode::INTERNAL_SERVER_ERROR,
            lines.join("\n") + "\n",
        ));
    }
    if !verbose {
        return Ok(text(StatusCode::OK, "ok".into()));
    }
    lines.push(format!("{endpoint} check passed"));
    Ok(text(StatusCode::OK, lines.join("\n") + "\n"))
}
