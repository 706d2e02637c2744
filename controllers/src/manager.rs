//! The controller manager: runs the selected controllers (all by default) on one client
//! until shutdown, and waits for their tasks to end.

use crate::informer::Informers;
use kube::Client;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Every controller the manager knows, by name.
pub const ALL: [&str; 25] = [
    "scheduler",
    "replicaset",
    "replicationcontroller",
    "deployment",
    "garbagecollector",
    "namespace",
    "endpoints",
    "job",
    "cronjob",
    "nodelifecycle",
    "horizontalpodautoscaling",
    "nodeipam",
    "podgc",
    "bootstrapsigner",
    "tokencleaner",
    "csrapproving",
    "csrsigning",
    "disruption",
    "daemonset",
    "persistentvolume-binder",
    "pvc-protection",
    "pv-protection",
    "statefulset",
    "root-ca-cert-publisher",
    "endpointslice-mirroring",
];

/// Fails on controller names the manager does not know.
pub fn check(names: &[String]) -> anyhow::Result<()> {
    match names.iter().find(|n| !ALL.contains(&n.as_str())) {
        Some(other) => anyhow::bail!("unknown controller {other:?} (known: {})", ALL.join(", ")),
        None => Ok(()),
    }
}

/// Settings of the controllers that have any (upstream's flags).
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// The HorizontalPodAutoscaler controller's.
    pub hpa: crate::hpa::controller::Config,
    /// The node lifecycle controller's timing.
    pub node_lifecycle: crate::nodelifecycle::Config,
    /// The node IPAM controller's cluster CIDR and block size.
    pub node_ipam: crate::nodeipam::Config,
    /// The CSR signer's CA (`None`: the `csrsigning` controller issues nothing).
    pub signing: Option<crate::certificates::SigningConfig>,
    /// The cluster CA (PEM) published in every namespace (`--root-ca-file`; `None`: the
    /// `root-ca-cert-publisher` publishes nothing).
    pub root_ca: Option<String>,
}

/// Runs the named controllers with default settings until `shutdown`; unknown names are an
/// error.
pub async fn run(
    client: Client,
    names: &[String],
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    run_with(client, names, Settings::default(), shutdown).await
}

/// Runs the controllers until `shutdown`: while this process holds the election's Lease
/// when there is one (several controller managers on one cluster), else at once.
pub async fn run_elected(
    client: kube::Client,
    election: Option<crate::leader::Config>,
    names: Vec<String>,
    settings: Settings,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let Some(cfg) = election else {
        return run_with(client, &names, settings, shutdown).await;
    };
    let c = client.clone();
    crate::leader::run(client, cfg, shutdown, move |leading| {
        let (c, names, settings) = (c.clone(), names.clone(), settings.clone());
        async move {
            if let Err(e) = run_with(c, &names, settings, leading).await {
                tracing::error!(error = %e, "controllers failed");
            }
        }
    })
    .await;
    Ok(())
}

/// Runs the named controllers until `shutdown`; unknown names are an error.
pub async fn run_with(
    client: Client,
    names: &[String],
    settings: Settings,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    check(names)?;
    let tasks = TaskTracker::new();
    let informers = Informers::new(client.clone(), tasks.clone(), shutdown.clone());
    for name in names {
        let (c, t, s) = (client.clone(), informers.clone(), shutdown.clone());
        // The task carries the controller's name (ALL holds the 'static spelling).
        let task_name: &'static str = ALL.iter().find(|n| **n == name).expect("checked above");
        macro_rules! go {
            ($run:expr) => {
                minik8s_task::spawn_on(&tasks, task_name, $run)
            };
        }
        match name.as_str() {
            "scheduler" => go!(crate::scheduler::run(c, t, s)),
            "replicaset" => go!(crate::replicaset::run(c, t, s)),
            "replicationcontroller" => go!(crate::replicaset::run_replication(c, t, s)),
            "deployment" => go!(crate::deployment::run(c, t, s)),
            "garbagecollector" => go!(crate::gc::run(c, tasks.clone(), s)),
            "namespace" => go!(crate::namespace::run(c, t, s)),
            "endpoints" => go!(crate::endpoints::run(c, t, s)),
            "job" => go!(crate::job::run(c, t, s)),
            "cronjob" => go!(crate::cronjob::run(c, t, s)),
            "nodelifecycle" => go!(crate::nodelifecycle::run(
                c,
                settings.node_lifecycle.clone(),
                t,
                s,
            )),
            "horizontalpodautoscaling" => go!(crate::hpa::controller::run_with(
                c,
                settings.hpa.clone(),
                t,
                s,
            )),
            "nodeipam" => go!(crate::nodeipam::run(c, settings.node_ipam.clone(), t, s)),
            "podgc" => go!(crate::podgc::run(c, t, s)),
            "disruption" => go!(crate::disruption::run(c, t, s)),
            "daemonset" => go!(crate::daemonset::run(c, t, s)),
            "persistentvolume-binder" => go!(crate::volumebinding::run(c, t, s)),
            "pvc-protection" => go!(crate::protection::run_claims(c, t, s)),
            "pv-protection" => go!(crate::protection::run_volumes(c, t, s)),
            "statefulset" => go!(crate::statefulset::run(c, t, s)),
            "endpointslice-mirroring" => go!(crate::mirroring::run(c, t, s)),
            "root-ca-cert-publisher" => go!(crate::rootca::run(c, settings.root_ca.clone(), t, s)),
            "bootstrapsigner" => go!(crate::bootstrap::run_signer(c, t, s)),
            "tokencleaner" => go!(crate::bootstrap::run_cleaner(c, t, s)),
            "csrapproving" => go!(crate::certificates::run_approver(c, t, s)),
            "csrsigning" => match settings.signing.clone() {
                Some(cfg) => go!(crate::certificates::run_signer(c, cfg, t, s)),
                None => {
                    tracing::info!("csrsigning: no --cluster-signing-cert-file; not signing");
                    continue;
                }
            },
            _ => unreachable!("names are checked above"),
        };
    }
    tracing::info!(controllers = %names.join(","), "controllers started");
    shutdown.cancelled().await;
    tasks.close();
    tasks.wait().await;
    Ok(())
}
