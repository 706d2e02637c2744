//! `minik8s join`: makes this machine a node of a cluster with nothing copied by hand, as
//! `kubeadm join` (discovery with a bootstrap token and a CA pin) plus the kubelet's TLS
//! bootstrap (a CSR the cluster approves and signs), then runs the node (kubelet on its
//! private containerd, proxy, cluster DNS) in the foreground, renewing its certificate before
//! it expires.

use minik8s_kubeconfig::join::{self, Discovery, JoinError};
use minik8s_kubeconfig::kubeconfig::User;
use minik8s_types::bootstrap::Token;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What `minik8s join` runs.
#[derive(Clone, Debug)]
pub struct JoinConfig {
    /// The apiserver URL (`https://host:port`).
    pub server: String,
    /// The bootstrap token.
    pub token: Token,
    /// The CA pins (`sha256:<hex>`).
    pub ca_hashes: Vec<String>,
    /// This node's name.
    pub node_name: String,
    /// This node's folder: `pki/ca.crt`, `kubelet.kubeconfig`, `node/`, `manifests/`.
    pub data_dir: PathBuf,
    /// The node's InternalIP (default: the source address of the default route).
    pub node_ip: Option<String>,
    /// Image archives imported into the node's runtime.
    pub images: Vec<PathBuf>,
    /// The registry the node's runtime pulls docker.io and registry.k8s.io images from.
    pub registry_mirror: Option<String>,
    /// Where the node's HTTP router listens (`None`: no router).
    pub router: Option<SocketAddr>,
    /// How long to wait for the certificate.
    pub csr_timeout: Duration,
    /// How long discovery keeps trying (server unreachable, token not signed yet).
    pub discovery_timeout: Duration,
    /// Where the node's client-side balancer over the apiservers listens (its kubeconfig
    /// names it).
    pub balancer: SocketAddr,
}

/// Why a join failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Discovery or TLS bootstrap.
    #[error(transparent)]
    Join(#[from] JoinError),
    /// A client for the node's own kubeconfig.
    #[error("connecting as the node")]
    Client(#[from] minik8s_kubeconfig::ClientError),
    /// The kubelet.
    #[error(transparent)]
    Kubelet(#[from] minik8s_kubelet::Error),
    /// The client-side balancer over the apiservers.
    #[error(transparent)]
    Balancer(#[from] minik8s_balancer::Error),
    /// A file.
    #[error("writing {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl JoinConfig {
    /// The node's kubeconfig, written by the TLS bootstrap.
    pub fn kubeconfig(&self) -> PathBuf {
        self.data_dir.join("kubelet.kubeconfig")
    }

    fn ca_path(&self) -> PathBuf {
        self.data_dir.join("pki/ca.crt")
    }

    /// The kubelet's configuration (pod CIDR left to the node IPAM controller).
    pub fn kubelet(&self) -> minik8s_kubelet::Config {
        let mut cfg = minik8s_kubelet::Config::new(&self.node_name, self.data_dir.join("node"));
        cfg.runtime.pod_cidr = String::new();
        cfg.node_ip = self.node_ip.clone();
        cfg.images = self.images.clone();
        cfg.runtime.registry_mirror = self.registry_mirror.clone();
        cfg.manifests = Some(self.data_dir.join("manifests"));
        cfg.client_ca = Some(self.ca_path());
        cfg
    }
}

fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Discovery and TLS bootstrap: verifies the cluster, obtains the node's certificate and
/// writes its kubeconfig and the CA. Nothing is created in the cluster before the cluster is
/// verified, and no Node before the certificate is issued.
pub async fn bootstrap(cfg: &JoinConfig) -> Result<(), Error> {
    let d = discover(cfg).await?;
    let client = bootstrap_client(&d, &cfg.token).await?;
    let (cert, key) =
        join::request_node_certificate(client, &cfg.node_name, cfg.csr_timeout).await?;
    write_identity(cfg, &d, &cert, &key)?;
    tracing::info!(node = %cfg.node_name, "the node's client certificate was issued");
    Ok(())
}

/// Discovery: the cluster-info the token signed, checked against the CA pins.
async fn discover(cfg: &JoinConfig) -> Result<Discovery, JoinError> {
    let d = join::discover(
        &cfg.server,
        &cfg.token,
        &cfg.ca_hashes,
        cfg.discovery_timeout,
    )
    .await?;
    tracing::info!(server = %cfg.server, "cluster-info verified with the token and the CA pin");
    Ok(d)
}

/// Discovery, then a client authenticated with the bootstrap token.
pub(crate) async fn verified_client(cfg: &JoinConfig) -> Result<kube::Client, JoinError> {
    bootstrap_client(&discover(cfg).await?, &cfg.token).await
}

/// A client authenticated with the bootstrap token, for a verified cluster.
async fn bootstrap_client(d: &Discovery, token: &Token) -> Result<kube::Client, JoinError> {
    join::client(
        d,
        &token.user(),
        User {
            client_certificate_data: None,
            client_key_data: None,
            token: Some(token.to_string()),
        },
    )
    .await
}

fn write_identity(cfg: &JoinConfig, d: &Discovery, cert: &str, key: &str) -> Result<(), Error> {
    let pki = cfg.data_dir.join("pki");
    std::fs::create_dir_all(&pki).map_err(io(&pki))?;
    let ca = cfg.ca_path();
    std::fs::write(&ca, &d.ca_pem).map_err(io(&ca))?;
    join::write_node_kubeconfig(&cfg.kubeconfig(), d, &cfg.node_name, cert, key)?;
    Ok(())
}

/// The certificate's validity from the node's kubeconfig: (not after, lifetime) in seconds.
fn validity(kubeconfig: &std::path::Path) -> Option<(i64, i64)> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).ok()?;
    let data = kc
        .auth_infos
        .first()?
        .auth_info
        .as_ref()?
        .client_certificate_data
        .clone()?;
    use base64::Engine;
    let pem = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .ok()?,
    )
    .ok()?;
    let (start, end) = minik8s_kubeconfig::csr::validity(&pem).ok()?;
    Some((end, end - start))
}

