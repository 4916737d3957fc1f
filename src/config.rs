//! Typed configuration: TOML file, overlaid by `LOCKSTEP_<SECTION>__<KEY>`
//! environment variables, overlaid by command-line flags, then validated.
//!
//! Why one validated struct: every other module receives plain, already
//! checked values (durations, socket addresses, a parsed upstream URL), so
//! nothing on the request path ever has to deal with a bad setting. Unknown
//! keys are errors (`deny_unknown_fields`) because a misspelt key silently
//! falling back to a default is how a proxy ends up in production with the
//! wrong timeout. The environment is passed in as an iterator so tests never
//! touch the process environment.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use crate::resources::ResourceConfig;
use crate::resources::ResourceMap;
use crate::store::PoolSettings;
use crate::tls::CertFiles;

/// The whole configuration, as read from the file and overlays.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub upstream: UpstreamConfig,
    pub database: DatabaseConfig,
    pub versioning: VersioningConfig,
    pub locks: LocksConfig,
    pub log: LogConfig,
    pub resources: Vec<ResourceConfig>,
}

/// The longest any duration setting may be: ten years. Deadlines are
/// computed as now plus the setting, in the database (milliseconds, stored
/// exactly up to 2^53) and on the monotonic clock (which panics on
/// overflow); a setting this long already means "never" in practice.
pub const MAX_DURATION_MS: u64 = 10 * 365 * 24 * 60 * 60 * 1000;

/// The most proxy workers `server.workers` may ask for.
pub const MAX_WORKERS: usize = 1024;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub listen: String,
    pub admin_listen: String,
    pub drain_timeout_ms: u64,
    pub max_body_bytes: u64,
    pub max_header_bytes: usize,
    pub header_read_timeout_ms: u64,
    pub idle_timeout_ms: u64,
    pub max_connections: usize,
    /// Proxy worker threads; 0 means half the CPUs, at least two (one on a
    /// single CPU)
    /// (`server::default_workers`).
    pub workers: usize,
    /// PEM certificate chain and key: set both to serve the proxy listener
    /// over TLS.
    pub cert_file: String,
    pub key_file: String,
    /// The same for the admin listener.
    pub admin_cert_file: String,
    pub admin_key_file: String,
    /// PEM CA certificates: when set, the admin listener accepts only
    /// clients presenting a certificate signed by one of them (mTLS).
    pub admin_client_ca_file: String,
    /// How often the certificate files are checked for a change (SIGHUP
    /// reloads at once).
    pub tls_reload_interval_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "0.0.0.0:8080".into(),
            admin_listen: "0.0.0.0:9090".into(),
            drain_timeout_ms: 25_000,
            max_body_bytes: 1_048_576,
            max_header_bytes: 65_536,
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            max_connections: 10_000,
            workers: 0,
            cert_file: String::new(),
            key_file: String::new(),
            admin_cert_file: String::new(),
            admin_key_file: String::new(),
            admin_client_ca_file: String::new(),
            tls_reload_interval_ms: 10_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    pub url: String,
    pub connect_timeout_ms: u64,
    pub request_timeout_ms: u64,
    pub pool_idle_timeout_ms: u64,
    pub pool_max_idle_per_host: usize,
    /// A request that is not safe to repeat (any method but GET, HEAD,
    /// OPTIONS, TRACE) reuses only a connection idle for less than this;
    /// otherwise it opens a new one. Below every common backend's own
    /// keep-alive timeout, so the backend never closes a connection under
    /// a write (which would make its outcome unknown).
    pub pool_write_reuse_ms: u64,
    /// PEM CA certificates trusted for an `https://` upstream instead of
    /// the system and webpki roots.
    pub ca_file: String,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            url: "http://127.0.0.1:3000".into(),
            connect_timeout_ms: 2_000,
            request_timeout_ms: 15_000,
            pool_idle_timeout_ms: 90_000,
            pool_max_idle_per_host: 256,
            pool_write_reuse_ms: 1_000,
            ca_file: String::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    pub url: String,
    pub max_connections: u32,
    pub acquire_timeout_ms: u64,
    /// PostgreSQL wake-ups across replicas (triggers + LISTEN/NOTIFY);
    /// SQLite ignores it.
    pub notify: crate::store::Notify,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: "sqlite://lockstep.db".into(),
            max_connections: 16,
            acquire_timeout_ms: 3_000,
            notify: crate::store::Notify::Auto,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VersioningConfig {
    pub body_field: String,
    pub require_precondition: bool,
    pub conflict_status: u16,
    pub write_lease_ms: u64,
    pub write_wait_ms: u64,
}

