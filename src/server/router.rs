//! Sends each request to a wing. The proxy listener: the lock API under its
//! optional prefix, versioned routes to the versioning wing, everything else
//! straight through. The admin listener: health, readiness, metrics, locks.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use super::Handler;
use crate::body::{self, Body};
use crate::error::Error;
use crate::locks::Locks;
use crate::problem;
use crate::proxy::{Inbound, Upstream};
use crate::resources::{ResourceMap, Route};
use crate::store::Store;
use crate::versioning::Versioning;

/// The proxy listener's router.
#[derive(Clone)]
pub struct ProxyRouter {
    pub resources: Arc<ResourceMap>,
    pub versioning: Versioning,
    pub upstream: Upstream,
    pub locks: Locks,
    /// `Some("/_lockstep")` mounts `/_lockstep/locks/{r}` on this listener.
    pub lock_prefix: Option<Arc<str>>,
    pub proto: &'static str,
}

impl Handler for ProxyRouter {
    async fn call(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        if let Some(prefix) = &self.lock_prefix {
            if let Some(rest) = req.uri().path().strip_prefix(prefix.as_ref()) {
                if let Some(resource) = rest.strip_prefix("/locks/") {
                    let resource = resource.to_string();
                    return self.locks.handle(req, &resource).await;
                }
            }
        }
        let inbound = Inbound {
            client_ip: peer.ip(),
            proto: self.proto,
        };
        let route = match self.resources.classify(req.uri().path()) {
            Ok(route) => route,
            Err(e) => return problem::response(&Error::InvalidPath(e)),
        };
        if route == Route::Unversioned {
            return self.upstream.passthrough(req, inbound).await;
        }
        match self.versioning.handle(req, &route, inbound).await {
            Ok(resp) => resp,
            // A method the route does not version (OPTIONS, POST on an item…).
            Err(req) => self.upstream.passthrough(req, inbound).await,
        }
    }
}

/// The admin listener's router.
#[derive(Clone)]
pub struct AdminRouter {
    pub store: Arc<dyn Store>,
    pub locks: Locks,
    pub metrics: Arc<dyn Fn() -> String + Send + Sync>,
}

impl Handler for AdminRouter {
    async fn call(&self, req: Request<Incoming>, _peer: SocketAddr) -> Response<Body> {
        let path = req.uri().path().to_string();
        if let Some(resource) = path.strip_prefix("/locks/") {
            return self.locks.handle(req, resource).await;
        }
        let read_only = req.method() == Method::GET || req.method() == Method::HEAD;
        match path.as_str() {
            "/healthz" if read_only => text(StatusCode::OK, "ok\n"),
            "/readyz" if read_only => {
                match tokio::time::timeout(Duration::from_secs(2), self.store.ping()).await {
                    Ok(Ok(())) => text(StatusCode::OK, "ready\n"),
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "not ready: store unreachable");
                        problem::response(&e)
                    }
                    Err(_) => problem::response(&Error::Unavailable(sqlx::Error::PoolTimedOut)),
                }
            }
            "/metrics" if read_only => {
                let mut resp = text(StatusCode::OK, &(self.metrics)());
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                resp
            }
            "/healthz" | "/readyz" | "/metrics" => {
                problem::response(&Error::MethodNotAllowed("GET, HEAD"))
            }
            _ => problem::response(&Error::NotFound(format!("no admin endpoint at {path}"))),
        }
    }
}

fn text(status: StatusCode, s: &str) -> Response<Body> {
    let mut resp = Response::new(body::full(s.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}
