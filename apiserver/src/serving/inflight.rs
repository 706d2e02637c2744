//! Seats for requests in flight (watches and other long-running requests take none), in two
//! lanes as upstream's priority levels keep heartbeats apart from the rest: Leases (node
//! heartbeats and leader election, upstream's `node-high` and `leader-election` levels) and
//! single-Node requests (a kubelet's status) have seats of their own, so a flood of other
//! requests cannot make nodes look dead or controllers lose their leadership. A request
//! finding its lane full gets 429.

use crate::serving::request::{RequestInfo, Verb};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The two lanes' seats.
#[derive(Debug)]
pub struct InFlight {
    heartbeats: Arc<Semaphore>,
    general: Arc<Semaphore>,
}

impl InFlight {
    /// `max` seats for requests in general, and a quarter as many again for heartbeats.
    pub fn new(max: usize) -> Self {
        InFlight {
            heartbeats: Arc::new(Semaphore::new((max / 4).max(1))),
            general: Arc::new(Semaphore::new(max.max(1))),
        }
    }

    /// A seat for this request in its lane, or `None` when the lane is full.
    pub fn try_acquire(&self, info: &RequestInfo) -> Option<OwnedSemaphorePermit> {
        let lane = if is_heartbeat(info) {
            &self.heartbeats
        } else {
            &self.general
        };
        lane.clone().try_acquire_owned().ok()
    }
}

/// Whether a request is a heartbeat: anything on Leases, or a read or write of one Node.
fn is_heartbeat(info: &RequestInfo) -> bool {
    let RequestInfo::Resource(r) = info else {
        return false;
    };
    match (r.group.as_str(), r.resource.as_str()) {
        ("coordination.k8s.io", "leases") => true,
        ("", "nodes") => matches!(
            r.verb,
            Verb::Get | Verb::Create | Verb::Update | Verb::Patch
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serving::request::parse;
    use axum::http::Method;

    fn info(method: Method, path: &str) -> RequestInfo {
        parse(&method, path, None)
    }

    #[test]
    fn a_full_general_lane_leaves_heartbeats_their_seats() {
        let seats = InFlight::new(4);
        let list = info(Method::GET, "/api/v1/pods");
        let held: Vec<_> = (0..4).map(|_| seats.try_acquire(&list).unwrap()).collect();
        assert!(seats.try_acquire(&list).is_none());
        let lease = info(
            Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1",
        );
        let status = info(Method::PATCH, "/api/v1/nodes/n1/status");
        let lease_seat = seats.try_acquire(&lease).expect("a heartbeat seat");
        // One heartbeat seat (4 / 4): the next heartbeat waits for it.
        assert!(seats.try_acquire(&status).is_none());
        drop(lease_seat);
        assert!(seats.try_acquire(&status).is_some());
        // A list of nodes is not a heartbeat.
        assert!(
            seats
                .try_acquire(&info(Method::GET, "/api/v1/nodes"))
                .is_none()
        );
        drop(held);
        assert!(seats.try_acquire(&list).is_some());
    }
}