/// Seconds until the node should renew: at 70–90 % of the lifetime, as upstream's
/// certificate manager (jittered so nodes do not renew at once); 0 if already due.
pub fn renew_in(not_after: i64, lifetime: i64, now: i64, jitter: f64) -> i64 {
    let per_mille = 700 + (200.0 * jitter.clamp(0.0, 1.0)).round() as i64;
    let at = not_after - lifetime + lifetime * per_mille / 1000;
    (at - now).max(0)
}

/// Joins (unless this folder already holds the node's identity) and runs the node until
/// `shutdown`, renewing the certificate before it expires (the kubelet and proxy restart on
/// the new one and adopt what runs). `ready` hears once the node's processes are started.
pub async fn run(
    cfg: JoinConfig,
    shutdown: CancellationToken,
    ready: impl FnOnce(),
) -> Result<(), Error> {
    if validity(&cfg.kubeconfig()).is_none_or(|(end, _)| end <= jiff::Timestamp::now().as_second())
    {
        bootstrap(&cfg).await?;
    } else {
        tracing::info!(kubeconfig = %cfg.kubeconfig().display(), "already joined; using the node's own certificate");
    }
    let pid = cfg.data_dir.join("minik8s.pid");
    std::fs::write(&pid, std::process::id().to_string()).map_err(io(&pid))?;
    // The kubelet and proxy reach the control plane through a local balancer over every
    // apiserver (as k3s agents do): seeded with the one joined, refreshed from
    // default/kubernetes, each checked with `/readyz`. The node's kubeconfig names it.
    let joined = host_port(&cfg.server);
    let ca_pem = std::fs::read_to_string(cfg.ca_path()).map_err(io(&cfg.ca_path()))?;
    let balancer = minik8s_balancer::start_with(
        cfg.balancer,
        std::slice::from_ref(&joined),
        minik8s_balancer::Health::Readyz(ca_pem),
        shutdown.clone(),
    )
    .await?;
    let balanced = format!("https://{}", balancer.addr());
    minik8s_kubeconfig::set_server(&cfg.kubeconfig(), &balanced)?;
    {
        let client = minik8s_kubeconfig::client_via(&cfg.kubeconfig(), &balanced).await?;
        minik8s_task::spawn(
            "apiserver-endpoints",
            refresh_servers(client, balancer.clone(), joined, shutdown.clone()),
        );
    }
    let mut ready = Some(ready);
    let result = loop {
        let client = minik8s_kubeconfig::client_via(&cfg.kubeconfig(), &balanced).await?;
        let mut node = cfg.kubelet();
        match minik8s_kubelet::node::await_pod_cidr(&client, &cfg.node_name, &shutdown).await? {
            Some(cidr) => node.runtime.pod_cidr = cidr,
            None => break Ok(()),
        }
        let run = shutdown.child_token();
        let tasks = tokio_util::task::TaskTracker::new();
        crate::start_node(
            &tasks,
            client.clone(),
            client,
            node,
            cfg.router,
            // As upstream's kube-proxy: plain HTTP on the node's loopback.
            Some(SocketAddr::from(([127, 0, 0, 1], 10249))),
            run.clone(),
        )
        .await;
        tasks.close();
        if let Some(ready) = ready.take() {
            ready();
        }
        let stopped = serve_until_renewed(&cfg, &balanced, &tasks, &shutdown).await;
        if stopped {
            break Ok(());
        }
        run.cancel();
        tasks.wait().await;
    };
    let _ = std::fs::remove_file(&pid);
    result
}

