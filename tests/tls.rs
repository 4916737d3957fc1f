//! TLS end to end: clients trusting a test CA talk HTTPS (HTTP/1.1 and
//! HTTP/2 by ALPN) to both listeners, lockstep talks HTTPS to a TLS backend
//! verified against `upstream.ca_file`, an untrusted backend is a 502 that
//! never reaches it, and certificates rotate under a running lockstep
//! (SIGHUP or a file change) without dropping open connections. With
//! `server.admin_client_ca_file` the admin listener talks only to clients
//! holding a certificate from that CA.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{check_config_text, raw_http1, Backend, Lockstep};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::RootCertStore;
use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// A throwaway certificate authority and the files it issues.
struct Pki {
    dir: TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "lockstep test CA");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let pki = Pki {
            dir: tempfile::tempdir().unwrap(),
            ca,
        };
        std::fs::write(pki.ca_file(), pki.ca.pem()).unwrap();
        pki
    }

    fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca.der().clone()).unwrap();
        roots
    }

    /// A leaf for 127.0.0.1 and localhost, written as `{name}.crt` and
    /// `{name}.key`; returns (cert file, key file, certificate DER).
    fn issue(&self, name: &str) -> (PathBuf, PathBuf, CertificateDer<'static>) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let (cert_file, key_file) = self.paths(name);
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        (cert_file, key_file, cert.der().clone())
    }

    fn paths(&self, name: &str) -> (PathBuf, PathBuf) {
        (
            self.dir.path().join(format!("{name}.crt")),
            self.dir.path().join(format!("{name}.key")),
        )
    }
}

fn toml_path(p: &Path) -> String {
    common::toml_string(&p.display().to_string())
}

/// Opens a TLS connection offering `alpn`, trusting only `roots`.
async fn connect(addr: SocketAddr, roots: RootCertStore, alpn: &[&[u8]]) -> TlsStream<TcpStream> {
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(addr).await.unwrap();
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap()
}

fn peer_leaf(stream: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    stream.get_ref().1.peer_certificates().unwrap()[0].clone()
}

/// An HTTP/1.1 connection over TLS that stays open between requests.
struct Conn {
    send: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    leaf: CertificateDer<'static>,
}

impl Conn {
    async fn open(addr: SocketAddr, roots: RootCertStore) -> Conn {
        let stream = connect(addr, roots, &[b"http/1.1"]).await;
        let leaf = peer_leaf(&stream);
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        Conn { send, leaf }
    }

    async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, http::HeaderMap, Value) {
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "127.0.0.1")
            .header("content-type", "application/json")
            .body(Full::new(body))
            .unwrap();
        self.send.ready().await.unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(20), self.send.send_request(req))
            .await
            .unwrap()
            .unwrap();
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (parts.status, parts.headers, json)
    }
}

