//! `minik8s`: the all-in-one binary. `minik8s up` runs a single-node cluster in the
//! foreground; `minik8s pki init` writes the cluster CA, certificates and kubeconfigs.

use anyhow::Context;
use clap::{Parser, Subcommand};
use minik8s::UpConfig;
use std::net::IpAddr;
use std::path::PathBuf;

/// jemalloc instead of glibc's malloc: the apiserver and controllers allocate and free many
/// small JSON values per request, and glibc's free lists (consolidation, unlinking) cost
/// about a fifth of the process's CPU under load (README, "Benchmarks → Scale").
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// A small, real Kubernetes.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs a single-node cluster in the foreground until SIGINT/SIGTERM.
    Up(UpArgs),
    /// Stops the cluster running on DATA_DIR and removes its pods, runtime, bridge, cgroups,
    /// mounts and iptables rules (the store and PKI stay).
    Down(UpArgs),
    /// Runs a control plane (and this machine's node, as `up`) and prints the command that
    /// joins other machines to it.
    Init(InitArgs),
    /// Joins this machine to a cluster as a node (discovery with a bootstrap token and a CA
    /// pin, then TLS bootstrapping) and runs the node in the foreground.
    Join(JoinArgs),
    /// Seals the keys every control-plane machine shares (CA, service-account and
    /// front-proxy keys, the etcd client identity) with a new certificate key into Secret
    /// kube-system/kubeadm-certs for two hours, and prints the key for `join --control-plane`
    /// (kubeadm's `init phase upload-certs --upload-certs`).
    UploadCerts {
        /// The key to seal them with (64 hex digits; default: a new random one).
        #[arg(long)]
        certificate_key: Option<String>,
        /// The control plane's data folder (its PKI and admin kubeconfig).
        #[arg(long, env = "MINIK8S_DATA_DIR", default_value = "/var/lib/minik8s")]
        data_dir: PathBuf,
    },
    /// Bootstrap tokens for joining nodes.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
        /// The cluster's data folder (its admin kubeconfig is used).
        #[arg(
            long,
            env = "MINIK8S_DATA_DIR",
            default_value = "/var/lib/minik8s",
            global = true
        )]
        data_dir: PathBuf,
    },
    /// Runs the apiserver alone in the foreground (the static control plane's
    /// `kube-apiserver` pod).
    Apiserver(UpArgs),
    /// Runs the controller manager in the foreground (the static control plane's
    /// `kube-controller-manager` pod; the same flags as the `controller-manager` binary).
    ControllerManager(minik8s_controllers::cli::Args),
    /// Runs one replica of the function-module controller (function bases as virtual nodes)
    /// in the foreground; replicas share the bases by racing for their node Leases.
    FunctionModules(minik8s_serverless::modules::Args),
    /// Runs one more edge registry replica (edges join through it and run as its virtual
    /// nodes; replicas share them by Lease races).
    EdgeRegistry(minik8s_edge::cloud::Args),
    /// Certificates and kubeconfigs.
    Pki {
        #[command(subcommand)]
        command: PkiCommand,
    },
}

#[derive(Subcommand, Debug)]
enum PkiCommand {
    /// Creates the cluster CA (once), the apiserver's serving certificate, and a client
    /// certificate plus kubeconfig for the admin and each component.
    Init(UpArgs),
    /// Issues the certificates of a private etcd cluster from the cluster CA (made first if
    /// needed): the members' serving and peer certificates under `pki/etcd/`, and the
    /// apiserver's etcd client certificate, which makes `--storage etcd://…` use TLS.
    /// `hack/etcd-cluster.sh` runs this.
    Etcd {
        /// Addresses the members are reached at, besides loopback (repeat or comma-separate).
        #[arg(long = "member-ip", value_delimiter = ',')]
        member_ips: Vec<IpAddr>,
        #[command(flatten)]
        args: UpArgs,
    },
    /// Issues the identity of another node NAME (a kubelet kubeconfig, `system:node:NAME`)
    /// and prints how to start its `kubelet` and `kube-proxy` against this cluster.
    Node {
        /// The joining node's name.
        name: String,
        #[command(flatten)]
        args: UpArgs,
    },
}

