//! Authenticated callers (docs/locks.md, `locks.api_tokens_file`): with a
//! tokens file every lock call, on the admin listener and under the proxy
//! prefix, needs `Authorization: Bearer <token>`, else 401 `unauthorized`;
//! the file is re-read when it changes; a file that does not load stops
//! check-config and serve (exit 64). Authentication does not depend on the
//! store, so these run on SQLite.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use http::Method;
use serde_json::json;

use common::{check_config_text, eventually, toml_string, Backend, Client, Lockstep, Resp};

const TOKENS: &str = "# lock clients, rotated 2026-05\n\n  tok-alpha-7f3c  \ntok-beta-91d2\n";

fn write_tokens(dir: &Path, text: &str) -> String {
    let path = dir.join("tokens");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

fn assert_unauthorized(r: &Resp, what: &str) {
    assert_eq!(r.status, 401, "{what}: {r:?}");
    assert_eq!(
        r.content_type().as_deref(),
        Some("application/problem+json"),
        "{what}: {r:?}"
    );
    assert_eq!(r.json()["type"], "unauthorized", "{what}: {r:?}");
    let challenge = r
        .header("www-authenticate")
        .unwrap_or_else(|| panic!("{what}: 401 without WWW-Authenticate: {r:?}"));
    assert!(
        challenge.starts_with("Bearer") && challenge.contains(r#"realm="lockstep""#),
        "{what}: {challenge}"
    );
}

async fn call(c: &Client, method: Method, url: &str, auth: Option<&str>) -> Resp {
    let mut req = c.request(method.clone(), url);
    if method == Method::POST || method == Method::PATCH {
        req = req.json(&json!({"owner": "worker-a", "ttl_ms": 30_000}));
    }
    if method == Method::DELETE {
        req = req.header("lock-owner", "worker-a");
    }
    if let Some(auth) = auth {
        req = req.header("authorization", auth);
    }
    req.send().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_lock_call_needs_a_token_on_both_listeners() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = write_tokens(dir.path(), TOKENS);
    let backend = Backend::start();
    let ls = Lockstep::builder()
        .upstream(backend.url())
        .locks_toml(&format!(
            "proxy_prefix = \"/_lockstep\"\napi_tokens_file = {}",
            toml_string(&tokens)
        ))
        .start();
    let c = Client::new();
    for base in [ls.admin_url(), format!("{}/_lockstep", ls.proxy_url())] {
        let url = format!("{base}/locks/job:guarded");
        for method in [Method::POST, Method::GET, Method::PATCH, Method::DELETE] {
            for (auth, what) in [
                (None, "no Authorization"),
                (Some("Bearer tok-gamma"), "an unknown token"),
                (Some("Bearer tok-alpha-7f3"), "a prefix of a token"),
                (Some("Bearer tok-alpha-7f3c0"), "a token and more"),
                (Some("Basic dG9rLWFscGhhLTdmM2M6"), "Basic auth"),
                (Some("tok-alpha-7f3c"), "no scheme"),
                (
                    Some("Bearer # lock clients, rotated 2026-05"),
                    "a comment line",
                ),
            ] {
                let r = call(&c, method.clone(), &url, auth).await;
                assert_unauthorized(&r, &format!("{method} {url} with {what}"));
            }
        }
        // Nothing was taken by the refused calls.
        let g = call(&c, Method::GET, &url, Some("Bearer tok-beta-91d2")).await;
        assert_eq!(g.status, 404, "{g:?}");

        // Either token works, for every call; the scheme is case-insensitive.
        let a = call(&c, Method::POST, &url, Some("Bearer tok-alpha-7f3c")).await;
        assert_eq!(a.status, 200, "{a:?}");
        let g = call(&c, Method::GET, &url, Some("bearer tok-beta-91d2")).await;
        assert_eq!(g.status, 200, "{g:?}");
        let r = call(&c, Method::PATCH, &url, Some("Bearer tok-beta-91d2")).await;
        assert_eq!(r.status, 200, "{r:?}");
        let d = call(&c, Method::DELETE, &url, Some("Bearer tok-alpha-7f3c")).await;
        assert_eq!(d.status, 204, "{d:?}");
    }

    // Health, readiness and metrics stay open.
    for path in ["/healthz", "/readyz", "/metrics"] {
        let r = c.get(ls.admin_url_for(path)).send().await;
        assert_eq!(r.status, 200, "{path}: {r:?}");
    }
    // Other proxy traffic is not the lock API's business.
    let r = c.get(ls.proxy_url_for("/articles/1")).send().await;
    assert_ne!(r.status, 401, "{r:?}");

    // The 401s are logged, the tokens never.
    ls.wait_for_log(Duration::from_secs(2), |l| {
        l["target"] == "lockstep::request"
            && (l["fields"]["outcome"] == "unauthorized" || l["outcome"] == "unauthorized")
    })
    .await;
    // Lines arrive in order, some (those that met a write in progress) a
    // moment after they are logged: once the last request's access line is
    // in, every line is.
    ls.wait_for_log(Duration::from_secs(2), |l| {
        l["target"] == "lockstep::request" && l["fields"]["path"] == "/articles/1"
    })
    .await;
    let output = ls.output_text();
    for secret in [
        "tok-alpha-7f3c",
        "tok-beta-91d2",
        "tok-gamma",
        "dG9rLWFscGhh",
    ] {
        assert!(!output.contains(secret), "{secret} was logged:\n{output}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_tokens_file_is_reread_when_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = write_tokens(dir.path(), "tok-old\n");
    let ls = Lockstep::builder()
        .locks_toml(&format!(
            "api_tokens_file = {}\napi_tokens_reload_interval_ms = 100",
            toml_string(&tokens)
        ))
        .start();
    let c = Client::new();
    let url = ls.admin_url_for("/locks/job:rotated");
    let status = |auth: &'static str| {
        let c = c.clone();
        let url = url.clone();
        async move { call(&c, Method::GET, &url, Some(auth)).await.status }
    };
    assert_eq!(status("Bearer tok-old").await, 404);
    assert_eq!(status("Bearer tok-new").await, 401);

    // Rotation: add the new token, move the clients, remove the old one.
    std::fs::write(&tokens, "tok-old\ntok-new\n").unwrap();
    eventually(
        Duration::from_secs(5),
        "the new token to be accepted",
        || async { (status("Bearer tok-new").await == 404).then_some(()) },
    )
    .await;
    assert_eq!(status("Bearer tok-old").await, 404);
    std::fs::write(&tokens, "tok-new\n").unwrap();
    eventually(
        Duration::from_secs(5),
        "the old token to be refused",
        || async { (status("Bearer tok-old").await == 401).then_some(()) },
    )
    .await;

    // A file left without a token (or unreadable) keeps the last tokens.
    std::fs::write(&tokens, "# emptied by mistake\n").unwrap();
    ls.wait_for_log(Duration::from_secs(5), |l| {
        l["level"] == "ERROR" && l.to_string().contains("tokens reload failed")
    })
    .await;
    assert_eq!(status("Bearer tok-new").await, 404);
    std::fs::remove_file(&tokens).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(status("Bearer tok-new").await, 404);
    assert_eq!(status("Bearer tok-old").await, 401);
}

#[test]
fn check_config_refuses_a_proxy_prefix_without_tokens() {
    let (out, _dir) = check_config_text("[locks]\nproxy_prefix = \"/_lockstep\"\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("locks.api_tokens_file") && stderr.contains("every lock"),
        "the refusal says why: {stderr}"
    );
    let failure = Lockstep::builder()
        .locks_toml(r#"proxy_prefix = "/_lockstep""#)
        .try_start()
        .err()
        .expect("serve started with a proxy_prefix and no tokens");
    assert_eq!(failure.code(), Some(64), "{failure}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tokens_file_that_does_not_load_stops_check_config_and_serve() {
    let dir = tempfile::tempdir().unwrap();
    let empty = write_tokens(dir.path(), "# no token yet\n\n   \n");
    let missing = dir.path().join("absent").display().to_string();
    for (path, why) in [(&empty, "holds no token"), (&missing, "cannot read")] {
        let text = format!("[locks]\napi_tokens_file = {}\n", toml_string(path));
        let (out, _dir) = check_config_text(&text);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{path}: {stderr}");
        assert!(
            stderr.contains("locks.api_tokens_file") && stderr.contains(why),
            "{path}: {stderr}"
        );
        let failure = Lockstep::builder()
            .locks_toml(&format!("api_tokens_file = {}", toml_string(path)))
            .try_start()
            .err()
            .unwrap_or_else(|| panic!("serve started with {path}"));
        assert_eq!(failure.code(), Some(64), "{failure}");
    }
    let good = write_tokens(dir.path(), TOKENS);
    let (out, _dir) = check_config_text(&format!(
        "[locks]\napi_tokens_file = {}\n",
        toml_string(&good)
    ));
    assert!(out.status.success(), "{out:?}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("tok-alpha"),
        "{out:?}"
    );
}
