//! `dns-bench`: Debian's `dnsperf` against a node's cluster DNS server (cluster names, then
//! cached external names); prints one JSON object.

use clap::Parser;

/// Cluster DNS benchmark.
#[derive(Parser, Debug)]
struct Args {
    /// Services in the zone (each queried by its full name).
    #[arg(long, default_value_t = 200)]
    services: usize,
    /// Seconds per dnsperf run.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Queries outstanding at once (dnsperf's `-q`).
    #[arg(long, default_value_t = 20)]
    outstanding: usize,
    /// dnsperf clients (`-c`).
    #[arg(long, default_value_t = 4)]
    clients: usize,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let result = minik8s_bench::dnsbench::run(minik8s_bench::dnsbench::Plan {
        services: a.services,
        seconds: a.seconds,
        outstanding: a.outstanding,
        clients: a.clients,
    })?;
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(())
}
