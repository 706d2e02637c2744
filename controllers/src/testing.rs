//! A mock API for reconcile tests (no cluster): a kube `Client` over a tower service that
//! records every request and answers from a closure, and reflector stores filled by hand.

use http::{Request, Response};
use kube::client::Body;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use serde_json::Value;
use std::sync::{Arc, Mutex};

/// One request the controller made.
#[derive(Clone, Debug)]
pub struct Call {
    /// HTTP method.
    pub method: String,
    /// Path (without the query).
    pub path: String,
    /// JSON body (null when empty).
    pub body: Value,
}

/// The requests made so far.
pub type Calls = Arc<Mutex<Vec<Call>>>;

/// A client whose requests are recorded and answered by `answer` (status, JSON body).
pub fn client(
    answer: impl Fn(&Call) -> (u16, Value) + Send + Sync + 'static,
) -> (kube::Client, Calls) {
    let calls: Calls = Arc::default();
    let answer = Arc::new(answer);
    let recorded = calls.clone();
    let service = tower::service_fn(move |req: Request<Body>| {
        let (recorded, answer) = (recorded.clone(), answer.clone());
        async move {
            let method = req.method().to_string();
            let path = req.uri().path().to_owned();
            let bytes = req.into_body().collect_bytes().await?;
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let call = Call { method, path, body };
            let (status, reply) = answer(&call);
            recorded.lock().expect("calls").push(call);
            Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&reply).expect("json")))
                .map_err(kube::Error::HttpError)
        }
    });
    (kube::Client::new(service, "default"), calls)
}

/// Echoes a written object back (what the apiserver would return, near enough); 404 for
/// reads, as nothing is stored.
pub fn echo(call: &Call) -> (u16, Value) {
    match call.method.as_str() {
        "POST" => (201, call.body.clone()),
        "PATCH" | "PUT" => (200, call.body.clone()),
        "DELETE" => (
            200,
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
        ),
        _ => (
            404,
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "NotFound", "code": 404, "message": "not found"}),
        ),
    }
}

/// A reflector store holding these objects.
pub fn store<K>(objects: impl IntoIterator<Item = K>) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let (reader, mut writer) = reflector::store();
    for o in objects {
        writer.apply_watcher_event(&watcher::Event::Apply(o));
    }
    reader
}

/// A store of `objects` read by namespace.
pub fn namespaced<K>(objects: impl IntoIterator<Item = K>) -> crate::informer::Namespaced<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let (reader, mut writer) = reflector::store();
    let mut events = Vec::new();
    for o in objects {
        let e = watcher::Event::Apply(o);
        writer.apply_watcher_event(&e);
        events.push(e);
    }
    crate::informer::Namespaced::following(reader, &events)
}

/// The calls with this method whose path ends with `suffix`.
pub fn matching(calls: &Calls, method: &str, suffix: &str) -> Vec<Call> {
    calls
        .lock()
        .expect("calls")
        .iter()
        .filter(|c| c.method == method && c.path.ends_with(suffix))
        .cloned()
        .collect()
}

/// A mock API with the runtime its client lives on.
pub struct Mock {
    rt: tokio::runtime::Runtime,
    /// The client to give the controller.
    pub client: kube::Client,
    /// What the controller asked.
    pub calls: Calls,
}

/// A mock API answering with `answer` (see [`client`]).
pub fn mock(answer: impl Fn(&Call) -> (u16, Value) + Send + Sync + 'static) -> Mock {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (client, calls) = {
        let _in = rt.enter();
        client(answer)
    };
    Mock { rt, client, calls }
}

impl Mock {
    /// Runs a reconcile future to completion.
    pub fn run<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Lets tasks the controller spawned (the event sink) run for a moment.
    pub fn settle(&self) {
        self.rt.block_on(async {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        });
    }
}
