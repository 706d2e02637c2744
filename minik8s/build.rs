//! How the `minik8s` binary is built.
//!
//! Linked position-dependent (`-no-pie`). A position-independent executable (the default)
//! carries about 117,000 dynamic relocations that the loader applies at every start: it
//! writes into every page of the 2.4 MB of vtables and constant tables (`.data.rel.ro`),
//! which then stay private, dirty memory for the life of the process. Linked at a fixed
//! address those tables stay clean, shared pages of the file, mapped only where they are read.
//! (Address-space randomisation then covers the heap, stacks and libraries, not the binary's
//! own code.) `hack/idle-rss.sh` measures it: docs/benchmarks.md.
//!
//! Records the source's git commit for `/version`'s `gitCommit` (`MINIK8S_GIT_COMMIT`; zeros
//! when the source is not a git tree). Read here rather than in the apiserver's library, so
//! that a commit rebuilds this thin crate, not the library and everything built on it.

fn main() {
    println!("cargo:rustc-link-arg-bins=-no-pie");
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|c| c.len() == 40 && c.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_else(|| "0".repeat(40));
    println!("cargo:rustc-env=MINIK8S_GIT_COMMIT={commit}");
    println!("cargo:rerun-if-changed=../.git/HEAD");
    println!("cargo:rerun-if-changed=../.git/refs/heads");
}
