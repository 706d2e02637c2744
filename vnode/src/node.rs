//! One served virtual node, as virtual-kubelet's `NodeController` and lease controller: the
//! Node is registered (labels, the provider taint, capacity, addresses, the kubelet
//! endpoint), its Lease renewed every `renew_interval` and its status written when the
//! provider reports a change, when its health changes, and at least every
//! `status_interval`. A holder that cannot renew for a whole lease duration (less one renew)
//! stops serving, so that no other replica can have taken the node over while it serves.

use crate::pods::PodState;
use crate::{
    Config, MANAGER, PROVIDER_LABEL, Provider, Served, Shared, TAINT_KEY, VNodeInfo, metrics,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use minik8s_controllers::leader::{self, Hold, Observed};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{Notify, mpsc};

/// The kubelet version virtual nodes report.
pub const VERSION: &str = "v1.33.0-minik8s-vnode";

/// Starts serving `info` (this replica has just won its Lease, `lease` as written).
pub(crate) fn start(
    shared: &Arc<Shared>,
    info: VNodeInfo,
    provider: Arc<dyn Provider>,
    lease: Option<Lease>,
) {
    let name = info.name.clone();
    let served = Arc::new(Served {
        info: std::sync::Mutex::new(info),
        provider,
        stop: shared.shutdown.child_token(),
        refresh: Notify::new(),
        pods: tokio::sync::Mutex::new(PodState::default()),
        adopted: std::sync::atomic::AtomicBool::new(false),
        done: tokio::sync::watch::Sender::new(false),
    });
    shared
        .served
        .lock()
        .expect("served")
        .insert(name.clone(), served.clone());
    metrics::get().held.inc();
    let shared = shared.clone();
    minik8s_task::spawn_on(&shared.tasks.clone(), "vnode-serve", async move {
        let result = serve(&shared, &served, lease).await;
        if let Err(e) = result {
            tracing::warn!(node = %name, error = %e, "stopped serving the node");
        }
        // Stopped for any reason but a Down (which removed it): stand by again.
        let removed = {
            let mut s = shared.served.lock().expect("served");
            match s.get(&name) {
                Some(x) if Arc::ptr_eq(x, &served) => s.remove(&name).is_some(),
                _ => false,
            }
        };
        if removed {
            metrics::get().held.dec();
        }
        served.done.send_replace(true);
        shared.wake.notify_one();
    });
}

/// Serves the node until its `stop` token is cancelled or its Lease is lost.
async fn serve(
    shared: &Arc<Shared>,
    served: &Arc<Served>,
    lease: Option<Lease>,
) -> Result<(), crate::Error> {
    let cfg = &shared.cfg;
    let name = served.name();
    let (pod_tx, mut pod_rx) = mpsc::unbounded_channel::<crate::provider::PodUpdate>();
    let (node_tx, mut node_rx) = mpsc::unbounded_channel::<crate::provider::NodeUpdate>();
    served.provider.notify_pods(crate::PodNotify(pod_tx));
    served
        .provider
        .notify_node_status(crate::NodeNotify(node_tx));
    let port = *shared.port.lock().expect("port");
    let info = served.info.lock().expect("info").clone();
    register(shared, &info, port).await?;
    // What runs already is adopted, not created again (the node's pods are queued then).
    crate::pods::resync(shared, served, true).await;
    tracing::info!(node = %name, identity = %cfg.identity, "serving the node");

    let labels = cfg.labels();
    let hold = Hold {
        name: &name,
        identity: &cfg.identity,
        duration: cfg.lease_duration,
        labels: &labels,
    };
    let mut last = lease;
    let mut observed = Observed::default();
    let mut renewed = Instant::now();
    // Stop serving before anyone else may take over: their clocks start at our last renewal.
    let deadline = cfg
        .lease_duration
        .saturating_sub(cfg.renew_interval)
        .max(cfg.renew_interval);
    let mut health = Health {
        ready: served.provider.ping().await.is_ok(),
        since: None,
    };
    let mut extra: Option<NodeStatus> = None;
    write_status(shared, &name, &health, extra.as_ref()).await;
    let mut status_written = Instant::now();
    let mut renew = tokio::time::interval_at(
        tokio::time::Instant::now() + cfg.renew_interval,
        cfg.renew_interval,
    );
    let mut resync = tokio::time::interval_at(tokio::time::Instant::now() + cfg.resync, cfg.resync);
    let status_writes = Arc::new(tokio::sync::Semaphore::new(8));
    loop {
        tokio::select! {
            _ = served.stop.cancelled() => return Ok(()),
            Some(update) = pod_rx.recv() => {
                // Status writes run beside the renewals, a few at a time.
                let (shared, served, permits) = (shared.clone(), served.clone(), status_writes.clone());
                minik8s_task::spawn_on(&shared.tasks.clone(), "vnode-pod-status", async move {
                    let _permit = permits.acquire().await;
                    match update {
                        crate::provider::PodUpdate::Status(pod) => {
                            crate::pods::on_provider_status(&shared, &served, pod).await
                        }
                        crate::provider::PodUpdate::Gone(pod) => {
                            crate::pods::on_provider_gone(&shared, &served, pod).await
                        }
                    }
                });
            }
            Some(update) = node_rx.recv() => match update {
                crate::provider::NodeUpdate::Status(status) => {
                    extra = Some(*status);
                    // A status from the provider is news of its health too: its answer now,
                    // not the last renewal's (else a provider back after an outage writes
                    // its conditions under a stale `Ready: Unknown`, which the node lifecycle
                    // controller then overwrites with `Unknown` as a node gone quiet).
                    health.set_ready(served.provider.ping().await.is_ok());
                    write_status(shared, &name, &health, extra.as_ref()).await;
                    status_written = Instant::now();
                }
                crate::provider::NodeUpdate::Resync => {
                    crate::pods::resync(shared, served, false).await;
                    crate::pods::queue_pods_of(shared, &name);
                }
                crate::provider::NodeUpdate::Labels(labels) => {
                    let info = {
                        let mut info = served.info.lock().expect("info");
                        info.labels = labels;
                        info.clone()
                    };
                    if let Err(e) = register(shared, &info, port).await {
                        tracing::warn!(node = %name, error = %e, "relabelling the node failed");
                    }
                }
            },
            _ = served.refresh.notified() => {
                let info = served.info.lock().expect("info").clone();
                if let Err(e) = register(shared, &info, port).await {
                    tracing::warn!(node = %name, error = %e, "refreshing the node failed");
                }
            }
            _ = resync.tick() => crate::pods::resync(shared, served, false).await,
            _ = renew.tick() => {
                let leases = shared.leases();
                let mut held = leader::try_hold(&leases, &hold, &mut observed, &mut last).await;
                if matches!(held, Ok(false)) {
                    // The cached Lease may be stale: read it once before giving up.
                    held = leader::try_hold(&leases, &hold, &mut observed, &mut last).await;
                }
                match held {
                    Ok(true) => renewed = Instant::now(),
                    Ok(false) => {
                        tracing::warn!(node = %name, "the node's lease is held by another replica; stopping");
                        return Ok(());
                    }
                    Err(e) => tracing::warn!(node = %name, error = %e, "renewing the node's lease failed"),
                }
                if renewed.elapsed() >= deadline {
                    tracing::warn!(node = %name, "could not renew the node's lease in time; stopping");
                    return Ok(());
                }
                let ready = match served.provider.ping().await {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::debug!(node = %name, error = %e, "provider ping failed");
                        false
                    }
                };
                let changed = health.set_ready(ready);
                if changed || status_written.elapsed() >= cfg.status_interval {
                    write_status(shared, &name, &health, extra.as_ref()).await;
                    status_written = Instant::now();
                }
            }
        }
    }
}

