//! A CRI runtime over the Docker Engine API, for machines that have Docker and nothing else
//! (the edge). The kubelet's pod worker drives it exactly as it drives containerd: the same
//! CRI calls, served here on a unix socket, become Docker calls.
//!
//! The mapping (the design's docker-compose one):
//! - a pod's sandbox is a pause container named `<pod>.pause` on the node's user network
//!   ([`Config::network`], a bridge over the node's pod subnet), with the pod's `app` and
//!   `k8s-app` labels as network aliases, so pods on the same machine find each other by
//!   them through Docker's DNS; other names go to the pod's DNS servers;
//! - each of the pod's containers is a Docker container named `<pod>.<container>` in the
//!   sandbox's network (and IPC, and PID when shared) namespace (`network_mode:
//!   container:<sandbox>`), so they talk over 127.0.0.1;
//! - volumes are bind mounts of the kubelet's folders; logs are Docker's own json-file logs,
//!   which the kubelet reads;
//! - everything the CRI must answer later (metadata, labels, annotations, the sandbox a
//!   container belongs to) is kept in Docker labels, so this runtime holds no state: a
//!   restarted edgelet sees its pods' containers as they are and adopts them.
//!
//! `exec`, `attach` and `port-forward` are served by the runtime's own stream server
//! ([`streams`]) on Docker's exec and attach and inside the sandbox's network namespace.
//!
//! Init containers in order, restart policies and back-off, probes and volumes are the
//! kubelet's, as on containerd. Not served: container statistics and host ports.

mod images;
mod names;
mod runtime;
mod streams;

use bollard::Docker;
use k8s_cri::v1::image_service_server::ImageServiceServer;
use k8s_cri::v1::runtime_service_server::RuntimeServiceServer;
use std::path::{Path, PathBuf};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Why the Docker runtime could not start or do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Docker's API answered with an error, or could not be reached.
    #[error("docker: {0}")]
    Docker(#[from] bollard::errors::Error),
    /// The node's network exists with another subnet.
    #[error(
        "docker network {network} has subnet {found}, not the node's pod subnet {wanted}: remove it or choose another network"
    )]
    NetworkMismatch {
        /// The network.
        network: String,
        /// Its subnet.
        found: String,
        /// The node's pod subnet.
        wanted: String,
    },
    /// A file could not be read or a socket bound.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The pod subnet is not an IPv4 CIDR.
    #[error("invalid pod subnet {0:?}")]
    Subnet(String),
}

/// The runtime's settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Docker's API socket (a path, or `unix://` followed by one).
    pub socket: String,
    /// The user network the pods join (created when missing).
    pub network: String,
    /// Its bridge's name on the machine.
    pub bridge: String,
    /// The pods' subnet (the network's; its first address is the gateway).
    pub pod_cidr: String,
    /// The image of the pods' pause containers.
    pub pause_image: String,
    /// The node's name: kept in a label of every container, so `down` removes only this
    /// node's.
    pub node: String,
}

/// The runtime's hold on Docker.
#[derive(Clone)]
pub struct Shim {
    docker: Docker,
    cfg: std::sync::Arc<Config>,
}

impl Shim {
    /// Connects to Docker (at the API version it speaks).
    pub async fn connect(cfg: Config) -> Result<Shim, Error> {
        let path = cfg.socket.trim_start_matches("unix://").to_owned();
        let docker = Docker::connect_with_unix(&path, 120, bollard::API_DEFAULT_VERSION)?
            .negotiate_version()
            .await?;
        Ok(Shim {
            docker,
            cfg: std::sync::Arc::new(cfg),
        })
    }

    /// Docker's version (`20.10.24+dfsg1`).
    pub async fn version(&self) -> Result<String, Error> {
        Ok(self.docker.version().await?.version.unwrap_or_default())
    }

