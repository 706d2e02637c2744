//! The per-pod worker: one reconcile pass reads what the runtime holds for the pod, works out
//! its [`plan::State`], takes the steps that state calls for (sandbox, images, init
//! containers, containers, teardown) and writes the pod's status when it changed. kube-runtime's
//! `Controller` never runs two passes for one pod at once, so each pod's changes are serialised.

pub mod env;
pub mod mirror;
pub mod observed;
pub mod plan;
pub mod probe;
pub mod spec;
pub mod status;
pub mod volumes;

use crate::cri::Cri;
use crate::error::{Error, Result};
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::{Api, Client, ResourceExt};
use observed::Observed;
use plan::{RestartPolicy, Shape, State};
use spec::Layout;
use status::Failures;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often a live pod is looked at again when nothing happens (the PLEG-like relist).
pub const RELIST: Duration = Duration::from_secs(1);

/// How often a running pod's configMap, secret, downwardAPI and projected volumes are
/// rewritten from the API.
const VOLUME_REFRESH: Duration = Duration::from_secs(10);

/// What every pod worker shares.
pub struct Worker {
    /// The kubelet's API client.
    pub client: Client,
    /// The runtime.
    pub cri: Cri,
    /// Folders and cgroups.
    pub layout: Layout,
    /// The node's address (hostIP).
    pub host_ip: String,
    /// The last create/start failure per pod uid and container.
    failures: Mutex<HashMap<String, Failures>>,
    /// Image pull back-off per (pod uid, container): no pull before the instant; the delay.
    pulls: Mutex<HashMap<(String, String), (std::time::Instant, Duration)>>,
    /// When each running pod's API-fed volumes were last rewritten.
    refreshed: Mutex<HashMap<String, std::time::Instant>>,
    /// The status last written per pod uid, and when (upstream's status manager cache).
    written: Mutex<HashMap<String, (k8s_openapi::api::core::v1::PodStatus, std::time::Instant)>>,
    /// Probe results per container.
    pub probes: probe::Probes,
    /// Publishes the pod events the kubelet reports (`FailedCreatePodSandBox`, …).
    recorder: minik8s_events::Recorder,
    /// Device plugins and the devices containers were given.
    pub devices: std::sync::Arc<crate::devices::Devices>,
    /// The pods this kubelet admitted (by uid, the latest copy seen), which a new pod's
    /// host ports must not collide with.
    admitted: Mutex<HashMap<String, Arc<Pod>>>,
}

/// A pod's host ports: (host IP, `0.0.0.0` when unset; protocol; port). The app containers'
/// only, as upstream's NodePorts predicate counts them. The scheduler has the same pair of
/// functions (`controllers/src/scheduler.rs`): the kubelet cannot use the controllers crate,
/// and the shared crate (`types`) has no Kubernetes types.
fn host_ports(pod: &Pod) -> Vec<(String, String, i32)> {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.is_some_and(|h| h > 0))
        .map(|p| {
            (
                p.host_ip
                    .clone()
                    .filter(|ip| !ip.is_empty())
                    .unwrap_or_else(|| "0.0.0.0".into()),
                p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                p.host_port.unwrap_or_default(),
            )
        })
        .collect()
}

/// Whether two host ports collide (the same protocol and port on the same or any address),
/// as upstream's NodePorts predicate.
fn ports_collide(a: &(String, String, i32), b: &(String, String, i32)) -> bool {
    a.1 == b.1 && a.2 == b.2 && (a.0 == b.0 || a.0 == "0.0.0.0" || b.0 == "0.0.0.0")
}

/// Whether a pod may run beside the admitted ones: its host ports are free (upstream's
/// kubelet admission, the NodePorts part of GeneralPredicates; the scheduler checked the
/// rest, and a pod bound by name skips it).
fn ports_free(pod: &Pod, admitted: &[Arc<Pod>]) -> bool {
    let wanted = host_ports(pod);
    wanted.is_empty()
        || admitted
            .iter()
            .filter(|p| p.uid() != pod.uid() && p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                !matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
            })
            .flat_map(|p| host_ports(p))
            .all(|used| !wanted.iter().any(|w| ports_collide(w, &used)))
}

impl Worker {
    /// A worker set for one node.
    pub fn new(client: Client, cri: Cri, layout: Layout, host_ip: String) -> Self {
        let recorder = minik8s_events::Recorder::new(client.clone(), "kubelet", Some(&layout.node));
        let devices = std::sync::Arc::new(crate::devices::Devices::new(
            client.clone(),
            &layout.node,
            layout.root.join("device-plugins"),
        ));
        Worker {
            recorder,
            devices,
            client,
            cri,
            layout,
            host_ip,
            failures: Mutex::new(HashMap::new()),
            pulls: Mutex::new(HashMap::new()),
            refreshed: Mutex::new(HashMap::new()),
            written: Mutex::new(HashMap::new()),
            probes: probe::Probes::default(),
            admitted: Mutex::new(HashMap::new()),
        }
    }

    /// Forgets admitted pods that are no longer the node's (`live`: the uids of its pods): a
    /// pod deleted at once (grace period 0) never reaches a sync that would forget it.
    pub fn retain_admitted(&self, live: &std::collections::HashSet<String>) {
        self.admitted
            .lock()
            .expect("admitted lock")
            .retain(|uid, _| live.contains(uid));
    }