/// The node's health as last written.
#[derive(Default)]
struct Health {
    ready: bool,
    /// When `ready` last changed.
    since: Option<jiff::Timestamp>,
}

impl Health {
    fn set_ready(&mut self, ready: bool) -> bool {
        let changed = self.ready != ready;
        if changed {
            self.ready = ready;
            self.since = Some(jiff::Timestamp::now());
        }
        changed
    }
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The Node object as this library registers it.
pub fn node_object(cfg: &Config, info: &VNodeInfo, port: u16) -> Value {
    let mut labels = json!({
        "type": "virtual-kubelet",
        "kubernetes.io/role": "agent",
        "kubernetes.io/hostname": info.name,
        "kubernetes.io/os": info.node_info.get("operatingSystem").map_or("linux", |s| s),
        PROVIDER_LABEL: cfg.provider,
    });
    for (k, v) in &info.labels {
        labels[k] = json!(v);
    }
    let mut addresses = vec![json!({"type": "InternalIP", "address": cfg.address})];
    if let Some(ip) = &info.external_ip {
        addresses.push(json!({"type": "ExternalIP", "address": ip}));
    }
    addresses.push(json!({"type": "Hostname", "address": info.name}));
    let mut metadata = json!({"name": info.name, "labels": labels});
    if !info.annotations.is_empty() {
        metadata["annotations"] = json!(info.annotations);
    }
    let fact = |k: &str| info.node_info.get(k).cloned().unwrap_or_default();
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": metadata,
        "spec": {"taints": [{"key": TAINT_KEY, "value": cfg.provider, "effect": "NoSchedule"}]},
        "status": {
            "capacity": info.capacity, "allocatable": info.capacity,
            "addresses": addresses,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
            "nodeInfo": {
                "kubeletVersion": VERSION, "kubeProxyVersion": "",
                "operatingSystem": info.node_info.get("operatingSystem").map_or("linux", |s| s),
                "architecture": info.node_info.get("architecture").map_or("amd64", |s| s),
                "containerRuntimeVersion": info.node_info.get("containerRuntimeVersion").map_or("vnode://".to_owned() + &cfg.provider, |s| s.clone()),
                "kernelVersion": fact("kernelVersion"), "osImage": fact("osImage"),
                "machineID": "", "systemUUID": "", "bootID": "",
            },
        },
    })
}

