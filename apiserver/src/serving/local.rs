//! The in-process transport: components running in the apiserver's own process (the
//! controller manager, the GPUJob controller, the function gateway, the edge registry, the
//! local node) send their requests straight into the router, as the user their client
//! certificate names. Authentication's result is the same as over TLS (the identity is put on
//! the request as a verified certificate's would be); authorization, admission, audit, the
//! in-flight limit and the request timeout all apply as for any client. What goes away is the
//! loopback socket, TLS and HTTP framing, and their buffers on both ends: one connection per
//! watch each held about 20 KB of read buffers and record state (see docs/benchmarks.md).

use crate::auth::{PeerIdentity, User};
use axum::Router;
use std::convert::Infallible;
use std::task::{Context, Poll};
use tower::ServiceExt;

/// A tower service into the apiserver's router as one user (`kube::Client::new` takes it).
#[derive(Clone)]
pub struct LocalService {
    app: Router,
    identity: PeerIdentity,
}

impl LocalService {
    /// Requests into `app` as `user`.
    pub fn new(app: Router, user: User) -> Self {
        LocalService {
            app,
            identity: PeerIdentity(Some(user)),
        }
    }
}

impl<B> tower::Service<axum::http::Request<B>> for LocalService
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = axum::response::Response;
    type Error = Infallible;
    type Future = tower::util::Oneshot<Router, axum::http::Request<axum::body::Body>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: axum::http::Request<B>) -> Self::Future {
        let mut req = req.map(axum::body::Body::new);
        req.extensions_mut().insert(self.identity.clone());
        self.app.clone().oneshot(req)
    }
}
