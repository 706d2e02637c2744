//! `controller-manager`: runs minik8s's controllers against an apiserver.

/// jemalloc instead of glibc's malloc, as in `minik8s` (informers decode and drop many small
/// objects; glibc's free lists cost a large share of the CPU under load).
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    use clap::Parser;
    minik8s_kubeconfig::process::init_tracing();
    minik8s_controllers::cli::run(minik8s_controllers::cli::Args::parse()).await
}
