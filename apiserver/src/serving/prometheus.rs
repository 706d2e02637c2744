//! The apiserver's Prometheus series, named and labelled as upstream's: requests by verb,
//! resource and code (`apiserver_request_total`), their latency
//! (`apiserver_request_duration_seconds`, without long-running requests), requests in
//! flight by kind (`apiserver_current_inflight_requests`), long-running requests and
//! registered watchers, storage operation latency (`etcd_request_duration_seconds`, recorded
//! by the storage layer for both backends) and stored objects per resource
//! (`apiserver_storage_objects`, counted at most every 30 s when scraped). `GET /metrics`
//! needs `get` on the non-resource URL `/metrics` (RBAC's `system:monitoring` role).

use crate::Api;
use crate::error::ApiResult;
use crate::serving::request::{RequestInfo, Verb};
use minik8s_metrics::{CounterVec, GaugeVec, HistogramVec, Labels, labels};
use minik8s_storage::{RangeRequest, Store};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

const COMPONENT: &str = "apiserver";

/// The apiserver's series.
pub struct Metrics {
    requests: CounterVec,
    latency: HistogramVec,
    inflight: GaugeVec,
    longrunning: GaugeVec,
    watchers: GaugeVec,
    objects: GaugeVec,
    counted: Mutex<Option<Instant>>,
}

/// The process's apiserver series (registered on first use).
pub fn get() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(|| {
        let m = Metrics {
            requests: CounterVec::default(),
            latency: minik8s_metrics::latency_family(),
            inflight: GaugeVec::default(),
            longrunning: GaugeVec::default(),
            watchers: GaugeVec::default(),
            objects: GaugeVec::default(),
            counted: Mutex::new(None),
        };
        use minik8s_metrics::register as r;
        r(COMPONENT, "apiserver_request", "Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.", m.requests.clone());
        r(COMPONENT, "apiserver_request_duration_seconds", "Response latency distribution in seconds for each verb, dry run value, group, version, resource, subresource, scope and component.", m.latency.clone());
        r(COMPONENT, "apiserver_current_inflight_requests", "Maximal number of currently used inflight request limit of this apiserver per request kind in last second.", m.inflight.clone());
        r(COMPONENT, "apiserver_longrunning_requests", "Gauge of all active long-running apiserver requests broken out by verb, group, version, resource, scope and component.", m.longrunning.clone());
        r(COMPONENT, "apiserver_registered_watchers", "Number of currently registered watchers for a given resources", m.watchers.clone());
        r(COMPONENT, "apiserver_storage_objects", "Number of stored objects at the time of last check split by kind.", m.objects.clone());
        minik8s_storage::metrics::register(COMPONENT);
        m
    })
}

/// What a request is, for its labels.
pub struct Described {
    labels: Labels,
    mutating: bool,
    watch: Option<Labels>,
}

/// Upstream's verb label: the HTTP-ish verb (`GET`, `LIST`, `WATCH`, `POST`, `PUT`, `PATCH`,
/// `APPLY`, `DELETE`, `CONNECT`).
fn verb_label(info: &RequestInfo, content_type: &str, long_running: bool) -> String {
    match info {
        RequestInfo::NonResource { verb, .. } => verb.to_ascii_uppercase(),
        RequestInfo::Resource(r) => {
            let connect = matches!(
                r.subresource.as_deref(),
                Some("exec" | "attach" | "portforward" | "proxy")
            );
            match r.verb {
                _ if connect => "CONNECT",
                Verb::Get if long_running && r.subresource.is_none() => "WATCH",
                Verb::Get => "GET",
                Verb::List => "LIST",
                Verb::Watch => "WATCH",
                Verb::Create => "POST",
                Verb::Update => "PUT",
                Verb::Patch if content_type.starts_with("application/apply-patch") => "APPLY",
                Verb::Patch => "PATCH",
                Verb::Delete | Verb::DeleteCollection => "DELETE",
                Verb::Options => "OPTIONS",
            }
            .to_owned()
        }
    }
}

impl Metrics {
    /// Labels a request about to be served.
    pub fn describe(
        &self,
        api: &Api,
        info: &RequestInfo,
        content_type: &str,
        long_running: bool,
    ) -> Described {
        let verb = verb_label(info, content_type, long_running);
        let (group, version, resource, subresource, scope) = match info {
            RequestInfo::NonResource { .. } => Default::default(),
            RequestInfo::Resource(r) => {
                let scope = if r.name.is_some() {
                    "resource"
                } else if r.namespace.is_some() {
                    "namespace"
                } else {
                    "cluster"
                };
                (
                    r.group.clone(),
                    r.version.clone(),
                    r.resource.clone(),
                    r.subresource.clone().unwrap_or_default(),
                    scope.to_owned(),
                )
            }
        };
        let watch = match info {
            RequestInfo::Resource(r) if verb == "WATCH" => api
                .registry
                .lookup(&r.group, &r.version, &r.resource)
                .ok()
                .map(|res| {
                    labels(&[
                        ("group", &res.group),
                        ("version", &res.version),
                        ("kind", &res.kind),
                    ])
                }),
            _ => None,
        };
        Described {
            mutating: !matches!(verb.as_str(), "GET" | "LIST" | "WATCH" | "HEAD" | "OPTIONS"),
            labels: labels(&[
                ("verb", &verb),
                ("dry_run", ""),
                ("group", &group),
                ("version", &version),
                ("resource", &resource),
                ("subresource", &subresource),
                ("scope", &scope),
                ("component", COMPONENT),
            ]),
            watch,
        }
    }