/// Creates or refreshes the Node and its static status.
async fn register(shared: &Shared, info: &VNodeInfo, port: u16) -> Result<(), crate::Error> {
    let nodes: Api<Node> = Api::all(shared.client.clone());
    let pp = PatchParams::apply(MANAGER).force();
    let mut obj = node_object(&shared.cfg, info, port);
    let status = obj.as_object_mut().and_then(|o| o.remove("status"));
    nodes.patch(&info.name, &pp, &Patch::Apply(&obj)).await?;
    let status = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": info.name}, "status": status});
    nodes
        .patch_status(&info.name, &pp, &Patch::Apply(&status))
        .await?;
    Ok(())
}

/// Writes the node's conditions (and what the provider last reported).
async fn write_status(shared: &Shared, name: &str, health: &Health, extra: Option<&NodeStatus>) {
    let since = health
        .since
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(now);
    let heartbeat = now();
    // A provider that does not answer leaves the node's state unknown, as a kubelet that
    // stopped posting its status (the node lifecycle controller taints it unreachable).
    let (ready, reason, message) = if health.ready {
        ("True", "KubeletReady", "the provider answers")
    } else {
        (
            "Unknown",
            "NodeStatusUnknown",
            "the provider does not answer",
        )
    };
    let cond = |t: &str, s: &str, reason: &str, message: &str| {
        json!({"type": t, "status": s, "reason": reason, "message": message,
               "lastHeartbeatTime": heartbeat, "lastTransitionTime": since})
    };
    let mut status = json!({
        "conditions": [
            cond("Ready", ready, reason, message),
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "virtual node"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "virtual node"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "virtual node"),
        ],
    });
    if let Some(extra) = extra {
        let extra = serde_json::to_value(extra).unwrap_or_default();
        for key in ["capacity", "allocatable"] {
            if let Some(v) = extra.get(key) {
                status[key] = v.clone();
            }
        }
        if let Some(conds) = extra.get("conditions").and_then(Value::as_array) {
            let list = status["conditions"].as_array_mut().expect("conditions");
            for c in conds {
                // The provider may say why its node is not ready (its runtime is down); a
                // provider that does not answer leaves it unknown, whatever it said before.
                if c["type"] == "Ready" && !health.ready {
                    continue;
                }
                list.retain(|x| x["type"] != c["type"]);
                list.push(c.clone());
            }
        }
    }
    let nodes: Api<Node> = Api::all(shared.client.clone());
    let body =
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": status});
    let pp = PatchParams::apply(&format!("{MANAGER}-status")).force();
    if let Err(e) = nodes.patch_status(name, &pp, &Patch::Apply(&body)).await {
        tracing::warn!(node = %name, error = %e, "writing the node status failed");
    }
}

/// The node is gone from its provider: its Node and Lease go too (the pod garbage collector
/// then deletes its pods, and their controllers recreate them on other nodes).
pub(crate) async fn remove(shared: &Shared, name: &str) {
    let nodes: Api<Node> = Api::all(shared.client.clone());
    match nodes.delete(name, &DeleteParams::default()).await {
        Ok(_) => tracing::info!(node = %name, "the provider's node is gone; deleted its Node"),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => tracing::warn!(node = %name, error = %e, "deleting the node failed"),
    }
    if let Err(e) = shared.leases().delete(name, &DeleteParams::default()).await
        && !matches!(&e, kube::Error::Api(s) if s.code == 404)
    {
        tracing::warn!(node = %name, error = %e, "deleting the node's lease failed");
    }
}