    /// Admits a pod that has not run here yet, or rejects it as upstream's kubelet does: a
    /// `NodePorts` warning event and the pod Failed with reason `NodePorts`. A pod already
    /// running (a sandbox exists) is admitted as it is. `false`: rejected.
    async fn admit(&self, pod: &Arc<Pod>, has_sandbox: bool) -> Result<bool> {
        let uid = pod.uid().unwrap_or_default();
        {
            let mut admitted = self.admitted.lock().expect("admitted lock");
            if has_sandbox || admitted.contains_key(&uid) {
                admitted.insert(uid, pod.clone());
                return Ok(true);
            }
            let others: Vec<Arc<Pod>> = admitted.values().cloned().collect();
            if ports_free(pod, &others) {
                admitted.insert(uid, pod.clone());
                return Ok(true);
            }
        }
        const REASON: &str = "NodePorts";
        const MESSAGE: &str = "Predicate NodePorts failed";
        tracing::info!(pod = %pod.name_any(), "rejected: its host ports are in use on this node");
        self.recorder.warning(
            &kube::Resource::object_ref(pod.as_ref(), &()),
            REASON,
            MESSAGE.to_owned(),
        );
        let status = k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Failed".into()),
            reason: Some(REASON.into()),
            message: Some(format!("Pod {MESSAGE}")),
            ..Default::default()
        };
        self.write_status(pod, status).await?;
        Ok(false)
    }

    fn failures(&self, uid: &str) -> Failures {
        self.failures
            .lock()
            .expect("failures lock")
            .get(uid)
            .cloned()
            .unwrap_or_default()
    }

    fn set_failure(&self, uid: &str, container: &str, failure: Option<(String, String)>) {
        let mut all = self.failures.lock().expect("failures lock");
        let entry = all.entry(uid.to_owned()).or_default();
        match failure {
            Some(f) => {
                entry.insert(container.to_owned(), f);
            }
            None => {
                entry.remove(container);
            }
        }
    }

    fn forget(&self, uid: &str) {
        self.failures.lock().expect("failures lock").remove(uid);
        self.refreshed.lock().expect("refresh lock").remove(uid);
        self.written.lock().expect("written lock").remove(uid);
        self.pulls
            .lock()
            .expect("pulls lock")
            .retain(|(u, _), _| u != uid);
    }

    /// Whether the container's image pull is in back-off now.
    fn pull_waits(&self, uid: &str, container: &str) -> bool {
        self.pulls
            .lock()
            .expect("pulls lock")
            .get(&(uid.to_owned(), container.to_owned()))
            .is_some_and(|(until, _)| std::time::Instant::now() < *until)
    }

    /// When to look at a pod whose containers did not start again: after a relist period
    /// while a pull has just failed (its back-off then shows), else after the back-off base.
    fn retry_after(&self, uid: &str) -> Duration {
        let pulls = self.pulls.lock().expect("pulls lock");
        let settling = pulls.iter().any(|((u, _), (until, delay))| {
            u == uid
                && until
                    .checked_sub(*delay)
                    .is_some_and(|at| at.elapsed() < RELIST)
        });
        if settling { RELIST } else { plan::BACKOFF_BASE }
    }

    /// Whether the container's last pull failed less than a relist period ago: its
    /// `ErrImagePull` stays shown until a later sync finds it in back-off, as upstream's
    /// kubelet shows it until its next sync (this kubelet also syncs on its own status writes).
    fn pull_just_failed(&self, uid: &str, container: &str) -> bool {
        self.pulls
            .lock()
            .expect("pulls lock")
            .get(&(uid.to_owned(), container.to_owned()))
            .is_some_and(just_failed)
    }

    /// Records a pull's outcome: a failure doubles the back-off (10 s … 5 min), a success
    /// clears it.
    fn pull_done(&self, uid: &str, container: &str, failed: bool) {
        let key = (uid.to_owned(), container.to_owned());
        let mut pulls = self.pulls.lock().expect("pulls lock");
        if failed {
            let delay = pulls
                .get(&key)
                .map_or(plan::BACKOFF_BASE, |(_, d)| (*d * 2).min(plan::BACKOFF_MAX));
            pulls.insert(key, (std::time::Instant::now() + delay, delay));
        } else {
            pulls.remove(&key);
        }
    }
}

/// Whether a pull back-off entry (retry instant, delay) began less than a relist period ago.
fn just_failed((until, delay): &(std::time::Instant, Duration)) -> bool {
    until
        .checked_sub(*delay)
        .is_some_and(|at| at.elapsed() < RELIST)
}

fn now_ns() -> i64 {
    jiff::Timestamp::now().as_nanosecond() as i64
}

/// The planner's view of the pod spec.
pub fn shape(pod: &Pod) -> Shape {
    let spec = pod.spec.clone().unwrap_or_default();
    Shape {
        init: spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| c.name.clone())
            .collect(),
        containers: spec.containers.iter().map(|c| c.name.clone()).collect(),
        restart: RestartPolicy::parse(spec.restart_policy.as_deref()),
    }
}

/// A reference to container `name` of the pod, as upstream's kubelet events name it
/// (`fieldPath: spec.containers{name}` or `spec.initContainers{name}`).
fn container_ref(pod: &Pod, name: &str) -> k8s_openapi::api::core::v1::ObjectReference {
    let mut r = kube::Resource::object_ref(pod, &());
    let spec = pod.spec.as_ref();
    let init = spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .any(|c| c.name == name);
    let ephemeral = spec
        .iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
        .any(|c| c.name == name);
    let list = if init {
        "initContainers"
    } else if ephemeral {
        "ephemeralContainers"
    } else {
        "containers"
    };
    r.field_path = Some(format!("spec.{list}{{{name}}}"));
    r
}

