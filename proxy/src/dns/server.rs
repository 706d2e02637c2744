//! The DNS server: UDP and TCP on one address, answering cluster names from the current
//! [`Zone`] and forwarding other names to the host's resolvers (hickory-resolver, with its
//! cache). Malformed queries get FORMERR; answers too large for UDP are truncated (TC) so the
//! client retries over TCP.

use super::zone::{Answer, Data, Kind, TTL, Zone};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, CNAME, PTR, SOA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use hickory_resolver::TokioResolver;
use hickory_resolver::net::{DnsError, NetError};
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio_util::sync::CancellationToken;

/// The zone the server answers from, replaced whole when the cluster changes.
pub type Shared = Arc<RwLock<Arc<Zone>>>;

/// The largest UDP answer without EDNS (RFC 1035).
const UDP_PLAIN: usize = 512;
/// The largest UDP answer offered with EDNS (the DNS flag day's 1232).
const UDP_EDNS: u16 = 1232;

/// Answers queries from a zone, forwarding the rest.
pub struct Handler {
    zone: Shared,
    forward: Option<TokioResolver>,
}

fn name(s: &str) -> Option<Name> {
    Name::from_ascii(format!("{s}.")).ok()
}

fn record(owner: &str, data: &Data) -> Option<Record> {
    let owner = name(owner)?;
    let rdata = match data {
        Data::A(ip) => RData::A(A(*ip)),
        Data::Cname(t) => RData::CNAME(CNAME(name(t)?)),
        Data::Ptr(t) => RData::PTR(PTR(name(t)?)),
        Data::Srv {
            port,
            weight,
            target,
        } => RData::SRV(SRV::new(0, *weight, *port, name(target)?)),
    };
    Some(Record::from_rdata(owner, TTL, rdata))
}

fn kind(t: RecordType) -> Kind {
    match t {
        RecordType::A => Kind::A,
        RecordType::AAAA => Kind::Aaaa,
        RecordType::CNAME => Kind::Cname,
        RecordType::SRV => Kind::Srv,
        RecordType::PTR => Kind::Ptr,
        RecordType::ANY => Kind::Any,
        _ => Kind::Other,
    }
}

/// The zone's SOA, as CoreDNS gives it (negative answers are cached for its minimum).
fn soa(domain: &str) -> Option<Record> {
    let data = SOA::new(
        name(&format!("ns.dns.{domain}"))?,
        name(&format!("hostmaster.{domain}"))?,
        1,
        7200,
        1800,
        86400,
        TTL,
    );
    Some(Record::from_rdata(name(domain)?, TTL, RData::SOA(data)))
}

impl Handler {
    /// A handler on `zone`; `forward` answers names outside it (none: REFUSED).
    pub fn new(zone: Shared, forward: Option<TokioResolver>) -> Self {
        Handler { zone, forward }
    }

    /// The host's resolvers (from `/etc/resolv.conf`), with a cache.
    pub fn system_resolver() -> Option<TokioResolver> {
        match TokioResolver::builder_tokio() {
            Ok(mut b) => {
                let opts = b.options_mut();
                opts.cache_size = 16_384;
                opts.timeout = Duration::from_secs(2);
                opts.attempts = 2;
                Some(b.build().ok()?)
            }
            Err(e) => {
                tracing::warn!(error = %e, "no host resolvers: names outside the cluster are refused");
                None
            }
        }
    }

    /// The answer to one DNS message (`None`: nothing to answer, as for a response), at most
    /// `limit` bytes long (UDP) or any length (TCP).
    pub async fn handle(&self, packet: &[u8], udp: bool) -> Option<Vec<u8>> {
        let request = match Message::from_vec(packet) {
            Ok(m) => m,
            Err(_) if packet.len() >= 2 => {
                let id = u16::from_be_bytes([packet[0], packet[1]]);
                let msg = Message::error_msg(id, OpCode::Query, ResponseCode::FormErr);
                return msg.to_vec().ok();
            }
            Err(_) => return None,
        };
        if request.metadata.message_type == MessageType::Response {
            return None;
        }
        let mut response = Message::response(request.metadata.id, request.metadata.op_code);
        response.metadata.recursion_desired = request.metadata.recursion_desired;
        response.metadata.recursion_available = true;
        let limit = match &request.edns {
            Some(e) => {
                let mut edns = Edns::new();
                edns.set_max_payload(UDP_EDNS);
                response.set_edns(edns);
                (e.max_payload().clamp(UDP_PLAIN as u16, UDP_EDNS)) as usize
            }
            None => UDP_PLAIN,
        };
        if request.metadata.op_code != OpCode::Query {
            response.metadata.response_code = ResponseCode::NotImp;
        } else if request.queries.len() != 1 {
            response.metadata.response_code = ResponseCode::FormErr;
        } else {
            let query = request.queries[0].clone();
            self.resolve(&query, &mut response).await;
            response.add_query(query);
        }
        let bytes = response.to_vec().ok()?;
        if udp && bytes.len() > limit {
            let mut cut = response.truncate();
            cut.metadata.truncation = true;
            return cut.to_vec().ok();
        }
        Some(bytes)
    }

