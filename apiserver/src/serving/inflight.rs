//! Seats for requests in flight (watches and other long-running requests take none), in
//! lanes as upstream's priority levels keep heartbeats apart from the rest: node heartbeats
//! (Leases in `kube-node-lease` and single-Node requests, a kubelet's status: upstream's
//! `node-high` level) and leader election (every other Lease: upstream's `leader-election`
//! level) have seats of their own, so a flood of other requests cannot make nodes look dead,
//! and 5,000 nodes' heartbeats cannot make controllers lose their leadership. A request
//! finding its lane full gets 429.

use crate::serving::request::{RequestInfo, Verb};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The lanes' seats.
#[derive(Debug)]
pub struct InFlight {
    heartbeats: Arc<Semaphore>,
    leader_election: Arc<Semaphore>,
    general: Arc<Semaphore>,
}

/// The namespace of the nodes' Leases.
const NODE_LEASES: &str = "kube-node-lease";

/// Which lane a request takes.
#[derive(Debug, PartialEq)]
enum Lane {
    Heartbeats,
    LeaderElection,
    General,
}

impl InFlight {
    /// `max` seats for requests in general, a quarter as many again for node heartbeats and
    /// a tenth for leader election (upstream's shares: node-high 40 and leader-election 10
    /// beside workload-low's 100 and the rest).
    pub fn new(max: usize) -> Self {
        InFlight {
            heartbeats: Arc::new(Semaphore::new((max / 4).max(1))),
            leader_election: Arc::new(Semaphore::new((max / 10).max(1))),
            general: Arc::new(Semaphore::new(max.max(1))),
        }
    }

    /// A seat for this request in its lane, or `None` when the lane is full.
    pub fn try_acquire(&self, info: &RequestInfo) -> Option<OwnedSemaphorePermit> {
        let lane = match lane(info) {
            Lane::Heartbeats => &self.heartbeats,
            Lane::LeaderElection => &self.leader_election,
            Lane::General => &self.general,
        };
        lane.clone().try_acquire_owned().ok()
    }
}

/// A request's lane: node heartbeats are the nodes' Leases and reads and writes of one Node;
/// leader election is any other Lease.
fn lane(info: &RequestInfo) -> Lane {
    let RequestInfo::Resource(r) = info else {
        return Lane::General;
    };
    match (r.group.as_str(), r.resource.as_str()) {
        ("coordination.k8s.io", "leases") if r.namespace.as_deref() == Some(NODE_LEASES) => {
            Lane::Heartbeats
        }
        ("coordination.k8s.io", "leases") => Lane::LeaderElection,
        ("", "nodes")
            if matches!(
                r.verb,
                Verb::Get | Verb::Create | Verb::Update | Verb::Patch
            ) =>
        {
            Lane::Heartbeats
        }
        _ => Lane::General,
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

    #[test]
    fn full_node_heartbeats_leave_leader_election_its_seats() {
        let seats = InFlight::new(10);
        let lease = info(
            Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1",
        );
        let held: Vec<_> = (0..2).map(|_| seats.try_acquire(&lease).unwrap()).collect();
        assert!(seats.try_acquire(&lease).is_none());
        let election = info(
            Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube-scheduler",
        );
        assert_eq!(lane(&election), Lane::LeaderElection);
        let seat = seats
            .try_acquire(&election)
            .expect("a leader-election seat");
        // One seat (10 / 10).
        assert!(seats.try_acquire(&election).is_none());
        drop((seat, held));
        assert!(seats.try_acquire(&election).is_some());
        assert_eq!(lane(&info(Method::GET, "/api/v1/pods")), Lane::General);
    }
}