/// Runs until the node stops (`true`) or its certificate was renewed (`false`): waits for the
/// renewal point, renews with the node's own identity (selfnodeclient), and the caller then
/// restarts the kubelet and proxy on it. A failed renewal is retried (at least a few seconds
/// apart) on the running node.
async fn serve_until_renewed(
    cfg: &JoinConfig,
    balanced: &str,
    tasks: &tokio_util::task::TaskTracker,
    shutdown: &CancellationToken,
) -> bool {
    loop {
        let wait = validity(&cfg.kubeconfig())
            .map_or(3600, |(end, life)| {
                renew_in(end, life, jiff::Timestamp::now().as_second(), rand_unit())
            })
            .max(5);
        tracing::info!(seconds = wait, "the node's certificate is renewed in");
        tokio::select! {
            _ = shutdown.cancelled() => {
                tasks.wait().await;
                return true;
            }
            _ = tasks.wait() => return true,
            _ = tokio::time::sleep(Duration::from_secs(wait as u64)) => {}
        }
        match renew(cfg, balanced).await {
            Ok(()) => {
                tracing::info!(
                    "renewed the node's client certificate; restarting the kubelet and proxy on it"
                );
                return false;
            }
            Err(e) => {
                tracing::error!(error = %e, "renewing the node's certificate failed; retrying")
            }
        }
    }
}

/// `host:port` of an `https://host:port` URL (port 443 when it names none).
pub fn host_port(url: &str) -> String {
    let rest = url.trim_start_matches("https://").trim_end_matches('/');
    if rest
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        rest.to_owned()
    } else {
        format!("{rest}:443")
    }
}

/// Every 10 s, sets the balancer's servers to the apiservers `default/kubernetes` lists (its
/// EndpointSlice), the joined one kept last as a fallback.
async fn refresh_servers(
    client: kube::Client,
    balancer: minik8s_balancer::Balancer,
    joined: String,
    shutdown: CancellationToken,
) {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let slices: kube::Api<EndpointSlice> = kube::Api::namespaced(client, "default");
    loop {
        match slices.get("kubernetes").await {
            Ok(slice) => {
                let ports = slice.ports.unwrap_or_default();
                let port = ports.first().and_then(|p| p.port).unwrap_or(6443);
                let mut servers: Vec<String> = slice
                    .endpoints
                    .iter()
                    .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
                    .flat_map(|e| e.addresses.iter())
                    .map(|a| {
                        if a.contains(':') {
                            format!("[{a}]:{port}")
                        } else {
                            format!("{a}:{port}")
                        }
                    })
                    .collect();
                if !servers.contains(&joined) {
                    servers.push(joined.clone());
                }
                balancer.set_servers(&servers);
            }
            Err(e) => tracing::debug!(error = %e, "reading default/kubernetes"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
    }
}

fn rand_unit() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id().into());
    (h.finish() % 1000) as f64 / 1000.0
}

/// Obtains a new certificate with the current one and replaces the kubeconfig (still naming
/// the balancer at `balanced`).
async fn renew(cfg: &JoinConfig, balanced: &str) -> Result<(), Error> {
    let ca_pem = std::fs::read_to_string(cfg.ca_path()).map_err(io(&cfg.ca_path()))?;
    let d = Discovery {
        server: balanced.to_owned(),
        ca_pem,
    };
    let client = minik8s_kubeconfig::client(&cfg.kubeconfig()).await?;
    let (cert, key) =
        join::request_node_certificate(client, &cfg.node_name, cfg.csr_timeout).await?;
    write_identity(cfg, &d, &cert, &key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_reads_urls() {
        assert_eq!(host_port("https://10.0.0.1:6443"), "10.0.0.1:6443");
        assert_eq!(host_port("https://cp.example/"), "cp.example:443");
    }

    #[test]
    fn renewal_falls_between_70_and_90_percent_of_the_lifetime() {
        let (start, life) = (1_000_000, 1000);
        let end = start + life;
        assert_eq!(renew_in(end, life, start, 0.0), 700);
        assert_eq!(renew_in(end, life, start, 1.0), 900);
        assert_eq!(renew_in(end, life, start + 950, 0.5), 0);
    }
}
