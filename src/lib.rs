//! lockstep: a sidecar reverse proxy that gives an unmodified REST API
//! optimistic concurrency (versions, ETags, 409 on stale writes) and a
//! distributed-lock service, both kept in one SQL database.
//!
//! # Layout
//!
//! Layers, top to bottom; a module only uses modules below it, and nothing
//! forms a loop.
//!
//! * [`app`] — the composition root: builds the store, the upstream client
//!   and the services from a validated config and hands each its narrow
//!   pieces. Nothing imports it.
//! * [`server`] — the edge: listeners, accept loop, graceful drain, and the
//!   router that sends each request to a wing, answers readiness and the
//!   metrics scrape from the whole [`store::Store`], and renders forwarding
//!   failures as problem responses. No wing imports it.
//! * [`versioning`] and [`locks`] — the two wings. They never import each
//!   other: the versioning wing holds only [`store::Versions`] (fencing
//!   reads the lock row inside the version table's own statements), the
//!   lock wing only [`store::LockStore`]; they meet only in the database.
//! * [`proxy`] (forwarding to the backend; failures are typed [`error`]s,
//!   never responses), [`problem`] (THE error → RFC 9457 response
//!   mapping), [`telemetry`] (tracing set-up).
//! * The ground floor: [`config`] (the typed settings every part receives,
//!   durations as `Duration`s), [`auth`] (bearer tokens of the lock and
//!   version APIs), [`store`], [`body`], [`names`], [`error`],
//!   [`resources`], [`metrics`], [`timefmt`], [`etag`], [`hex`], [`tls`].
//!   Within it, `config`
//!   uses `resources`, `store` and `tls`; `auth`, `body`, `names` and
//!   `store` use `error` (`store` also `metrics`); `error` uses `resources`;
//!   `resources`, `metrics`, `timefmt`, `etag`, `hex` and `tls` use nothing
//!   of lockstep's.
//!   [`metrics`] holds the one registry; the wings, forwarding and the store
//!   each register their own families in it.
//!
//! Inside [`store`]: the statement texts (`statements/`) stand below the
//! shared SQL plumbing (`sql.rs`: pools, timing, the read and write path),
//! which stands below the tables' implementations (`versions.rs`,
//! `version_ops.rs`, `locks.rs`); `sqlite.rs` and `postgres.rs` build it.

pub mod app;
pub mod auth;
pub mod body;
pub mod config;
pub mod error;
pub mod etag;
pub mod hex;
pub mod json_object;
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
