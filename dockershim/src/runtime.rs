//! The CRI `RuntimeService` over Docker: sandboxes as pause containers, containers in their
//! namespaces, statuses read back from Docker's inspect and labels.

use crate::Shim;
use crate::names;
use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::{
    ContainerCreateBody, ContainerSummary, EndpointSettings, HostConfig, HostConfigLogConfig,
    NetworkingConfig,
};
use bollard::query_parameters as q;
use futures::StreamExt;
use k8s_cri::v1 as cri;
use std::collections::HashMap;
use std::time::Duration;
use tonic::{Request, Response, Status};

type Answer<T> = Result<Response<T>, Status>;

/// Docker's error as the CRI's: not found stays not found, the rest says Docker's message.
pub(crate) fn status(e: DockerError) -> Status {
    match e {
        DockerError::DockerResponseServerError {
            status_code: 404,
            message,
        } => Status::not_found(message),
        DockerError::DockerResponseServerError {
            status_code: 409,
            message,
        } => Status::already_exists(message),
        DockerError::DockerResponseServerError { message, .. } => {
            Status::unknown(format!("docker: {message}"))
        }
        DockerError::DockerStreamError { error } => Status::unknown(format!("docker: {error}")),
        other => Status::unavailable(format!("docker: {other}")),
    }
}

