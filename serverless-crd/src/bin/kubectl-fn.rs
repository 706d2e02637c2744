//! `kubectl fn`: the kubectl plugin for minik8s Functions (see `minik8s_serverless::cli`).

use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = minik8s_serverless::cli::Args::parse();
    match minik8s_serverless::cli::run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            match e {
                minik8s_serverless::cli::Error::Kube(_) => eprintln!("{e}"),
                _ => eprintln!("error: {e}"),
            }
            std::process::ExitCode::FAILURE
        }
    }
}
