//! How the `minik8s` binary is linked.
//!
//! - **Position-dependent** (`-no-pie`). A position-independent executable (the default)
//!   carries about 117,000 dynamic relocations that the loader applies at every start: it
//!   reads all 2.8 MB of them and writes into every page of the 2.4 MB of vtables and
//!   constant tables (`.data.rel.ro`), which then stay private, dirty memory for the life of
//!   the process. Linked at a fixed address those tables stay clean, shared pages of the
//!   file, mapped only where they are read. (Address-space randomisation then covers the
//!   heap, stacks and libraries, not the binary's own code.)
//! - **Idle code first, then start-up's** (release builds). `startup.order` lists the
//!   functions an idle control plane runs, then those only its start-up runs
//!   (`hack/order-symbols.sh` records both with callgrind); the linker (LLD, Rust's default on
//!   x86-64 Linux) lays them out in that order at the start of `.text`. Start-up then touches
//!   a few megabytes of dense code instead of pages scattered over 55 MB, each of which the
//!   kernel maps with its 64 KiB fault-around window, and once `up` gives start-up's pages
//!   back (`src/startup_code.rs`) the idle code faults back in as one dense block. The
//!   workspace's linker driver (`hack/link/cc`) first resolves the file's names to this
//!   build's, local copies (`.llvm.<hash>`) included, whose hashes change with every edit of
//!   their codegen unit. Names a build no longer has are skipped, and functions the file does
//!   not name follow it as before: a stale file costs memory, never correctness.
use std::path::Path;

fn main() {
    println!("cargo:rustc-link-arg-bins=-no-pie");
    println!("cargo:rerun-if-changed=startup.order");
    let order = Path::new(env!("CARGO_MANIFEST_DIR")).join("startup.order");
    if std::env::var("PROFILE").as_deref() == Ok("release") && order.exists() {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
}
