//! The `lockstep` binary: command line, configuration, logging, signals.
//! Everything else lives in the library, except the subcommands that are
//! only clients of a running lockstep ([`cli`]).

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lockstep::config::{Config, ConfigSource, FlagOverrides, Validated};

/// mimalloc rather than the system's malloc: 3–7 % fewer instructions per
/// request (docs/performance.md, "The allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Sidecar reverse proxy: optimistic concurrency and distributed locks for
/// an unmodified REST API.
#[derive(Debug, Parser)]
#[command(name = "lockstep", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the proxy and the admin listener.
    Serve {
        /// Configuration file (TOML).
        #[arg(long, default_value = "config/lockstep.toml")]
        config: PathBuf,
        /// Proxy listener address, e.g. 0.0.0.0:8080.
        #[arg(long)]
        listen: Option<String>,
        /// Admin listener address, e.g. 0.0.0.0:9090.
        #[arg(long)]
        admin_listen: Option<String>,
        /// Backend URL, e.g. http://127.0.0.1:3000.
        #[arg(long)]
        upstream: Option<String>,
        /// Database URL: sqlite://PATH, sqlite::memory: or postgres://…
        #[arg(long)]
        database: Option<String>,
    },
    /// Validate a configuration file and exit (0: valid, 64: invalid).
    CheckConfig {
        #[arg(long, default_value = "config/lockstep.toml")]
        config: PathBuf,
    },
    /// Run COMMAND while holding a lock of a running lockstep, like flock(1)
    /// across machines.
    Lock(cli::lock::Args),
}

/// EX_USAGE: the command line or the configuration is wrong; nothing was
/// started.
const EXIT_CONFIG: u8 = 64;

fn load(path: PathBuf, explicit: bool, flags: &FlagOverrides) -> Result<Validated, ExitCode> {
    let source = ConfigSource { path, explicit };
    let validated = Config::load(&source, std::env::vars(), flags).map_err(|e| {
        eprintln!("lockstep: {e}");
        ExitCode::from(EXIT_CONFIG)
    })?;
    // A tokens file that does not load is a configuration error too: the
    // lock API would otherwise refuse every caller.
    if let Some(path) = &validated.api_tokens_file {
        if let Err(e) = lockstep::auth::ApiTokens::load(path) {
            eprintln!("lockstep: invalid configuration: locks.api_tokens_file: {e}");
            return Err(ExitCode::from(EXIT_CONFIG));
        }
    }
    Ok(validated)
}

fn explicit(path: &std::path::Path) -> bool {
    // The default path may be absent (built-in defaults apply); any path the
    // user named must exist.
    std::env::args().any(|a| a == "--config" || a.starts_with("--config="))
        || path != std::path::Path::new("config/lockstep.toml")
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print to stdout and succeed; anything
            // else is a usage error (clap's own default would be 2).
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_CONFIG)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.command {
        Command::Lock(args) => cli::lock::run(args),
        Command::CheckConfig { config } => {
            let explicit = explicit(&config);
            match load(config.clone(), explicit, &FlagOverrides::default()) {
                Ok(v) => {
                    // The default file may be absent: then the defaults were
                    // checked, not a file, and saying "FILE: ok" would
                    // suggest one was read.
                    let source = if config.exists() {
                        config.display().to_string()
                    } else {
                        format!("no {}, built-in defaults", config.display())
                    };
                    println!(
                        "{source}: ok (proxy {}, admin {}, upstream {}, {} resource pattern(s))",
                        v.listen,
                        v.admin_listen,
                        v.upstream,
                        v.config.resources.len()
                    );
                    ExitCode::SUCCESS
                }
                Err(code) => code,
            }
        }
        Command::Serve {
            config,
            listen,
            admin_listen,
            upstream,
            database,
        } => {
            let flags = FlagOverrides {
                listen,
                admin_listen,
                upstream,
                database,
            };
            let explicit = explicit(&config);
            let validated = match load(config, explicit, &flags) {
                Ok(v) => v,
                Err(code) => return code,
            };
            // Held to the end: dropping it flushes the lines still queued.
            let log_writer = lockstep::telemetry::init(&validated.config.log);
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("lockstep: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            // The handlers are installed before anything is bound: a signal
            // that arrives as soon as lockstep answers /readyz must start a
            // drain, not kill the process by the default action.
            let run = async {
                let shutdown = shutdown_signal();
                lockstep::app::run(validated, shutdown).await
            };
            let outcome = runtime.block_on(run);
            if let Err(e) = &outcome {
                tracing::error!(error = %e, "lockstep failed");
            }
            // Tasks still ending while the runtime goes may log; then every
            // line is out before the last word below.
            drop(runtime);
            drop(log_writer);
            match outcome {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("lockstep: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Installs the SIGTERM and SIGINT handlers at once, and returns a future
/// that resolves on either. (An `async fn` would install them only when
/// first polled, after the listeners are bound.)
#[cfg(unix)]
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            // No handler could be installed: nothing will ever arrive.
            _ => std::future::pending::<()>().await,
        }
    }
}

#[cfg(not(unix))]
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
