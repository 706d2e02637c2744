//! The node's HTTP router: one table ([`routes::Table`]) rendered from the seed's `DNS`
//! objects ([`types::DNS`]: host + paths, prefix stripped) and standard `Ingress`es of the
//! `minik8s` class (the default class), served on port 80 of the node. Their hosts resolve to
//! the node: the cluster DNS answers them (through the channel [`run`] feeds), and a managed
//! block of `/etc/hosts` lists them for the node itself. The router also writes each `DNS`
//! object's `status.backends` and `Ready` condition and each Ingress's load-balancer address.

pub mod http;
pub mod routes;
pub mod types;

use crate::Result;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, CustomResourceExt, ResourceExt};
use routes::{Backend, PathType, Port, Route, Table};
use serde_json::json;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use types::{DNS, DnsStatus};

/// The IngressClass (and `spec.controller`) the router serves.
pub const CLASS: &str = "minik8s";
const CONTROLLER: &str = "minik8s.io/router";
const MANAGER: &str = "minik8s-router";
/// The lines around the managed block of the hosts file.
pub const BEGIN: &str = "# BEGIN minik8s";
/// The block's last line.
pub const END: &str = "# END minik8s";

/// How the router runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where it serves HTTP (port 80 of every address by default).
    pub listen: SocketAddr,
    /// Where it serves HTTPS for Ingresses with `tls` (port 443; `None`: no HTTPS).
    pub listen_tls: Option<SocketAddr>,
    /// The node's address (DNS answers, `/etc/hosts`, Ingress status).
    pub node_ip: Ipv4Addr,
    /// The hosts file whose managed block lists the routed hosts (`None`: leave it alone).
    pub hosts_file: Option<PathBuf>,
}

/// The hosts routed here and the node's address, as the cluster DNS needs them.
pub use crate::dns::RouterHosts as Hosts;

/// Installs the `DNS` CRD, the default `minik8s` IngressClass, and what every node's router
/// may read and write (`minik8s:router`, bound to `system:kube-proxy` and the node group).
pub async fn install(client: Client) -> Result<()> {
    let pp = PatchParams::apply(MANAGER).force();
    let cluster_roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(client.clone());
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "minik8s:router"},
        "rules": [{"apiGroups": [""], "resources": ["services", "namespaces"],
                   "verbs": ["get", "list", "watch"]},
                  {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                   "verbs": ["get", "list", "watch"]},
                  {"apiGroups": ["networking.minik8s.io"], "resources": ["dnses"],
                   "verbs": ["get", "list", "watch"]},
                  {"apiGroups": ["networking.minik8s.io"], "resources": ["dnses/status"],
                   "verbs": ["get", "patch", "update"]},
                  {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses", "ingressclasses"],
                   "verbs": ["get", "list", "watch"]},
                  {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
                  {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses/status"],
                   "verbs": ["get", "patch", "update"]}],
    });
    cluster_roles
        .patch("minik8s:router", &pp, &Patch::Apply(&role))
        .await?;
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(client.clone());
    let bound = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "minik8s:router"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "minik8s:router"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:kube-proxy"},
                     {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}],
    });
    bindings
        .patch("minik8s:router", &pp, &Patch::Apply(&bound))
        .await?;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    let crd = DNS::crd();
    crds.patch(&crd.name_any(), &pp, &Patch::Apply(&crd))
        .await?;
    let classes: Api<IngressClass> = Api::all(client);
    let class = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
        "metadata": {"name": CLASS, "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}},
        "spec": {"controller": CONTROLLER},
    });
    classes.patch(CLASS, &pp, &Patch::Apply(&class)).await?;
    Ok(())
}