fn not_found(e: &DockerError) -> bool {
    matches!(
        e,
        DockerError::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// Every container (running or not) carrying all of `labels` (`key=value`).
pub async fn list(
    docker: &Docker,
    labels: &[String],
) -> Result<Vec<ContainerSummary>, DockerError> {
    let filters: HashMap<String, Vec<String>> = [("label".to_owned(), labels.to_vec())].into();
    docker
        .list_containers(Some(
            q::ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
}

/// Removes a container, running or not, and its anonymous volumes; gone already is fine.
pub async fn remove(docker: &Docker, id: &str) -> Result<(), DockerError> {
    match docker
        .remove_container(
            id,
            Some(
                q::RemoveContainerOptionsBuilder::default()
                    .force(true)
                    .v(true)
                    .build(),
            ),
        )
        .await
    {
        Err(e) if !not_found(&e) => Err(e),
        _ => Ok(()),
    }
}

/// Label filters (`key=value`) for a CRI label selector, with the kind's.
fn filters(kind: &str, selector: &HashMap<String, String>) -> Vec<String> {
    let mut out = vec![format!("{}={kind}", names::KIND)];
    out.extend(selector.iter().map(|(k, v)| format!("{k}={v}")));
    out
}

fn sandbox_state(running: bool) -> i32 {
    if running {
        cri::PodSandboxState::SandboxReady as i32
    } else {
        cri::PodSandboxState::SandboxNotready as i32
    }
}

fn container_state(docker_state: &str) -> i32 {
    match docker_state {
        "created" => cri::ContainerState::ContainerCreated as i32,
        "running" | "paused" | "restarting" => cri::ContainerState::ContainerRunning as i32,
        "exited" | "dead" | "removing" => cri::ContainerState::ContainerExited as i32,
        _ => cri::ContainerState::ContainerUnknown as i32,
    }
}

fn metadata<T: serde::de::DeserializeOwned + Default>(labels: &HashMap<String, String>) -> T {
    labels
        .get(names::METADATA)
        .and_then(|m| serde_json::from_str(m).ok())
        .unwrap_or_default()
}

/// The CRI runtime service.
pub struct Runtime {
    shim: Shim,
    streams: std::sync::Arc<crate::streams::Streams>,
}

impl Runtime {
    pub fn new(shim: Shim, streams: std::sync::Arc<crate::streams::Streams>) -> Runtime {
        Runtime { shim, streams }
    }

    /// Checks that `id` is a Docker container of this runtime's `kind` (`sandbox` or
    /// `container`) that runs: a stream to anything else is refused as upstream's runtimes
    /// refuse it.
    async fn running(&self, id: &str, kind: &str) -> Result<(), Status> {
        let c = self
            .docker()
            .inspect_container(id, None::<q::InspectContainerOptions>)
            .await
            .map_err(status)?;
        let labels = c
            .config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default();
        if labels.get(names::KIND).map(String::as_str) != Some(kind) {
            return Err(Status::not_found(format!("{kind} {id} not found")));
        }
        if !c.state.and_then(|s| s.running).unwrap_or(false) {
            return Err(Status::failed_precondition(format!(
                "{kind} {id} is not running"
            )));
        }
        Ok(())
    }

    fn docker(&self) -> &Docker {
        &self.shim.docker
    }

    /// Creates a container under `name`; when another container holds the name, an exited
    /// one is renamed out of the way (it stays for `--previous` logs) and a running one makes
    /// this one take the fallback name.
    async fn create_named(
        &self,
        name: &str,
        fallback: &str,
        body: ContainerCreateBody,
    ) -> Result<String, Status> {
        let create = |n: &str| {
            self.docker().create_container(
                Some(q::CreateContainerOptionsBuilder::default().name(n).build()),
                body.clone(),
            )
        };
        match create(name).await {
            Ok(made) => return Ok(made.id),
            Err(DockerError::DockerResponseServerError {
                status_code: 409, ..
            }) => {}
            Err(e) => return Err(status(e)),
        }
        let holder = self
            .docker()
            .inspect_container(name, None::<q::InspectContainerOptions>)
            .await
            .map_err(status)?;
        let running = holder
            .state
            .as_ref()
            .and_then(|s| s.running)
            .unwrap_or(false);
        let target = if running {
            fallback.to_owned()
        } else {
            let id = holder.id.unwrap_or_default();
            let aside = format!("{name}.{}", &id[..id.len().min(12)]);
            self.docker()
                .rename_container(
                    &id,
                    q::RenameContainerOptionsBuilder::default()
                        .name(&aside)
                        .build(),
                )
                .await
                .map_err(status)?;
            name.to_owned()
        };
        self.docker()
            .create_container(
                Some(
                    q::CreateContainerOptionsBuilder::default()
                        .name(&target)
                        .build(),
                ),
                body,
            )
            .await
            .map(|made| made.id)
            .map_err(status)
    }

    /// The ids of a sandbox's containers.
    async fn members(&self, sandbox: &str) -> Result<Vec<String>, Status> {
        Ok(
            list(self.docker(), &[format!("{}={sandbox}", names::SANDBOX)])
                .await
                .map_err(status)?
                .into_iter()
                .filter_map(|c| c.id)
                .collect(),
        )
    }

    async fn stop(&self, id: &str, timeout: i64) -> Result<(), Status> {
        match self
            .docker()
            .stop_container(
                id,
                Some(
                    q::StopContainerOptionsBuilder::default()
                        .t(i32::try_from(timeout).unwrap_or(i32::MAX))
                        .build(),
                ),
            )
            .await
        {
            Err(e) if !not_found(&e) => Err(status(e)),
            _ => Ok(()),
        }
    }
}

/// A CRI mount as a Docker bind (`host:container[:ro][,propagation]`).
fn bind(m: &cri::Mount) -> String {
    let mut opts = Vec::new();
    if m.readonly {
        opts.push("ro");
    }
    match cri::MountPropagation::try_from(m.propagation) {
        Ok(cri::MountPropagation::PropagationHostToContainer) => opts.push("rslave"),
        Ok(cri::MountPropagation::PropagationBidirectional) => opts.push("rshared"),
        _ => {}
    }
    if opts.is_empty() {
        format!("{}:{}", m.host_path, m.container_path)
    } else {
        format!("{}:{}:{}", m.host_path, m.container_path, opts.join(","))
    }
}

/// Whether a namespace option says the pod shares it (`POD`) or the node's (`NODE`).
fn mode(value: i32) -> Option<cri::NamespaceMode> {
    cri::NamespaceMode::try_from(value).ok()
}

#[tonic::async_trait]
impl cri::runtime_service_server::RuntimeService for Runtime {
    async fn version(&self, _: Request<cri::VersionRequest>) -> Answer<cri::VersionResponse> {
        let v = self.docker().version().await.map_err(status)?;
        Ok(Response::new(cri::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "docker".into(),
            runtime_version: v.version.unwrap_or_default(),
            runtime_api_version: v.api_version.unwrap_or_default(),
        }))
    }

    async fn run_pod_sandbox(
        &self,
        request: Request<cri::RunPodSandboxRequest>,
    ) -> Answer<cri::RunPodSandboxResponse> {
        let config = request
            .into_inner()
            .config
            .ok_or_else(|| Status::invalid_argument("a sandbox config is required"))?;
        let meta = config.metadata.clone().unwrap_or_default();
        let linux = config.linux.clone().unwrap_or_default();
        let security = linux.security_context.clone().unwrap_or_default();
        let ns = security.namespace_options.clone().unwrap_or_default();
        let host_network = mode(ns.network) == Some(cri::NamespaceMode::Node);
        let mut labels = config.labels.clone();
        labels.insert(names::KIND.into(), "sandbox".into());
        labels.insert(
            names::METADATA.into(),
            serde_json::to_string(&meta).unwrap_or_default(),
        );
        labels.insert(
            names::ANNOTATIONS.into(),
            serde_json::to_string(&config.annotations).unwrap_or_default(),
        );
        labels.insert(names::NODE.into(), self.shim.cfg.node.clone());
        let dns = config.dns_config.clone().unwrap_or_default();
        let network = &self.shim.cfg.network;
        let body = ContainerCreateBody {
            image: Some(self.shim.cfg.pause_image.clone()),
            hostname: (!config.hostname.is_empty()).then(|| config.hostname.clone()),
            labels: Some(labels),
            host_config: Some(HostConfig {
                network_mode: Some(if host_network {
                    "host".into()
                } else {
                    network.clone()
                }),
                ipc_mode: Some(if mode(ns.ipc) == Some(cri::NamespaceMode::Node) {
                    "host".into()
                } else {
                    "shareable".into()
                }),
                pid_mode: (mode(ns.pid) == Some(cri::NamespaceMode::Node)).then(|| "host".into()),
                dns: (!host_network && !dns.servers.is_empty()).then(|| dns.servers.clone()),
                dns_search: (!host_network && !dns.searches.is_empty())
                    .then(|| dns.searches.clone()),
                dns_options: (!host_network && !dns.options.is_empty())
                    .then(|| dns.options.clone()),
                cgroup_parent: (!linux.cgroup_parent.is_empty())
                    .then(|| linux.cgroup_parent.clone()),
                privileged: Some(security.privileged),
                sysctls: (!linux.sysctls.is_empty()).then(|| linux.sysctls.clone()),
                ..Default::default()
            }),
            networking_config: (!host_network).then(|| NetworkingConfig {
                endpoints_config: Some(
                    [(
                        network.clone(),
                        EndpointSettings {
                            aliases: Some(names::aliases(&config.labels)),
                            ..Default::default()
                        },
                    )]
                    .into(),
                ),
            }),
            ..Default::default()
        };
        let name = names::container_name(&meta.name, "pause");
        let fallback = names::fallback_name(&name, &meta.uid, meta.attempt);
        let id = self.create_named(&name, &fallback, body).await?;
        if let Err(e) = self
            .docker()
            .start_container(&id, None::<q::StartContainerOptions>)
            .await
        {
            let _ = remove(self.docker(), &id).await;
            return Err(status(e));
        }
        tracing::info!(pod = %format!("{}/{}", meta.namespace, meta.name), sandbox = %id, "sandbox started");
        Ok(Response::new(cri::RunPodSandboxResponse {
            pod_sandbox_id: id,
        }))
    }

    async fn stop_pod_sandbox(
        &self,
        request: Request<cri::StopPodSandboxRequest>,
    ) -> Answer<cri::StopPodSandboxResponse> {
        let id = request.into_inner().pod_sandbox_id;
        for member in self.members(&id).await? {
            self.stop(&member, 10).await?;
        }
        self.stop(&id, 10).await?;
        Ok(Response::new(cri::StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        request: Request<cri::RemovePodSandboxRequest>,
    ) -> Answer<cri::RemovePodSandboxResponse> {
        let id = request.into_inner().pod_sandbox_id;
        for member in self.members(&id).await? {
            remove(self.docker(), &member).await.map_err(status)?;
        }
        remove(self.docker(), &id).await.map_err(status)?;
        Ok(Response::new(cri::RemovePodSandboxResponse {}))
    }

    async fn pod_sandbox_status(
        &self,
        request: Request<cri::PodSandboxStatusRequest>,
    ) -> Answer<cri::PodSandboxStatusResponse> {
        let req = request.into_inner();
        let c = self
            .docker()
            .inspect_container(&req.pod_sandbox_id, None::<q::InspectContainerOptions>)
            .await
            .map_err(status)?;
        let labels = c
            .config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default();
        if labels.get(names::KIND).map(String::as_str) != Some("sandbox") {
            return Err(Status::not_found(format!(
                "{} is not a pod sandbox",
                req.pod_sandbox_id
            )));
        }
        let state = c.state.clone().unwrap_or_default();
        let ip = c
            .network_settings
            .as_ref()
            .and_then(|n| n.networks.as_ref())
            .and_then(|n| n.get(&self.shim.cfg.network))
            .and_then(|e| e.ip_address.clone())
            .unwrap_or_default();
        let running = state.running.unwrap_or(false);
        let pid = state.pid.unwrap_or(0);
        let mut info = HashMap::new();
        if req.verbose {
            info.insert(
                "info".to_owned(),
                serde_json::json!({"pid": if running { pid } else { 0 }}).to_string(),
            );
        }
        Ok(Response::new(cri::PodSandboxStatusResponse {
            status: Some(cri::PodSandboxStatus {
                id: c.id.clone().unwrap_or_default(),
                metadata: Some(metadata(&labels)),
                state: sandbox_state(running),
                created_at: names::nanos(c.created.as_deref()),
                network: Some(cri::PodSandboxNetworkStatus {
                    ip,
                    ..Default::default()
                }),
                labels: names::cri_labels(&labels),
                annotations: names::annotations(&labels),
                ..Default::default()
            }),
            info,
            ..Default::default()
        }))
    }

    async fn list_pod_sandbox(
        &self,
        request: Request<cri::ListPodSandboxRequest>,
    ) -> Answer<cri::ListPodSandboxResponse> {
        let filter = request.into_inner().filter.unwrap_or_default();
        let found = list(self.docker(), &filters("sandbox", &filter.label_selector))
            .await
            .map_err(status)?;
        let items = found
            .into_iter()
            .map(|c| {
                let labels = c.labels.clone().unwrap_or_default();
                let running = c.state.map(|s| s.to_string()).as_deref() == Some("running");
                cri::PodSandbox {
                    id: c.id.clone().unwrap_or_default(),
                    metadata: Some(metadata(&labels)),
                    state: sandbox_state(running),
                    created_at: c.created.unwrap_or(0) * 1_000_000_000,
                    labels: names::cri_labels(&labels),
                    annotations: names::annotations(&labels),
                    runtime_handler: String::new(),
                }
            })
            .filter(|s| filter.id.is_empty() || s.id.starts_with(&filter.id))
            .filter(|s| filter.state.as_ref().is_none_or(|f| f.state == s.state))
            .collect();
        Ok(Response::new(cri::ListPodSandboxResponse { items }))
    }

    async fn create_container(
        &self,
        request: Request<cri::CreateContainerRequest>,
    ) -> Answer<cri::CreateContainerResponse> {
        let req = request.into_inner();
        let config = req
            .config
            .ok_or_else(|| Status::invalid_argument("a container config is required"))?;
        let sandbox_config = req.sandbox_config.unwrap_or_default();
        let pod = sandbox_config.metadata.clone().unwrap_or_default();
        let meta = config.metadata.clone().unwrap_or_default();
        let image = config.image.clone().unwrap_or_default().image;
        let linux = config.linux.clone().unwrap_or_default();
        let security = linux.security_context.clone().unwrap_or_default();
        let resources = linux.resources.clone().unwrap_or_default();
        let ns = security.namespace_options.clone().unwrap_or_default();
        let sandbox = &req.pod_sandbox_id;
        let mut labels = config.labels.clone();
        labels.insert(names::KIND.into(), "container".into());
        labels.insert(
            names::METADATA.into(),
            serde_json::to_string(&meta).unwrap_or_default(),
        );
        labels.insert(
            names::ANNOTATIONS.into(),
            serde_json::to_string(&config.annotations).unwrap_or_default(),
        );
        labels.insert(names::SANDBOX.into(), sandbox.clone());
        labels.insert(names::IMAGE.into(), image.clone());
        labels.insert(names::NODE.into(), self.shim.cfg.node.clone());
        let user = security
            .run_as_user
            .as_ref()
            .map(|u| match &security.run_as_group {
                Some(g) => format!("{}:{}", u.value, g.value),
                None => u.value.to_string(),
            });
        let caps = security.capabilities.clone().unwrap_or_default();
        let body = ContainerCreateBody {
            image: Some(image.clone()),
            entrypoint: (!config.command.is_empty()).then(|| config.command.clone()),
            cmd: (!config.args.is_empty()).then(|| config.args.clone()),
            working_dir: (!config.working_dir.is_empty()).then(|| config.working_dir.clone()),
            env: Some(
                config
                    .envs
                    .iter()
                    .map(|e| format!("{}={}", e.key, e.value))
                    .collect(),
            ),
            user,
            tty: Some(config.tty),
            open_stdin: Some(config.stdin),
            stdin_once: Some(config.stdin_once),
            labels: Some(labels),
            host_config: Some(HostConfig {
                network_mode: Some(format!("container:{sandbox}")),
                ipc_mode: Some(format!("container:{sandbox}")),
                pid_mode: match mode(ns.pid) {
                    Some(cri::NamespaceMode::Pod) => Some(format!("container:{sandbox}")),
                    Some(cri::NamespaceMode::Node) => Some("host".into()),
                    _ => None,
                },
                binds: Some(config.mounts.iter().map(bind).collect()),
                privileged: Some(security.privileged),
                readonly_rootfs: Some(security.readonly_rootfs),
                cap_add: (!caps.add_capabilities.is_empty()).then(|| caps.add_capabilities.clone()),
                cap_drop: (!caps.drop_capabilities.is_empty())
                    .then(|| caps.drop_capabilities.clone()),
                security_opt: security
                    .no_new_privs
                    .then(|| vec!["no-new-privileges".into()]),
                cgroup_parent: sandbox_config
                    .linux
                    .as_ref()
                    .map(|l| l.cgroup_parent.clone())
                    .filter(|p| !p.is_empty()),
                cpu_period: (resources.cpu_period > 0).then_some(resources.cpu_period),
                cpu_quota: (resources.cpu_quota > 0).then_some(resources.cpu_quota),
                cpu_shares: (resources.cpu_shares > 0).then_some(resources.cpu_shares),
                memory: (resources.memory_limit_in_bytes > 0)
                    .then_some(resources.memory_limit_in_bytes),
                oom_score_adj: (resources.oom_score_adj != 0).then_some(resources.oom_score_adj),
                log_config: Some(HostConfigLogConfig {
                    typ: Some("json-file".into()),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let name = names::container_name(&pod.name, &meta.name);
        let fallback = names::fallback_name(&name, &pod.uid, meta.attempt);
        let id = self.create_named(&name, &fallback, body).await?;
        Ok(Response::new(cri::CreateContainerResponse {
            container_id: id,
        }))
    }

    async fn start_container(
        &self,
        request: Request<cri::StartContainerRequest>,
    ) -> Answer<cri::StartContainerResponse> {
        let id = request.into_inner().container_id;
        self.docker()
            .start_container(&id, None::<q::StartContainerOptions>)
            .await
            .map_err(status)?;
        Ok(Response::new(cri::StartContainerResponse {}))
    }

    async fn stop_container(
        &self,
        request: Request<cri::StopContainerRequest>,
    ) -> Answer<cri::StopContainerResponse> {
        let req = request.into_inner();
        self.stop(&req.container_id, req.timeout).await?;
        Ok(Response::new(cri::StopContainerResponse {}))
    }

    async fn remove_container(
        &self,
        request: Request<cri::RemoveContainerRequest>,
    ) -> Answer<cri::RemoveContainerResponse> {
        remove(self.docker(), &request.into_inner().container_id)
            .await
            .map_err(status)?;
        Ok(Response::new(cri::RemoveContainerResponse {}))
    }

    async fn list_containers(
        &self,
        request: Request<cri::ListContainersRequest>,
    ) -> Answer<cri::ListContainersResponse> {
        let filter = request.into_inner().filter.unwrap_or_default();
        let mut selector = filter.label_selector.clone();
        if !filter.pod_sandbox_id.is_empty() {
            selector.insert(names::SANDBOX.into(), filter.pod_sandbox_id.clone());
        }
        let found = list(self.docker(), &filters("container", &selector))
            .await
            .map_err(status)?;
        let containers = found
            .into_iter()
            .map(|c| {
                let labels = c.labels.clone().unwrap_or_default();
                cri::Container {
                    id: c.id.clone().unwrap_or_default(),
                    pod_sandbox_id: labels.get(names::SANDBOX).cloned().unwrap_or_default(),
                    metadata: Some(metadata(&labels)),
                    image: Some(cri::ImageSpec {
                        image: labels.get(names::IMAGE).cloned().unwrap_or_default(),
                        ..Default::default()
                    }),
                    image_ref: c.image_id.clone().unwrap_or_default(),
                    state: container_state(&c.state.map(|s| s.to_string()).unwrap_or_default()),
                    created_at: c.created.unwrap_or(0) * 1_000_000_000,
                    labels: names::cri_labels(&labels),
                    annotations: names::annotations(&labels),
                    ..Default::default()
                }
            })
            .filter(|c| filter.id.is_empty() || c.id.starts_with(&filter.id))
            .filter(|c| filter.state.as_ref().is_none_or(|f| f.state == c.state))
            .collect();
        Ok(Response::new(cri::ListContainersResponse { containers }))
    }

    async fn container_status(
        &self,
        request: Request<cri::ContainerStatusRequest>,
    ) -> Answer<cri::ContainerStatusResponse> {
        let id = request.into_inner().container_id;
        let c = self
            .docker()
            .inspect_container(&id, None::<q::InspectContainerOptions>)
            .await
            .map_err(status)?;
        let labels = c
            .config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default();
        if labels.get(names::KIND).map(String::as_str) != Some("container") {
            return Err(Status::not_found(format!("{id} is not a pod's container")));
        }
        let state = c.state.clone().unwrap_or_default();
        let docker_state = state.status.map(|s| s.to_string()).unwrap_or_default();
        let cri_state = container_state(&docker_state);
        let exit_code = state.exit_code.unwrap_or(0);
        let (reason, message) = if cri_state != cri::ContainerState::ContainerExited as i32 {
            (String::new(), String::new())
        } else if state.oom_killed.unwrap_or(false) {
            ("OOMKilled".to_owned(), String::new())
        } else if exit_code == 0 {
            ("Completed".to_owned(), String::new())
        } else {
            ("Error".to_owned(), state.error.clone().unwrap_or_default())
        };
        let mounts = c
            .mounts
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|m| cri::Mount {
                container_path: m.destination.unwrap_or_default(),
                host_path: m.source.unwrap_or_default(),
                readonly: !m.rw.unwrap_or(true),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(cri::ContainerStatusResponse {
            status: Some(cri::ContainerStatus {
                id: c.id.clone().unwrap_or_default(),
                metadata: Some(metadata(&labels)),
                state: cri_state,
                created_at: names::nanos(c.created.as_deref()),
                started_at: names::nanos(state.started_at.as_deref()),
                finished_at: if cri_state == cri::ContainerState::ContainerExited as i32 {
                    names::nanos(state.finished_at.as_deref())
                } else {
                    0
                },
                exit_code: i32::try_from(exit_code).unwrap_or(-1),
                image: Some(cri::ImageSpec {
                    image: labels.get(names::IMAGE).cloned().unwrap_or_default(),
                    ..Default::default()
                }),
                image_ref: c.image.clone().unwrap_or_default(),
                reason,
                message,
                labels: names::cri_labels(&labels),
                annotations: names::annotations(&labels),
                mounts,
                // Docker's own json-file log, which the kubelet reads as upstream's does.
                log_path: c.log_path.clone().unwrap_or_default(),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    async fn update_container_resources(
        &self,
        _: Request<cri::UpdateContainerResourcesRequest>,
    ) -> Answer<cri::UpdateContainerResourcesResponse> {
        Err(Status::unimplemented(
            "the docker runtime does not resize containers",
        ))
    }

    async fn reopen_container_log(
        &self,
        _: Request<cri::ReopenContainerLogRequest>,
    ) -> Answer<cri::ReopenContainerLogResponse> {
        // Docker rotates its own logs.
        Ok(Response::new(cri::ReopenContainerLogResponse {}))
    }

    async fn exec_sync(
        &self,
        request: Request<cri::ExecSyncRequest>,
    ) -> Answer<cri::ExecSyncResponse> {
        let req = request.into_inner();
        let exec = self
            .docker()
            .create_exec(
                &req.container_id,
                bollard::exec::CreateExecOptions {
                    cmd: Some(req.cmd.clone()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await
            .map_err(status)?;
        let run = async {
            let mut stdout = Vec::new();
            let mut stderr = Vec::new();
            if let bollard::exec::StartExecResults::Attached { mut output, .. } = self
                .docker()
                .start_exec(&exec.id, None::<bollard::exec::StartExecOptions>)
                .await
                .map_err(status)?
            {
                while let Some(chunk) = output.next().await {
                    match chunk.map_err(status)? {
                        bollard::container::LogOutput::StdErr { message } => {
                            stderr.extend_from_slice(&message)
                        }
                        other => stdout.extend_from_slice(&other.into_bytes()),
                    }
                }
            }
            Ok::<_, Status>((stdout, stderr))
        };
        let (stdout, stderr) = if req.timeout > 0 {
            tokio::time::timeout(Duration::from_secs(req.timeout as u64), run)
                .await
                .map_err(|_| {
                    Status::deadline_exceeded(format!(
                        "command {:?} timed out after {}s",
                        req.cmd, req.timeout
                    ))
                })??
        } else {
            run.await?
        };
        let inspected = self.docker().inspect_exec(&exec.id).await.map_err(status)?;
        Ok(Response::new(cri::ExecSyncResponse {
            stdout,
            stderr,
            exit_code: inspected
                .exit_code
                .and_then(|c| i32::try_from(c).ok())
                .unwrap_or(-1),
        }))
    }

    async fn exec(&self, request: Request<cri::ExecRequest>) -> Answer<cri::ExecResponse> {
        let req = request.into_inner();
        if req.cmd.is_empty() {
            return Err(Status::invalid_argument("cmd must not be empty"));
        }
        if !(req.stdin || req.stdout || req.stderr) {
            return Err(Status::invalid_argument(
                "one of stdin, stdout, or stderr must be set",
            ));
        }
        self.running(&req.container_id, "container").await?;
        let url = self.streams.register(crate::streams::Pending::Exec(req));
        Ok(Response::new(cri::ExecResponse { url }))
    }

    async fn attach(&self, request: Request<cri::AttachRequest>) -> Answer<cri::AttachResponse> {
        let req = request.into_inner();
        if !(req.stdin || req.stdout || req.stderr) {
            return Err(Status::invalid_argument(
                "one of stdin, stdout, or stderr must be set",
            ));
        }
        self.running(&req.container_id, "container").await?;
        let url = self.streams.register(crate::streams::Pending::Attach(req));
        Ok(Response::new(cri::AttachResponse { url }))
    }

    async fn port_forward(
        &self,
        request: Request<cri::PortForwardRequest>,
    ) -> Answer<cri::PortForwardResponse> {
        let req = request.into_inner();
        self.running(&req.pod_sandbox_id, "sandbox").await?;
        let url = self
            .streams
            .register(crate::streams::Pending::PortForward(req.pod_sandbox_id));
        Ok(Response::new(cri::PortForwardResponse { url }))
    }

    async fn container_stats(
        &self,
        _: Request<cri::ContainerStatsRequest>,
    ) -> Answer<cri::ContainerStatsResponse> {
        Err(Status::unimplemented(
            "the docker runtime does not report container statistics",
        ))
    }

    async fn list_container_stats(
        &self,
        _: Request<cri::ListContainerStatsRequest>,
    ) -> Answer<cri::ListContainerStatsResponse> {
        // Docker's statistics take a second per container; none are reported.
        Ok(Response::new(cri::ListContainerStatsResponse {
            stats: Vec::new(),
        }))
    }

    async fn pod_sandbox_stats(
        &self,
        _: Request<cri::PodSandboxStatsRequest>,
    ) -> Answer<cri::PodSandboxStatsResponse> {
        Err(Status::unimplemented(
            "the docker runtime does not report sandbox statistics",
        ))
    }

    async fn list_pod_sandbox_stats(
        &self,
        _: Request<cri::ListPodSandboxStatsRequest>,
    ) -> Answer<cri::ListPodSandboxStatsResponse> {
        Ok(Response::new(cri::ListPodSandboxStatsResponse {
            stats: Vec::new(),
        }))
    }

    async fn update_runtime_config(
        &self,
        _: Request<cri::UpdateRuntimeConfigRequest>,
    ) -> Answer<cri::UpdateRuntimeConfigResponse> {
        Ok(Response::new(cri::UpdateRuntimeConfigResponse {}))
    }

    async fn status(&self, _: Request<cri::StatusRequest>) -> Answer<cri::StatusResponse> {
        let runtime = self.docker().ping().await;
        let network = self
            .docker()
            .inspect_network(&self.shim.cfg.network, None::<q::InspectNetworkOptions>)
            .await;
        let condition = |kind: &str, r: Result<(), String>| cri::RuntimeCondition {
            r#type: kind.into(),
            status: r.is_ok(),
            reason: if r.is_ok() {
                String::new()
            } else {
                "DockerNotReady".into()
            },
            message: r.err().unwrap_or_default(),
        };
        Ok(Response::new(cri::StatusResponse {
            status: Some(cri::RuntimeStatus {
                conditions: vec![
                    condition(
                        "RuntimeReady",
                        runtime.map(|_| ()).map_err(|e| {
                            format!(
                                "Cannot connect to the Docker daemon at unix://{}: {e}. Is the \
                                 docker daemon running?",
                                self.shim.cfg.socket.trim_start_matches("unix://")
                            )
                        }),
                    ),
                    condition(
                        "NetworkReady",
                        network
                            .map(|_| ())
                            .map_err(|e| format!("docker network {}: {e}", self.shim.cfg.network)),
                    ),
                ],
            }),
            ..Default::default()
        }))
    }

    async fn checkpoint_container(
        &self,
        _: Request<cri::CheckpointContainerRequest>,
    ) -> Answer<cri::CheckpointContainerResponse> {
        Err(Status::unimplemented(
            "the docker runtime does not checkpoint containers",
        ))
    }

    type GetContainerEventsStream =
        futures::stream::Empty<Result<cri::ContainerEventResponse, Status>>;

    async fn get_container_events(
        &self,
        _: Request<cri::GetEventsRequest>,
    ) -> Answer<Self::GetContainerEventsStream> {
        Err(Status::unimplemented(
            "the docker runtime does not stream container events",
        ))
    }

    async fn list_metric_descriptors(
        &self,
        _: Request<cri::ListMetricDescriptorsRequest>,
    ) -> Answer<cri::ListMetricDescriptorsResponse> {
        Ok(Response::new(cri::ListMetricDescriptorsResponse::default()))
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _: Request<cri::ListPodSandboxMetricsRequest>,
    ) -> Answer<cri::ListPodSandboxMetricsResponse> {
        Ok(Response::new(cri::ListPodSandboxMetricsResponse::default()))
    }

    async fn runtime_config(
        &self,
        _: Request<cri::RuntimeConfigRequest>,
    ) -> Answer<cri::RuntimeConfigResponse> {
        Ok(Response::new(cri::RuntimeConfigResponse {
            linux: Some(cri::LinuxRuntimeConfiguration {
                cgroup_driver: cri::CgroupDriver::Cgroupfs as i32,
            }),
        }))
    }
}