impl Default for VersioningConfig {
    fn default() -> Self {
        Self {
            body_field: "version".into(),
            require_precondition: false,
            conflict_status: 409,
            write_lease_ms: 20_000,
            write_wait_ms: 10_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocksConfig {
    pub default_ttl_ms: Option<u64>,
    pub min_ttl_ms: u64,
    pub max_ttl_ms: u64,
    pub max_wait_ms: u64,
    pub proxy_prefix: String,
    /// One bearer token per line: when set, every lock call needs one.
    pub api_tokens_file: String,
    /// How often the tokens file is checked for a change.
    pub api_tokens_reload_interval_ms: u64,
    pub warn_held_fraction: f64,
    pub sweep_interval_ms: u64,
    pub retention_ms: u64,
}

impl Default for LocksConfig {
    fn default() -> Self {
        Self {
            default_ttl_ms: None,
            min_ttl_ms: 100,
            max_ttl_ms: 3_600_000,
            max_wait_ms: 30_000,
            proxy_prefix: String::new(),
            api_tokens_file: String::new(),
            api_tokens_reload_interval_ms: 10_000,
            warn_held_fraction: 0.8,
            sweep_interval_ms: 60_000,
            retention_ms: 3_600_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub format: LogFormat,
    pub level: String,
    /// One INFO line per unversioned (passthrough) request; versioned and
    /// lock requests are always logged.
    pub access_log: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".into(),
            access_log: true,
        }
    }
}

/// Values given on the command line; they win over file and environment.
#[derive(Debug, Clone, Default)]
pub struct FlagOverrides {
    pub listen: Option<String>,
    pub admin_listen: Option<String>,
    pub upstream: Option<String>,
    pub database: Option<String>,
}

/// A configuration problem, with enough context to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid environment variable {name}: {message}")]
    Env { name: String, message: String },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// Where the file came from: an explicit `--config` must exist, the default
/// path may be absent (then built-in defaults apply).
#[derive(Debug, Clone)]
pub struct ConfigSource {
    pub path: PathBuf,
    pub explicit: bool,
}

impl Config {
    /// Reads, overlays and validates. `env` is the process environment (or a
    /// test's stand-in); only `LOCKSTEP_*__*` names are looked at.
    pub fn load(
        source: &ConfigSource,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &FlagOverrides,
    ) -> Result<Validated, ConfigError> {
        let text = match std::fs::read_to_string(&source.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !source.explicit => String::new(),
            Err(source_err) => {
                return Err(ConfigError::Read {
                    path: source.path.clone(),
                    source: source_err,
                })
            }
        };
        Self::from_toml_str(&text, &source.path, env, flags)
    }

    /// Same as [`Config::load`] on text already in memory.
    ///
    /// The file and each environment variable are checked on their own
    /// before they are merged, so a mistake is blamed on where it was made:
    /// an unknown key in the file names the file and its line, a misspelt
    /// `LOCKSTEP_*` variable names the variable (and never a file that may
    /// not even exist).
    pub fn from_toml_str(
        text: &str,
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &FlagOverrides,
    ) -> Result<Validated, ConfigError> {
        let file_error = |e: toml::de::Error| ConfigError::Parse {
            path: path.to_path_buf(),
            message: located(text, &e),
        };
        // Deserialized from the text (not from a parsed table) so that the
        // error carries the span of the offending key.
        toml::from_str::<Config>(text).map_err(file_error)?;
        let mut table: toml::Table = toml::from_str(text).map_err(file_error)?;
        apply_env(&mut table, env)?;
        // Both layers passed alone; a merge of them could only fail on a
        // combination, which is not one place's fault.
        let mut config: Config =
            toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| {
                    ConfigError::Invalid(format!(
                        "the file {} with the LOCKSTEP_* variables: {}",
                        path.display(),
                        e.message().trim()
                    ))
                })?;
        if let Some(v) = &flags.listen {
            config.server.listen.clone_from(v);
        }
        if let Some(v) = &flags.admin_listen {
            config.server.admin_listen.clone_from(v);
        }
        if let Some(v) = &flags.upstream {
            config.upstream.url.clone_from(v);
        }
        if let Some(v) = &flags.database {
            config.database.url.clone_from(v);
        }
        config.validate()
    }

    /// Every duration setting, by its full name.
    fn durations(&self) -> Vec<(&'static str, u64)> {
        let (s, u, v, l) = (&self.server, &self.upstream, &self.versioning, &self.locks);
        let mut all = vec![
            ("server.drain_timeout_ms", s.drain_timeout_ms),
            ("server.header_read_timeout_ms", s.header_read_timeout_ms),
            ("server.idle_timeout_ms", s.idle_timeout_ms),
            ("server.tls_reload_interval_ms", s.tls_reload_interval_ms),
            ("upstream.connect_timeout_ms", u.connect_timeout_ms),
            ("upstream.request_timeout_ms", u.request_timeout_ms),
            ("upstream.pool_idle_timeout_ms", u.pool_idle_timeout_ms),
            ("upstream.pool_write_reuse_ms", u.pool_write_reuse_ms),
            (
                "database.acquire_timeout_ms",
                self.database.acquire_timeout_ms,
            ),
            ("versioning.write_lease_ms", v.write_lease_ms),
            ("versioning.write_wait_ms", v.write_wait_ms),
            ("locks.min_ttl_ms", l.min_ttl_ms),
            ("locks.max_ttl_ms", l.max_ttl_ms),
            ("locks.max_wait_ms", l.max_wait_ms),
            (
                "locks.api_tokens_reload_interval_ms",
                l.api_tokens_reload_interval_ms,
            ),
            ("locks.sweep_interval_ms", l.sweep_interval_ms),
            ("locks.retention_ms", l.retention_ms),
        ];
        if let Some(ttl) = l.default_ttl_ms {
            all.push(("locks.default_ttl_ms", ttl));
        }
        all
    }

    /// Checks every value and combination; returns the checked form.
    pub fn validate(self) -> Result<Validated, ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        if let Some((name, ms)) = self
            .durations()
            .into_iter()
            .find(|(_, ms)| *ms > MAX_DURATION_MS)
        {
            return invalid(format!(
                "{name} ({ms}) is more than ten years ({MAX_DURATION_MS} ms): a deadline that far \
                 out would not fit the database's timestamps or the clock's arithmetic"
            ));
        }
        let listen = parse_addr("server.listen", &self.server.listen)?;
        let admin_listen = parse_addr("server.admin_listen", &self.server.admin_listen)?;
        if self.server.max_body_bytes == 0 {
            return invalid("server.max_body_bytes must be greater than 0".into());
        }
        if self.server.max_header_bytes < 8192 {
            return invalid("server.max_header_bytes must be at least 8192".into());
        }
        // Each worker is a thread with its own runtime and upstream pool:
        // past this, a typo rather than a machine.
        if self.server.workers > MAX_WORKERS {
            return invalid(format!(
                "server.workers ({}) must be at most {MAX_WORKERS} (0: half the CPUs, at least two)",
                self.server.workers
            ));
        }
        let upstream: http::Uri = self.upstream.url.parse().map_err(|e| {
            ConfigError::Invalid(format!(
                "upstream.url {:?} is not a URL: {e}",
                self.upstream.url
            ))
        })?;
        if !matches!(upstream.scheme_str(), Some("http" | "https")) {
            return invalid(format!(
                "upstream.url {:?} must start with http:// or https://",
                self.upstream.url
            ));
        }
        if upstream.authority().is_none() {
            return invalid(format!("upstream.url {:?} has no host", self.upstream.url));
        }
        if upstream.path() != "/" && !upstream.path().is_empty() {
            return invalid(format!(
                "upstream.url {:?} must not carry a path; requests keep their own path",
                self.upstream.url
            ));
        }
        if self.server.idle_timeout_ms == 0 {
            return invalid(
                "server.idle_timeout_ms must be > 0: it is the HTTP/2 ping interval's double and \
                 how long a client may take no bytes of an answer"
                    .into(),
            );
        }
        if self.upstream.connect_timeout_ms == 0 || self.upstream.request_timeout_ms == 0 {
            return invalid(
                "upstream.connect_timeout_ms and upstream.request_timeout_ms must be > 0".into(),
            );
        }
        if self.upstream.connect_timeout_ms >= self.upstream.request_timeout_ms {
            return invalid(format!(
                "upstream.connect_timeout_ms ({}) must be less than upstream.request_timeout_ms ({}): \
                 a backend that cannot even be connected to within the time a whole request may take \
                 is down, and should get its 502 sooner",
                self.upstream.connect_timeout_ms, self.upstream.request_timeout_ms
            ));
        }
        let db = &self.database.url;
        if !(db.starts_with("sqlite:")
            || db.starts_with("postgres://")
            || db.starts_with("postgresql://"))
        {
            return invalid(format!(
                "database.url {db:?} must be sqlite://PATH, sqlite::memory: or postgres://…"
            ));
        }
        if self.database.max_connections == 0 {
            return invalid("database.max_connections must be > 0".into());
        }
        let v = &self.versioning;
        if v.conflict_status != 409 && v.conflict_status != 412 {
            return invalid(format!(
                "versioning.conflict_status must be 409 or 412, not {}",
                v.conflict_status
            ));
        }
        let (connect, request) = (
            self.upstream.connect_timeout_ms,
            self.upstream.request_timeout_ms,
        );
        if v.write_lease_ms <= connect + request {
            return invalid(format!(
                "versioning.write_lease_ms ({}) must be greater than upstream.connect_timeout_ms + \
                 upstream.request_timeout_ms ({connect} + {request}): a write may take that long to reach \
                 the backend and be answered, and a write lease that ran out while the backend still \
                 works on the write would let a second write race it",
                v.write_lease_ms
            ));
        }
        if v.body_field.contains(['"', '\\']) || v.body_field.chars().any(char::is_control) {
            return invalid(format!(
                "versioning.body_field {:?} must be a plain JSON member name",
                v.body_field
            ));
        }
        let l = &self.locks;
        if l.min_ttl_ms == 0 || l.min_ttl_ms > l.max_ttl_ms {
            return invalid(format!(
                "locks.min_ttl_ms ({}) must be > 0 and <= locks.max_ttl_ms ({})",
                l.min_ttl_ms, l.max_ttl_ms
            ));
        }
        if let Some(d) = l.default_ttl_ms {
            if d < l.min_ttl_ms || d > l.max_ttl_ms {
                return invalid(format!(
                    "locks.default_ttl_ms ({d}) must lie within [locks.min_ttl_ms, locks.max_ttl_ms] = [{}, {}]",
                    l.min_ttl_ms, l.max_ttl_ms
                ));
            }
        }
        if !(l.warn_held_fraction > 0.0 && l.warn_held_fraction <= 1.0) {
            return invalid(format!(
                "locks.warn_held_fraction ({}) must lie in (0, 1]",
                l.warn_held_fraction
            ));
        }
        if l.sweep_interval_ms == 0 {
            return invalid("locks.sweep_interval_ms must be > 0".into());
        }
        // Compared with the raw request path byte for byte, so it must be
        // a path a request can have as it is: segments of RFC 3986 `pchar`s
        // with no percent-encoding, none empty or a dot segment.
        let canonical_prefix = l.proxy_prefix.strip_prefix('/').is_some_and(|rest| {
            rest.split('/').all(|seg| {
                !seg.is_empty()
                    && seg != "."
                    && seg != ".."
                    && seg
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@".contains(&b))
            })
        });
        if !l.proxy_prefix.is_empty() && !canonical_prefix {
            return invalid(format!(
                "locks.proxy_prefix {:?} must be a path as requests spell it: start with '/', not end \
                 with '/', no empty, '.' or '..' segment, and only letters, digits and -._~!$&'()*+,;=:@ \
                 (no spaces, '?', '#' or '%'; e.g. \"/_lockstep\")",
                l.proxy_prefix
            ));
        }
        if !l.proxy_prefix.is_empty() && l.api_tokens_file.is_empty() {
            return invalid(format!(
                "locks.proxy_prefix {:?} needs locks.api_tokens_file: without bearer tokens it would \
                 hand every client of the public API every lock",
                l.proxy_prefix
            ));
        }
        if l.api_tokens_reload_interval_ms == 0 {
            return invalid("locks.api_tokens_reload_interval_ms must be > 0".into());
        }
        let api_tokens_file =
            (!l.api_tokens_file.is_empty()).then(|| PathBuf::from(&l.api_tokens_file));
        let level = self.log.level.clone();
        if tracing_subscriber::EnvFilter::try_new(&level).is_err() {
            return invalid(format!(
                "log.level {level:?} is not a valid level or filter"
            ));
        }
        // A bare word is a valid filter (that target at every level), so a
        // misspelt level (`inof`) would turn every other line off without a
        // word. lockstep's filters name a target with `=`.
        if let Some(word) = level
            .split(',')
            .map(str::trim)
            .find(|d| !d.is_empty() && !d.contains('=') && !is_level_name(d))
        {
            return invalid(format!(
                "log.level {level:?}: {word:?} is not a level (trace, debug, info, warn, error, off); \
                 to filter by target write TARGET=LEVEL, e.g. \"info,lockstep::locks=debug\""
            ));
        }
        let resources = ResourceMap::new(&self.resources).map_err(ConfigError::Invalid)?;
        let s = &self.server;
        let proxy_tls = cert_pair(
            "server.cert_file",
            &s.cert_file,
            "server.key_file",
            &s.key_file,
        )?;
        let admin_tls = cert_pair(
            "server.admin_cert_file",
            &s.admin_cert_file,
            "server.admin_key_file",
            &s.admin_key_file,
        )?;
        let admin_client_ca = if s.admin_client_ca_file.is_empty() {
            None
        } else {
            if admin_tls.is_none() {
                return invalid(
                    "server.admin_client_ca_file needs admin TLS (server.admin_cert_file and \
                     server.admin_key_file): client certificates are asked for in a TLS handshake"
                        .into(),
                );
            }
            let ca = PathBuf::from(&s.admin_client_ca_file);
            crate::tls::client_verifier(&ca)
                .map_err(|e| ConfigError::Invalid(format!("server.admin_client_ca_file: {e}")))?;
            Some(ca)
        };
        if s.tls_reload_interval_ms == 0 {
            return invalid("server.tls_reload_interval_ms must be > 0".into());
        }
        let upstream_ca =
            (!self.upstream.ca_file.is_empty()).then(|| PathBuf::from(&self.upstream.ca_file));
        // Only a CA file can fail to load (unreadable system roots are
        // skipped), so only then is the client config built here.
        if let Some(ca) = &upstream_ca {
            crate::tls::client_config(Some(ca))
                .map_err(|e| ConfigError::Invalid(format!("upstream.ca_file: {e}")))?;
        }
        Ok(Validated {
            api_tokens_reload_interval: Duration::from_millis(
                self.locks.api_tokens_reload_interval_ms,
            ),
            tls_reload_interval: Duration::from_millis(self.server.tls_reload_interval_ms),
            conn: ConnLimits::from(&self.server),
            upstream_limits: UpstreamLimits::from(&self.upstream),
            pool: PoolSettings::from(&self.database),
            versioning: VersioningSettings::new(&self.versioning, self.server.max_body_bytes),
            locks: LockSettings::from(&self.locks),
            listen,
            admin_listen,
            upstream,
            upstream_ca,
            proxy_tls,
            admin_tls,
            admin_client_ca,
            api_tokens_file,
            resources,
            config: self,
        })
    }
}

/// A configuration that passed [`Config::validate`], with parsed values.
#[derive(Debug, Clone)]
pub struct Validated {
    pub config: Config,
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub upstream: http::Uri,
    /// Trust only these CAs for an `https://` upstream.
    pub upstream_ca: Option<PathBuf>,
    /// Certificate files of the proxy and admin listeners (checked to load).
    pub proxy_tls: Option<CertFiles>,
    pub admin_tls: Option<CertFiles>,
    /// Client certificates of the admin listener must chain to these CAs.
    pub admin_client_ca: Option<PathBuf>,
    /// Bearer tokens of the lock API; the binary checks the file loads
    /// (it is the lock wing's format, not the config's).
    pub api_tokens_file: Option<PathBuf>,
    /// How often the tokens file is checked for a change.
    pub api_tokens_reload_interval: Duration,
    pub resources: ResourceMap,
    /// How both listeners treat their connections.
    pub conn: ConnLimits,
    /// How often the certificate files are checked for a change.
    pub tls_reload_interval: Duration,
    /// How the upstream client connects and pools.
    pub upstream_limits: UpstreamLimits,
    /// The database pool.
    pub pool: PoolSettings,
    /// The versioning wing.
    pub versioning: VersioningSettings,
    /// The lock wing.
    pub locks: LockSettings,
}

// The typed settings each part receives. Keys and file stay in
// milliseconds (`*_ms`); what leaves validation is a `Duration`, so no part
// converts units on its own.

/// Whether `word` is one of `tracing`'s level names (any case).
fn is_level_name(word: &str) -> bool {
    ["trace", "debug", "info", "warn", "error", "off"]
        .iter()
        .any(|l| l.eq_ignore_ascii_case(word))
}

/// Connection-level limits of a listener, from `[server]`.
#[derive(Debug, Clone)]
pub struct ConnLimits {
    pub max_header_bytes: usize,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub drain_timeout: Duration,
}

/// How the upstream client connects and pools, from `[upstream]`.
#[derive(Debug, Clone)]
pub struct UpstreamLimits {
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub pool_idle_timeout: Duration,
    pub pool_max_idle_per_host: usize,
    /// A request that is not safe to repeat reuses only a connection idle
    /// for less than this.
    pub pool_write_reuse: Duration,
}

/// Settings of the versioning wing, from `[versioning]` and `[server]`.
#[derive(Debug, Clone)]
pub struct VersioningSettings {
    pub body_field: String,
    pub require_precondition: bool,
    pub conflict_status: u16,
    pub write_lease: Duration,
    pub write_wait: Duration,
    pub max_body_bytes: u64,
}

/// Settings of the lock wing, from `[locks]`. TTLs stay milliseconds: they
/// are compared with the `ttl_ms` of lock requests.
#[derive(Debug, Clone)]
pub struct LockSettings {
    pub default_ttl_ms: Option<u64>,
    pub min_ttl_ms: u64,
    pub max_ttl_ms: u64,
    pub max_wait_ms: u64,
    pub warn_held_fraction: f64,
    pub sweep_interval: Duration,
    pub retention: Duration,
}

impl From<&ServerConfig> for ConnLimits {
    fn from(s: &ServerConfig) -> Self {
        Self {
            max_header_bytes: s.max_header_bytes,
            header_read_timeout: Duration::from_millis(s.header_read_timeout_ms),
            idle_timeout: Duration::from_millis(s.idle_timeout_ms),
            max_connections: s.max_connections,
            drain_timeout: Duration::from_millis(s.drain_timeout_ms),
        }
    }
}

impl From<&UpstreamConfig> for UpstreamLimits {
    fn from(u: &UpstreamConfig) -> Self {
        Self {
            connect_timeout: Duration::from_millis(u.connect_timeout_ms),
            request_timeout: Duration::from_millis(u.request_timeout_ms),
            pool_idle_timeout: Duration::from_millis(u.pool_idle_timeout_ms),
            pool_max_idle_per_host: u.pool_max_idle_per_host,
            pool_write_reuse: Duration::from_millis(u.pool_write_reuse_ms),
        }
    }
}

impl From<&DatabaseConfig> for PoolSettings {
    fn from(d: &DatabaseConfig) -> Self {
        Self {
            max_connections: d.max_connections,
            acquire_timeout: Duration::from_millis(d.acquire_timeout_ms),
            idle_timeout: crate::store::DEFAULT_IDLE_TIMEOUT,
        }
    }
}

impl VersioningSettings {
    fn new(v: &VersioningConfig, max_body_bytes: u64) -> Self {
        Self {
            body_field: v.body_field.clone(),
            require_precondition: v.require_precondition,
            conflict_status: v.conflict_status,
            write_lease: Duration::from_millis(v.write_lease_ms),
            write_wait: Duration::from_millis(v.write_wait_ms),
            max_body_bytes,
        }
    }
}

impl From<&LocksConfig> for LockSettings {
    fn from(l: &LocksConfig) -> Self {
        Self {
            default_ttl_ms: l.default_ttl_ms,
            min_ttl_ms: l.min_ttl_ms,
            max_ttl_ms: l.max_ttl_ms,
            max_wait_ms: l.max_wait_ms,
            warn_held_fraction: l.warn_held_fraction,
            sweep_interval: Duration::from_millis(l.sweep_interval_ms),
            retention: Duration::from_millis(l.retention_ms),
        }
    }
}

/// Both keys set (and the pair loads) or neither.
fn cert_pair(
    cert_key: &str,
    cert: &str,
    key_key: &str,
    key: &str,
) -> Result<Option<CertFiles>, ConfigError> {
    match (cert.is_empty(), key.is_empty()) {
        (true, true) => Ok(None),
        (false, false) => {
            let files = CertFiles {
                cert_file: PathBuf::from(cert),
                key_file: PathBuf::from(key),
            };
            files
                .load()
                .map_err(|e| ConfigError::Invalid(format!("{cert_key}/{key_key}: {e}")))?;
            Ok(Some(files))
        }
        _ => Err(ConfigError::Invalid(format!(
            "{cert_key} and {key_key} go together: set both to serve TLS, or neither"
        ))),
    }
}

fn parse_addr(name: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    value.parse().map_err(|_| {
        ConfigError::Invalid(format!(
            "{name} {value:?} is not an IP:PORT socket address (e.g. \"0.0.0.0:8080\")"
        ))
    })
}

/// The sections an environment variable can set a key of.
const ENV_SECTIONS: [&str; 6] = [
    "SERVER",
    "UPSTREAM",
    "DATABASE",
    "VERSIONING",
    "LOCKS",
    "LOG",
];

/// For a name such as `LOCKSTEP_LOCKS_MAX_WAIT_MS`, a section's key written
/// with one underscore where two belong, the name that was meant. Left
/// alone it would be skipped without a word, and the setting silently not
/// applied. Other `LOCKSTEP_*` names (`LOCKSTEP_ADMIN_URL`, the
/// `LOCKSTEP_FENCING_TOKEN` that `lockstep lock` hands its command) are
/// not configuration and stay ignored.
fn one_underscore_short(name: &str) -> Option<String> {
    let rest = name.strip_prefix("LOCKSTEP_")?;
    ENV_SECTIONS.iter().find_map(|section| {
        let key = rest.strip_prefix(section)?.strip_prefix('_')?;
        (!key.is_empty() && !key.starts_with('_')).then(|| format!("LOCKSTEP_{section}__{key}"))
    })
}

/// Applies `LOCKSTEP_<SECTION>__<KEY>=value` onto the parsed file. The value
/// is read as a TOML value when it parses as one (numbers, booleans), else
/// as a string, so `LOCKSTEP_SERVER__LISTEN=0.0.0.0:80` needs no quoting.
fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<(), ConfigError> {
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in env {
        if name.starts_with("LOCKSTEP_") && name.contains("__") {
            vars.insert(name, value);
        } else if let Some(meant) = one_underscore_short(&name) {
            return Err(ConfigError::Env {
                name,
                message: format!(
                    "expected LOCKSTEP_<SECTION>__<KEY>, two underscores after the section: {meant}"
                ),
            });
        }
    }
    for (name, raw) in vars {
        let rest = &name["LOCKSTEP_".len()..];
        let Some((section, key)) = rest.split_once("__") else {
            continue;
        };
        if section.is_empty() || key.is_empty() || key.contains("__") {
            return Err(ConfigError::Env {
                name,
                message: "expected LOCKSTEP_<SECTION>__<KEY>".into(),
            });
        }
        let section = section.to_ascii_lowercase();
        let key = key.to_ascii_lowercase();
        let value = parse_env_value(&raw);
        let entry = table
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let Some(section_table) = entry.as_table_mut() else {
            return Err(ConfigError::Env {
                name,
                message: format!("[{section}] is not a table"),
            });
        };
        // The variable alone against the schema: an unknown section or key,
        // or a value of the wrong type, is this variable's fault.
        let alone = toml::Table::from_iter([(
            section.clone(),
            toml::Value::Table(toml::Table::from_iter([(key.clone(), value.clone())])),
        )]);
        if let Err(e) = toml::Value::Table(alone).try_into::<Config>() {
            return Err(ConfigError::Env {
                name,
                message: e.message().trim().to_string(),
            });
        }
        section_table.insert(key, value);
    }
    Ok(())
}

/// `line L, column C (`the line`): message` for an error in `text`, so the
/// key is named even when the complaint is about its value.
fn located(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim();
    let Some(start) = e.span().map(|s| s.start) else {
        return message.to_string();
    };
    let before = text.get(..start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    let source = text[line_start..].lines().next().unwrap_or("").trim();
    format!("line {line}, column {column} (`{source}`): {message}")
}

fn parse_env_value(raw: &str) -> toml::Value {
    let doc = format!("v = {raw}");
    match doc.parse::<toml::Table>() {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.to_string())),
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn load(text: &str, env: &[(&str, &str)]) -> Result<Validated, ConfigError> {
        Config::from_toml_str(
            text,
            Path::new("test.toml"),
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
            &FlagOverrides::default(),
        )
    }

    #[test]
    fn empty_file_gives_spec_defaults() {
        let c = load("", &[]).unwrap();
        assert_eq!(c.listen.to_string(), "0.0.0.0:8080");
        assert_eq!(c.admin_listen.to_string(), "0.0.0.0:9090");
        assert_eq!(c.config.server.drain_timeout_ms, 25_000);
        assert_eq!(c.config.server.max_body_bytes, 1_048_576);
        assert_eq!(c.config.upstream.request_timeout_ms, 15_000);
        assert_eq!(c.config.versioning.body_field, "version");
        assert_eq!(c.config.versioning.write_lease_ms, 20_000);
        assert_eq!(c.config.database.url, "sqlite://lockstep.db");
        assert_eq!(c.config.locks.default_ttl_ms, None);
    }

    /// config/lockstep.toml says it shows every key with its built-in
    /// default; this holds it to that, but for the one key it sets on
    /// purpose and the example resource.
    #[test]
    fn the_shipped_file_shows_the_built_in_defaults() {
        let shipped: Config = toml::from_str(include_str!("../config/lockstep.toml")).unwrap();
        let built_in = Config::default();
        assert_eq!(shipped.server, built_in.server);
        assert_eq!(shipped.upstream, built_in.upstream);
        assert_eq!(shipped.database, built_in.database);
        assert_eq!(shipped.versioning, built_in.versioning);
        assert_eq!(shipped.log, built_in.log);
        assert_eq!(built_in.locks.default_ttl_ms, None);
        assert_eq!(shipped.locks.default_ttl_ms, Some(30_000));
        let locks = LocksConfig {
            default_ttl_ms: None,
            ..shipped.locks.clone()
        };
        assert_eq!(locks, built_in.locks);
        // The example resource shows its optional keys at their defaults.
        assert!(built_in.resources.is_empty());
        let [example] = shipped.resources.as_slice() else {
            panic!("one example resource: {:?}", shipped.resources);
        };
        assert!(!example.case_insensitive_ids);
        assert!(!example.require_lock && example.lock.is_none());
        assert!(!example.detect_drift && example.drift_ignore.is_empty());
        assert!(!example.exclusive_writes);
    }

    /// The `*_ms` keys (from the file or the environment) reach each part
    /// as durations of that many milliseconds.
    #[test]
    fn the_typed_settings_carry_the_ms_keys_as_durations() {
        let c = load(
            "[server]\ndrain_timeout_ms = 1500\nheader_read_timeout_ms = 250\n\
             [upstream]\nconnect_timeout_ms = 700\n\
             [versioning]\nwrite_lease_ms = 30000\n\
             [locks]\nretention_ms = 5000\n",
            &[("LOCKSTEP_DATABASE__ACQUIRE_TIMEOUT_MS", "1234")],
        )
        .unwrap();
        let ms = Duration::from_millis;
        assert_eq!(c.conn.drain_timeout, ms(1500));
        assert_eq!(c.conn.header_read_timeout, ms(250));
        assert_eq!(c.conn.idle_timeout, ms(60_000));
        assert_eq!(c.upstream_limits.connect_timeout, ms(700));
        assert_eq!(c.upstream_limits.request_timeout, ms(15_000));
        assert_eq!(c.pool.acquire_timeout, ms(1234));
        assert_eq!(c.versioning.write_lease, ms(30_000));
        assert_eq!(c.versioning.write_wait, ms(10_000));
        assert_eq!(c.versioning.max_body_bytes, 1_048_576);
        assert_eq!(c.locks.retention, ms(5000));
        assert_eq!(c.locks.sweep_interval, ms(60_000));
        assert_eq!(c.tls_reload_interval, ms(10_000));
        assert_eq!(c.api_tokens_reload_interval, ms(10_000));
    }

    #[test]
    fn a_worker_count_past_the_limit_is_an_error() {
        assert!(load("[server]\nworkers = 1024\n", &[]).is_ok());
        let e = load("[server]\nworkers = 100000\n", &[]).unwrap_err();
        assert!(e.to_string().contains("server.workers (100000)"), "{e}");
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e = load("[server]\nlisten_addr = \"x\"\n", &[]).unwrap_err();
        assert!(e.to_string().contains("listen_addr"), "{e}");
        let e = load("[nope]\n", &[]).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
    }

    #[test]
    fn env_overrides_file_and_flags_override_env() {
        let c = load(
            "[server]\nlisten = \"127.0.0.1:1\"\n",
            &[
                ("LOCKSTEP_SERVER__LISTEN", "127.0.0.1:2"),
                ("LOCKSTEP_VERSIONING__REQUIRE_PRECONDITION", "true"),
                ("LOCKSTEP_UPSTREAM__CONNECT_TIMEOUT_MS", "500"),
                ("LOCKSTEP_UPSTREAM__REQUEST_TIMEOUT_MS", "1000"),
                ("UNRELATED", "x"),
            ],
        )
        .unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:2");
        assert!(c.config.versioning.require_precondition);
        assert_eq!(c.config.upstream.request_timeout_ms, 1000);

        let flags = FlagOverrides {
            listen: Some("127.0.0.1:3".into()),
            ..Default::default()
        };
        let c = Config::from_toml_str(
            "",
            Path::new("t"),
            [(
                "LOCKSTEP_SERVER__LISTEN".to_string(),
                "127.0.0.1:2".to_string(),
            )],
            &flags,
        )
        .unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:3");
    }

    #[test]
    fn a_section_key_with_one_underscore_is_an_error_that_names_the_meant_variable() {
        let e = load("", &[("LOCKSTEP_LOCKS_MAX_WAIT_MS", "5")]).unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(&e, ConfigError::Env { name, .. } if name == "LOCKSTEP_LOCKS_MAX_WAIT_MS"),
            "{text}"
        );
        assert!(text.contains("LOCKSTEP_LOCKS__MAX_WAIT_MS"), "{text}");
        // Not configuration: what `lockstep lock` reads or hands on.
        for name in [
            "LOCKSTEP_ADMIN_URL",
            "LOCKSTEP_FENCING_TOKEN",
            "LOCKSTEP_LOCK_RESOURCE",
            "LOCKSTEP_LOGS",
            "LOCKSTEP_LOG_",
        ] {
            assert!(load("", &[(name, "x")]).is_ok(), "{name}");
        }
        // Every section named here is one the file has.
        for section in ENV_SECTIONS {
            let e = load("", &[(&format!("LOCKSTEP_{section}__NO_SUCH_KEY"), "1")]).unwrap_err();
            assert!(e.to_string().contains("no_such_key"), "{section}: {e}");
        }
    }

