//! The device plugin manager (upstream's `deviceplugin/v1beta1`): the kubelet serves
//! `Registration` on `<root>/device-plugins/kubelet.sock`; a plugin registers its resource
//! name (`nvidia.com/gpu`) and socket, the kubelet follows the plugin's `ListAndWatch` and
//! publishes the healthy devices as the node's capacity and allocatable. A container that
//! requests the resource gets that many free healthy devices, chosen by the kubelet and
//! passed to the plugin's `Allocate`; the envs, mounts and device nodes it answers go into
//! the container's config. Allocations are by pod and container and freed with the pod.

use crate::cri;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Node, Pod};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// The generated device plugin API.
#[allow(missing_docs, clippy::all)]
pub mod api {
    tonic::include_proto!("v1beta1");
}

use api::device_plugin_client::DevicePluginClient;
use api::registration_server::{Registration, RegistrationServer};

/// The API version plugins must register with.
pub const VERSION: &str = "v1beta1";

/// The socket name the kubelet serves `Registration` on, in its device plugin folder.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// What a container gets from its devices' plugins.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Allocation {
    /// Environment variables.
    pub envs: Vec<cri::KeyValue>,
    /// Bind mounts.
    pub mounts: Vec<cri::Mount>,
    /// Device nodes.
    pub devices: Vec<cri::Device>,
}

struct Plugin {
    client: DevicePluginClient<tonic::transport::Channel>,
    /// Device id → healthy.
    devices: BTreeMap<String, bool>,
}

#[derive(Default)]
struct State {
    plugins: HashMap<String, Plugin>,
    /// (pod uid, container) → (resource, device ids).
    allocated: HashMap<(String, String), (String, Vec<String>)>,
}

/// The node's device plugins and their allocations.
pub struct Devices {
    client: Client,
    node: String,
    dir: PathBuf,
    state: Mutex<State>,
}

/// The extended resources (`vendor/name`) a container asks for, with counts.
pub fn requested(c: &Container) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    let res = c.resources.as_ref();
    for list in [
        res.and_then(|r| r.limits.as_ref()),
        res.and_then(|r| r.requests.as_ref()),
    ]
    .into_iter()
    .flatten()
    {
        for (k, v) in list {
            if k.contains('/') && !k.starts_with("kubernetes.io/") && !k.starts_with("hugepages-") {
                let n = minik8s_types::Quantity::parse(&v.0).map_or(0, |q| q.units() as i64);
                out.insert(k.clone(), n);
            }
        }
    }
    out
}

/// Picks `n` healthy devices not in `taken` (in id order); `None` if there are too few.
pub fn pick(
    devices: &BTreeMap<String, bool>,
    taken: &BTreeSet<String>,
    n: usize,
) -> Option<Vec<String>> {
    let free: Vec<String> = devices
        .iter()
        .filter(|(id, healthy)| **healthy && !taken.contains(*id))
        .map(|(id, _)| id.clone())
        .take(n)
        .collect();
    (free.len() == n).then_some(free)
}

impl Devices {
    /// A manager for `node` serving in `dir`.
    pub fn new(client: Client, node: &str, dir: PathBuf) -> Self {
        Devices {
            client,
            node: node.to_owned(),
            dir,
            state: Mutex::new(State::default()),
        }
    }

    /// The folder plugins put their sockets in (and find the kubelet's).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Healthy devices per registered resource.
    pub fn capacity(&self) -> BTreeMap<String, i64> {
        let st = self.state.lock().expect("devices");
        st.plugins
            .iter()
            .map(|(r, p)| (r.clone(), p.devices.values().filter(|h| **h).count() as i64))
            .collect()
    }

