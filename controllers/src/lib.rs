//! minik8s controllers: scheduler and workload controllers built on kube-runtime (not built yet).