    /// Creates the pods' network when missing; refuses one with another subnet.
    pub async fn ensure_network(&self) -> Result<(), Error> {
        let cfg = &self.cfg;
        let gateway = gateway(&cfg.pod_cidr).ok_or_else(|| Error::Subnet(cfg.pod_cidr.clone()))?;
        match self
            .docker
            .inspect_network(
                &cfg.network,
                None::<bollard::query_parameters::InspectNetworkOptions>,
            )
            .await
        {
            Ok(net) => {
                let found = net
                    .ipam
                    .and_then(|i| i.config)
                    .and_then(|c| c.into_iter().next())
                    .and_then(|c| c.subnet)
                    .unwrap_or_default();
                if found != cfg.pod_cidr {
                    return Err(Error::NetworkMismatch {
                        network: cfg.network.clone(),
                        found,
                        wanted: cfg.pod_cidr.clone(),
                    });
                }
                Ok(())
            }
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => {
                tracing::info!(network = %cfg.network, subnet = %cfg.pod_cidr, bridge = %cfg.bridge, "creating the pods' docker network");
                self.docker
                    .create_network(bollard::models::NetworkCreateRequest {
                        name: cfg.network.clone(),
                        driver: Some("bridge".into()),
                        ipam: Some(bollard::models::Ipam {
                            config: Some(vec![bollard::models::IpamConfig {
                                subnet: Some(cfg.pod_cidr.clone()),
                                gateway: Some(gateway),
                                ..Default::default()
                            }]),
                            ..Default::default()
                        }),
                        options: Some(
                            [(
                                "com.docker.network.bridge.name".to_owned(),
                                cfg.bridge.clone(),
                            )]
                            .into(),
                        ),
                        labels: Some([(names::NODE.to_owned(), cfg.node.clone())].into()),
                        ..Default::default()
                    })
                    .await?;
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Loads image archives (`docker save` format) into Docker.
    pub async fn load(&self, archives: &[PathBuf]) -> Result<(), Error> {
        for archive in archives {
            images::load(&self.docker, archive).await?;
        }
        Ok(())
    }

    /// Serves the CRI on the unix socket `socket` (and its stream server on a loopback port)
    /// until `shutdown`, on `tasks`.
    pub async fn serve(
        &self,
        socket: &Path,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Result<(), Error> {
        let _ = std::fs::remove_file(socket);
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir).map_err(|source| Error::Io {
                what: format!("creating {}", dir.display()),
                source,
            })?;
        }
        let listener = tokio::net::UnixListener::bind(socket).map_err(|source| Error::Io {
            what: format!("binding {}", socket.display()),
            source,
        })?;
        let streams = streams::Streams::start(self.docker.clone(), tasks, shutdown.clone()).await?;
        let runtime = RuntimeServiceServer::new(runtime::Runtime::new(self.clone(), streams));
        let images = ImageServiceServer::new(images::Images::new(self.clone()));
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        minik8s_task::spawn_on(tasks, "docker-cri", async move {
            if let Err(e) = tonic::transport::Server::builder()
                .add_service(runtime)
                .add_service(images)
                .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
                .await
            {
                tracing::error!(error = %e, "the docker runtime's CRI server stopped");
            }
        });
        Ok(())
    }

    /// Removes this node's pods' containers (running or not) and the pods' network.
    pub async fn down(&self) -> Result<usize, Error> {
        let ours = runtime::list(
            &self.docker,
            &[format!("{}={}", names::NODE, self.cfg.node)],
        )
        .await?;
        for c in &ours {
            let id = c.id.as_deref().unwrap_or_default();
            runtime::remove(&self.docker, id).await?;
        }
        match self.docker.remove_network(&self.cfg.network).await {
            Ok(())
            | Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(ours.len())
    }
}

/// The first host address of an IPv4 CIDR (the network's gateway).
fn gateway(cidr: &str) -> Option<String> {
    let (base, bits) = cidr.split_once('/')?;
    let base: std::net::Ipv4Addr = base.parse().ok()?;
    let bits: u32 = bits.parse().ok()?;
    if bits > 30 {
        return None;
    }
    let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
    Some(std::net::Ipv4Addr::from((u32::from(base) & mask) + 1).to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_gateway_is_the_subnets_first_address() {
        assert_eq!(super::gateway("10.88.0.0/24").as_deref(), Some("10.88.0.1"));
        assert_eq!(super::gateway("10.88.3.7/16").as_deref(), Some("10.88.0.1"));
        assert_eq!(super::gateway("10.88.0.0/31"), None);
        assert_eq!(super::gateway("nonsense"), None);
    }
}