impl Worker {
    /// Makes sure the container's image is present, pulling it as its pull policy says, with
    /// upstream's events (`Pulling`, `Pulled`, `Failed`, `ErrImageNeverPull`).
    async fn ensure_image(&self, pod: &Pod, c: &Container) -> Result<String, (String, String)> {
        let image = c.image.clone().unwrap_or_default();
        let policy = c.image_pull_policy.clone().unwrap_or_else(|| {
            if image.ends_with(":latest") || !image.rsplit('/').next().unwrap_or("").contains(':') {
                "Always".into()
            } else {
                "IfNotPresent".into()
            }
        });
        let at = container_ref(pod, &c.name);
        let present = self
            .cri
            .image_id(&image)
            .await
            .map_err(|e| ("ErrImagePull".to_owned(), e.to_string()))?;
        let already = |id: String| {
            self.recorder.normal(
                &at,
                "Pulled",
                format!("Container image \"{image}\" already present on machine"),
            );
            Ok(id)
        };
        match (policy.as_str(), present) {
            ("Never", Some(id)) | ("IfNotPresent", Some(id)) => already(id),
            ("Never", None) => {
                let message =
                    format!("Container image \"{image}\" is not present with pull policy of Never");
                self.recorder
                    .warning(&at, "ErrImageNeverPull", message.clone());
                self.recorder
                    .warning(&at, "Failed", "Error: ErrImageNeverPull");
                Err(("ErrImageNeverPull".into(), message))
            }
            (_, present) => {
                self.recorder
                    .normal(&at, "Pulling", format!("Pulling image \"{image}\""));
                let began = std::time::Instant::now();
                match self.cri.pull_image(&image).await {
                    Ok(r) => {
                        let took = began.elapsed();
                        let size = match self.cri.image(&image).await {
                            Ok(Some((_, size))) => size,
                            _ => 0,
                        };
                        self.recorder.normal(
                            &at,
                            "Pulled",
                            format!(
                                "Successfully pulled image \"{image}\" in {took:.3?} ({took:.3?} including waiting). Image size: {size} bytes."
                            ),
                        );
                        Ok(r)
                    }
                    // A local image stands in when the registry cannot be reached.
                    Err(_) if present.is_some() => already(present.unwrap_or_default()),
                    Err(e) => {
                        self.recorder.warning(
                            &at,
                            "Failed",
                            format!("Failed to pull image \"{image}\": {}", e.runtime_message()),
                        );
                        self.recorder.warning(&at, "Failed", "Error: ErrImagePull");
                        Err(("ErrImagePull".into(), e.runtime_message()))
                    }
                }
            }
        }
    }