    async fn resolve(&self, query: &Query, response: &mut Message) {
        let qname = query
            .name()
            .to_ascii()
            .trim_end_matches('.')
            .to_ascii_lowercase();
        let zone = self.zone.read().expect("zone lock").clone();
        if !zone.synced() {
            // Nothing listed yet: not an answer to cache.
            response.metadata.response_code = ResponseCode::ServFail;
            return;
        }
        match zone.answer(&qname, kind(query.query_type())) {
            Answer::Records {
                answers,
                additional,
            } => {
                response.metadata.authoritative = true;
                let last = answers.last().map(|(_, d)| d.clone());
                response.add_answers(answers.iter().filter_map(|(n, d)| record(n, d)));
                response.add_additionals(additional.iter().filter_map(|(n, d)| record(n, d)));
                // An ExternalName's target outside the cluster: follow it upstream.
                if let Some(Data::Cname(target)) = last
                    && query.query_type() != RecordType::CNAME
                    && let (Some(forward), Some(target)) = (&self.forward, name(&target))
                    && let Ok(found) = forward.lookup(target, query.query_type()).await
                {
                    response.add_answers(found.answers().iter().cloned());
                }
            }
            Answer::NoData => {
                response.metadata.authoritative = true;
                response.add_authorities(soa(zone.domain()));
            }
            Answer::NxDomain => {
                response.metadata.authoritative = true;
                response.metadata.response_code = ResponseCode::NXDomain;
                response.add_authorities(soa(zone.domain()));
            }
            Answer::Forward => {
                let Some(forward) = &self.forward else {
                    response.metadata.response_code = ResponseCode::Refused;
                    return;
                };
                match forward
                    .lookup(query.name().clone(), query.query_type())
                    .await
                {
                    Ok(found) => {
                        response.add_answers(found.answers().iter().cloned());
                    }
                    Err(NetError::Dns(DnsError::NoRecordsFound(none))) => {
                        response.metadata.response_code = none.response_code;
                        if let Some(soa) = none.soa {
                            response.add_authority(soa.into_record_of_rdata());
                        }
                    }
                    Err(e) => {
                        tracing::debug!(name = %qname, error = %e, "forwarding failed");
                        response.metadata.response_code = ResponseCode::ServFail;
                    }
                }
            }
        }
    }
}

/// Binds UDP and TCP on `addr` (also before the address exists on the node: `IP_FREEBIND`).
pub fn bind(addr: SocketAddr) -> std::io::Result<(UdpSocket, TcpListener)> {
    use socket2::{Domain, Protocol, Socket, Type};
    let domain = Domain::for_address(addr);
    let udp = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    udp.set_freebind_v4(true)?;
    udp.set_reuse_address(true)?;
    udp.set_recv_buffer_size(4 << 20)?;
    udp.set_nonblocking(true)?;
    udp.bind(&addr.into())?;
    let tcp = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
    tcp.set_freebind_v4(true)?;
    tcp.set_reuse_address(true)?;
    tcp.set_nonblocking(true)?;
    tcp.bind(&addr.into())?;
    tcp.listen(1024)?;
    Ok((
        UdpSocket::from_std(udp.into())?,
        TcpListener::from_std(tcp.into())?,
    ))
}

