//! `function-modules`: one replica of the function-module controller (bases as virtual
//! nodes) as its own process; `minik8s up` runs one in its own.

use clap::Parser;

/// The function-module controller.
#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    args: minik8s_serverless::modules::Args,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    minik8s_kubeconfig::process::init_tracing();
    minik8s_serverless::modules::run_cli(Cli::parse().args).await
}
