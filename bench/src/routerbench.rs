//! The router benchmark: through `minik8s up` with its node, a busybox web server behind a
//! Service and a `DNS` object, timed GETs straight to the Service's ClusterIP and through the
//! node's router (host + path), one at a time, then requests per second through the router
//! with several clients. busybox's httpd closes every connection, so each request opens a new
//! connection to the backend on both paths; the clients keep theirs to the router.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// The web server, its Service and the `DNS` object routing to it.
async fn create(client: &kube::Client) -> anyhow::Result<()> {
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::api::PostParams;
    let pp = PostParams::default();
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "busybox",
                    "command": ["sh", "-c", "mkdir -p /www && echo hello > /www/index.html && exec httpd -f -p 8080 -h /www"]}]}}},
    }))?;
    Api::<Deployment>::namespaced(client.clone(), "default")
        .create(&pp, &deployment)
        .await?;
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }))?;
    Api::<Service>::namespaced(client.clone(), "default")
        .create(&pp, &service)
        .await?;
    let dns: minik8s_proxy::router::types::DNS = serde_json::from_value(json!({
        "apiVersion": "networking.minik8s.io/v1alpha1", "kind": "DNS",
        "metadata": {"name": "bench"},
        "spec": {"host": "bench.minik8s.test", "subpaths": [{"path": "/web", "service": "web", "port": 80}]},
    }))?;
    Api::<minik8s_proxy::router::types::DNS>::namespaced(client.clone(), "default")
        .create(&pp, &dns)
        .await?;
    Ok(())
}

/// One GET on a fresh connection to `addr`.
async fn fresh(addr: &str, host: &str, path: &str) -> anyhow::Result<u16> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    get(&mut send, host, path).await
}

async fn get(
    send: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    host: &str,
    path: &str,
) -> anyhow::Result<u16> {
    send.ready().await?;
    let req = hyper::Request::get(path)
        .header("host", host)
        .body(Empty::<Bytes>::new())?;
    let resp = send.send_request(req).await?;
    let code = resp.status().as_u16();
    resp.into_body().collect().await?;
    Ok(code)
}

/// A kept-alive connection to the router.
async fn kept(addr: &str) -> anyhow::Result<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(send)
}

/// Runs the benchmark: `n` timed requests per path, then `clients` clients for `seconds`.
pub async fn run(
    binary: &Path,
    images: &[std::path::PathBuf],
    n: usize,
    clients: usize,
    seconds: u64,
) -> anyhow::Result<Value> {
    crate::nodebench::around_node(binary, images, |client, _pid| async move {
        create(&client).await?;
        let svc: Api<Service> = Api::namespaced(client.clone(), "default");
        let ip = svc
            .get("web")
            .await?
            .spec
            .and_then(|s| s.cluster_ip)
            .unwrap_or_default();
        let direct = format!("{ip}:80");
        let router = "127.0.0.1:80";
        let host = "bench.minik8s.test";
        // Wait until both paths answer.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let a = fresh(&direct, "web", "/").await.unwrap_or(0);
            let b = fresh(router, host, "/web/").await.unwrap_or(0);
            if a == 200 && b == 200 {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "web never answered ({a}, {b})");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut straight = Vec::with_capacity(n);
        let mut routed = Vec::with_capacity(n);
        let mut conn = kept(router).await?;
        for _ in 0..n {
            let t = Instant::now();
            anyhow::ensure!(
                fresh(&direct, "web", "/").await? == 200,
                "direct GET failed"
            );
            straight.push(t.elapsed());
            let t = Instant::now();
            anyhow::ensure!(
                get(&mut conn, host, "/web/").await? == 200,
                "routed GET failed"
            );
            routed.push(t.elapsed());
        }
        let straight = crate::bench::percentiles(&mut straight);
        let routed = crate::bench::percentiles(&mut routed);
        let overhead =
            routed["p50_ms"].as_f64().unwrap_or(0.0) - straight["p50_ms"].as_f64().unwrap_or(0.0);
        // Throughput through the router.
        let stop = Instant::now() + Duration::from_secs(seconds);
        let mut tasks = Vec::new();
        for _ in 0..clients {
            tasks.push(tokio::spawn(async move {
                let mut conn = kept(router).await?;
                let (mut ok, mut failed) = (0u64, 0u64);
                while Instant::now() < stop {
                    match get(&mut conn, host, "/web/").await {
                        Ok(200) => ok += 1,
                        _ => {
                            failed += 1;
                            conn = kept(router).await?;
                        }
                    }
                }
                anyhow::Ok((ok, failed))
            }));
        }
        let (mut ok, mut failed) = (0, 0);
        for t in tasks {
            let (o, f) = t.await??;
            ok += o;
            failed += f;
        }
        Ok(json!({
            "straight_to_cluster_ip": straight,
            "through_router": routed,
            "router_overhead_p50_ms": overhead,
            "sustained": {"clients": clients, "seconds": seconds,
                          "requests_per_second": ok as f64 / seconds as f64, "failed": failed},
        }))
    })
    .await
}