/// Rewrites the managed block of `file` to list `hosts` at `ip` (atomically: a new file
/// renamed over the old); no hosts removes the block.
pub fn write_hosts_block(file: &Path, ip: Ipv4Addr, hosts: &[String]) -> std::io::Result<()> {
    let old = std::fs::read_to_string(file).unwrap_or_default();
    let mut out = String::new();
    let mut inside = false;
    for line in old.lines() {
        match line.trim() {
            BEGIN => inside = true,
            END => inside = false,
            _ if !inside => {
                out.push_str(line);
                out.push('\n');
            }
            _ => {}
        }
    }
    if !hosts.is_empty() {
        out.push_str(&format!("{BEGIN}\n{ip}\t{}\n{END}\n", hosts.join(" ")));
    }
    if out == old {
        return Ok(());
    }
    let tmp = file.with_extension("minik8s-tmp");
    std::fs::write(&tmp, &out)?;
    if let Ok(meta) = std::fs::metadata(file) {
        let _ = std::fs::set_permissions(&tmp, meta.permissions());
    }
    std::fs::rename(&tmp, file)
}

/// Removes the managed block (`minik8s down`).
pub fn remove_hosts_block(file: &Path) -> std::io::Result<()> {
    write_hosts_block(file, Ipv4Addr::UNSPECIFIED, &[])
}

/// How often every Ingress's status is brought back to the router's address.
const STATUS_SYNC: Duration = Duration::from_secs(60);

/// Whether the router's IngressClass is marked as the cluster's default now (a user may take
/// the mark off, or give it to another class).
fn class_is_default(classes: &Store<IngressClass>) -> bool {
    classes.state().iter().any(|c| {
        c.name_any() == CLASS
            && c.annotations()
                .get("ingressclass.kubernetes.io/is-default-class")
                .is_some_and(|v| v == "true")
    })
}

/// Whether an Ingress is the router's, as upstream's controllers decide: class `minik8s`, or no
/// class while `minik8s` is the default class. An Ingress of another class, or class-less while
/// another class is the default, is left alone (its status is not written).
fn ours(i: &Ingress, default_class: bool) -> bool {
    let class = i
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.clone())
        .or_else(|| i.annotations().get("kubernetes.io/ingress.class").cloned());
    match class {
        Some(c) => c == CLASS,
        None => default_class,
    }
}

/// The router's Ingresses.
fn our_ingresses(ingresses: &Store<Ingress>, classes: &Store<IngressClass>) -> Vec<Arc<Ingress>> {
    let default_class = class_is_default(classes);
    ingresses
        .state()
        .into_iter()
        .filter(|i| ours(i, default_class))
        .collect()
}

/// Paths of `DNS` objects that another, older object already routes: by `namespace/name`,
/// each path with the object that has it.
pub type Conflicts = std::collections::HashMap<String, Vec<String>>;