async fn h2_get(
    addr: SocketAddr,
    roots: RootCertStore,
    path: &str,
) -> (StatusCode, http::HeaderMap, Value) {
    let stream = connect(addr, roots, &[b"h2", b"http/1.1"]).await;
    assert_eq!(
        stream.get_ref().1.alpn_protocol(),
        Some(&b"h2"[..]),
        "lockstep should pick h2 when the client offers it"
    );
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = Request::builder()
        .uri(format!("https://127.0.0.1{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn etag(headers: &http::HeaderMap) -> Option<&str> {
    headers.get("etag").and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn https_clients_reach_an_https_backend_through_both_tls_listeners() {
    let pki = Pki::new();
    let (backend_cert, backend_key, _) = pki.issue("backend");
    let (cert, key, lockstep_leaf) = pki.issue("lockstep");
    let (admin_cert, admin_key, admin_leaf) = pki.issue("lockstep-admin");
    let backend = Backend::start_tls(&backend_cert, &backend_key);
    assert!(backend.url().starts_with("https://"));
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .server_toml(&format!(
            "cert_file = {}\nkey_file = {}\nadmin_cert_file = {}\nadmin_key_file = {}",
            toml_path(&cert),
            toml_path(&key),
            toml_path(&admin_cert),
            toml_path(&admin_key)
        ))
        .upstream_toml(&format!("ca_file = {}", toml_path(&pki.ca_file())))
        .start();

    // HTTP/1.1 over TLS: a versioned write and read, end to end.
    let mut conn = Conn::open(lockstep.proxy_addr(), pki.roots()).await;
    assert_eq!(conn.leaf, lockstep_leaf);
    let (status, headers, body) = conn
        .request("PUT", "/articles/7", Some(json!({"title": "over tls"})))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(etag(&headers), Some("\"2\""));
    let (status, headers, body) = conn.request("GET", "/articles/7", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(etag(&headers), Some("\"2\""));
    assert_eq!(body["title"], "over tls");
    assert_eq!(body["version"], 2);

    // The backend saw the request as forwarded from an HTTPS client.
    let (status, _, echo) = conn.request("GET", "/echo/tls", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(echo["headers"]["x-forwarded-proto"][0], "https", "{echo}");

    // HTTP/2 negotiated by ALPN on the same listener.
    let (status, headers, body) = h2_get(lockstep.proxy_addr(), pki.roots(), "/articles/7").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(etag(&headers), Some("\"2\""));
    assert_eq!(body["version"], 2);

    // The admin listener has its own certificate.
    let mut admin = Conn::open(lockstep.admin_addr(), pki.roots()).await;
    assert_eq!(admin.leaf, admin_leaf);
    let (status, _, _) = admin.request("GET", "/readyz", None).await;
    assert_eq!(status, StatusCode::OK);

    // Plain HTTP on a TLS port gets no HTTP answer.
    let reply = raw_http1(
        lockstep.proxy_addr(),
        "GET /articles/7 HTTP/1.1\r\nhost: x\r\n\r\n",
    )
    .await;
    assert!(
        !reply.starts_with("HTTP/"),
        "plain HTTP was answered: {reply:?}"
    );
}

#[tokio::test]
async fn an_untrusted_backend_certificate_is_a_502_and_the_write_never_reaches_it() {
    let pki = Pki::new();
    let (backend_cert, backend_key, _) = pki.issue("backend");
    let backend = Backend::start_tls(&backend_cert, &backend_key);
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite_url(dir.path());

    // Trusts the system and webpki roots only, which do not know the test CA.
    let untrusting = Lockstep::builder()
        .upstream(backend.url())
        .database(&db)
        .start();
    let client = common::Client::new();
    let resp = client
        .put(
            untrusting.proxy_url_for("/articles/9"),
            json!({"title": "lost?"}),
        )
        .send()
        .await;
    assert_eq!(resp.status, StatusCode::BAD_GATEWAY, "{}", resp.text());
    assert_eq!(
        resp.content_type().as_deref(),
        Some("application/problem+json")
    );
    let problem = resp.json();
    assert!(
        problem["type"].as_str().unwrap().ends_with("bad-gateway"),
        "{problem}"
    );
    assert!(
        problem["detail"].as_str().unwrap().contains("certificate"),
        "the detail should say why: {problem}"
    );

    // A lockstep trusting the CA, on the same database, sees no such item
    // and the version untouched: the refused handshake sent nothing. (One
    // lockstep per SQLite file: the first one goes first.)
    let mut untrusting = untrusting;
    untrusting.terminate();
    assert!(untrusting
        .wait_exit(std::time::Duration::from_secs(10))
        .await
        .success());
    let trusting = Lockstep::builder()
        .upstream(backend.url())
        .database(&db)
        .upstream_toml(&format!("ca_file = {}", toml_path(&pki.ca_file())))
        .start();
    let resp = client
        .get(trusting.proxy_url_for("/articles/9"))
        .send()
        .await;
    assert_eq!(resp.status, StatusCode::NOT_FOUND, "{}", resp.text());
    let resp = client
        .put(
            trusting.proxy_url_for("/articles/9"),
            json!({"title": "now"}),
        )
        .if_match(1)
        .send()
        .await;
    assert_eq!(resp.status, StatusCode::OK, "{}", resp.text());
    assert_eq!(resp.etag_version(), Some(2));
}

/// lockstep serving HTTPS with the pair, checking the files every
/// `reload_ms`.
fn serving(backend: &Backend, cert: &Path, key: &Path, reload_ms: u64) -> Lockstep {
    Lockstep::builder()
        .upstream(backend.url())
        .server_toml(&format!(
            "cert_file = {}\nkey_file = {}\ntls_reload_interval_ms = {reload_ms}",
            toml_path(cert),
            toml_path(key)
        ))
        .start()
}

#[tokio::test]
async fn sighup_rotates_the_certificate_and_open_connections_keep_working() {
    let pki = Pki::new();
    let (cert, key, first) = pki.issue("served");
    let backend = Backend::start();
    let lockstep = serving(&backend, &cert, &key, 3600000);
    let mut old = Conn::open(lockstep.proxy_addr(), pki.roots()).await;
    assert_eq!(old.leaf, first);
    let (status, _, _) = old.request("GET", "/echo/before", None).await;
    assert_eq!(status, StatusCode::OK);

    // Issue a new pair over the same files, then signal.
    let (_, _, second) = pki.issue("served");
    assert_ne!(first, second);
    // Without the signal (the poll interval is an hour) nothing changes.
    let still = Conn::open(lockstep.proxy_addr(), pki.roots()).await;
    assert_eq!(still.leaf, first);
    lockstep.hangup();
    lockstep
        .wait_for_log(Duration::from_secs(10), |l| {
            l["fields"]["message"].as_str()
                == Some("TLS certificate reloaded; new connections get it")
        })
        .await;

    let new = Conn::open(lockstep.proxy_addr(), pki.roots()).await;
    assert_eq!(
        new.leaf, second,
        "a new connection should get the new certificate"
    );
    // The connection opened before the rotation still serves requests.
    let (status, _, echo) = old.request("GET", "/echo/after", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(echo["path"], "/echo/after");
}

#[tokio::test]
async fn changed_files_are_picked_up_and_a_broken_pair_keeps_the_old_certificate() {
    let pki = Pki::new();
    let (cert, key, first) = pki.issue("served");
    let backend = Backend::start();
    let lockstep = serving(&backend, &cert, &key, 100);
    let roots = pki.roots();

    let (_, _, second) = pki.issue("served");
    common::eventually(
        Duration::from_secs(10),
        "the rotated certificate is served",
        || {
            let roots = roots.clone();
            let second = second.clone();
            let addr = lockstep.proxy_addr();
            async move { (Conn::open(addr, roots).await.leaf == second).then_some(()) }
        },
    )
    .await;
    assert_ne!(first, second);

    // A half-done rotation: the key no longer matches the certificate.
    let (_, other_key, _) = pki.issue("other");
    std::fs::copy(&other_key, &key).unwrap();
    lockstep
        .wait_for_log(Duration::from_secs(10), |l| {
            l["fields"]["message"].as_str()
                == Some("TLS certificate reload failed; still serving the previous one")
                && l["fields"]["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("does not match"))
        })
        .await;
    let conn = Conn::open(lockstep.proxy_addr(), pki.roots()).await;
    assert_eq!(
        conn.leaf, second,
        "the last good certificate stays in service"
    );
}

#[tokio::test]
async fn a_tls_client_that_half_closes_after_its_request_still_gets_the_answer() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pki = Pki::new();
    let (cert, key, _) = pki.issue("lockstep");
    let backend = Backend::start();
    let lockstep = serving(&backend, &cert, &key, 10_000);

    let body = r#"{"title":"half"}"#;
    let mut stream = connect(lockstep.proxy_addr(), pki.roots(), &[b"http/1.1"]).await;
    let request = format!(
        "PUT /articles/tls-hc HTTP/1.1\r\nHost: example\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    // close_notify, then FIN: the sending side is done.
    stream.shutdown().await.unwrap();
    let mut answer = Vec::new();
    // Whether lockstep ends with close_notify or just closes is not the
    // point; what it sent before that is.
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("lockstep neither answered nor closed");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert!(
        answer.to_ascii_lowercase().contains("etag: \"2\""),
        "{answer:?}"
    );
    assert!(
        answer.ends_with(r#"{"title":"half","version":2}"#),
        "{answer:?}"
    );
}

#[tokio::test]
async fn sighup_without_tls_does_not_stop_lockstep() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    lockstep.hangup();
    lockstep
        .wait_for_log(Duration::from_secs(10), |l| {
            l["fields"]["message"].as_str() == Some("SIGHUP: no TLS certificate to reload")
        })
        .await;
    let resp = common::Client::new()
        .get(lockstep.proxy_url_for("/echo/alive"))
        .send()
        .await;
    assert_eq!(resp.status, StatusCode::OK);
}

/// `GET path` on `addr` over TLS trusting `roots`, presenting the client
/// certificate in `client` (cert file, key file) if any. `Err` when the
/// handshake or the request fails: with TLS 1.3 a refused client
/// certificate surfaces at the first read, not in `connect`.
async fn get_with_client_cert(
    addr: SocketAddr,
    roots: RootCertStore,
    client: Option<(&Path, &Path)>,
    path: &str,
) -> Result<StatusCode, String> {
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match client {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(key).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("http handshake: {e}"))?;
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", "127.0.0.1")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
        .await
        .map_err(|_| "no answer within 10 s".to_string())?
        .map_err(|e| format!("request: {e}"))?;
    Ok(resp.status())
}

#[tokio::test]
async fn the_admin_listener_talks_only_to_clients_with_a_certificate_from_its_ca() {
    let pki = Pki::new();
    let (admin_cert, admin_key, _) = pki.issue("lockstep-admin");
    let (client_cert, client_key, _) = pki.issue("lock-client");
    let rogue_ca = Pki::new();
    let (rogue_cert, rogue_key, _) = rogue_ca.issue("lock-client");
    let backend = Backend::start();
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .server_toml(&format!(
            "admin_cert_file = {}
admin_key_file = {}
admin_client_ca_file = {}",
            toml_path(&admin_cert),
            toml_path(&admin_key),
            toml_path(&pki.ca_file())
        ))
        .start();
    let admin = lockstep.admin_addr();

    for path in ["/healthz", "/locks/job:1"] {
        let anonymous = get_with_client_cert(admin, pki.roots(), None, path).await;
        assert!(
            anonymous.is_err(),
            "{path} without a client certificate: {anonymous:?}"
        );
        let rogue =
            get_with_client_cert(admin, pki.roots(), Some((&rogue_cert, &rogue_key)), path).await;
        assert!(
            rogue.is_err(),
            "{path} with a certificate from another CA: {rogue:?}"
        );
    }
    let good = Some((client_cert.as_path(), client_key.as_path()));
    let health = get_with_client_cert(admin, pki.roots(), good, "/healthz").await;
    assert_eq!(health, Ok(StatusCode::OK));
    let lock = get_with_client_cert(admin, pki.roots(), good, "/locks/job:1").await;
    assert_eq!(lock, Ok(StatusCode::NOT_FOUND), "no lock yet, but answered");

    // The proxy listener is not the admin listener's business.
    let passthrough = plain_get(lockstep.proxy_addr(), "/echo/plain").await;
    assert!(passthrough.starts_with("HTTP/1.1 200"), "{passthrough}");
}

async fn plain_get(addr: SocketAddr, path: &str) -> String {
    raw_http1(
        addr,
        format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"),
    )
    .await
}

#[test]
fn check_config_refuses_incomplete_unreadable_and_mismatched_certificates() {
    let pki = Pki::new();
    let (cert, key, _) = pki.issue("a");
    let (_, other_key, _) = pki.issue("b");
    let missing = pki.dir.path().join("missing.crt");
    let cases = [
        (
            format!("[server]\ncert_file = {}\n", toml_path(&cert)),
            "server.cert_file and server.key_file go together",
        ),
        (
            format!("[server]\nadmin_key_file = {}\n", toml_path(&key)),
            "server.admin_cert_file and server.admin_key_file go together",
        ),
        (
            format!(
                "[server]\ncert_file = {}\nkey_file = {}\n",
                toml_path(&missing),
                toml_path(&key)
            ),
            "cannot read",
        ),
        (
            format!(
                "[server]\ncert_file = {}\nkey_file = {}\n",
                toml_path(&cert),
                toml_path(&other_key)
            ),
            "does not match",
        ),
        (
            format!(
                "[server]\ncert_file = {}\nkey_file = {}\n",
                toml_path(&key),
                toml_path(&key)
            ),
            "no CERTIFICATE",
        ),
        (
            format!(
                "[upstream]\nurl = \"https://127.0.0.1:1\"\nca_file = {}\n",
                toml_path(&missing)
            ),
            "upstream.ca_file",
        ),
        (
            format!(
                "[server]\nadmin_client_ca_file = {}\n",
                toml_path(&pki.ca_file())
            ),
            "server.admin_client_ca_file needs admin TLS",
        ),
        (
            format!(
                "[server]\nadmin_cert_file = {}\nadmin_key_file = {}\nadmin_client_ca_file = {}\n",
                toml_path(&cert),
                toml_path(&key),
                toml_path(&missing)
            ),
            "server.admin_client_ca_file: cannot read",
        ),
    ];
    for (text, expected) in cases {
        let (out, _dir) = check_config_text(&text);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{text}\n{stderr}");
        assert!(
            stderr.contains(expected),
            "{text}\nexpected {expected:?} in:\n{stderr}"
        );
    }
    let (out, _dir) = check_config_text(&format!(
        "[server]\ncert_file = {}\nkey_file = {}\nadmin_cert_file = {}\nadmin_key_file = {}\n\
         admin_client_ca_file = {}\n[upstream]\nurl = \"https://127.0.0.1:1\"\nca_file = {}\n",
        toml_path(&cert),
        toml_path(&key),
        toml_path(&cert),
        toml_path(&key),
        toml_path(&pki.ca_file()),
        toml_path(&pki.ca_file())
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_backend_that_stalls_the_tls_handshake_is_a_502_within_the_connect_timeout_and_bumps_nothing(
) {
    // Accepts TCP connections and never answers the ClientHello.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
        }
    });
    let lockstep = Lockstep::builder()
        .upstream(format!("https://{addr}"))
        .upstream_toml("connect_timeout_ms = 300\nrequest_timeout_ms = 8000")
        .versioning_toml("write_lease_ms = 9000")
        .start();
    let client = common::Client::new();
    for attempt in 0..2 {
        let started = std::time::Instant::now();
        let resp = client
            .put(lockstep.proxy_url_for("/articles/stall"), json!({"t": 1}))
            .if_match(1)
            .send()
            .await;
        // Not a 504 after the request timeout, and not a 409 on the second
        // attempt: the write was known not to have been sent, so version 1
        // still stands.
        assert_eq!(
            resp.status,
            StatusCode::BAD_GATEWAY,
            "attempt {attempt}: {}",
            resp.text()
        );
        assert!(
            resp.json()["detail"]
                .as_str()
                .unwrap()
                .contains("connect_timeout_ms"),
            "{}",
            resp.text()
        );
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "attempt {attempt} took {:?}",
            started.elapsed()
        );
    }
    held.abort();
}

/// A TCP relay to `to` that holds each new connection for `delay` before
/// passing any byte: a TLS handshake through it takes at least `delay`,
/// requests on a connection already set up are not slowed.
async fn slow_handshake_relay(to: SocketAddr, delay: Duration) -> (SocketAddr, JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let relay = tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let mut outbound = TcpStream::connect(to).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            });
        }
    });
    (addr, relay)
}

#[tokio::test]
async fn time_spent_connecting_does_not_count_against_the_request_timeout() {
    let pki = Pki::new();
    let (cert, key, _) = pki.issue("backend");
    let backend = Backend::start_tls(&cert, &key);
    // The handshake takes 600 ms, the answer 600 ms more: 1.2 s in all,
    // against a 1 s request timeout that starts once the connection is up.
    let (relay, relay_task) =
        slow_handshake_relay(backend.addr(), Duration::from_millis(600)).await;
    let lockstep = Lockstep::builder()
        .upstream(format!("https://{relay}"))
        .upstream_toml(&format!(
            "ca_file = {}\nconnect_timeout_ms = 900\nrequest_timeout_ms = 1000",
            toml_path(&pki.ca_file())
        ))
        .versioning_toml("write_lease_ms = 5000")
        .start();
    let client = common::Client::new();
    let resp = client
        .put(lockstep.proxy_url_for("/articles/slow"), json!({"t": 1}))
        .if_match(1)
        .header("x-backend-delay-ms", "600")
        .send()
        .await;
    // Not a 504 with the version bumped as an unknown outcome.
    assert_eq!(resp.status, StatusCode::OK, "{}", resp.text());
    assert_eq!(resp.etag_version(), Some(2));
    let metrics = client
        .get(lockstep.admin_url_for("/metrics"))
        .send()
        .await
        .text();
    let unknown: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("lockstep_version_unknown_outcome_bumps_total"))
        .filter(|l| !l.ends_with(" 0"))
        .collect();
    assert!(unknown.is_empty(), "unknown outcomes counted: {unknown:?}");
    relay_task.abort();
}

