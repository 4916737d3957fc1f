//! lockstep: a sidecar reverse proxy that gives an unmodified REST API
//! optimistic concurrency (versions, ETags, 409 on stale writes) and a
//! distributed-lock service, both kept in one SQL database.
//!
//! # Layout
//!
//! Layers, top to bottom; a module only uses modules below it.
//!
//! * [`app`] — the composition root: builds the store, the upstream client
//!   and the services from a validated config and hands them to the server.
//! * [`server`] — the edge: listeners, accept loop, graceful drain, and the
//!   router that sends each request to a wing.
//! * [`versioning`] and [`locks`] — the two wings. They never import each
//!   other and meet only through the store.
//! * [`proxy`] (forwarding to the backend), [`problem`] (errors as RFC 9457
//!   responses), [`telemetry`] (tracing set-up).
//! * [`config`], [`resources`], [`store`], [`metrics`], [`error`], [`body`],
//!   [`names`], [`timefmt`], [`tls`] (certificates and trust roots) — the
//!   ground floor.
//!   [`metrics`] imports nothing of lockstep's; the store records its
//!   statement timings there.

pub mod app;
pub mod auth;
pub mod body;
pub mod config;
pub mod error;
pub mod locks;
pub mod metrics;
pub mod names;
pub mod problem;
pub mod proxy;
pub mod resources;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod timefmt;
pub mod tls;
pub mod versioning;