/// The table and services from the stores, and the `DNS` paths left out as duplicates.
pub fn build(
    dnses: &Store<DNS>,
    ingresses: &[Arc<Ingress>],
    services: &Store<Service>,
) -> (http::State, Conflicts) {
    let mut routes = Vec::new();
    let mut default = None;
    let mut conflicts = Conflicts::new();
    // The oldest object keeps a host + path; later ones are told (Ready=False).
    let mut all = dnses.state();
    all.sort_by_key(|d| {
        (
            d.metadata.creation_timestamp.as_ref().map(|t| t.0),
            d.namespace(),
            d.name_any(),
        )
    });
    let mut claimed: std::collections::HashMap<(String, String), String> = Default::default();
    for d in all {
        let ns = d.namespace().unwrap_or_default();
        let me = format!("{ns}/{}", d.name_any());
        for s in &d.spec.subpaths {
            let key = (
                d.spec.host.to_ascii_lowercase(),
                s.path.trim_end_matches('/').to_owned(),
            );
            match claimed.get(&key) {
                Some(owner) if owner != &me => {
                    conflicts.entry(me.clone()).or_default().push(format!(
                        "{}: {}{} is already routed by {owner}",
                        s.path, d.spec.host, s.path
                    ));
                    continue;
                }
                _ => {
                    claimed.insert(key, me.clone());
                }
            }
            routes.push(Route {
                host: d.spec.host.clone(),
                path: s.path.clone(),
                path_type: PathType::Prefix,
                strip: true,
                backend: Backend {
                    namespace: ns.clone(),
                    service: s.service.clone(),
                    port: Port::Number(s.port as u16),
                },
            });
        }
    }
    let backend_of = |ns: &str, b: &k8s_openapi::api::networking::v1::IngressBackend| {
        let svc = b.service.as_ref()?;
        let port = svc.port.as_ref()?;
        Some(Backend {
            namespace: ns.to_owned(),
            service: svc.name.clone(),
            port: match (&port.number, &port.name) {
                (Some(n), _) => Port::Number(*n as u16),
                (None, Some(name)) => Port::Name(name.clone()),
                _ => return None,
            },
        })
    };
    for i in ingresses {
        let ns = i.namespace().unwrap_or_default();
        let Some(spec) = &i.spec else { continue };
        if default.is_none() {
            default = spec
                .default_backend
                .as_ref()
                .and_then(|b| backend_of(&ns, b));
        }
        for rule in spec.rules.iter().flatten() {
            let host = rule.host.clone().unwrap_or_default();
            for p in rule.http.iter().flat_map(|h| &h.paths) {
                let Some(backend) = backend_of(&ns, &p.backend) else {
                    continue;
                };
                routes.push(Route {
                    host: host.clone(),
                    path: p.path.clone().unwrap_or_else(|| "/".into()),
                    path_type: if p.path_type == "Exact" {
                        PathType::Exact
                    } else {
                        PathType::Prefix
                    },
                    strip: false,
                    backend,
                });
            }
        }
    }
    let services = services
        .state()
        .iter()
        .map(|s| {
            let spec = s.spec.clone().unwrap_or_default();
            (
                format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any()),
                http::ServiceInfo {
                    cluster_ip: spec.cluster_ip.as_deref().and_then(|ip| ip.parse().ok()),
                    ports: spec
                        .ports
                        .iter()
                        .flatten()
                        .map(|p| (p.name.clone().unwrap_or_default(), p.port as u16))
                        .collect(),
                },
            )
        })
        .collect();
    (
        http::State {
            table: Table::new(routes, default),
            services,
            certs: Default::default(),
        },
        conflicts,
    )
}

/// A `DNS` object's status from the router's state.
fn dns_status(
    d: &DNS,
    state: &http::State,
    conflicts: &Conflicts,
    old: Option<&DnsStatus>,
) -> DnsStatus {
    let ns = d.namespace().unwrap_or_default();
    let duplicates = conflicts
        .get(&format!("{ns}/{}", d.name_any()))
        .cloned()
        .unwrap_or_default();
    let mut problems = Vec::new();
    let backends = d
        .spec
        .subpaths
        .iter()
        .map(|s| {
            let backend = Backend {
                namespace: ns.clone(),
                service: s.service.clone(),
                port: Port::Number(s.port as u16),
            };
            let ip = match http::resolve(state, &backend) {
                Ok(addr) => addr.ip().to_string(),
                Err(why) => {
                    problems.push(format!("{}: {why}", s.path));
                    state
                        .services
                        .get(&format!("{ns}/{}", s.service))
                        .and_then(|i| i.cluster_ip)
                        .map(|ip| ip.to_string())
                        .unwrap_or_default()
                }
            };
            types::Backend {
                path: s.path.clone(),
                service: s.service.clone(),
                port: s.port,
                cluster_ip: ip,
            }
        })
        .collect();
    let (status, reason, message) = if !duplicates.is_empty() {
        ("False", "DuplicatePath", duplicates.join("; "))
    } else if problems.is_empty() {
        (
            "True",
            "BackendsFound",
            "every path has its Service and port".to_owned(),
        )
    } else {
        ("False", "BackendNotFound", problems.join("; "))
    };
    let previous = old
        .and_then(|o| o.conditions.iter().find(|c| c.type_ == "Ready"))
        .cloned();
    let transition = match &previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
    };
    DnsStatus {
        backends,
        conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: "Ready".into(),
            status: status.into(),
            reason: reason.into(),
            message,
            last_transition_time: transition,
            observed_generation: d.metadata.generation,
        }],
    }
}