/// A connection whose reads can be held back, as a client whose program
/// stops reading: while held, a read waits (its waker kept for the
/// release).
struct Holdable<I> {
    io: I,
    hold: Hold,
}

#[derive(Clone, Default)]
struct Hold(Arc<std::sync::Mutex<(bool, Option<std::task::Waker>)>>);

impl Hold {
    fn set(&self, held: bool) {
        let mut state = self.0.lock().unwrap();
        state.0 = held;
        if !held {
            if let Some(waker) = state.1.take() {
                waker.wake();
            }
        }
    }
}

impl<I: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Holdable<I> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        {
            let mut state = self.hold.0.lock().unwrap();
            if state.0 {
                state.1 = Some(cx.waker().clone());
                return std::task::Poll::Pending;
            }
        }
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Holdable<I> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[tokio::test]
async fn an_http2_client_over_tls_that_stops_reading_its_socket_is_closed() {
    const BIG: usize = 256 << 20;
    let pki = Pki::new();
    let (cert, key, _) = pki.issue("lockstep");
    let backend = Backend::start();
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .server_toml(&format!(
            "cert_file = {}\nkey_file = {}\nidle_timeout_ms = 1000",
            toml_path(&cert),
            toml_path(&key)
        ))
        .start();
    let stream = connect(lockstep.proxy_addr(), pki.roots(), &[b"h2"]).await;
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let hold = Hold::default();
    let io = Holdable {
        io: stream,
        hold: hold.clone(),
    };
    // Windows far larger than the answer's first seconds: what stops
    // lockstep is the socket, not HTTP/2's flow control.
    let (mut send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(1 << 30)
        .initial_connection_window_size(1 << 30)
        .handshake(TokioIo::new(io))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::builder()
        .uri(format!("https://127.0.0.1/bytes/{BIG}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.version(), http::Version::HTTP_2);
    // The client stops reading for longer than the timeout, then reads on.
    hold.set(true);
    tokio::time::sleep(Duration::from_millis(3000)).await;
    hold.set(false);
    let mut body = resp.into_body();
    let mut got = 0usize;
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => got += frame.data_ref().map_or(0, Bytes::len),
                Err(_) => return,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the answer neither ended nor broke off");
    assert!(
        got < BIG,
        "all {got} bytes arrived: the stalled connection was never cut"
    );
}