    #[test]
    fn unknown_env_key_is_an_error() {
        let e = load("", &[("LOCKSTEP_SERVER__LISTN", "x")]).unwrap_err();
        assert!(e.to_string().contains("listn"), "{e}");
    }

    #[test]
    fn a_bad_environment_variable_is_blamed_on_the_variable_not_the_file() {
        for (name, value, needle) in [
            ("LOCKSTEP_UPSTREAM__ULR", "http://x", "`ulr`"),
            ("LOCKSTEP_UPSTRAEM__URL", "http://x", "`upstraem`"),
            ("LOCKSTEP_SERVER__MAX_BODY_BYTES", "lots", "lots"),
        ] {
            let e = load("[server]\nlisten = \"127.0.0.1:1\"\n", &[(name, value)]).unwrap_err();
            let text = e.to_string();
            assert!(
                matches!(&e, ConfigError::Env { name: n, .. } if n == name),
                "{text}"
            );
            assert!(text.contains(name) && text.contains(needle), "{text}");
            assert!(!text.contains("test.toml"), "{text}");
        }
    }

    #[test]
    fn an_unknown_key_in_the_file_names_the_file_and_line() {
        let e = load("[server]\nlisten = \"127.0.0.1:1\"\nlistn = 1\n", &[]).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("test.toml"), "{text}");
        assert!(text.contains("line 3, column 1"), "{text}");
        assert!(text.contains("`listn`"), "{text}");
        // Even when a good variable for the same section is set.
        let e = load(
            "[upstream]\nulr = 1\n",
            &[("LOCKSTEP_UPSTREAM__URL", "http://x")],
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("test.toml") && e.to_string().contains("line 2"),
            "{e}"
        );
    }

    #[test]
    fn database_notify_is_auto_unless_turned_off() {
        use crate::store::Notify;
        assert_eq!(load("", &[]).unwrap().config.database.notify, Notify::Auto);
        let c = load("[database]\nnotify = \"off\"\n", &[]).unwrap();
        assert_eq!(c.config.database.notify, Notify::Off);
        let c = load("", &[("LOCKSTEP_DATABASE__NOTIFY", "off")]).unwrap();
        assert_eq!(c.config.database.notify, Notify::Off);
        let e = load("[database]\nnotify = \"sometimes\"\n", &[]).unwrap_err();
        assert!(e.to_string().contains("sometimes"), "{e}");
    }

    #[test]
    fn access_log_is_on_unless_turned_off() {
        assert!(load("", &[]).unwrap().config.log.access_log);
        let off = load("[log]\naccess_log = false\n", &[]).unwrap();
        assert!(!off.config.log.access_log);
        let off = load("", &[("LOCKSTEP_LOG__ACCESS_LOG", "false")]).unwrap();
        assert!(!off.config.log.access_log);
        assert!(load("[log]\naccess_log = \"no\"\n", &[]).is_err());
    }

    #[test]
    fn impossible_values_are_rejected_with_a_reason() {
        let cases = [
            ("[versioning]\nwrite_lease_ms = 1000\n", "write_lease_ms"),
            (
                "[upstream]\nconnect_timeout_ms = 15000\n",
                "upstream.connect_timeout_ms (15000) must be less than upstream.request_timeout_ms (15000)",
            ),
            ("[versioning]\nconflict_status = 400\n", "conflict_status"),
            ("[server]\nlisten = \"nope\"\n", "server.listen"),
            (
                "[server]\nidle_timeout_ms = 0\n",
                "server.idle_timeout_ms must be > 0",
            ),
            ("[upstream]\nurl = \"ftp://x\"\n", "upstream.url"),
            ("[upstream]\nurl = \"http://x/base\"\n", "path"),
            ("[database]\nurl = \"mysql://x\"\n", "database.url"),
            ("[locks]\nmin_ttl_ms = 10\nmax_ttl_ms = 5\n", "min_ttl_ms"),
            ("[locks]\ndefault_ttl_ms = 1\n", "default_ttl_ms"),
            (
                "[locks]\nmax_ttl_ms = 9223372036854775807\n",
                "locks.max_ttl_ms (9223372036854775807) is more than ten years",
            ),
            (
                "[versioning]\nwrite_lease_ms = 400000000000\n",
                "versioning.write_lease_ms (400000000000) is more than ten years",
            ),
            ("[locks]\nproxy_prefix = \"x\"\n", "proxy_prefix"),
            ("[locks]\nproxy_prefix = \"/a b\"\n", "as requests spell it"),
            ("[locks]\nproxy_prefix = \"/_ls?x\"\n", "as requests spell it"),
            ("[locks]\nproxy_prefix = \"//x\"\n", "as requests spell it"),
            ("[locks]\nproxy_prefix = \"/_ls/../x\"\n", "as requests spell it"),
            ("[locks]\nproxy_prefix = \"/%5Fls\"\n", "as requests spell it"),
            (
                "[locks]\nproxy_prefix = \"/_lockstep\"\n",
                "locks.proxy_prefix \"/_lockstep\" needs locks.api_tokens_file",
            ),
            ("[log]\nformat = \"xml\"\n", "format"),
            ("[log]\nlevel = \"inof\"\n", "\"inof\" is not a level"),
            ("[log]\nlevel = \"warn,lockstep::locks\"\n", "is not a level"),
            ("[[resources]]\npattern = \"articles/{id}\"\n", "pattern"),
            ("[[resources]]\npattern = \"/a/{id\"\n", "pattern"),
            (
                "[[resources]]\npattern = \"/a/{id}\"\n[[resources]]\npattern = \"/A/{x}\"\n",
                "resources[1].pattern \"/A/{x}\": matches the same paths as resources[0]",
            ),
            (
                "[[resources]]\npattern = \"/settings\"\ncase_insensitive_ids = true\n",
                "resources[0].case_insensitive_ids",
            ),
            (
                "[[resources]]\npattern = \"/a/{id}\"\ncase_insensitive_ids = \"yes\"\n",
                "case_insensitive_ids",
            ),
            (
                "[[resources]]\npattern = \"/items/{id}\"\nlock = \"jobs/{job}\"\n",
                "resources[0].lock \"jobs/{job}\": names {job}, which the pattern does not have",
            ),
            (
                "[[resources]]\npattern = \"/a/{id}\"\nrequire_lock = 1\n",
                "require_lock",
            ),
            (
                "[[resources]]\npattern = \"/a/{id}\"\ndrift_ignore = [\"/x\"]\n",
                "resources[0].drift_ignore: has no effect without detect_drift = true",
            ),
            (
                "[[resources]]\npattern = \"/a/{id}\"\ndetect_drift = true\ndrift_ignore = [\"updated_at\"]\n",
                "resources[0].drift_ignore: \"updated_at\" is not a JSON pointer",
            ),
            (
                "[[resources]]\npattern = \"/a/{id}\"\ndetect_drift = true\ndrift_ignore = [\"/a~2\"]\n",
                "has a '~' not followed by 0 or 1",
            ),
            (
                "[[resources]]\npattern = \"/a/{id}\"\ndetect_drift = true\ndrift_ignore = [\"\"]\n",
                "must start with '/'",
            ),
            (
                "[[resources]]\npattern = \"/a/{id}\"\ndetect_drift = \"yes\"\n",
                "detect_drift",
            ),
        ];
        for (text, needle) in cases {
            let e = load(text, &[]).unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?} -> {e}");
        }
    }
}
