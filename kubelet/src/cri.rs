//! The CRI v1 client: the runtime and image services of containerd over its unix socket.
//! Every call the kubelet makes to the runtime goes through [`Cri`].

use crate::error::{Error, Result};
use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
pub use k8s_cri::v1::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// Label keys the kubelet puts on sandboxes and containers (as upstream's kubelet does).
pub mod labels {
    /// The pod's name.
    pub const POD_NAME: &str = "io.kubernetes.pod.name";
    /// The pod's namespace.
    pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
    /// The pod's uid.
    pub const POD_UID: &str = "io.kubernetes.pod.uid";
    /// The container's name in the pod spec.
    pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
    /// The node (kubelet) that made it.
    pub const NODE: &str = "minik8s.io/node";
}

/// A connection to a CRI runtime.
#[derive(Clone, Debug)]
pub struct Cri {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

fn cri(call: &'static str) -> impl FnOnce(tonic::Status) -> Error {
    move |status| Error::Cri {
        call,
        status: Box::new(status),
    }
}

impl Cri {
    /// Connects to the runtime's unix socket.
    pub async fn connect(path: &Path) -> Result<Self> {
        let socket = path.to_path_buf();
        let channel =
            Endpoint::from_static("http://[::]:50051")
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let socket = socket.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?))
                    }
                }))
                .await
                .map_err(|source| Error::Connect {
                    path: path.to_path_buf(),
                    source,
                })?;
        Ok(Cri {
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        })
    }

    /// The runtime's name and version (`containerd`, `1.6.20~ds1`).
    pub async fn version(&self) -> Result<VersionResponse> {
        let req = VersionRequest {
            version: "v1".into(),
        };
        Ok(self
            .runtime
            .clone()
            .version(req)
            .await
            .map_err(cri("Version"))?
            .into_inner())
    }

    /// What keeps the runtime from being ready, in upstream's kubelet's words (`None`: it is
    /// ready): "container runtime is down" when it does not answer its status call, or the
    /// first condition that is not met with the runtime's reason and message.
    pub async fn problem(&self) -> Option<String> {
        let mut runtime = self.runtime.clone();
        let asked = runtime.status(StatusRequest { verbose: false });
        let status = match tokio::time::timeout(Duration::from_secs(5), asked).await {
            Ok(Ok(s)) => s.into_inner().status.unwrap_or_default(),
            Ok(Err(e)) => return Some(format!("container runtime is down: {}", e.message())),
            Err(_) => return Some("container runtime is down: no answer in 5 s".into()),
        };
        for kind in ["RuntimeReady", "NetworkReady"] {
            let Some(c) = status.conditions.iter().find(|c| c.r#type == kind) else {
                return Some(format!(
                    "container runtime not ready: {kind} missing from the runtime's status"
                ));
            };
            if !c.status {
                let what = if kind == "RuntimeReady" {
                    "container runtime not ready"
                } else {
                    "container runtime network not ready"
                };
                return Some(format!(
                    "{what}: {kind}=false reason:{} message:{}",
                    c.reason, c.message
                ));
            }
        }
        None
    }

    /// Whether the runtime and its network are ready.
    pub async fn ready(&self) -> Result<bool> {
        let status = self
            .runtime
            .clone()
            .status(StatusRequest { verbose: false })
            .await
            .map_err(cri("Status"))?
            .into_inner();
        Ok(status.status.is_some_and(|s| {
            s.conditions.iter().all(|c| c.status)
                && ["RuntimeReady", "NetworkReady"]
                    .iter()
                    .all(|t| s.conditions.iter().any(|c| c.r#type == *t))
        }))
    }

    /// Starts a sandbox and returns its id.
    pub async fn run_sandbox(&self, config: PodSandboxConfig) -> Result<String> {
        let req = RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        };
        Ok(self
            .runtime
            .clone()
            .run_pod_sandbox(req)
            .await
            .map_err(cri("RunPodSandbox"))?
            .into_inner()
            .pod_sandbox_id)
    }

    /// Stops a sandbox (its containers and network).
    pub async fn stop_sandbox(&self, id: &str) -> Result<()> {
        let req = StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.runtime
            .clone()
            .stop_pod_sandbox(req)
            .await
            .map_err(cri("StopPodSandbox"))?;
        Ok(())
    }

    /// Removes a stopped sandbox and its containers.
    pub async fn remove_sandbox(&self, id: &str) -> Result<()> {
        let req = RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.runtime
            .clone()
            .remove_pod_sandbox(req)
            .await
            .map_err(cri("RemovePodSandbox"))?;
        Ok(())
    }

    /// A sandbox's status (its IP among it).
    pub async fn sandbox_status(&self, id: &str) -> Result<Option<PodSandboxStatus>> {
        Ok(self.status_of(id, false).await?.status)
    }

    /// A sandbox's address and the process holding its namespaces (which containerd's
    /// verbose status says).
    pub async fn sandbox_ip_and_pid(&self, id: &str) -> Result<(Option<String>, Option<u32>)> {
        let resp = self.status_of(id, true).await?;
        let ip = resp
            .status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .filter(|ip| !ip.is_empty());
        let pid = resp
            .info
            .get("info")
            .and_then(|i| serde_json::from_str::<serde_json::Value>(i).ok())
            .and_then(|i| i.get("pid").and_then(serde_json::Value::as_u64))
            .and_then(|p| u32::try_from(p).ok())
            .filter(|p| *p > 0);
        Ok((ip, pid))
    }

    async fn status_of(&self, id: &str, verbose: bool) -> Result<PodSandboxStatusResponse> {
        let req = PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose,
        };
        Ok(self
            .runtime
            .clone()
            .pod_sandbox_status(req)
            .await
            .map_err(cri("PodSandboxStatus"))?
            .into_inner())
    }

    /// The sandboxes carrying all of `labels`.
    pub async fn sandboxes(&self, labels: HashMap<String, String>) -> Result<Vec<PodSandbox>> {
        let req = ListPodSandboxRequest {
            filter: Some(PodSandboxFilter {
                label_selector: labels,
                ..Default::default()
            }),
        };
        Ok(self
            .runtime
            .clone()
            .list_pod_sandbox(req)
            .await
            .map_err(cri("ListPodSandbox"))?
            .into_inner()
            .items)
    }

    /// Creates a container in a sandbox and returns its id.
    pub async fn create_container(
        &self,
        sandbox: &str,
        config: ContainerConfig,
        sandbox_config: PodSandboxConfig,
    ) -> Result<String> {
        let req = CreateContainerRequest {
            pod_sandbox_id: sandbox.into(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        Ok(self
            .runtime
            .clone()
            .create_container(req)
            .await
            .map_err(cri("CreateContainer"))?
            .into_inner()
            .container_id)
    }

    /// Starts a created container.
    pub async fn start_container(&self, id: &str) -> Result<()> {
        let req = StartContainerRequest {
            container_id: id.into(),
        };
        self.runtime
            .clone()
            .start_container(req)
            .await
            .map_err(cri("StartContainer"))?;
        Ok(())
    }

    /// Stops a container: SIGTERM, then SIGKILL after `timeout` seconds.
    pub async fn stop_container(&self, id: &str, timeout: i64) -> Result<()> {
        let req = StopContainerRequest {
            container_id: id.into(),
            timeout,
        };
        self.runtime
            .clone()
            .stop_container(req)
            .await
            .map_err(cri("StopContainer"))?;
        Ok(())
    }

    /// Removes a stopped container.
    pub async fn remove_container(&self, id: &str) -> Result<()> {
        let req = RemoveContainerRequest {
            container_id: id.into(),
        };
        self.runtime
            .clone()
            .remove_container(req)
            .await
            .map_err(cri("RemoveContainer"))?;
        Ok(())
    }

    /// The containers carrying all of `labels`.
    pub async fn containers(&self, labels: HashMap<String, String>) -> Result<Vec<Container>> {
        let req = ListContainersRequest {
            filter: Some(ContainerFilter {
                label_selector: labels,
                ..Default::default()
            }),
        };
        Ok(self
            .runtime
            .clone()
            .list_containers(req)
            .await
            .map_err(cri("ListContainers"))?
            .into_inner()
            .containers)
    }

    /// One container's status (exit code, times, reason).
    pub async fn container_status(&self, id: &str) -> Result<Option<ContainerStatus>> {
        let req = ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        Ok(self
            .runtime
            .clone()
            .container_status(req)
            .await
            .map_err(cri("ContainerStatus"))?
            .into_inner()
            .status)
    }

    /// Runs a command in a container and waits for it (`timeout` seconds, 0 = none).
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: i64,
    ) -> Result<ExecSyncResponse> {
        let req = ExecSyncRequest {
            container_id: id.into(),
            cmd,
            timeout,
        };
        Ok(self
            .runtime
            .clone()
            .exec_sync(req)
            .await
            .map_err(cri("ExecSync"))?
            .into_inner())
    }

    /// A streaming URL (on the runtime's stream server) that runs `cmd` in the container.
    pub async fn exec(&self, req: ExecRequest) -> Result<String> {
        Ok(self
            .runtime
            .clone()
            .exec(req)
            .await
            .map_err(cri("Exec"))?
            .into_inner()
            .url)
    }

    /// A streaming URL that attaches to the container's main process.
    pub async fn attach(&self, req: AttachRequest) -> Result<String> {
        Ok(self
            .runtime
            .clone()
            .attach(req)
            .await
            .map_err(cri("Attach"))?
            .into_inner()
            .url)
    }

    /// A streaming URL that forwards ports into the sandbox's network namespace.
    pub async fn port_forward(&self, sandbox: &str, ports: Vec<i32>) -> Result<String> {
        let req = PortForwardRequest {
            pod_sandbox_id: sandbox.into(),
            port: ports,
        };
        Ok(self
            .runtime
            .clone()
            .port_forward(req)
            .await
            .map_err(cri("PortForward"))?
            .into_inner()
            .url)
    }

    /// CPU and memory of the containers carrying all of `labels`.
    pub async fn container_stats(
        &self,
        labels: HashMap<String, String>,
    ) -> Result<Vec<ContainerStats>> {
        let req = ListContainerStatsRequest {
            filter: Some(ContainerStatsFilter {
                label_selector: labels,
                ..Default::default()
            }),
        };
        Ok(self
            .runtime
            .clone()
            .list_container_stats(req)
            .await
            .map_err(cri("ListContainerStats"))?
            .into_inner()
            .stats)
    }

    /// The image's id if the runtime has it.
    pub async fn image_id(&self, image: &str) -> Result<Option<String>> {
        Ok(self.image(image).await?.map(|(id, _)| id))
    }

    /// The id and size in bytes of an image, if present.
    pub async fn image(&self, image: &str) -> Result<Option<(String, u64)>> {
        let req = ImageStatusRequest {
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            verbose: false,
        };
        let status = self
            .images
            .clone()
            .image_status(req)
            .await
            .map_err(cri("ImageStatus"))?;
        Ok(status.into_inner().image.map(|i| (i.id, i.size)))
    }

    /// Pulls an image and returns its reference.
    pub async fn pull_image(&self, image: &str) -> Result<String> {
        let req = PullImageRequest {
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        };
        Ok(self
            .images
            .clone()
            .pull_image(req)
            .await
            .map_err(cri("PullImage"))?
            .into_inner()
            .image_ref)
    }
}

/// Where the CRI socket of a containerd started by [`crate::containerd`] lives.
pub fn socket_in(dir: &Path) -> PathBuf {
    dir.join("containerd.sock")
}
