//! minik8s's benchmarks and fault drills. Each benchmark is a module with a `run` the
//! binary of the same name calls (`api-bench`, `scale-bench`, `node-bench`, `fn-bench`,
//! `dns-bench`, `router-bench`, `wf-bench`, `gpu-bench`, `vnode-bench`, `edge-bench`, `ha-bench`); they print figures and are not
//! timed tests. `drills` are the fault drills (`fault-drill`, and the `fault_drills` test).
//! The clusters they start come from the conformance harness (`minik8s-conformance`).

pub mod bench;
pub mod dnsbench;
pub mod drills;
pub mod edgebench;
pub mod fnbench;
pub mod gpubench;
pub mod habench;
pub mod nodebench;
pub mod routerbench;
pub mod scale;
pub mod vnodebench;
pub mod wfbench;