#[derive(Subcommand, Debug)]
enum TokenCommand {
    /// Creates a node bootstrap token (authentication and signing) and prints it.
    Create {
        /// The token to create (default: a random one).
        token: Option<String>,
        /// How long it is valid (a Go duration; 0 for ever).
        #[arg(long, default_value = "24h0m0s")]
        ttl: String,
        /// A description kept with the token.
        #[arg(long, default_value = "")]
        description: String,
        /// Print the whole `minik8s join` command instead of the token alone.
        #[arg(long)]
        print_join_command: bool,
    },
    /// Lists the bootstrap tokens.
    List,
    /// Deletes bootstrap tokens, given as ids or whole tokens.
    Delete {
        /// The tokens or token ids.
        #[arg(required = true)]
        tokens: Vec<String>,
    },
}

/// Options of `init`: those of `up`, and the join it prints.
#[derive(clap::Args, Debug)]
struct InitArgs {
    #[command(flatten)]
    up: UpArgs,
    /// The address other machines reach the apiserver at (default: the listen address, or
    /// this machine's address on its default route).
    #[arg(long)]
    advertise_address: Option<IpAddr>,
    /// How long the first bootstrap token is valid (a Go duration; 0 for ever).
    #[arg(long, default_value = "24h0m0s")]
    token_ttl: String,
    /// The first bootstrap token (default: a random one).
    #[arg(long)]
    token: Option<String>,
    /// Run the apiserver and the controller manager as static pods of this node (manifests
    /// in DATA_DIR/manifests), from the control-plane image.
    #[arg(long)]
    static_control_plane: bool,
    /// The control-plane image archive (`hack/control-plane-image.sh`; default:
    /// DATA_DIR/images/control-plane.tar).
    #[arg(long)]
    control_plane_image: Option<PathBuf>,
    /// Seal the keys control-plane machines share into Secret kube-system/kubeadm-certs (for
    /// two hours) and print the `join --control-plane` command with their certificate key.
    /// Needs the cluster on etcd (`--storage etcd://…`).
    #[arg(long)]
    upload_certs: bool,
    /// The certificate key for --upload-certs (64 hex digits; default: a new random one).
    #[arg(long, requires = "upload_certs")]
    certificate_key: Option<String>,
}

/// Options of `join`.
#[derive(clap::Args, Debug)]
struct JoinArgs {
    /// The apiserver: `https://HOST:PORT` or `HOST:PORT`.
    server: String,
    /// The bootstrap token (`minik8s token create` on the control plane).
    #[arg(long)]
    token: String,
    /// The pin of the cluster CA's public key, `sha256:<hex>` (repeatable).
    #[arg(long = "discovery-token-ca-cert-hash", required = true)]
    ca_hashes: Vec<String>,
    /// This node's name (default: the host name).
    #[arg(long, env = "MINIK8S_NODE_NAME")]
    node_name: Option<String>,
    /// This node's folder (its identity, runtime and pods).
    #[arg(long, env = "MINIK8S_DATA_DIR", default_value = "/var/lib/minik8s")]
    data_dir: PathBuf,
    /// This node's InternalIP (default: the source address of the default route).
    #[arg(long)]
    node_ip: Option<String>,
    /// Image archives imported into the node's runtime (default: DATA_DIR/images/*.tar).
    #[arg(long = "image", value_delimiter = ',')]
    images: Vec<PathBuf>,
    /// A registry mirror (`HOST:PORT`, plain HTTP, such as a site registry) the node pulls
    /// docker.io and registry.k8s.io images from. Without one, pulls go to the internet, and
    /// an image that is only imported waits for that to fail before it is used (use
    /// `imagePullPolicy: IfNotPresent` on machines with no internet).
    #[arg(long)]
    registry_mirror: Option<String>,
    /// Where the node's HTTP router listens.
    #[arg(long, default_value = "0.0.0.0:80")]
    router: std::net::SocketAddr,
    /// Run no HTTP router.
    #[arg(long)]
    no_router: bool,
    /// Seconds to wait for the node's certificate.
    #[arg(long, default_value_t = 120)]
    csr_timeout: u64,
    /// Seconds discovery keeps trying while the server is unreachable or has not signed the
    /// token yet.
    #[arg(long, default_value_t = 60)]
    discovery_timeout: u64,
    /// Join as another control-plane machine: an apiserver, a controller manager and the
    /// cluster's other control components run here on the cluster's etcd, beside this
    /// machine's node (kubeadm's `join --control-plane`).
    #[arg(long, requires = "certificate_key")]
    control_plane: bool,
    /// The key `minik8s init --upload-certs` (or `minik8s upload-certs`) printed: it opens
    /// the shared keys in Secret kube-system/kubeadm-certs.
    #[arg(long, requires = "control_plane")]
    certificate_key: Option<String>,
    /// Where this node's client-side balancer over the apiservers listens (loopback; the
    /// node's kubeconfig names it, as k3s agents' 6444).
    #[arg(long, default_value = "127.0.0.1:6444")]
    balancer: std::net::SocketAddr,
    /// The port this control-plane machine's apiserver listens on (default: the joined
    /// server's).
    #[arg(long, requires = "control_plane")]
    apiserver_bind_port: Option<u16>,
}