/// Writes the `DNS` objects' and Ingresses' status where it changed.
async fn write_status(
    client: &Client,
    state: &http::State,
    conflicts: &Conflicts,
    dnses: &Store<DNS>,
    ingresses: &[Arc<Ingress>],
    node_ip: Ipv4Addr,
    full: bool,
) {
    let pp = PatchParams::default();
    for d in dnses.state() {
        let want = dns_status(&d, state, conflicts, d.status.as_ref());
        if d.status.as_ref() == Some(&want) {
            continue;
        }
        let api: Api<DNS> = Api::namespaced(client.clone(), &d.namespace().unwrap_or_default());
        if let Err(e) = api
            .patch_status(&d.name_any(), &pp, &Patch::Merge(json!({"status": want})))
            .await
        {
            tracing::warn!(dns = %d.name_any(), error = %e, "writing DNS status");
        }
    }
    let ip = node_ip.to_string();
    for i in ingresses {
        let has = i
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .is_some_and(|l| l.iter().any(|e| e.ip.as_deref() == Some(ip.as_str())));
        let any = i
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .is_some_and(|l| !l.is_empty());
        // A new Ingress gets its address at once; one that says something else is corrected
        // on the periodic sync only (as ingress-nginx's status updater), not raced on every
        // change.
        if has || (any && !full) {
            continue;
        }
        let api: Api<Ingress> = Api::namespaced(client.clone(), &i.namespace().unwrap_or_default());
        let patch = json!({"status": {"loadBalancer": {"ingress": [{"ip": ip}]}}});
        if let Err(e) = api
            .patch_status(&i.name_any(), &pp, &Patch::Merge(patch))
            .await
        {
            tracing::warn!(ingress = %i.name_any(), error = %e, "writing Ingress status");
        }
    }
}

/// Runs the router until `shutdown`; `hosts` tells the cluster DNS which names are routed here.
pub async fn run(
    client: Client,
    cfg: Config,
    hosts: tokio::sync::watch::Sender<(Vec<String>, Option<Ipv4Addr>)>,
    shutdown: CancellationToken,
) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| crate::Error::Router(format!("binding {}: {e}", cfg.listen)))?;
    let shared: http::Shared = Arc::default();
    let serving = minik8s_task::spawn(
        "router-http",
        http::serve(listener, shared.clone(), None, shutdown.clone()),
    );
    tracing::info!(listen = %cfg.listen, "router serving");
    let serving_tls = match cfg.listen_tls {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| crate::Error::Router(format!("binding {addr}: {e}")))?;
            let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map_err(|e| crate::Error::Router(format!("TLS: {e}")))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(http::Certs(shared.clone())));
            tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
            tracing::info!(listen = %addr, "router serving TLS");
            Some(minik8s_task::spawn(
                "router-https",
                http::serve(listener, shared.clone(), Some(acceptor), shutdown.clone()),
            ))
        }
        None => None,
    };
    let changed = Arc::new(Notify::new());
    let default = watcher::Config::default;
    let (dnses, f1) = crate::mirror::<DNS>(&client, default(), &changed);
    let (ingresses, f2) = crate::mirror::<Ingress>(&client, default(), &changed);
    let (services, f3) = crate::mirror::<Service>(&client, default(), &changed);
    let (classes, f4) = crate::mirror::<IngressClass>(&client, default(), &changed);
    let rebuild = async {
        let listed = async {
            let _ = dnses.wait_until_ready().await;
            let _ = ingresses.wait_until_ready().await;
            let _ = services.wait_until_ready().await;
            let _ = classes.wait_until_ready().await;
        };
        tokio::select! {
            _ = listed => {}
            _ = shutdown.cancelled() => return,
        }
        let mut last_hosts: Option<Vec<String>> = None;
        let mut last_full = std::time::Instant::now();
        loop {
            let mine = our_ingresses(&ingresses, &classes);
            let (mut state, conflicts) = build(&dnses, &mine, &services);
            state.certs = certificates(&client, &mine).await;
            let state = Arc::new(state);
            *shared.write().expect("router state") = state.clone();
            let names = state.table.host_names();
            if last_hosts.as_ref() != Some(&names) {
                let _ = hosts.send((names.clone(), Some(cfg.node_ip)));
                if let Some(file) = &cfg.hosts_file
                    && let Err(e) = write_hosts_block(file, cfg.node_ip, &names)
                {
                    tracing::warn!(file = %file.display(), error = %e, "writing the hosts block");
                }
                last_hosts = Some(names);
            }
            let full = last_full.elapsed() >= STATUS_SYNC;
            if full {
                last_full = std::time::Instant::now();
            }
            write_status(
                &client,
                &state,
                &conflicts,
                &dnses,
                &mine,
                cfg.node_ip,
                full,
            )
            .await;
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = changed.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(30)) => {}
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::select! {
        _ = f1 => {}
        _ = f2 => {}
        _ = f3 => {}
        _ = f4 => {}
        _ = rebuild => {}
    }
    let _ = serving.await;
    if let Some(t) = serving_tls {
        let _ = t.await;
    }
    Ok(())
}

