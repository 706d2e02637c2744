//! GPUs as extended resources through the kubelet's device plugin API (`deviceplugin/v1beta1`):
//! a fake plugin written for this test registers `nvidia.com/gpu` with two devices backed by
//! ordinary files; the node shows them as capacity, two pods asking for one each run with
//! their own device (its file mounted and its id in the environment, as Allocate answers),
//! and a third stays Pending (`Insufficient nvidia.com/gpu`).

use minik8s_conformance::Cluster;
use minik8s_kubelet::devices::api;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The fake plugin: devices `gpu0` and `gpu1`, each a file holding its name.
struct Fake {
    files: BTreeMap<String, PathBuf>,
}

#[tonic::async_trait]
impl api::device_plugin_server::DevicePlugin for Fake {
    async fn get_device_plugin_options(
        &self,
        _: tonic::Request<api::Empty>,
    ) -> Result<tonic::Response<api::DevicePluginOptions>, tonic::Status> {
        Ok(tonic::Response::new(api::DevicePluginOptions::default()))
    }

    type ListAndWatchStream = std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<api::ListAndWatchResponse, tonic::Status>> + Send>,
    >;

    async fn list_and_watch(
        &self,
        _: tonic::Request<api::Empty>,
    ) -> Result<tonic::Response<Self::ListAndWatchStream>, tonic::Status> {
        let devices = self
            .files
            .keys()
            .map(|id| api::Device {
                id: id.clone(),
                health: "Healthy".into(),
                topology: None,
            })
            .collect();
        // One list, then the stream stays open (as a plugin's does while it runs).
        let first = futures::stream::once(async move { Ok(api::ListAndWatchResponse { devices }) });
        Ok(tonic::Response::new(Box::pin(
            first.chain(futures::stream::pending()),
        )))
    }

    async fn get_preferred_allocation(
        &self,
        _: tonic::Request<api::PreferredAllocationRequest>,
    ) -> Result<tonic::Response<api::PreferredAllocationResponse>, tonic::Status> {
        Ok(tonic::Response::new(
            api::PreferredAllocationResponse::default(),
        ))
    }

    async fn allocate(
        &self,
        req: tonic::Request<api::AllocateRequest>,
    ) -> Result<tonic::Response<api::AllocateResponse>, tonic::Status> {
        let mut out = api::AllocateResponse::default();
        for c in req.into_inner().container_requests {
            let mut r = api::ContainerAllocateResponse::default();
            r.envs.insert("FAKE_GPUS".into(), c.devices_ids.join(","));
            for (i, id) in c.devices_ids.iter().enumerate() {
                let file = self
                    .files
                    .get(id)
                    .ok_or_else(|| tonic::Status::not_found(id.clone()))?;
                r.mounts.push(api::Mount {
                    container_path: format!("/dev/fakegpu{i}"),
                    host_path: file.display().to_string(),
                    read_only: true,
                });
            }
            out.container_responses.push(r);
        }
        Ok(tonic::Response::new(out))
    }

    async fn pre_start_container(
        &self,
        _: tonic::Request<api::PreStartContainerRequest>,
    ) -> Result<tonic::Response<api::PreStartContainerResponse>, tonic::Status> {
        Ok(tonic::Response::new(api::PreStartContainerResponse {}))
    }
}

use futures::StreamExt;

fn pod(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox\n    command: [sh, -c, 'cat /dev/fakegpu0; echo $FAKE_GPUS; exec sleep 3600']\n    resources: {{limits: {{nvidia.com/gpu: 1}}}}\n"
    )
}

#[test]
fn a_device_plugin_advertises_gpus_that_pods_get_one_each() {
    let c = Cluster::start();
    c.run_controllers(0);
    let _node = c.run_node("dp1", 9);
    let dir = c.dir().join("node-dp1/device-plugins");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !dir.join("kubelet.sock").exists() {
        assert!(
            Instant::now() < deadline,
            "the kubelet serves no registration socket"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The plugin's devices are ordinary files.
    let backing = c.dir().join("fake-gpus");
    std::fs::create_dir_all(&backing).unwrap();
    let mut files = BTreeMap::new();
    for id in ["gpu0", "gpu1"] {
        let f = backing.join(id);
        std::fs::write(&f, format!("device {id}\n")).unwrap();
        files.insert(id.to_owned(), f);
    }
    let socket = dir.join("fake.sock");
    let listener = c
        .block_on(async { tokio::net::UnixListener::bind(&socket) })
        .unwrap();
    let stop = c.shutdown_token();
    c.spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(api::device_plugin_server::DevicePluginServer::new(Fake {
                files,
            }))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                stop.cancelled_owned(),
            )
            .await;
    });
    let kubelet = dir.join("kubelet.sock");
    c.block_on(async move {
        let channel = tonic::transport::Endpoint::from_static("http://[::]:50051")
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let kubelet = kubelet.clone();
                async move {
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                        tokio::net::UnixStream::connect(kubelet).await?,
                    ))
                }
            }))
            .await
            .expect("connecting to the kubelet");
        let mut client = api::registration_client::RegistrationClient::new(channel);
        // A wrong version is refused.
        let refused = client
            .register(api::RegisterRequest {
                version: "v1alpha".into(),
                endpoint: "fake.sock".into(),
                resource_name: "nvidia.com/gpu".into(),
                options: None,
            })
            .await;
        assert!(refused.is_err());
        client
            .register(api::RegisterRequest {
                version: "v1beta1".into(),
                endpoint: "fake.sock".into(),
                resource_name: "nvidia.com/gpu".into(),
                options: None,
            })
            .await
            .expect("registered");
    });
    c.eventually(
        &[
            "get",
            "node",
            "dp1",
            "-o",
            r"jsonpath={.status.capacity.nvidia\.com/gpu} {.status.allocatable.nvidia\.com/gpu}",
        ],
        |s| s == "2 2",
    );
    // The scheduler's node view is rebuilt at most once a second.
    std::thread::sleep(Duration::from_secs(2));
    for p in ["g1", "g2"] {
        let r = c.with_manifest(&["apply"], &pod(p));
        assert!(r.ok, "{}", r.stderr);
    }
    let mut seen = Vec::new();
    for p in ["g1", "g2"] {
        c.eventually_within(
            Duration::from_secs(90),
            &["get", "pod", p, "-o", "jsonpath={.status.phase}"],
            |s| s == "Running",
        );
        let logs = c.eventually(&["logs", p], |s| s.lines().count() >= 2);
        let lines: Vec<&str> = logs.lines().collect();
        // The mounted file and the env name the same device.
        let id = lines[1].trim().to_owned();
        assert_eq!(lines[0].trim(), format!("device {id}"), "{logs}");
        seen.push(id);
    }
    seen.sort();
    assert_eq!(seen, ["gpu0", "gpu1"], "each pod has its own device");
    let r = c.with_manifest(&["apply"], &pod("g3"));
    assert!(r.ok, "{}", r.stderr);
    c.eventually(
        &["get", "events", "--field-selector=involvedObject.name=g3"],
        |s| s.contains("FailedScheduling") && s.contains("Insufficient nvidia.com/gpu"),
    );
    assert_eq!(
        c.ok(&["get", "pod", "g3", "-o", "jsonpath={.status.phase}"]),
        "Pending"
    );
    // A freed device goes to the waiting pod.
    c.ok(&["delete", "pod", "g1", "--wait=false"]);
    c.eventually_within(
        Duration::from_secs(90),
        &["get", "pod", "g3", "-o", "jsonpath={.status.phase}"],
        |s| s == "Running",
    );
}