fn ttl_seconds(s: &str) -> anyhow::Result<i64> {
    if s == "0" {
        return Ok(0);
    }
    minik8s_controllers::util::go_duration(s)
        .map(|d| d.as_secs() as i64)
        .ok_or_else(|| anyhow::anyhow!("{s:?} is not a duration (like 24h0m0s)"))
}

fn parse_token(s: &str) -> anyhow::Result<minik8s_types::bootstrap::Token> {
    minik8s_types::bootstrap::Token::parse(s).ok_or_else(|| {
        anyhow::anyhow!("{s:?} is not a bootstrap token: want [a-z0-9]{{6}}.[a-z0-9]{{16}}")
    })
}

async fn token_command(command: TokenCommand, data_dir: &std::path::Path) -> anyhow::Result<()> {
    use minik8s::tokens;
    let admin = data_dir.join("admin.kubeconfig");
    let client = minik8s_kubeconfig::client(&admin).await.map_err(|e| {
        anyhow::anyhow!(
            "{e} ({}: is the cluster's data folder right?)",
            admin.display()
        )
    })?;
    match command {
        TokenCommand::Create {
            token,
            ttl,
            description,
            print_join_command,
        } => {
            let token = token.as_deref().map(parse_token).transpose()?;
            let token =
                tokens::create(client.clone(), token, ttl_seconds(&ttl)?, &description).await?;
            if print_join_command {
                println!("{}", tokens::join_command(client, &token).await?);
            } else {
                println!("{token}");
            }
        }
        TokenCommand::List => {
            let rows = tokens::list(client).await?;
            println!(
                "{:<24}  {:<10} {:<21} {:<23} {:<12} EXTRA GROUPS",
                "TOKEN", "TTL", "EXPIRES", "USAGES", "DESCRIPTION"
            );
            for r in rows {
                println!(
                    "{:<24}  {:<10} {:<21} {:<23} {:<12} {}",
                    r.token, r.ttl, r.expires, r.usages, r.description, r.groups
                );
            }
        }
        TokenCommand::Delete { tokens: which } => {
            for w in which {
                let id = tokens::delete(client.clone(), &w).await?;
                println!("bootstrap token {id:?} deleted");
            }
        }
    }
    Ok(())
}

