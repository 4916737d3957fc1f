//! TLS material: the listeners' certificates (reloadable while serving) and
//! the trust roots for `https://` upstreams, all with rustls and the `ring`
//! provider.
//!
//! Why it lives on the ground floor: the config check (`check-config` must
//! refuse a key that does not match its certificate), the edge (both
//! listeners) and the upstream client all need it, and none of them may
//! import another.
//!
//! Why a resolver instead of a fixed certificate: Kubernetes rotates a
//! mounted Secret by swapping files under a running Pod. rustls asks the
//! resolver for a certificate at every handshake, so replacing what the
//! resolver holds serves the new certificate to new connections while every
//! open connection keeps going untouched. [`watch`] reloads on SIGHUP and
//! whenever the files' bytes change; a pair that does not load (a half-written
//! rotation, a key that does not match) is logged and the old one kept.
//!
//! The admin listener can also demand a client certificate signed by a CA
//! of the operator's ([`client_verifier`], `server.admin_client_ca_file`):
//! then only holders of such a certificate reach the lock API, metrics and
//! probes at all, whatever the network lets through.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_util::sync::CancellationToken;

/// Why TLS material could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Pem { path: PathBuf, message: String },
    #[error("{0}")]
    Rustls(String),
}

/// A certificate chain and its private key, as PEM files on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// The files' bytes, kept to notice a change.
#[derive(PartialEq, Eq)]
struct Snapshot {
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl CertFiles {
    fn snapshot(&self) -> Result<Snapshot, TlsError> {
        Ok(Snapshot {
            cert: read(&self.cert_file)?,
            key: read(&self.key_file)?,
        })
    }

    /// Loads and checks the pair: at least one certificate, one private key
    /// of a supported type, and the key matching the leaf certificate.
    pub fn load(&self) -> Result<CertifiedKey, TlsError> {
        certified_key(self, &self.snapshot()?)
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_path_buf(),
            message: format!("not a PEM certificate file: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_path_buf(),
            message: "no CERTIFICATE block found".into(),
        });
    }
    Ok(certs)
}

fn certified_key(files: &CertFiles, snap: &Snapshot) -> Result<CertifiedKey, TlsError> {
    let chain = certificates(&files.cert_file, &snap.cert)?;
    let key = PrivateKeyDer::from_pem_slice(&snap.key).map_err(|e| TlsError::Pem {
        path: files.key_file.clone(),
        message: format!("no usable private key (PKCS#8, PKCS#1 or SEC1 PEM): {e}"),
    })?;
    let key = any_supported_type(&key).map_err(|e| TlsError::Pem {
        path: files.key_file.clone(),
        message: format!("unsupported private key: {e}"),
    })?;
    let certified = CertifiedKey::new(chain, key);
    certified.keys_match().map_err(|e| {
        TlsError::Rustls(format!(
            "{} does not match the certificate in {}: {e}",
            files.key_file.display(),
            files.cert_file.display()
        ))
    })?;
    Ok(certified)
}

/// The certificate a listener serves, replaced in place by [`reload`].
///
/// [`reload`]: ReloadingCert::reload
pub struct ReloadingCert {
    files: CertFiles,
    current: RwLock<(Arc<CertifiedKey>, Snapshot)>,
}

impl fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ReloadingCert {
    pub fn new(files: CertFiles) -> Result<Arc<Self>, TlsError> {
        let snap = files.snapshot()?;
        let key = Arc::new(certified_key(&files, &snap)?);
        Ok(Arc::new(Self {
            files,
            current: RwLock::new((key, snap)),
        }))
    }

