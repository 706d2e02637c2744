//! How the `minik8s` binary is linked: position-dependent (`-no-pie`). A position-independent
//! executable (the default) carries about 117,000 dynamic relocations that the loader applies
//! at every start: it writes into every page of the 2.4 MB of vtables and constant tables
//! (`.data.rel.ro`), which then stay private, dirty memory for the life of the process. Linked
//! at a fixed address those tables stay clean, shared pages of the file, mapped only where
//! they are read. (Address-space randomisation then covers the heap, stacks and libraries,
//! not the binary's own code.) `hack/idle-rss.sh` measures it: docs/benchmarks.md.

fn main() {
    println!("cargo:rustc-link-arg-bins=-no-pie");
}