/// `upload-certs`: seals the shared keys again under a (new) certificate key.
async fn upload_certs(key: Option<String>, data_dir: &std::path::Path) -> anyhow::Result<()> {
    let admin = data_dir.join("admin.kubeconfig");
    let client = minik8s_kubeconfig::client(&admin)
        .await
        .with_context(|| format!("{}: is the cluster's data folder right?", admin.display()))?;
    let key = key.unwrap_or_else(minik8s_kubeconfig::copycerts::new_key);
    minik8s::control_plane::upload_certs(client, &data_dir.join("pki"), &key).await?;
    println!(
        "[upload-certs] Storing the certificates in Secret \"kubeadm-certs\" in the \"kube-system\" Namespace"
    );
    println!("[upload-certs] Using certificate key:");
    println!("{key}");
    Ok(())
}

/// The control plane a `join --control-plane` runs beside its node: the apiserver on every
/// address at `port` (advertised at the node's address), the controllers, the function
/// gateway and the edge registry; the storage comes from the cluster.
fn control_plane_config(node: &minik8s::join::JoinConfig, port: u16) -> anyhow::Result<UpConfig> {
    Ok(UpConfig {
        data_dir: node.data_dir.clone(),
        storage: None,
        bind: IpAddr::from([0, 0, 0, 0]),
        port,
        hosts: Vec::new(),
        ips: Vec::new(),
        node_name: node.node_name.clone(),
        node_ip: node.node_ip.clone(),
        audit_level: minik8s_apiserver::serving::audit::Level::Metadata,
        run_node: false,
        images: Vec::new(),
        registry: None,
        gateway: Some("0.0.0.0:8181".parse()?),
        router: None,
        edge_registry: Some("0.0.0.0:10360".parse()?),
        static_control_plane: None,
        node_monitor_grace: std::time::Duration::from_secs(40),
        signing_duration: std::time::Duration::from_secs(8760 * 3600),
        compaction_interval: minik8s_apiserver::store::compactor::DEFAULT_INTERVAL,
        store_cache_mib: minik8s_storage::DEFAULT_CACHE_BYTES >> 20,
        store_history_age: minik8s_storage::DEFAULT_HISTORY_AGE,
        node_ipam: Default::default(),
    })
}

/// Runs the apiserver and controller manager as static pods of this node, from the
/// control-plane image archive (`init --static-control-plane`).
async fn static_control_plane(cfg: &mut UpConfig, archive: Option<PathBuf>) -> anyhow::Result<()> {
    let archive = archive.unwrap_or_else(|| cfg.data_dir.join("images/control-plane.tar"));
    let image = minik8s_kubelet::registry::archive_tags(&archive)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{} is not a control-plane image archive: build it with hack/control-plane-image.sh",
                archive.display()
            )
        })?;
    // The archive is the node's to import, not the registry's (it is large and only this
    // node runs it).
    cfg.images.retain(|i| i != &archive);
    cfg.static_control_plane = Some(minik8s::static_plane::StaticPlane { archive, image });
    Ok(())
}

/// What `init` prints once the cluster is up: where kubectl points and how machines join.
fn print_joins(admin: &std::path::Path, join: &str, certificate_key: Option<&str>) {
    println!("minik8s is up. Point kubectl at it with:");
    println!("export KUBECONFIG={}", admin.display());
    println!("Join other machines to it by running on each (as root):");
    println!("{join}");
    if let Some(key) = certificate_key {
        println!(
            "Join more control-plane machines (on the same etcd) by running on each (as root):"
        );
        println!("{join} --control-plane --certificate-key {key}");
        println!(
            "The certificate key gives access to the cluster's private keys: keep it secret. \
             They are deleted from the cluster in two hours; `minik8s upload-certs` \
             uploads them again with a new key."
        );
    }
}

