//! Serving: HTTPS with client certificates (`server`), turning a request into a typed
//! [`request::RequestInfo`], the seats of requests in flight (`inflight`), health checks, the
//! audit log, the Prometheus series of `/metrics` (`prometheus`), the in-process transport for
//! components in this process (`local`), and the encodings of responses: Tables (`table`) and
//! protobuf (`proto`).

pub mod audit;
pub mod health;
pub mod inflight;
pub mod local;
pub mod prometheus;
pub mod proto;
pub mod request;
pub mod server;
pub mod table;