/// Serves DNS on the bound sockets until `shutdown`, with `workers` UDP tasks.
pub async fn serve(
    handler: Arc<Handler>,
    udp: UdpSocket,
    tcp: TcpListener,
    workers: usize,
    shutdown: CancellationToken,
) {
    let udp = Arc::new(udp);
    let tasks = tokio_util::task::TaskTracker::new();
    for _ in 0..workers.max(1) {
        let (udp, handler, shutdown) = (udp.clone(), handler.clone(), shutdown.clone());
        minik8s_task::spawn_on(&tasks, "dns-udp-worker", async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let (n, peer) = tokio::select! {
                    r = udp.recv_from(&mut buf) => match r {
                        Ok(r) => r,
                        Err(e) => {
                            tracing::debug!(error = %e, "dns recv");
                            continue;
                        }
                    },
                    _ = shutdown.cancelled() => return,
                };
                if let Some(answer) = handler.handle(&buf[..n], true).await
                    && let Err(e) = udp.send_to(&answer, peer).await
                {
                    tracing::debug!(error = %e, %peer, "dns send");
                }
            }
        });
    }
    {
        let shutdown = shutdown.clone();
        minik8s_task::spawn_on(&tasks, "dns-tcp-accept", async move {
            loop {
                let (mut conn, _) = tokio::select! {
                    r = tcp.accept() => match r {
                        Ok(c) => c,
                        Err(e) => {
                            tracing::debug!(error = %e, "dns accept");
                            continue;
                        }
                    },
                    _ = shutdown.cancelled() => return,
                };
                let (handler, shutdown) = (handler.clone(), shutdown.clone());
                minik8s_task::spawn("dns-tcp-connection", async move {
                    let serve = async {
                        loop {
                            let len = conn.read_u16().await? as usize;
                            let mut buf = vec![0u8; len];
                            conn.read_exact(&mut buf).await?;
                            if let Some(answer) = handler.handle(&buf, false).await {
                                conn.write_u16(answer.len() as u16).await?;
                                conn.write_all(&answer).await?;
                            }
                        }
                        #[allow(unreachable_code)]
                        Ok::<(), std::io::Error>(())
                    };
                    tokio::select! {
                        _ = tokio::time::timeout(Duration::from_secs(30), serve) => {}
                        _ = shutdown.cancelled() => {}
                    }
                });
            }
        });
    }
    tasks.close();
    tasks.wait().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;

    fn handler() -> Handler {
        let zone = Zone::build(
            "cluster.local",
            &[super::super::zone::Service {
                namespace: "default".into(),
                name: "web".into(),
                cluster_ip: Some("10.96.0.20".parse().unwrap()),
                ..Default::default()
            }],
            &[],
            &[],
            &[],
            None,
        );
        Handler::new(Arc::new(RwLock::new(Arc::new(zone))), None)
    }

    fn ask(name: &str, t: RecordType) -> Vec<u8> {
        let mut m = Message::query();
        m.metadata.id = 7;
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        m.to_vec().unwrap()
    }

    #[tokio::test]
    async fn answers_nxdomain_formerr_and_refuses_without_upstream() {
        let h = handler();
        let got = h
            .handle(&ask("web.default.svc.cluster.local.", RecordType::A), true)
            .await
            .unwrap();
        let m = Message::from_vec(&got).unwrap();
        assert_eq!(m.metadata.id, 7);
        assert!(m.metadata.authoritative);
        assert_eq!(m.answers.len(), 1);
        assert_eq!(
            m.answers[0].data.ip_addr(),
            Some("10.96.0.20".parse().unwrap())
        );
        let got = h
            .handle(&ask("nope.default.svc.cluster.local.", RecordType::A), true)
            .await
            .unwrap();
        let m = Message::from_vec(&got).unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
        assert_eq!(m.authorities.len(), 1, "SOA in authority");
        // Garbage with an id gets FORMERR; shorter garbage gets nothing.
        let got = h.handle(&[0x12, 0x34, 0xff], true).await.unwrap();
        let m = Message::from_vec(&got).unwrap();
        assert_eq!(
            (m.metadata.id, m.metadata.response_code),
            (0x1234, ResponseCode::FormErr)
        );
        assert_eq!(h.handle(&[1], true).await, None);
        let got = h
            .handle(&ask("example.org.", RecordType::A), true)
            .await
            .unwrap();
        let m = Message::from_vec(&got).unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::Refused);
    }
}