/// `init`: `up`, then the cluster-info ConfigMap and a first token, and the join command.
async fn init(args: InitArgs) -> anyhow::Result<()> {
    let ttl = ttl_seconds(&args.token_ttl)?;
    let token = args.token.as_deref().map(parse_token).transpose()?;
    let storage = args.up.storage.clone();
    let certificate_key = match (args.upload_certs, args.certificate_key) {
        (false, _) => None,
        (true, _) if storage == "embedded" => {
            return Err(minik8s::control_plane::Error::Embedded).context("--upload-certs");
        }
        (true, Some(k)) => {
            minik8s_kubeconfig::copycerts::parse_key(&k)?;
            Some(k)
        }
        (true, None) => Some(minik8s_kubeconfig::copycerts::new_key()),
    };
    let mut cfg = UpConfig::try_from(args.up)?;
    if args.static_control_plane {
        static_control_plane(&mut cfg, args.control_plane_image).await?;
    }
    let advertise: IpAddr = match args.advertise_address {
        Some(ip) => ip,
        None if !cfg.bind.is_unspecified() => cfg.bind,
        None => minik8s_kubelet::node::default_ip().await.parse()?,
    };
    cfg.ips.push(advertise);
    if cfg.node_ip.is_none() {
        cfg.node_ip = Some(advertise.to_string());
    }
    let server = format!("https://{}", std::net::SocketAddr::new(advertise, cfg.port));
    let shutdown = minik8s_kubeconfig::process::shutdown_on_signal();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let ca = cfg.data_dir.join("pki/ca.crt");
    let pki_dir = cfg.data_dir.join("pki");
    let up = minik8s_task::spawn(
        "up",
        minik8s::up(cfg, shutdown.clone(), move |kubeconfig| {
            let _ = tx.send(kubeconfig.to_path_buf());
        }),
    );
    if let Ok(admin) = rx.await {
        let steps = async {
            let client = minik8s_kubeconfig::client(&admin).await?;
            let ca_pem = std::fs::read_to_string(&ca)?;
            minik8s::tokens::publish_cluster_info(client.clone(), &server, &ca_pem).await?;
            minik8s::control_plane::publish_config(client.clone(), &storage).await?;
            if let Some(key) = &certificate_key {
                minik8s::control_plane::upload_certs(client.clone(), &pki_dir, key).await?;
            }
            let token =
                minik8s::tokens::create(client.clone(), token, ttl, "made by minik8s init").await?;
            minik8s::tokens::wait_signed(
                client.clone(),
                &token,
                std::time::Duration::from_secs(10),
            )
            .await;
            anyhow::Ok(minik8s::tokens::join_command(client, &token).await?)
        };
        match steps.await {
            Ok(join) => print_joins(&admin, &join, certificate_key.as_deref()),
            Err(e) => {
                shutdown.cancel();
                let _ = up.await;
                return Err(e.context("preparing joins"));
            }
        }
    }
    up.await??;
    Ok(())
}