    /// Serves `Registration` until `shutdown`.
    pub async fn serve(self: Arc<Self>, shutdown: CancellationToken) {
        if let Err(e) = std::fs::create_dir_all(&self.dir) {
            tracing::warn!(error = %e, dir = %self.dir.display(), "device plugins: no folder");
            return;
        }
        let socket = self.dir.join(KUBELET_SOCKET);
        let _ = std::fs::remove_file(&socket);
        let listener = match tokio::net::UnixListener::bind(&socket) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, socket = %socket.display(), "device plugins: cannot listen");
                return;
            }
        };
        tracing::info!(socket = %socket.display(), "device plugin registration");
        let svc = RegistrationServer::new(Registrar {
            devices: self.clone(),
            shutdown: shutdown.clone(),
        });
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        if let Err(e) = tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(incoming, shutdown.cancelled())
            .await
        {
            tracing::warn!(error = %e, "device plugin registration server");
        }
        let _ = std::fs::remove_file(&socket);
    }

    /// Publishes the capacity of every registered resource on the Node.
    async fn publish(&self) {
        let cap: BTreeMap<String, String> = self
            .capacity()
            .into_iter()
            .map(|(r, n)| (r, n.to_string()))
            .collect();
        let patch = serde_json::json!({"status": {"capacity": cap, "allocatable": cap}});
        if let Err(e) = Api::<Node>::all(self.client.clone())
            .patch_status(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(error = %e, "publishing device capacity");
        }
    }

    /// Follows a registered plugin's devices until its stream ends or `shutdown`.
    async fn follow(
        self: Arc<Self>,
        resource: String,
        mut client: DevicePluginClient<tonic::transport::Channel>,
        shutdown: CancellationToken,
    ) {
        let mut stream = match client.list_and_watch(api::Empty {}).await {
            Ok(s) => s.into_inner(),
            Err(e) => {
                tracing::warn!(%resource, error = %e, "ListAndWatch");
                return;
            }
        };
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => break,
                n = stream.next() => n,
            };
            let Some(Ok(resp)) = next else { break };
            {
                let mut st = self.state.lock().expect("devices");
                if let Some(p) = st.plugins.get_mut(&resource) {
                    p.devices = resp
                        .devices
                        .iter()
                        .map(|d| (d.id.clone(), d.health == "Healthy"))
                        .collect();
                }
            }
            tracing::info!(%resource, devices = resp.devices.len(), "device plugin update");
            self.publish().await;
        }
        // The plugin went away: its devices are gone (upstream keeps them for a grace period).
        self.state
            .lock()
            .expect("devices")
            .plugins
            .remove(&resource);
        tracing::info!(%resource, "device plugin gone");
        let patch = serde_json::json!({"status": {"capacity": {&resource: "0"}, "allocatable": {&resource: "0"}}});
        let _ = Api::<Node>::all(self.client.clone())
            .patch_status(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
    }

    /// Allocates the devices container `c` of `pod` asks for (once per pod and container);
    /// `Err` explains why not (too few free devices, the plugin's refusal).
    pub async fn allocate(&self, pod: &Pod, c: &Container) -> Result<Allocation, String> {
        let uid = pod.uid().unwrap_or_default();
        let mut out = Allocation::default();
        for (resource, n) in requested(c) {
            if n <= 0 {
                continue;
            }
            let (ids, mut client) = {
                let mut st = self.state.lock().expect("devices");
                let key = (uid.clone(), c.name.clone());
                // An extended resource no plugin serves (one advertised by patching the
                // node's capacity) is only counted by the scheduler: nothing to allocate,
                // as upstream's device manager skips non-device-plugin resources.
                let Some(plugin) = st.plugins.get(&resource) else {
                    continue;
                };
                let client = plugin.client.clone();
                let ids = match st.allocated.get(&key) {
                    Some((r, ids)) if *r == resource => ids.clone(),
                    _ => {
                        let taken: BTreeSet<String> = st
                            .allocated
                            .values()
                            .filter(|(r, _)| *r == resource)
                            .flat_map(|(_, ids)| ids.iter().cloned())
                            .collect();
                        let ids = pick(&plugin.devices, &taken, n as usize).ok_or_else(|| {
                            format!("requested {n} of {resource}, fewer are free")
                        })?;
                        st.allocated.insert(key, (resource.clone(), ids.clone()));
                        ids
                    }
                };
                (ids, client)
            };
            let req = api::AllocateRequest {
                container_requests: vec![api::ContainerAllocateRequest { devices_ids: ids }],
            };
            let resp = client
                .allocate(req)
                .await
                .map_err(|e| format!("{resource} Allocate: {}", e.message()))?
                .into_inner();
            for r in resp.container_responses {
                out.envs.extend(
                    r.envs
                        .into_iter()
                        .map(|(key, value)| cri::KeyValue { key, value }),
                );
                out.mounts.extend(r.mounts.into_iter().map(|m| cri::Mount {
                    container_path: m.container_path,
                    host_path: m.host_path,
                    readonly: m.read_only,
                    ..Default::default()
                }));
                out.devices
                    .extend(r.devices.into_iter().map(|d| cri::Device {
                        container_path: d.container_path,
                        host_path: d.host_path,
                        permissions: d.permissions,
                    }));
            }
        }
        Ok(out)
    }

    /// Frees every allocation of pods not in `live` (uids).
    pub fn release_except(&self, live: &std::collections::HashSet<String>) {
        self.state
            .lock()
            .expect("devices")
            .allocated
            .retain(|(uid, _), _| live.contains(uid));
    }
}