    /// Creates and starts attempt `attempt` of container `c` in the pod's sandbox.
    async fn start_container(
        &self,
        pod: &Pod,
        c: &Container,
        attempt: u32,
        observed: &Observed,
        prepared: &volumes::Prepared,
    ) -> Result<(), (String, String)> {
        let sandbox = observed
            .sandbox
            .as_ref()
            .ok_or_else(|| ("ContainerCreating".to_owned(), "no sandbox".to_owned()))?;
        self.ensure_image(pod, c).await?;
        let pod_ip = sandbox.ip.as_deref();
        let envs = env::resolve(&self.client, pod, c, pod_ip, Some(&self.host_ip))
            .await
            .map_err(|e| ("CreateContainerConfigError".to_owned(), e.to_string()))?;
        let mut mounts = volumes::mounts(c, prepared, &envs)
            .map_err(|e| ("CreateContainerConfigError".to_owned(), e.to_string()))?;
        // The kubelet's own /etc/hosts (not for host-network pods, nor over the container's
        // own mount there), as upstream.
        if !spec::host_network(pod)
            && let Some(ip) = pod_ip
            && !mounts.iter().any(|m| m.container_path == "/etc/hosts")
        {
            let dir = self.layout.pod_dir(&pod.uid().unwrap_or_default());
            let file = dir.join("etc-hosts");
            let text = spec::hosts_file(pod, ip, &self.layout.cluster_domain);
            std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(&file, text))
                .map_err(|e| {
                    (
                        "CreateContainerConfigError".to_owned(),
                        format!("writing {}: {e}", file.display()),
                    )
                })?;
            mounts.push(crate::cri::Mount {
                container_path: "/etc/hosts".into(),
                host_path: file.display().to_string(),
                ..Default::default()
            });
        }
        // The termination message file, written by the container and read when it exits
        // (upstream's: an empty, world-writable file per container attempt).
        let path = spec::termination_path(c).to_owned();
        if !mounts.iter().any(|m| m.container_path == path) {
            let dir = self
                .layout
                .pod_dir(&pod.uid().unwrap_or_default())
                .join("termination-log");
            let file = dir.join(format!("{}-{attempt}", c.name));
            let made = std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(&file, b""))
                .and_then(|()| {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666))
                });
            made.map_err(|e| {
                (
                    "CreateContainerConfigError".to_owned(),
                    format!("writing {}: {e}", file.display()),
                )
            })?;
            mounts.push(crate::cri::Mount {
                container_path: path,
                host_path: file.display().to_string(),
                ..Default::default()
            });
        }
        // Devices of extended resources, from their plugins' Allocate.
        let given = self
            .devices
            .allocate(pod, c)
            .await
            .map_err(|e| ("UnexpectedAdmissionError".to_owned(), e))?;
        let mut envs = envs;
        envs.extend(given.envs);
        mounts.extend(given.mounts);
        let mut config = spec::container_config(pod, c, attempt, envs, mounts, &self.layout.node);
        config.devices.extend(given.devices);
        let sandbox_config = spec::sandbox_config(pod, &self.layout, sandbox.attempt);
        let id = self
            .cri
            .create_container(&sandbox.id, config, sandbox_config)
            .await
            .map_err(|e| ("CreateContainerError".to_owned(), e.to_string()))?;
        let at = container_ref(pod, &c.name);
        self.recorder
            .normal(&at, "Created", format!("Created container: {}", c.name));
        if let Err(e) = self.cri.start_container(&id).await {
            let _ = self.cri.remove_container(&id).await;
            return Err(("RunContainerError".to_owned(), e.to_string()));
        }
        self.recorder
            .normal(&at, "Started", format!("Started container {}", c.name));
        // postStart runs once the container has started; the pod's other containers wait
        // for it, and a failure kills the container, as upstream's kubelet.
        if let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let ip = if spec::host_network(pod) {
                self.host_ip.clone()
            } else {
                pod_ip.unwrap_or_default().to_owned()
            };
            if let Err(e) = self.run_hook(hook, c, &id, &ip, 120).await {
                let message = format!("PostStartHook failed: {e}");
                self.recorder
                    .warning(&at, "FailedPostStartHook", message.clone());
                self.recorder.normal(&at, "Killing", "FailedPostStartHook");
                let _ = self.cri.stop_container(&id, 0).await;
                return Err(("PostStartHookError".to_owned(), message));
            }
        }
        crate::metrics::get().container_started();
        // Keep the newest exited container (for `lastState` and `logs --previous`) only.
        for old in observed
            .containers
            .get(&c.name)
            .into_iter()
            .flatten()
            .skip(1)
        {
            let _ = self.cri.remove_container(&old.id).await;
        }
        Ok(())
    }

    /// Starts container `name` (init or app) and records the outcome.
    async fn start(
        &self,
        pod: &Pod,
        name: &str,
        observed: &Observed,
        prepared: &volumes::Prepared,
    ) -> bool {
        let uid = pod.uid().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let ephemeral = spec::ephemeral_containers(pod);
        let Some(c) = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .chain(ephemeral.iter())
            .find(|c| c.name == name)
        else {
            return false;
        };
        let attempt = observed.latest(name).map_or(0, |r| r.attempt + 1);
        if self.pull_waits(&uid, name) {
            if self.pull_just_failed(&uid, name) {
                return false;
            }
            let message = match self.failures(&uid).get(name) {
                Some((reason, message)) if reason == "ImagePullBackOff" => message.clone(),
                before => format!(
                    "Back-off pulling image \"{}\"{}",
                    c.image.as_deref().unwrap_or_default(),
                    before.map(|(_, m)| format!(": {m}")).unwrap_or_default()
                ),
            };
            let at = container_ref(pod, name);
            self.recorder.normal(
                &at,
                "BackOff",
                format!(
                    "Back-off pulling image \"{}\"",
                    c.image.as_deref().unwrap_or_default()
                ),
            );
            self.recorder
                .warning(&at, "Failed", "Error: ImagePullBackOff");
            self.set_failure(&uid, name, Some(("ImagePullBackOff".into(), message)));
            return false;
        }
        let outcome = self
            .start_container(pod, c, attempt, observed, prepared)
            .await;
        let pull_failed = matches!(&outcome, Err((r, _)) if r == "ErrImagePull");
        if pull_failed || outcome.is_ok() {
            self.pull_done(&uid, name, pull_failed);
        }
        match outcome {
            Ok(()) => {
                self.set_failure(&uid, name, None);
                true
            }
            Err((reason, message)) => {
                tracing::warn!(pod = %pod.name_any(), container = name, %reason, %message, "container did not start");
                // Pull failures have had their events in ensure_image.
                if !matches!(reason.as_str(), "ErrImagePull" | "ErrImageNeverPull") {
                    self.recorder.warning(
                        &container_ref(pod, name),
                        "Failed",
                        format!("Error: {message}"),
                    );
                }
                self.set_failure(&uid, name, Some((reason, message)));
                false
            }
        }
    }

    /// Starts the containers `names` (volumes written first, once per pass); true if any
    /// started.
    async fn start_all(
        &self,
        pod: &Pod,
        names: &[&str],
        observed: &Observed,
        prepared: &mut Option<volumes::Prepared>,
    ) -> Result<bool> {
        if prepared.is_none() {
            let ip = observed.sandbox.as_ref().and_then(|s| s.ip.clone());
            let ready = volumes::prepare(&self.client, &self.layout, pod, ip.as_deref())
                .await
                .map_err(|e| Error::Pod(e.to_string()))?;
            *prepared = Some(ready);
        }
        let prepared = prepared.as_ref().expect("prepared above");
        let mut any = false;
        for name in names {
            any |= self.start(pod, name, observed, prepared).await;
        }
        Ok(any)
    }

    /// Records a Warning event about the pod.
    fn warn(&self, pod: &Pod, reason: &str, note: String) {
        self.recorder
            .warning(&kube::Resource::object_ref(pod, &()), reason, note);
    }

    /// Starts a new sandbox (after stopping a dead one).
    async fn start_sandbox(&self, pod: &Pod, attempt: u32, observed: &Observed) -> Result<()> {
        if let Some(old) = &observed.sandbox {
            let _ = self.cri.stop_sandbox(&old.id).await;
        }
        let config = spec::sandbox_config(pod, &self.layout, attempt);
        std::fs::create_dir_all(&config.log_directory)
            .map_err(crate::error::io(&config.log_directory))?;
        let id = self.cri.run_sandbox(config).await?;
        crate::metrics::get().pod_started();
        match self.cri.sandbox_ip_and_pid(&id).await {
            Ok((Some(ip), pid)) => announce(&ip, pid).await,
            Ok((None, _)) => {}
            Err(e) => {
                tracing::debug!(sandbox = %id, error = %e, "reading the new sandbox's status")
            }
        }
        Ok(())
    }

    /// Runs the container's preStop hook (exec or httpGet), bounded by `grace` seconds.
    async fn pre_stop(&self, c: &Container, id: &str, pod_ip: &str, grace: i64) {
        let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) else {
            return;
        };
        if let Err(e) = self.run_hook(hook, c, id, pod_ip, grace).await {
            tracing::info!(container = %c.name, error = %e, "preStop hook failed");
        }
    }

    /// Runs a lifecycle handler (exec, HTTP GET or sleep) within `limit` seconds; `Err` says
    /// how it failed, as upstream's handler runner words it.
    async fn run_hook(
        &self,
        hook: &k8s_openapi::api::core::v1::LifecycleHandler,
        c: &Container,
        id: &str,
        pod_ip: &str,
        limit: i64,
    ) -> std::result::Result<(), String> {
        let limit_d = Duration::from_secs(limit.max(1) as u64);
        if let Some(exec) = &hook.exec {
            let cmd = exec.command.clone().unwrap_or_default();
            let shown = format!("{cmd:?}");
            return match tokio::time::timeout(limit_d, self.cri.exec_sync(id, cmd, limit.max(1)))
                .await
            {
                Ok(Ok(r)) if r.exit_code == 0 => Ok(()),
                Ok(Ok(r)) => Err(format!(
                    "command '{shown}' exited with {}: {}",
                    r.exit_code,
                    String::from_utf8_lossy(&r.stderr)
                )),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("command '{shown}' timed out")),
            };
        }
        if let Some(http) = &hook.http_get {
            let probe = k8s_openapi::api::core::v1::Probe {
                http_get: Some(http.clone()),
                timeout_seconds: Some(limit.max(1) as i32),
                ..Default::default()
            };
            return match tokio::time::timeout(
                limit_d,
                probe::run_once(&self.cri, &probe, c, id, pod_ip),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err("the HTTP hook timed out".into()),
            };
        }
        if let Some(sleep) = &hook.sleep {
            tokio::time::sleep(Duration::from_secs(
                sleep.seconds.clamp(0, limit.max(0)) as u64
            ))
            .await;
        }
        Ok(())
    }

    /// Stops the pod's containers within `grace` seconds (after their preStop hooks), removes
    /// its sandboxes and folder.
    pub async fn teardown(&self, uid: &str, grace: i64, pod: Option<&Pod>) -> Result<()> {
        let observed = Observed::read(&self.cri, uid).await?;
        self.stop(&observed, grace, pod).await;
        for id in observed
            .sandbox
            .iter()
            .map(|s| &s.id)
            .chain(observed.old_sandboxes.iter())
        {
            self.cri.stop_sandbox(id).await?;
            self.cri.remove_sandbox(id).await?;
        }
        volumes::remove(&self.layout, uid).await?;
        self.forget(uid);
        Ok(())
    }

    /// Stops a pod's running containers: preStop hooks, then SIGTERM and, after what is left
    /// of the grace period, SIGKILL (a `Killing` event each).
    async fn stop(&self, observed: &Observed, grace: i64, pod: Option<&Pod>) {
        let pod_ip = observed
            .sandbox
            .as_ref()
            .and_then(|s| s.ip.clone())
            .unwrap_or_default();
        let started = std::time::Instant::now();
        let hooks: Vec<_> = pod
            .and_then(|p| p.spec.as_ref())
            .into_iter()
            .flat_map(|s| s.containers.iter())
            .filter_map(|c| {
                let run = observed.latest(&c.name)?;
                matches!(run.run, observed::Run::Running { .. })
                    .then(|| self.pre_stop(c, &run.id, &pod_ip, grace))
            })
            .collect();
        futures::future::join_all(hooks).await;
        // What the hooks used comes out of the grace period.
        let left = (grace - started.elapsed().as_secs() as i64).max(0);
        let running: Vec<_> = observed
            .containers
            .iter()
            .flat_map(|(name, runs)| runs.iter().map(move |r| (name, r)))
            .filter(|(_, c)| matches!(c.run, observed::Run::Running { .. }))
            .map(|(name, c)| {
                if let Some(pod) = pod {
                    self.recorder.normal(
                        &container_ref(pod, name),
                        "Killing",
                        format!("Stopping container {name}"),
                    );
                }
                self.cri.stop_container(&c.id, left)
            })
            .collect();
        for r in futures::future::join_all(running).await {
            if let Err(e) = r {
                tracing::warn!(error = %e, "stopping a container");
            }
        }
    }

    /// Removes the pod from the API (grace 0, this very pod only) once it has stopped.
    pub(crate) async fn remove(&self, pod: &Pod) -> Result<()> {
        self.admitted
            .lock()
            .expect("admitted lock")
            .remove(&pod.uid().unwrap_or_default());
        Ok(finish_deletion(&self.client, pod).await?)
    }

    async fn write_status(
        &self,
        pod: &Pod,
        status: k8s_openapi::api::core::v1::PodStatus,
    ) -> Result<()> {
        if !status::changed(pod.status.as_ref(), &status) {
            return Ok(());
        }
        // As upstream's status manager: what the kubelet computes is written when it changes;
        // a status someone else changed is put back only on the periodic reconcile (10 s),
        // not at once (a DaemonSet's failed pod must be seen failed to be replaced).
        let uid = pod.uid().unwrap_or_default();
        if let Some((last, at)) = self.written.lock().expect("written lock").get(&uid)
            && !status::changed(Some(last), &status)
            && at.elapsed() < STATUS_RECONCILE
        {
            return Ok(());
        }
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        // This very pod (its uid), as upstream's status manager: a pod replaced under the
        // same name is not written over. A static pod's status goes to its mirror pod,
        // which has a uid of its own.
        let from_file = pod
            .annotations()
            .get(mirror::SOURCE)
            .is_some_and(|s| s == "file");
        let patch = if from_file {
            serde_json::json!({"status": status})
        } else {
            serde_json::json!({"metadata": {"uid": uid}, "status": status})
        };
        match api
            .patch_status(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {
                self.written
                    .lock()
                    .expect("written lock")
                    .insert(uid, (status, std::time::Instant::now()));
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// How often a status someone else changed is put back (upstream's status manager syncs
/// every 10 s).
const STATUS_RECONCILE: Duration = Duration::from_secs(10);

/// How long until the pod's activeDeadlineSeconds passes, counted from its start time.
fn deadline_left(pod: &Pod, now: i64) -> Option<Duration> {
    let seconds = pod.spec.as_ref()?.active_deadline_seconds?;
    let start = pod.status.as_ref()?.start_time.as_ref()?.0.as_nanosecond() as i64;
    let end = start + seconds.max(0) * 1_000_000_000;
    Some(Duration::from_nanos((end - now).max(0) as u64))
}

/// Stops a pod past its deadline and reports it Failed with reason DeadlineExceeded.
async fn fail_deadline(pod: &Pod, w: &Worker, shape: &Shape) -> Result<Action> {
    const MESSAGE: &str = "Pod was active on the node longer than the specified deadline";
    let uid = pod.uid().unwrap_or_default();
    let already = pod
        .status
        .as_ref()
        .is_some_and(|s| s.reason.as_deref() == Some("DeadlineExceeded"));
    if !already {
        w.recorder.normal(
            &kube::Resource::object_ref(pod, &()),
            "DeadlineExceeded",
            MESSAGE.to_owned(),
        );
    }
    let grace = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    let observed = Observed::read(&w.cri, &uid).await?;
    w.stop(&observed, grace, Some(pod)).await;
    if let Some(s) = observed.sandbox.as_ref().filter(|s| s.ready) {
        w.cri.stop_sandbox(&s.id).await?;
    }
    let observed = Observed::read(&w.cri, &uid).await?;
    let failures = w.failures(&uid);
    let mut new = status::compute(
        pod,
        shape,
        &observed,
        &State::Finished { succeeded: false },
        &status::Reports {
            failures: &failures,
            probes: &HashMap::new(),
        },
        &w.host_ip,
        spec::host_network(pod),
        now_ns(),
    );
    new.reason = Some("DeadlineExceeded".into());
    new.message = Some(MESSAGE.into());
    // The phase changes with it, so the status manager writes it (reason and message too).
    w.write_status(pod, new).await?;
    Ok(Action::await_change())
}

/// One pass over one pod.
/// Syncs one pod (see [`sync`]), timing it for `kubelet_pod_worker_duration_seconds`.
pub async fn reconcile(pod: Arc<Pod>, w: Arc<Worker>) -> Result<Action> {
    let started = std::time::Instant::now();
    let r = sync(pod, w).await;
    crate::metrics::get().pod_synced("sync", started.elapsed().as_secs_f64());
    r
}

/// Brings one pod's sandbox and containers to its spec, or tears it down.
async fn sync(pod: Arc<Pod>, w: Arc<Worker>) -> Result<Action> {
    let uid = pod.uid().unwrap_or_default();
    if mirror::is_mirror(&pod) {
        // Its static pod runs from the manifest; a deleted mirror goes (and is made again).
        if pod.metadata.deletion_timestamp.is_some() {
            w.remove(&pod).await?;
        }
        return Ok(Action::await_change());
    }
    if pod.metadata.deletion_timestamp.is_some() {
        let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(30);
        w.teardown(&uid, grace, Some(&pod)).await?;
        w.remove(&pod).await?;
        return Ok(Action::await_change());
    }
    let shape = shape(&pod);
    // activeDeadlineSeconds (upstream's activeDeadlineHandler): past it, the pod's containers
    // are stopped and it fails with DeadlineExceeded; before it, look again when it is due.
    let deadline = deadline_left(&pod, now_ns());
    if deadline.is_some_and(|d| d.is_zero()) {
        return fail_deadline(&pod, &w, &shape).await;
    }
    let mut prepared: Option<volumes::Prepared> = None;
    let mut requeue = Some(deadline.map_or(RELIST, |d| d.min(RELIST)));
    // Where a pass spends its time (logged at debug: the pod-start profile of node-bench).
    let pass = std::time::Instant::now();
    let mut steps: Vec<(&str, Duration)> = Vec::new();
    let mut step = |name: &'static str, since: &mut std::time::Instant| {
        steps.push((name, since.elapsed()));
        *since = std::time::Instant::now();
    };
    let mut since = pass;
    // As upstream's pod worker: a runtime that cannot say what the pod has (down, refusing)
    // is a FailedSync event with its answer, and the pass is tried again.
    let mut observed = match Observed::read(&w.cri, &uid).await {
        Ok(o) => o,
        Err(e) => {
            w.warn(
                &pod,
                "FailedSync",
                format!("error determining status: {}", e.runtime_message()),
            );
            // A pod the runtime never saw shows its containers waiting in ContainerCreating
            // (PodInitializing behind init containers) rather than a bare Pending.
            let unseen = pod.status.as_ref().is_none_or(|s| {
                s.container_statuses.is_none() && s.init_container_statuses.is_none()
            });
            if unseen {
                let none = Observed::default();
                let new = status::compute(
                    &pod,
                    &shape,
                    &none,
                    &plan::state(&shape, &none, now_ns()),
                    &status::Reports {
                        failures: &w.failures(&uid),
                        probes: &HashMap::new(),
                    },
                    &w.host_ip,
                    spec::host_network(&pod),
                    now_ns(),
                );
                if let Err(e) = w.write_status(&pod, new).await {
                    tracing::info!(pod = %pod.name_any(), error = %e, "writing the waiting status");
                }
            }
            return Err(e);
        }
    };
    step("observe", &mut since);
    let rejected = pod.status.as_ref().is_some_and(|s| {
        s.phase.as_deref() == Some("Failed") && s.reason.as_deref() == Some("NodePorts")
    });
    if rejected || !w.admit(&pod, observed.sandbox.is_some()).await? {
        return Ok(Action::await_change());
    }
    // A few steps per pass: sandbox, then init containers or the app containers, so that a
    // new pod reaches Running in one pass.
    for _ in 0..8 {
        let state = plan::state(&shape, &observed, now_ns());
        let name = match &state {
            State::NoSandbox { .. } => "sandbox",
            State::Initializing { .. } => "init-container",
            State::Running { .. } => "containers",
            _ => "other",
        };
        let acted = match &state {
            State::NoSandbox { attempt } => {
                match w.start_sandbox(&pod, *attempt, &observed).await {
                    Ok(()) => true,
                    // As upstream: the pod stays Pending with its containers waiting in
                    // ContainerCreating, an event says why, and the sandbox is retried.
                    Err(e) => {
                        tracing::warn!(pod = %pod.name_any(), error = %e, "pod sandbox not created");
                        w.warn(
                            &pod,
                            "FailedCreatePodSandBox",
                            format!("Failed to create pod sandbox: {e}"),
                        );
                        requeue = Some(plan::BACKOFF_BASE);
                        false
                    }
                }
            }
            State::Initializing { index, wait } => {
                if wait.is_zero() {
                    let names = [shape.init[*index].as_str()];
                    let ok = w.start_all(&pod, &names, &observed, &mut prepared).await?;
                    if !ok {
                        requeue = Some(w.retry_after(&uid));
                    }
                    ok
                } else {
                    requeue = Some(*wait);
                    false
                }
            }
            State::InitRunning { .. } => false,
            State::Running { start, wait } => {
                if let Some(wait) = wait {
                    requeue = Some((*wait).min(RELIST));
                }
                if start.is_empty() {
                    false
                } else {
                    let names: Vec<&str> = start
                        .iter()
                        .map(|i| shape.containers[*i].as_str())
                        .collect();
                    let any = w.start_all(&pod, &names, &observed, &mut prepared).await?;
                    if !any {
                        requeue = Some(w.retry_after(&uid));
                    }
                    any
                }
            }
            State::Finished { .. } => {
                if let Some(s) = observed.sandbox.as_ref().filter(|s| s.ready) {
                    w.cri.stop_sandbox(&s.id).await?;
                    true
                } else {
                    requeue = None;
                    false
                }
            }
        };
        if !acted {
            break;
        }
        step(name, &mut since);
        observed = Observed::read(&w.cri, &uid).await?;
        step("observe", &mut since);
    }
    let mut state = plan::state(&shape, &observed, now_ns());
    // Ephemeral containers (`kubectl debug`) start once in a running pod and never again.
    if matches!(state, State::Running { .. }) {
        let ephemeral = spec::ephemeral_containers(&pod);
        let new: Vec<&str> = ephemeral
            .iter()
            .map(|c| c.name.as_str())
            .filter(|name| observed.latest(name).is_none())
            .collect();
        if !new.is_empty() {
            if w.start_all(&pod, &new, &observed, &mut prepared).await? {
                observed = Observed::read(&w.cri, &uid).await?;
                state = plan::state(&shape, &observed, now_ns());
            } else {
                requeue = Some(w.retry_after(&uid));
            }
        }
    }
    // configMap, secret, downwardAPI and projected volumes follow the API while the pod
    // runs (upstream's periodic sync), at most every VOLUME_REFRESH.
    if matches!(state, State::Running { .. } | State::InitRunning { .. })
        && volumes::has_followed(&pod)
    {
        let due = {
            let mut r = w.refreshed.lock().expect("refresh lock");
            let due = r.get(&uid).is_none_or(|t| t.elapsed() >= VOLUME_REFRESH);
            if due {
                r.insert(uid.clone(), std::time::Instant::now());
            }
            due
        };
        if due {
            let ip = observed.sandbox.as_ref().and_then(|s| s.ip.clone());
            if let Err(e) = volumes::refresh(&w.client, &w.layout, &pod, ip.as_deref()).await {
                tracing::info!(pod = %pod.name_any(), error = %e, "refreshing volumes");
            }
        }
    }
    // Probes of the running app containers; a failed liveness probe restarts the container.
    let mut verdicts: HashMap<String, probe::Verdict> = HashMap::new();
    if matches!(state, State::Running { .. }) {
        let ip = if spec::host_network(&pod) {
            w.host_ip.clone()
        } else {
            observed
                .sandbox
                .as_ref()
                .and_then(|s| s.ip.clone())
                .unwrap_or_default()
        };
        let grace = pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30);
        let mut killed = false;
        for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
            let Some(run) = observed.latest(&c.name) else {
                continue;
            };
            let observed::Run::Running { started } = run.run else {
                continue;
            };
            let (verdict, failed) = w.probes.check(&w.cri, c, &run.id, started, &ip).await;
            for (kind, message) in failed {
                w.recorder.warning(
                    &container_ref(&pod, &c.name),
                    "Unhealthy",
                    format!("{} probe failed: {message}", kind.name()),
                );
            }
            if verdict.kill {
                tracing::info!(pod = %pod.name_any(), container = %c.name, "probe failed; restarting the container");
                let which = if verdict.started {
                    "liveness"
                } else {
                    "startup"
                };
                w.recorder.normal(
                    &container_ref(&pod, &c.name),
                    "Killing",
                    format!(
                        "Container {} failed {which} probe, will be restarted",
                        c.name
                    ),
                );
                w.cri.stop_container(&run.id, grace).await?;
                killed = true;
            }
            verdicts.insert(c.name.clone(), verdict);
        }
        if killed {
            observed = Observed::read(&w.cri, &uid).await?;
            state = plan::state(&shape, &observed, now_ns());
        }
    }
    let failures = w.failures(&uid);
    let new = status::compute(
        &pod,
        &shape,
        &observed,
        &state,
        &status::Reports {
            failures: &failures,
            probes: &verdicts,
        },
        &w.host_ip,
        spec::host_network(&pod),
        now_ns(),
    );
    for cs in new
        .container_statuses
        .iter()
        .flatten()
        .chain(new.init_container_statuses.iter().flatten())
    {
        let waiting = cs.state.as_ref().and_then(|s| s.waiting.as_ref());
        if waiting.and_then(|w| w.reason.as_deref()) == Some("CrashLoopBackOff") {
            w.recorder.warning(
                &container_ref(&pod, &cs.name),
                "BackOff",
                format!(
                    "Back-off restarting failed container {} in pod {}_{}({uid})",
                    cs.name,
                    pod.name_any(),
                    pod.namespace().unwrap_or_default()
                ),
            );
        }
    }
    step("probes-and-status", &mut since);
    w.write_status(&pod, new).await?;
    step("status-write", &mut since);
    tracing::debug!(
        pod = %pod.name_any(),
        total_ms = pass.elapsed().as_secs_f64() * 1e3,
        steps = %steps
            .iter()
            .map(|(n, d)| format!("{n}={:.1}ms", d.as_secs_f64() * 1e3))
            .collect::<Vec<_>>()
            .join(" "),
        "pod sync pass"
    );
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}