/// Options of `up` (and `pki init`, which uses the same names and addresses).
#[derive(clap::Args, Debug)]
struct UpArgs {
    /// The cluster's data folder (PKI, store, admin kubeconfig).
    #[arg(long, env = "MINIK8S_DATA_DIR", default_value = "/var/lib/minik8s")]
    data_dir: PathBuf,
    /// `embedded` (default, under DATA_DIR/store) or `etcd://HOST:PORT[,HOST:PORT…]`.
    #[arg(long, env = "MINIK8S_STORAGE", default_value = "embedded")]
    storage: String,
    /// Address the apiserver listens on.
    #[arg(long, env = "MINIK8S_BIND", default_value = "127.0.0.1")]
    bind: IpAddr,
    /// Port the apiserver listens on.
    #[arg(long, env = "MINIK8S_PORT", default_value_t = 6443)]
    port: u16,
    /// Extra DNS names for the serving certificate.
    #[arg(long = "host", env = "MINIK8S_HOSTS", value_delimiter = ',')]
    hosts: Vec<String>,
    /// Extra IP addresses for the serving certificate.
    #[arg(long = "ip", env = "MINIK8S_IPS", value_delimiter = ',')]
    ips: Vec<IpAddr>,
    /// This machine's node name.
    #[arg(long, env = "MINIK8S_NODE_NAME", default_value = "minik8s-node")]
    node_name: String,
    /// Audit log level (None, Metadata, Request); the log is DATA_DIR/audit.log.
    #[arg(long, env = "MINIK8S_AUDIT_LEVEL", default_value = "Metadata")]
    audit_level: minik8s_apiserver::serving::audit::Level,
    /// This machine's node's InternalIP (default: the source address of the default route;
    /// for `init`, the advertise address).
    #[arg(long, env = "MINIK8S_NODE_IP")]
    node_ip: Option<String>,
    /// Run the control plane only, without this machine's node (kubelet and containerd).
    #[arg(long, env = "MINIK8S_NO_NODE")]
    no_node: bool,
    /// Image archives for the node, pushed to its registry (default: DATA_DIR/images/*.tar).
    #[arg(long = "image", env = "MINIK8S_IMAGES", value_delimiter = ',')]
    images: Vec<PathBuf>,
    /// Where the node's local image registry listens (loopback only).
    #[arg(long, env = "MINIK8S_REGISTRY", default_value = "127.0.0.1:5000")]
    registry: std::net::SocketAddr,
    /// Run no local registry: the image archives are imported into the runtime instead.
    #[arg(long, env = "MINIK8S_NO_REGISTRY")]
    no_registry: bool,
    /// Where the function gateway listens (a host port; Functions' URLs name it).
    #[arg(long, env = "MINIK8S_GATEWAY", default_value = "0.0.0.0:8181")]
    gateway: std::net::SocketAddr,
    /// Run no function gateway or Function controller.
    #[arg(long, env = "MINIK8S_NO_FUNCTIONS")]
    no_functions: bool,
    /// Where the node's HTTP router (the `DNS` kind, Ingresses) listens.
    #[arg(long, env = "MINIK8S_ROUTER", default_value = "0.0.0.0:80")]
    router: std::net::SocketAddr,
    /// Run no HTTP router.
    #[arg(long, env = "MINIK8S_NO_ROUTER")]
    no_router: bool,
    /// Where the edge registry listens (edges join and are driven through it).
    #[arg(long, env = "MINIK8S_EDGE_REGISTRY", default_value = "0.0.0.0:10360")]
    edge_registry: std::net::SocketAddr,
    /// Run no edge registry.
    #[arg(long, env = "MINIK8S_NO_EDGE_REGISTRY")]
    no_edge_registry: bool,
    /// How long a node may go without a heartbeat before it is NotReady (a Go duration).
    #[arg(long, default_value = "40s")]
    node_monitor_grace_period: String,
    /// The longest validity of a certificate the CSR signer issues (a Go duration).
    #[arg(long, default_value = "8760h0m0s")]
    cluster_signing_duration: String,
    /// How often the apiserver compacts the store's history (a Go duration; 0: never).
    #[arg(long, default_value = "5m0s")]
    etcd_compaction_interval: String,
    /// The embedded store's page cache in MiB (the kernel caches the store's file too).
    #[arg(long, default_value_t = minik8s_storage::DEFAULT_CACHE_BYTES >> 20)]
    store_cache_mib: usize,
    /// How long the embedded store keeps its history at least, for watches and paginated
    /// LISTs at older revisions (a Go duration; upstream's etcd keeps 5 to 10 minutes).
    #[arg(long, default_value = "5m0s")]
    store_history_age: String,
    /// The cluster's pod CIDR, split into one block per node (256 nodes of /24 in the
    /// default /16; a bigger cluster needs a bigger one, as upstream's).
    #[arg(long, default_value = "10.244.0.0/16")]
    cluster_cidr: String,
    /// The prefix length of each node's block.
    #[arg(long, default_value_t = 24)]
    node_cidr_mask_size: u8,
}

impl TryFrom<UpArgs> for UpConfig {
    type Error = anyhow::Error;

