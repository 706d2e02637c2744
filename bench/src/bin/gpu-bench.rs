//! `gpu-bench`: GPUJob throughput on the private Slurm (`hack/slurm.sh`) through `minik8s up`;
//! prints one JSON object. Run as root from the repository (it starts Slurm and sshd).

use clap::Parser;

/// GPUJob benchmark.
#[derive(Parser, Debug)]
struct Args {
    /// The minik8s binary to start.
    #[arg(long, default_value = "target/release/minik8s", env = "MINIK8S_BIN")]
    minik8s: std::path::PathBuf,
    /// Jobs created at once.
    #[arg(long, default_value_t = 50)]
    jobs: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let result = minik8s_bench::gpubench::run(&args.minik8s, args.jobs).await?;
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(())
}
