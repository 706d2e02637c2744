//! The load, as ClusterLoader2's load test shapes it: a namespace per 100 nodes, each with
//! Deployments of three sizes (a quarter of its pods in 250-pod Deployments, a quarter in
//! 30-pod ones, the rest in 5-pod ones), each Deployment with a ConfigMap and a Secret its
//! pods mount, and every second one behind a Service.

use serde_json::{Value, json};

/// Label on every object of the load (and on its pods).
pub const LOAD_LABEL: &str = "scale.minik8s.io/load";

/// One Deployment of the load.
#[derive(Clone, Debug)]
pub struct Deploy {
    /// Its namespace.
    pub namespace: String,
    /// Its name (also its pods' `app` label, its ConfigMap's, Secret's and Service's name).
    pub name: String,
    /// Its size.
    pub replicas: usize,
    /// Whether a Service selects its pods.
    pub service: bool,
}

/// The namespaces of a load on `nodes` nodes (one per 100 nodes, as ClusterLoader2's
/// `NODES_PER_NAMESPACE`).
pub fn namespaces(nodes: usize) -> Vec<String> {
    (0..nodes.div_ceil(100).max(1))
        .map(|i| format!("load-{i}"))
        .collect()
}

/// The Deployments of `pods` pods spread over the namespaces of `nodes` nodes.
pub fn plan(nodes: usize, pods: usize) -> Vec<Deploy> {
    let namespaces = namespaces(nodes);
    let mut out = Vec::new();
    for (n, namespace) in namespaces.iter().enumerate() {
        // The first namespace takes the remainder.
        let mut left = pods / namespaces.len() + if n == 0 { pods % namespaces.len() } else { 0 };
        let big = left / 4 / 250;
        let medium = left / 4 / 30;
        let mut sizes = vec![250; big];
        sizes.extend(std::iter::repeat_n(30, medium));
        left -= big * 250 + medium * 30;
        sizes.extend(std::iter::repeat_n(5, left / 5));
        if !left.is_multiple_of(5) {
            sizes.push(left % 5);
        }
        for (i, replicas) in sizes.into_iter().enumerate() {
            let kind = match replicas {
                250 => "big",
                30 => "medium",
                _ => "small",
            };
            out.push(Deploy {
                namespace: namespace.clone(),
                name: format!("{kind}-{i}"),
                replicas,
                service: i % 2 == 0,
            });
        }
    }
    out
}

fn labels(d: &Deploy) -> Value {
    json!({"app": d.name, LOAD_LABEL: "true"})
}

/// A Namespace of the load.
pub fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {LOAD_LABEL: "true"}}})
}

/// The Deployment's ConfigMap (a few hundred bytes, as ClusterLoader2's).
pub fn config_map(d: &Deploy) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": d.name, "labels": labels(d)},
        "data": {"data.yaml": format!("a: 1\nb: 2\nname: {}\n{}", d.name, "x".repeat(200))}})
}

/// The Deployment's Secret.
pub fn secret(d: &Deploy) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": d.name, "labels": labels(d)},
        "type": "Opaque",
        "stringData": {"password": format!("{}-secret", d.name)}})
}

/// The Service in front of the Deployment's pods.
pub fn service(d: &Deploy) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": d.name, "labels": labels(d)},
        "spec": {"selector": {"app": d.name},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
}

/// The Deployment: small pods that mount its ConfigMap and Secret.
pub fn deployment(d: &Deploy) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": d.name, "labels": labels(d)},
        "spec": {"replicas": d.replicas, "selector": {"matchLabels": {"app": d.name}},
            "template": {"metadata": {"labels": labels(d)},
                "spec": {
                    "containers": [{"name": "app", "image": "pause:3.10",
                        "resources": {"requests": {"cpu": "10m", "memory": "10Mi"}},
                        "volumeMounts": [{"name": "config", "mountPath": "/etc/config"},
                                         {"name": "secret", "mountPath": "/etc/secret"}]}],
                    "volumes": [{"name": "config", "configMap": {"name": d.name}},
                                {"name": "secret", "secret": {"secretName": d.name}}],
                    "terminationGracePeriodSeconds": 1}}}})
}

/// A small deterministic generator (the same scale-downs and updates in every run).
pub struct Lcg(u64);

impl Lcg {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Lcg(seed.wrapping_mul(6364136223846793005).wrapping_add(1))
    }

    /// A number in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_places_every_pod_in_mixed_sizes() {
        for (nodes, pods) in [(200, 2000), (1000, 30000), (5000, 150000), (3, 17)] {
            let plan = plan(nodes, pods);
            assert_eq!(plan.iter().map(|d| d.replicas).sum::<usize>(), pods);
            assert_eq!(
                plan.iter()
                    .map(|d| &d.namespace)
                    .collect::<std::collections::HashSet<_>>()
                    .len(),
                nodes.div_ceil(100)
            );
        }
        let plan = plan(200, 2000);
        assert!(plan.iter().any(|d| d.replicas == 250));
        assert!(plan.iter().any(|d| d.replicas == 30));
        assert!(plan.iter().any(|d| d.replicas == 5));
    }
}