    fn try_from(a: UpArgs) -> anyhow::Result<Self> {
        let storage = match a.storage.as_str() {
            "embedded" => None,
            other => Some(other.parse()?),
        };
        Ok(UpConfig {
            storage,
            bind: a.bind,
            port: a.port,
            hosts: a.hosts,
            ips: a.ips,
            node_name: a.node_name,
            node_ip: a.node_ip,
            audit_level: a.audit_level,
            run_node: !a.no_node,
            registry: (!a.no_registry).then_some(a.registry),
            gateway: (!a.no_functions).then_some(a.gateway),
            router: (!a.no_router).then_some(a.router),
            edge_registry: (!a.no_edge_registry).then_some(a.edge_registry),
            static_control_plane: None,
            signing_duration: duration_arg(&a.cluster_signing_duration, "8760h0m0s")?,
            node_monitor_grace: duration_arg(&a.node_monitor_grace_period, "40s")?,
            compaction_interval: duration_arg(&a.etcd_compaction_interval, "5m0s")?,
            store_cache_mib: a.store_cache_mib,
            store_history_age: duration_arg(&a.store_history_age, "5m0s")?,
            node_ipam: minik8s_controllers::nodeipam::Config::parse(
                &a.cluster_cidr,
                a.node_cidr_mask_size,
            )
            .map_err(|e| anyhow::anyhow!("--cluster-cidr: {e}"))?,
            images: if a.images.is_empty() {
                archives(&a.data_dir.join("images"))
            } else {
                a.images
            },
            data_dir: a.data_dir,
        })
    }
}

/// A flag's Go duration, or an error that shows what one looks like.
fn duration_arg(value: &str, example: &str) -> anyhow::Result<std::time::Duration> {
    minik8s_controllers::util::go_duration(value)
        .ok_or_else(|| anyhow::anyhow!("{value:?} is not a duration (like {example})"))
}

/// The `.tar` archives in `dir`, sorted (none if it does not exist).
fn archives(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "tar"))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// `pki`: writes the cluster's certificates and kubeconfigs.
fn pki(command: PkiCommand) -> anyhow::Result<()> {
    match command {
        PkiCommand::Init(args) => {
            let cfg = UpConfig::try_from(args)?;
            let (_, admin) = minik8s::init_pki(&cfg)?;
            let link = cfg.data_dir.join("admin.kubeconfig");
            std::fs::copy(&admin, &link)?;
            println!("export KUBECONFIG={}", link.display());
            Ok(())
        }
        PkiCommand::Etcd { member_ips, args } => {
            let cfg = UpConfig::try_from(args)?;
            let certs = minik8s::open_pki(&cfg)?.ensure_etcd_certs(&member_ips)?;
            for (name, path) in [
                ("ca", &certs.ca),
                ("server-cert", &certs.server.0),
                ("server-key", &certs.server.1),
                ("peer-cert", &certs.peer.0),
                ("peer-key", &certs.peer.1),
                ("client-cert", &certs.client.0),
                ("client-key", &certs.client.1),
            ] {
                println!("{name} {}", path.display());
            }
            Ok(())
        }
        PkiCommand::Node { name, args } => {
            let cfg = UpConfig::try_from(args)?;
            let (pki, _) = minik8s::init_pki(&cfg)?;
            let kubelet = pki.ensure_identity(&minik8s_kubeconfig::Identity::new(
                &format!("kubelet-{name}"),
                &format!("system:node:{name}"),
                &["system:nodes"],
            ))?;
            let proxy = pki.ensure_identity(&minik8s_kubeconfig::Identity::new(
                "proxy",
                "system:kube-proxy",
                &[],
            ))?;
            println!("Copy these to node {name}, then run there (as root):");
            println!(
                "kubelet --kubeconfig {} --node-name {name} --client-ca {} --pod-cidr 10.244.N.0/24 --bridge mk8sN",
                kubelet.display(),
                pki.ca_path().display()
            );
            println!(
                "kube-proxy --kubeconfig {} --node-name {name}",
                proxy.display()
            );
            Ok(())
        }
    }
}