/// Finishes a pod's deletion once nothing runs it any more: a delete at grace 0 of this very
/// pod (its uid), as upstream's kubelet does; a pod already gone, or replaced, is fine.
pub async fn finish_deletion(client: &kube::Client, pod: &Pod) -> kube::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&pod.name_any(), &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Addresses are handed out again, and the node and the pods on its bridge may still hold the
/// MAC of the pod that had this one: a STALE neighbour entry, used for seconds before it is
/// probed, during which the new pod is unreachable from them. The node's entry is dropped, and
/// the pod (its sandbox process `pid`) announces itself with a gratuitous ARP from its own
/// network namespace, which every neighbour holding an entry for it takes.
async fn announce(ip: &str, pid: Option<u32>) {
    crate::containerd::quiet("ip", &["neigh", "flush", "to", ip]).await;
    let Some(pid) = pid.filter(|_| ip.contains('.')) else {
        return;
    };
    let pid = pid.to_string();
    crate::containerd::quiet(
        "nsenter",
        &[
            "-t", &pid, "-n", "busybox", "arping", "-q", "-U", "-c", "1", "-I", "eth0", "-s", ip,
            ip,
        ],
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_port(uid: &str, host_ip: Option<&str>, port: i32, phase: Option<&str>) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": uid, "uid": uid},
                "spec": {"containers": [{"name": "c", "ports": [
                    {"containerPort": 80, "hostPort": port, "hostIP": host_ip, "protocol": "TCP"}]}]},
                "status": {"phase": phase},
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_pod_whose_host_port_is_taken_is_not_admitted() {
        let running = with_port("a", None, 21017, Some("Running"));
        let admitted = vec![running.clone()];
        assert!(!ports_free(&with_port("b", None, 21017, None), &admitted));
        assert!(!ports_free(
            &with_port("b", Some("10.0.0.1"), 21017, None),
            &admitted
        ));
        assert!(ports_free(&with_port("b", None, 21018, None), &admitted));
        // A pod does not collide with itself, nor with finished pods.
        assert!(ports_free(&running, &admitted));
        let done = vec![with_port("a", None, 21017, Some("Failed"))];
        assert!(ports_free(&with_port("b", None, 21017, None), &done));
        // Different addresses do not collide.
        let one = vec![with_port("a", Some("10.0.0.1"), 21017, Some("Running"))];
        assert!(ports_free(
            &with_port("b", Some("10.0.0.2"), 21017, None),
            &one
        ));
    }
}