    /// Marks a request started; the guard ends it.
    pub fn begin(&'static self, d: &Described, long_running: bool) -> Guard {
        if long_running {
            self.longrunning.get_or_create(&d.labels).inc();
            if let Some(w) = &d.watch {
                self.watchers.get_or_create(w).inc();
            }
        } else {
            self.inflight.get_or_create(&kind(d)).inc();
        }
        Guard {
            metrics: self,
            labels: d.labels.clone(),
            kind: kind(d),
            watch: d.watch.clone(),
            long_running,
            started: Instant::now(),
        }
    }

    /// Counts objects per resource, at most every 30 s.
    pub async fn count_objects(&self, api: &Api) -> ApiResult<()> {
        {
            let mut at = self.counted.lock().expect("metrics");
            if at.is_some_and(|t| t.elapsed() < Duration::from_secs(30)) {
                return Ok(());
            }
            *at = Some(Instant::now());
        }
        let mut seen = std::collections::HashSet::new();
        for res in api.registry.all() {
            let prefix = res.key_prefix();
            if !seen.insert(prefix.clone()) {
                continue;
            }
            // Counted by the store, one value read (etcd's count-only range): reading every
            // value took more than the request timeout at 150,000 pods (800 MB of them), and
            // the scrape answered 504.
            let mut req = RangeRequest::prefix(prefix);
            req.limit = 1;
            req.count = true;
            let n = api.store.range(req).await?.count as i64;
            let resource = if res.group.is_empty() {
                res.plural.clone()
            } else {
                format!("{}.{}", res.plural, res.group)
            };
            self.objects
                .get_or_create(&labels(&[("resource", &resource)]))
                .set(n);
        }
        Ok(())
    }
}

fn kind(d: &Described) -> Labels {
    labels(&[(
        "request_kind",
        if d.mutating { "mutating" } else { "readOnly" },
    )])
}

/// A request being served; [`Guard::finish`] records its outcome.
pub struct Guard {
    metrics: &'static Metrics,
    labels: Labels,
    kind: Labels,
    watch: Option<Labels>,
    long_running: bool,
    started: Instant,
}

impl Guard {
    /// Records the response code (and, for short requests, the latency).
    pub fn finish(self, code: u16) {
        let mut with_code = self.labels.clone();
        with_code.push(("code".into(), code.to_string()));
        self.metrics.requests.get_or_create(&with_code).inc();
        if !self.long_running {
            self.metrics
                .latency
                .get_or_create(&self.labels)
                .observe(self.started.elapsed().as_secs_f64());
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.long_running {
            self.metrics.longrunning.get_or_create(&self.labels).dec();
            if let Some(w) = &self.watch {
                self.metrics.watchers.get_or_create(w).dec();
            }
        } else {
            self.metrics.inflight.get_or_create(&self.kind).dec();
        }
    }
}

/// The components whose series the apiserver's `/metrics` shows: its own, plus those of the
/// controller manager and proxy when they run in this process (`minik8s up`).
pub const SERVED: &[&str] = &[COMPONENT, "controller-manager", "proxy"];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serving::request;
    use axum::http::Method;

    #[test]
    fn verbs_are_labelled_as_upstream() {
        let v = |m: Method, path: &str, q: Option<&str>, ct: &str, long: bool| {
            verb_label(&request::parse(&m, path, q), ct, long)
        };
        assert_eq!(v(Method::GET, "/api/v1/pods", None, "", false), "LIST");
        assert_eq!(
            v(Method::GET, "/api/v1/pods", Some("watch=true"), "", true),
            "WATCH"
        );
        assert_eq!(
            v(Method::GET, "/api/v1/namespaces/d/pods/p", None, "", false),
            "GET"
        );
        assert_eq!(
            v(Method::POST, "/api/v1/namespaces/d/pods", None, "", false),
            "POST"
        );
        assert_eq!(
            v(Method::PUT, "/api/v1/namespaces/d/pods/p", None, "", false),
            "PUT"
        );
        assert_eq!(
            v(
                Method::PATCH,
                "/api/v1/namespaces/d/pods/p",
                None,
                "application/apply-patch+yaml",
                false
            ),
            "APPLY"
        );
        assert_eq!(
            v(Method::DELETE, "/api/v1/namespaces/d/pods", None, "", false),
            "DELETE"
        );
        assert_eq!(
            v(
                Method::POST,
                "/api/v1/namespaces/d/pods/p/exec",
                None,
                "",
                true
            ),
            "CONNECT"
        );
        assert_eq!(v(Method::GET, "/version", None, "", false), "GET");
        assert_eq!(
            v(
                Method::GET,
                "/api/v1/namespaces/d/pods/p/log",
                Some("follow=true"),
                "",
                true
            ),
            "GET"
        );
    }
}