/// `join`: this machine joins a cluster as a node, or as a control-plane machine with a
/// certificate key.
fn join(a: JoinArgs) -> anyhow::Result<()> {
    let server = if a.server.starts_with("https://") {
        a.server.clone()
    } else {
        format!("https://{}", a.server)
    };
    let node_name = match a.node_name {
        Some(n) => n,
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")?
            .trim()
            .to_ascii_lowercase(),
    };
    let cfg = minik8s::join::JoinConfig {
        server,
        token: parse_token(&a.token)?,
        ca_hashes: a.ca_hashes,
        node_name,
        images: if a.images.is_empty() {
            archives(&a.data_dir.join("images"))
        } else {
            a.images
        },
        data_dir: a.data_dir,
        node_ip: a.node_ip,
        registry_mirror: a.registry_mirror,
        router: (!a.no_router).then_some(a.router),
        csr_timeout: std::time::Duration::from_secs(a.csr_timeout),
        discovery_timeout: std::time::Duration::from_secs(a.discovery_timeout),
        balancer: a.balancer,
    };
    if let Some(key) = a.certificate_key {
        let port = a.apiserver_bind_port.unwrap_or_else(|| {
            minik8s::join::host_port(&cfg.server)
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse().ok())
                .unwrap_or(443)
        });
        let up = control_plane_config(&cfg, port)?;
        let plane = minik8s::control_plane::ControlPlaneJoin {
            certificate_key: key,
            up,
        };
        let node = cfg.node_name.clone();
        return tokio::runtime::Runtime::new()?.block_on(async move {
            let shutdown = minik8s_kubeconfig::process::shutdown_on_signal();
            minik8s::control_plane::join(cfg, plane, shutdown, || {
                println!("control-plane machine {node} joined the cluster");
            })
            .await
        });
    }
    let node = cfg.node_name.clone();
    tokio::runtime::Runtime::new()?.block_on(async move {
        let shutdown = minik8s_kubeconfig::process::shutdown_on_signal();
        minik8s::join::run(cfg, shutdown, || {
            println!("node {node} joined the cluster");
        })
        .await
    })?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    minik8s_kubeconfig::process::init_tracing();
    minik8s_apiserver::set_git_commit(env!("MINIK8S_GIT_COMMIT"));
    match Cli::parse().command {
        Command::Pki { command } => pki(command),
        Command::Apiserver(args) => {
            let cfg = UpConfig::try_from(args)?;
            tokio::runtime::Runtime::new()?.block_on(async move {
                let shutdown = minik8s_kubeconfig::process::shutdown_on_signal();
                minik8s::apiserver(cfg, shutdown).await
            })?;
            Ok(())
        }
        Command::ControllerManager(args) => {
            tokio::runtime::Runtime::new()?.block_on(minik8s_controllers::cli::run(args))
        }
        Command::FunctionModules(args) => {
            tokio::runtime::Runtime::new()?.block_on(minik8s_serverless::modules::run_cli(args))
        }
        Command::EdgeRegistry(args) => {
            tokio::runtime::Runtime::new()?.block_on(minik8s_edge::cloud::run_cli(args))
        }
        Command::Init(args) => {
            tokio::runtime::Runtime::new()?.block_on(init(args))?;
            Ok(())
        }
        Command::UploadCerts {
            certificate_key,
            data_dir,
        } => tokio::runtime::Runtime::new()?.block_on(upload_certs(certificate_key, &data_dir)),
        Command::Token { command, data_dir } => {
            tokio::runtime::Runtime::new()?.block_on(token_command(command, &data_dir))
        }
        Command::Join(a) => join(a),
        Command::Down(args) => {
            let cfg = UpConfig::try_from(args)?;
            tokio::runtime::Runtime::new()?.block_on(minik8s::down(&cfg))?;
            println!("minik8s is down; its node left nothing behind");
            Ok(())
        }
        Command::Up(args) => {
            let cfg = UpConfig::try_from(args)?;
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(async move {
                let shutdown = minik8s_kubeconfig::process::shutdown_on_signal();
                minik8s::up(cfg, shutdown, |kubeconfig| {
                    println!("minik8s is up. Point kubectl at it with:");
                    println!("export KUBECONFIG={}", kubeconfig.display());
                    println!("kubectl get namespaces");
                })
                .await
            })?;
            Ok(())
        }
    }
}
