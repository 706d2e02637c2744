//! APIs the apiserver answers in process instead of from the store: `metrics.k8s.io`
//! (NodeMetrics, PodMetrics), gathered from the kubelets as metrics-server does.

pub mod metrics;
