//! minik8s apiserver: Kubernetes REST and watch over HTTPS on the storage layer (filled by the apiserver issue).