    /// Reads the files again; swaps the certificate in when they changed and
    /// load. Returns whether it was swapped.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let snap = self.files.snapshot()?;
        let unchanged = self
            .current
            .read()
            .map(|cur| cur.1 == snap)
            .unwrap_or(false);
        if unchanged {
            return Ok(false);
        }
        let key = Arc::new(certified_key(&self.files, &snap)?);
        match self.current.write() {
            Ok(mut cur) => *cur = (key, snap),
            Err(poisoned) => *poisoned.into_inner() = (key, snap),
        }
        Ok(true)
    }

    pub fn files(&self) -> &CertFiles {
        &self.files
    }

    /// A rustls server config serving this certificate, offering HTTP/2
    /// and HTTP/1.1 by ALPN; with `client_ca`, only to clients presenting a
    /// certificate signed by one of its CAs.
    pub fn server_config(
        self: &Arc<Self>,
        client_ca: Option<&Path>,
    ) -> Result<Arc<ServerConfig>, TlsError> {
        let builder =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| TlsError::Rustls(e.to_string()))?;
        let builder = match client_ca {
            Some(path) => builder.with_client_cert_verifier(client_verifier(path)?),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        match self.current.read() {
            Ok(cur) => Some(cur.0.clone()),
            Err(poisoned) => Some(poisoned.into_inner().0.clone()),
        }
    }
}

/// Reloads `certs` on SIGHUP and every `interval` (when their files
/// changed) until `shutdown`. A failed reload keeps the old certificate.
///
/// SIGHUP is handled even without certificates, so the conventional
/// "reload" signal never kills a running proxy.
///
/// The signal handler is installed when this is called, not when the
/// returned future first runs, so a SIGHUP right after start-up is never
/// taken for the default "terminate".
pub fn watch(
    certs: Vec<Arc<ReloadingCert>>,
    interval: Duration,
    shutdown: CancellationToken,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    if let Err(e) = &hangup {
        tracing::warn!(error = %e, "cannot handle SIGHUP; certificates reload on file change only");
    }
    let mut hangup = hangup.ok();
    async move {
        let mut tick = tokio::time::interval(interval.max(Duration::from_millis(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            let sighup = async {
                match hangup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            let trigger = tokio::select! {
                () = shutdown.cancelled() => return,
                _ = sighup => "sighup",
                _ = tick.tick(), if !certs.is_empty() => "file change",
            };
            if certs.is_empty() {
                tracing::info!(trigger, "SIGHUP: no TLS certificate to reload");
            }
            for cert in &certs {
                match cert.reload() {
                    Ok(true) => tracing::info!(
                        cert_file = %cert.files().cert_file.display(),
                        trigger,
                        "TLS certificate reloaded; new connections get it"
                    ),
                    Ok(false) => {}
                    Err(e) => tracing::error!(
                        cert_file = %cert.files().cert_file.display(),
                        trigger,
                        error = %e,
                        "TLS certificate reload failed; still serving the previous one"
                    ),
                }
            }
        }
    }
}

/// A verifier accepting only client certificates that chain to a CA in
/// `ca_file` (PEM, one or more certificates); anonymous clients are refused
/// in the handshake.
pub fn client_verifier(ca_file: &Path) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(ca_file, &read(ca_file)?)? {
        roots.add(cert).map_err(|e| TlsError::Pem {
            path: ca_file.to_path_buf(),
            message: format!("not a usable CA certificate: {e}"),
        })?;
    }
    WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .map_err(|e| TlsError::Rustls(format!("{}: {e}", ca_file.display())))
}

/// The client config for `https://` upstreams: trusts only the CAs in
/// `ca_file` when given, else the system's roots and the webpki (Mozilla)
/// roots. ALPN is left to the connector (which offers HTTP/1.1 only, like
/// the plain upstream client).
pub fn client_config(ca_file: Option<&Path>) -> Result<ClientConfig, TlsError> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for cert in certificates(path, &read(path)?)? {
                roots.add(cert).map_err(|e| TlsError::Pem {
                    path: path.to_path_buf(),
                    message: format!("not a usable CA certificate: {e}"),
                })?;
            }
        }
        None => {
            // Unreadable system certificates are skipped; webpki roots remain.
            let native = rustls_native_certs::load_native_certs();
            let _ = roots.add_parsable_certificates(native.certs);
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
    }
    Ok(
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Rustls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}
