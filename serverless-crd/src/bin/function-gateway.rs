//! `function-gateway`: the serverless components as their own process (`minik8s up` runs them
//! in its own): the function gateway (activator and autoscaler), the Function controller, and
//! the Workflow controllers with their durable executor.

use clap::Parser;

/// The function gateway and controller.
#[derive(Parser, Debug)]
struct Args {
    /// Kubeconfig of the identity it acts as.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: std::path::PathBuf,
    /// Where the gateway listens.
    #[arg(long, env = "MINIK8S_GATEWAY", default_value = "0.0.0.0:8181")]
    listen: std::net::SocketAddr,
    /// The node address users and pods reach the gateway at (Functions' URLs name it).
    #[arg(long, env = "MINIK8S_GATEWAY_HOST")]
    public_host: String,
    /// How many function bases to start with the first `placement: module` function.
    #[arg(long, default_value_t = 2)]
    bases: i32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    minik8s_kubeconfig::process::init_tracing();
    let args = Args::parse();
    let shutdown = minik8s_kubeconfig::process::shutdown_on_signal();
    let client = minik8s_kubeconfig::client(&args.kubeconfig).await?;
    // The CRDs and roles, when this identity may write them (the cluster's bootstrap installs
    // them otherwise).
    match minik8s_serverless::install(client.clone()).await {
        Ok(()) => {}
        Err(kube::Error::Api(s)) if s.code == 403 => {
            tracing::info!("not installing the CRDs and roles: {}", s.message);
        }
        Err(e) => return Err(e.into()),
    }
    let cfg = minik8s_serverless::Config {
        listen: args.listen,
        public_host: args.public_host,
        bases: args.bases,
    };
    minik8s_serverless::serve(client, cfg, shutdown).await?;
    Ok(())
}
