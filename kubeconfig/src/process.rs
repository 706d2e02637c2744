//! What every minik8s binary does at start: logs through `tracing` (filter from `RUST_LOG`,
//! `info` by default, to stderr) and a shutdown token cancelled on SIGTERM or Ctrl-C.

use tokio_util::sync::CancellationToken;

/// Installs the `tracing` subscriber.
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// A token cancelled at the first SIGTERM or Ctrl-C (call inside a Tokio runtime).
pub fn shutdown_on_signal() -> CancellationToken {
    let shutdown = CancellationToken::new();
    let signals = shutdown.clone();
    minik8s_task::spawn("signals", async move {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("shutting down");
        signals.cancel();
    });
    shutdown
}