/// The certificates of the router's Ingresses' `tls` entries, by host, from their Secrets
/// (`tls.crt`, `tls.key`); a Secret that is missing or unreadable is logged and skipped.
async fn certificates(
    client: &Client,
    ingresses: &[Arc<Ingress>],
) -> std::collections::HashMap<String, Arc<rustls::sign::CertifiedKey>> {
    let mut out = std::collections::HashMap::new();
    for i in ingresses {
        let ns = i.namespace().unwrap_or_default();
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &ns);
        for tls in i.spec.iter().flat_map(|s| s.tls.iter().flatten()) {
            let Some(name) = &tls.secret_name else {
                continue;
            };
            let secret = match secrets.get_opt(name).await {
                Ok(Some(s)) => s,
                Ok(None) => {
                    tracing::warn!(ingress = %i.name_any(), secret = %name, "TLS secret not found");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(secret = %name, error = %e, "reading a TLS secret");
                    continue;
                }
            };
            let data = secret.data.unwrap_or_default();
            let (Some(crt), Some(key)) = (data.get("tls.crt"), data.get("tls.key")) else {
                tracing::warn!(secret = %name, "TLS secret without tls.crt and tls.key");
                continue;
            };
            match http::certified_key(&crt.0, &key.0) {
                Ok(k) => {
                    let k = Arc::new(k);
                    for h in tls.hosts.iter().flatten() {
                        out.insert(h.to_ascii_lowercase(), k.clone());
                    }
                }
                Err(e) => tracing::warn!(secret = %name, error = %e, "bad TLS secret"),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_less_ingresses_are_the_routers_only_while_its_class_is_the_default() {
        let ingress = |class: Option<&str>| -> Ingress {
            serde_json::from_value(json!({
                "metadata": {"name": "i", "namespace": "d"},
                "spec": {"ingressClassName": class},
            }))
            .unwrap()
        };
        assert!(ours(&ingress(Some(CLASS)), false));
        assert!(ours(&ingress(Some(CLASS)), true));
        assert!(!ours(&ingress(Some("nginx")), true));
        assert!(ours(&ingress(None), true));
        assert!(!ours(&ingress(None), false));
    }

    #[test]
    fn the_hosts_block_is_added_replaced_and_removed_leaving_the_rest() {
        let dir = std::env::temp_dir().join(format!("minik8s-hosts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("hosts");
        std::fs::write(&file, "127.0.0.1\tlocalhost\n").unwrap();
        let ip: Ipv4Addr = "192.168.1.10".parse().unwrap();
        write_hosts_block(&file, ip, &["a.test".into(), "b.test".into()]).unwrap();
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            "127.0.0.1\tlocalhost\n# BEGIN minik8s\n192.168.1.10\ta.test b.test\n# END minik8s\n"
        );
        write_hosts_block(&file, ip, &["c.test".into()]).unwrap();
        assert!(
            std::fs::read_to_string(&file)
                .unwrap()
                .contains("\tc.test\n# END")
        );
        remove_hosts_block(&file).unwrap();
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            "127.0.0.1\tlocalhost\n"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
