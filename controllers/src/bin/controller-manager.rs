//! `controller-manager`: runs minik8s's controllers against an apiserver.

use clap::Parser;
use tokio_util::sync::CancellationToken;

/// Runs the scheduler and the workload controllers.
#[derive(Parser)]
struct Args {
    /// Kubeconfig of the controller-manager's identity.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: std::path::PathBuf,
    /// Controllers to run (comma-separated; default: all).
    #[arg(long, value_delimiter = ',')]
    controllers: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let client = minik8s_kubeconfig::client(&args.kubeconfig).await?;
    let names: Vec<String> = if args.controllers.is_empty() {
        minik8s_controllers::manager::ALL
            .iter()
            .map(|s| s.to_string())
            .collect()
    } else {
        args.controllers
    };
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        stop.cancel();
    });
    minik8s_controllers::manager::run(client, &names, shutdown).await
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