struct Registrar {
    devices: Arc<Devices>,
    shutdown: CancellationToken,
}

async fn connect(
    socket: PathBuf,
) -> Result<DevicePluginClient<tonic::transport::Channel>, tonic::transport::Error> {
    let channel = tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await?;
    Ok(DevicePluginClient::new(channel))
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn register(
        &self,
        req: tonic::Request<api::RegisterRequest>,
    ) -> Result<tonic::Response<api::Empty>, tonic::Status> {
        let r = req.into_inner();
        if r.version != VERSION {
            return Err(tonic::Status::invalid_argument(format!(
                "unsupported API version {:?} (this kubelet: {VERSION})",
                r.version
            )));
        }
        let valid_name = r
            .resource_name
            .split_once('/')
            .is_some_and(|(d, n)| !d.is_empty() && !n.is_empty() && !d.ends_with("kubernetes.io"));
        if !valid_name {
            return Err(tonic::Status::invalid_argument(format!(
                "invalid extended resource name {:?}",
                r.resource_name
            )));
        }
        if r.endpoint.contains('/') {
            return Err(tonic::Status::invalid_argument(
                "endpoint must be a socket name in the device plugin folder",
            ));
        }
        let client = connect(self.devices.dir.join(&r.endpoint))
            .await
            .map_err(|e| {
                tonic::Status::unavailable(format!("connecting to {}: {e}", r.endpoint))
            })?;
        self.devices.state.lock().expect("devices").plugins.insert(
            r.resource_name.clone(),
            Plugin {
                client: client.clone(),
                devices: BTreeMap::new(),
            },
        );
        tracing::info!(resource = %r.resource_name, endpoint = %r.endpoint, "device plugin registered");
        minik8s_task::spawn(
            "device-plugin",
            self.devices
                .clone()
                .follow(r.resource_name, client, self.shutdown.clone()),
        );
        Ok(tonic::Response::new(api::Empty {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_ask_for_extended_resources_and_get_free_healthy_devices() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c",
            "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "1", "memory": "1Gi"}},
        }))
        .unwrap();
        assert_eq!(
            requested(&c),
            BTreeMap::from([("nvidia.com/gpu".to_owned(), 2)])
        );
        let devices = BTreeMap::from([
            ("d0".to_owned(), true),
            ("d1".to_owned(), false),
            ("d2".to_owned(), true),
            ("d3".to_owned(), true),
        ]);
        let taken = BTreeSet::from(["d0".to_owned()]);
        assert_eq!(
            pick(&devices, &taken, 2),
            Some(vec!["d2".to_owned(), "d3".to_owned()])
        );
        assert_eq!(pick(&devices, &taken, 3), None);
    }
}
