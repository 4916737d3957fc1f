//! The composition root: builds the store, the upstream client and the two
//! wings from a validated config, binds the listeners and runs them until
//! shutdown. Nothing imports this module; it imports everything.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Validated;
use crate::locks::metrics::LockMetrics;
use crate::locks::{self, Locks};
use crate::metrics::Metrics;
use crate::proxy::metrics::UpstreamMetrics;
use crate::proxy::{Upstream, UpstreamSettings};
use crate::server::router::{AdminRouter, ProxyRouter};
use crate::server::{self, ConnSettings};
use crate::store::{self, DbMetrics, PoolGauges};
use crate::tls::ReloadingCert;
use crate::versioning::metrics::VersionMetrics;
use crate::versioning::plan_cache::PlanCache;
use crate::versioning::Versioning;

/// Why lockstep could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot open the database: {0}")]
    Database(String),
    #[error("TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
    #[error("locks.api_tokens_file: {0}")]
    Tokens(#[from] crate::auth::TokensError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// The two listening sockets, bound before anything is served, so a port
/// in use stops start-up with its address.
struct Listeners {
    /// A std listener: each proxy worker clones it into its own runtime.
    proxy: std::net::TcpListener,
    proxy_addr: SocketAddr,
    admin: TcpListener,
    admin_addr: SocketAddr,
}

impl Listeners {
    async fn bind(cfg: &Validated) -> Result<Self, RunError> {
        let on = |addr: SocketAddr| move |source| RunError::Bind { addr, source };
        let proxy = std::net::TcpListener::bind(cfg.listen)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(on(cfg.listen))?;
        let admin = TcpListener::bind(cfg.admin_listen)
            .await
            .map_err(on(cfg.admin_listen))?;
        Ok(Self {
            proxy_addr: proxy.local_addr().map_err(on(cfg.listen))?,
            admin_addr: admin.local_addr().map_err(on(cfg.admin_listen))?,
            proxy,
            admin,
        })
    }
}

/// Runs lockstep until `shutdown` resolves, then drains and returns.
pub async fn run(cfg: Validated, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    let c = &cfg.config;
    // One registry; each wing registers its own group into it, and each
    // service gets only its group.
    let mut metrics = Metrics::new();
    let version_metrics = VersionMetrics::register(metrics.registry());
    let lock_metrics = LockMetrics::register(metrics.registry());
    let upstream_metrics = UpstreamMetrics::register(metrics.registry());
    let db_metrics = DbMetrics::register(metrics.registry());

    let store = store::connect_with(&c.database.url, &cfg.pool, c.database.notify, db_metrics)
        .await
        .map_err(|e| RunError::Database(crate::error::chain(&e)))?;
    PoolGauges::register(metrics.registry(), store.clone());
    let metrics = Arc::new(metrics);

    let upstream_settings = UpstreamSettings {
        url: cfg.upstream.clone(),
        limits: cfg.upstream_limits.clone(),
        tls: crate::tls::client_config(cfg.upstream_ca.as_deref())?,
    };
    let resources = Arc::new(cfg.resources.clone());
    let versioning_settings = cfg.versioning.clone();
    let lock_settings = cfg.locks.clone();
    let api_tokens = cfg
        .api_tokens_file
        .as_deref()
        .map(crate::auth::ApiTokens::load)
        .transpose()?;
    // Each wing gets its half of the store; they meet only in the database.
    let versions: Arc<dyn store::Versions> = store.clone();
    let lock_store: Arc<dyn store::LockStore> = store.clone();
    let wakeups = store.wakeups().clone();
    let locks = Locks::new(
        lock_store.clone(),
        wakeups.clone(),
        lock_settings.clone(),
        lock_metrics.clone(),
        api_tokens.clone(),
    );
    let lock_prefix: Option<Arc<str>> =
        (!c.locks.proxy_prefix.is_empty()).then(|| Arc::from(c.locks.proxy_prefix.as_str()));

    let proxy_cert = cfg.proxy_tls.clone().map(ReloadingCert::new).transpose()?;
    let admin_cert = cfg.admin_tls.clone().map(ReloadingCert::new).transpose()?;
    let proxy_https = proxy_cert.is_some();
    let admin_https = admin_cert.is_some();

    // Each proxy worker gets its own router with its own upstream client, so
    // a request, its upstream connection and their tasks stay on one thread.
    let access_log = c.log.access_log;
    // One plan cache for every worker: its budget is the process's.
    let plans = Arc::new(PlanCache::default());
    // The admin listener's versioning answers operators only; its upstream
    // client is never used to forward.
    let admin_versioning = Versioning::new(
        versions.clone(),
        wakeups.clone(),
        Upstream::new(&upstream_settings, upstream_metrics.clone()),
        resources.clone(),
        versioning_settings.clone(),
        version_metrics.clone(),
        plans.clone(),
    );
    let make_proxy_router = {
        let versions = versions.clone();
        let locks = locks.clone();
        let metrics = metrics.clone();
        move || {
            let upstream = Upstream::new(&upstream_settings, upstream_metrics.clone());
            ProxyRouter {
                resources: resources.clone(),
                versioning: Versioning::new(
                    versions.clone(),
                    wakeups.clone(),
                    upstream.clone(),
                    resources.clone(),
                    versioning_settings.clone(),
                    version_metrics.clone(),
                    plans.clone(),
                ),
                upstream,
                locks: locks.clone(),
                lock_prefix: lock_prefix.clone(),
                proto: if proxy_https { "https" } else { "http" },
                metrics: metrics.http.clone(),
                access_log,
            }
        }
    };
    let engine = store.engine();
    let admin_router = AdminRouter {
        store: store.clone(),
        locks,
        versioning: admin_versioning,
        tokens: api_tokens.clone(),
        metrics: metrics.clone(),
    };

    let Listeners {
        proxy: proxy_listener,
        proxy_addr,
        admin: admin_listener,
        admin_addr,
    } = Listeners::bind(&cfg).await?;

    let conn = ConnSettings {
        tls: proxy_cert
            .as_ref()
            .map(|cert| cert.server_config(None))
            .transpose()?,
        limits: cfg.conn.clone(),
        half_close: true,
    };
    let stop = CancellationToken::new();
    let worker_count = match c.server.workers {
        0 => server::default_workers(std::thread::available_parallelism().map_or(1, |n| n.get())),
        n => n,
    };
    let workers = server::spawn_workers(
        proxy_listener,
        worker_count,
        make_proxy_router,
        conn.clone(),
        stop.clone(),
    )
    .map_err(|source| RunError::Bind {
        addr: cfg.listen,
        source,
    })?;
    let admin_conn = ConnSettings {
        tls: admin_cert
            .as_ref()
            .map(|cert| cert.server_config(cfg.admin_client_ca.as_deref()))
            .transpose()?,
        half_close: false,
        ..conn.clone()
    };
    let admin = tokio::spawn(server::serve(
        "admin",
        admin_listener,
        admin_router,
        admin_conn,
        stop.clone(),
    ));
    let cert_watch = tokio::spawn(crate::tls::watch(
        proxy_cert.into_iter().chain(admin_cert).collect(),
        cfg.tls_reload_interval,
        stop.clone(),
    ));
    let token_watch = tokio::spawn({
        let stop = stop.clone();
        let interval = cfg.api_tokens_reload_interval;
        async move {
            if let Some(tokens) = api_tokens {
                crate::auth::watch(tokens, interval, stop).await;
            }
        }
    });
    let heartbeat = tokio::spawn(server::timer_heartbeat(stop.clone()));
    let sweeper = tokio::spawn(locks::sweeper(
        lock_store,
        lock_settings,
        lock_metrics,
        stop.clone(),
    ));

    tracing::info!(
        proxy = %proxy_addr,
        proxy_tls = proxy_https,
        admin_tls = admin_https,
        admin_client_certificates = cfg.admin_client_ca.is_some(),
        lock_api_tokens = cfg.api_tokens_file.is_some(),
        workers = worker_count,
        admin = %admin_addr,
        upstream = %cfg.upstream,
        database = engine,
        "listening"
    );

    shutdown.await;
    tracing::info!(
        drain_timeout_ms = c.server.drain_timeout_ms,
        "shutting down: no new connections, draining in-flight requests"
    );
    stop.cancel();
    let proxy = tokio::task::spawn_blocking(move || {
        for w in workers {
            let _ = w.join();
        }
    });
    let _ = tokio::join!(proxy, admin, sweeper, cert_watch, token_watch, heartbeat);
    tracing::info!("stopped");
    Ok(())
}
