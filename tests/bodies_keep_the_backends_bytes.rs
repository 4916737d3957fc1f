//! Bytes are the backend's (and the client's): a stamped read differs from
//! what the backend sent only in the version member, a write reaches the
//! backend less only its version member, and compression survives stamping.
//! The backend serves exact seeded bytes (`PUT /_backend/raw/…`) and
//! compresses them when asked.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod versioned_support;

use std::io::Read;

use bytes::Bytes;
use common::{Backend, Client, Lockstep, Resp};
use http::Method;
use versioned_support::received;

/// Makes the backend answer `GET path` with exactly `body`.
async fn seed_raw(backend: &Backend, path: &str, content_type: &str, body: impl Into<Bytes>) {
    let resp = Client::new()
        .request(
            Method::PUT,
            backend.url_for(&format!("/_backend/raw{path}")),
        )
        .header("content-type", content_type)
        .body(body)
        .send()
        .await;
    assert_eq!(resp.status, 204, "seeding raw {path}: {resp:?}");
}

const BIG: &str = "{\n  \"id64\": 18446744073709551616,\n  \"amount\": 0.1,\n  \"huge\": 1e400,\n  \"tiny\": -1E-400,\n  \"name\": \"caf\\u00e9 \\ud83d\\ude00\",\n  \"dup\": 1, \"dup\": 2,\n  \"nested\": {\"version\": 99}\n}";

fn with_version(body: &str, version: u64) -> String {
    // The backend's document, plus one member after the last one.
    let close = body.rfind('}').unwrap();
    let last = body[..close].trim_end().len();
    format!("{},\"version\":{version}{}", &body[..last], &body[last..])
}

#[tokio::test]
async fn a_stamped_read_keeps_every_byte_but_the_version() {
    let backend = Backend::start();
    seed_raw(&backend, "/articles/big", "application/json", BIG).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();

    let get = client
        .get(lockstep.proxy_url_for("/articles/big"))
        .send()
        .await;
    assert_eq!(get.status, 200, "{get:?}");
    assert_eq!(get.etag().as_deref(), Some("\"1\""), "{get:?}");
    assert_eq!(get.text(), with_version(BIG, 1), "{get:?}");
    assert_eq!(
        get.header("content-length"),
        Some(get.body.len().to_string())
    );

    let head = client
        .head(lockstep.proxy_url_for("/articles/big"))
        .send()
        .await;
    assert!(head.body.is_empty());
    assert_eq!(head.header("content-length"), get.header("content-length"));
}

#[tokio::test]
async fn an_existing_version_member_is_replaced_in_place() {
    let backend = Backend::start();
    let body = "{ \"version\" : \"stale\" , \"n\":1.0, \"vers\\u0069on\":[7] }";
    seed_raw(&backend, "/articles/v", "application/json", body).await;
    let lockstep = Lockstep::in_front_of(&backend);

    let get = Client::new()
        .get(lockstep.proxy_url_for("/articles/v"))
        .send()
        .await;
    assert_eq!(
        get.text(),
        "{ \"version\" : 1 , \"n\":1.0, \"vers\\u0069on\":1 }",
        "{get:?}"
    );
}

#[tokio::test]
async fn invalid_and_non_object_json_is_served_unchanged_with_an_etag() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    for (path, body) in [
        ("/articles/bad", "{\"a\":01}"),
        ("/articles/trunc", "{\"a\":[1,2"),
        ("/articles/list", "[{\"version\":3}]"),
        ("/articles/surrogate", "{\"a\":\"\\ud800\"}"),
    ] {
        seed_raw(&backend, path, "application/json", body).await;
        let get = Client::new().get(lockstep.proxy_url_for(path)).send().await;
        assert_eq!(get.status, 200, "{get:?}");
        assert_eq!(get.text(), body, "{path}: {get:?}");
        assert_eq!(get.etag().as_deref(), Some("\"1\""), "{get:?}");
    }
}

#[tokio::test]
async fn a_body_near_the_limit_is_stamped_and_one_over_it_streams_unchanged() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    // 1 MiB limit by default: one body just under it, one just over.
    let item = "{\"n\":123456789012345678901234567890,\"s\":\"\\u00e9\"},";
    let under = format!(
        "{{\"items\":[{}{{}}]}}",
        item.repeat((1_048_576 - 64) / item.len())
    );
    let over = format!(
        "{{\"items\":[{}{{}}]}}",
        item.repeat(1_048_576 / item.len() + 1)
    );
    assert!(under.len() + 14 <= 1_048_576 && over.len() > 1_048_576);
    seed_raw(
        &backend,
        "/articles/under",
        "application/json",
        under.clone(),
    )
    .await;
    seed_raw(&backend, "/articles/over", "application/json", over.clone()).await;

    let get = Client::new()
        .get(lockstep.proxy_url_for("/articles/under"))
        .send()
        .await;
    assert_eq!(get.etag().as_deref(), Some("\"1\""));
    assert!(
        get.text() == with_version(&under, 1),
        "stamped body differs"
    );

    let get = Client::new()
        .get(lockstep.proxy_url_for("/articles/over"))
        .send()
        .await;
    assert_eq!(get.etag().as_deref(), Some("\"1\""));
    assert!(get.body == over.as_bytes(), "over-limit body changed");
}

#[tokio::test]
async fn a_write_body_is_forwarded_exactly_less_its_version_member() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let sent = "{\"version\":1,\"amount\":0.1,\"id64\":18446744073709551616,\n \"s\":\"\\u00e9\"}";

    let resp = client
        .request(Method::PATCH, lockstep.proxy_url_for("/articles/w"))
        .header("content-type", "application/json")
        .body(sent)
        .send()
        .await;
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.etag().as_deref(), Some("\"2\""), "{resp:?}");

    let patches = received(&backend, "PATCH", "/articles/w").await;
    assert_eq!(patches.len(), 1, "{patches:?}");
    assert_eq!(
        patches[0]["body"],
        "{\"amount\":0.1,\"id64\":18446744073709551616,\n \"s\":\"\\u00e9\"}"
    );
}

#[tokio::test]
async fn a_malformed_write_body_is_refused_and_not_forwarded() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let resp = Client::new()
        .request(Method::PATCH, lockstep.proxy_url_for("/articles/m"))
        .header("content-type", "application/json")
        .body("{\"version\":1,\"a\":\"\\ud800\"}")
        .send()
        .await;
    versioned_support::assert_problem(&resp, 400, "invalid-body");
    assert!(received(&backend, "PATCH", "/articles/m").await.is_empty());
}

fn decode(coding: &str, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match coding {
        "gzip" => {
            flate2::read::GzDecoder::new(body)
                .read_to_end(&mut out)
                .unwrap();
        }
        "br" => {
            brotli::Decompressor::new(body, 4096)
                .read_to_end(&mut out)
                .unwrap();
        }
        "zstd" => out = zstd::decode_all(body).unwrap(),
        other => panic!("unexpected coding {other}"),
    }
    out
}

async fn get_encoded(lockstep: &Lockstep, path: &str, accept: &str, method: Method) -> Resp {
    Client::new()
        .request(method, lockstep.proxy_url_for(path))
        .header("accept-encoding", accept)
        .send()
        .await
}

#[tokio::test]
async fn compressed_stamped_reads_keep_the_backends_coding() {
    let backend = Backend::start();
    // Big enough that compression matters.
    let body = format!(
        "{{\"rows\":[{}0],\"big\":18446744073709551616}}",
        "{\"a\":0.1,\"b\":\"text text text\"},".repeat(2000)
    );
    seed_raw(&backend, "/articles/z", "application/json", body.clone()).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let want = with_version(&body, 1);

    for coding in ["gzip", "br", "zstd"] {
        let get = get_encoded(&lockstep, "/articles/z", coding, Method::GET).await;
        assert_eq!(get.status, 200, "{get:?}");
        assert_eq!(get.header("content-encoding").as_deref(), Some(coding));
        assert_eq!(get.etag().as_deref(), Some("\"1\""));
        assert!(
            get.header_all("vary")
                .iter()
                .any(|v| v.to_ascii_lowercase().contains("accept-encoding")),
            "{get:?}"
        );
        assert_eq!(
            get.header("content-length"),
            Some(get.body.len().to_string())
        );
        assert!(
            get.body.len() < body.len() / 10,
            "{coding}: {} bytes for {}",
            get.body.len(),
            body.len()
        );
        let plain = decode(coding, &get.body);
        assert!(plain == want.as_bytes(), "{coding}: decoded body differs");

        let head = get_encoded(&lockstep, "/articles/z", coding, Method::HEAD).await;
        assert!(head.body.is_empty());
        assert_eq!(head.header("content-encoding").as_deref(), Some(coding));
        assert_eq!(head.header("content-length"), get.header("content-length"));
    }

    // A client that accepts no coding gets plain bytes.
    let plain = Client::new()
        .get(lockstep.proxy_url_for("/articles/z"))
        .send()
        .await;
    assert_eq!(plain.header("content-encoding"), None);
    assert!(plain.body == want.as_bytes());
}

#[tokio::test]
async fn a_compressed_body_over_the_limit_once_decoded_passes_unchanged() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    // Compresses to a few KiB, decodes to 2 MB: more than max_body_bytes.
    let body = format!("{{\"z\":\"{}\"}}", "0".repeat(2_000_000));
    seed_raw(&backend, "/articles/bomb", "application/json", body.clone()).await;
    let get = get_encoded(&lockstep, "/articles/bomb", "gzip", Method::GET).await;
    assert_eq!(get.status, 200, "{get:?}");
    assert_eq!(get.etag().as_deref(), Some("\"1\""));
    assert_eq!(get.header("content-encoding").as_deref(), Some("gzip"));
    assert!(decode("gzip", &get.body) == body.as_bytes());
}

/// A read whose body is the one its item was last stamped from reuses that
/// scan; any change, even of one byte at the same length, is scanned anew.
/// Seen from outside: every read is the backend's current bytes, stamped.
#[tokio::test]
async fn repeated_reads_of_a_changing_body_are_each_stamped_from_their_own_bytes() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let pad = "x".repeat(4000);
    // The same length each time; the version member moves, and the object
    // turns into an invalid document and an array on the way.
    let bodies = [
        format!(r#"{{"version":5,"a":"{pad}","b":1}}"#),
        format!(r#"{{"version":5,"a":"{pad}","b":1}}"#),
        format!(r#"{{"b":1,"a":"{pad}","version":5}}"#),
        format!(r#"{{"b":1,"a":"{pad}","version":5}}"#),
        format!(r#"{{"b":1,"a":"{pad}","version":5 "#),
        format!(r#"["b",1,"{pad}","version",5]"#),
        format!(r#"{{"version":5,"a":"{pad}","b":1}}"#),
    ];
    let mut seen = Vec::new();
    for body in &bodies {
        seed_raw(
            &backend,
            "/articles/moving",
            "application/json",
            body.clone(),
        )
        .await;
        for _ in 0..2 {
            let get = client
                .get(lockstep.proxy_url_for("/articles/moving"))
                .send()
                .await;
            assert_eq!(get.status, 200, "{get:?}");
            assert_eq!(get.etag().as_deref(), Some("\"1\""));
            seen.push(get.text());
        }
    }
    let stamped_first = format!(r#"{{"version":1,"a":"{pad}","b":1}}"#);
    let stamped_last = format!(r#"{{"b":1,"a":"{pad}","version":1}}"#);
    let want = [
        &stamped_first,
        &stamped_first,
        &stamped_last,
        &stamped_last,
        &bodies[4],
        &bodies[5],
        &stamped_first,
    ];
    for (n, want) in want.iter().enumerate() {
        for k in 0..2 {
            assert!(
                seen[2 * n + k] == **want,
                "read {} of body {n}: got {:.80}…",
                k + 1,
                seen[2 * n + k]
            );
        }
    }
}

/// `req` with the four digest headers, or (`via_backend`) asking the
/// backend to answer with them.
fn with_digests(
    mut req: common::RequestBuilder<'_>,
    via_backend: bool,
) -> common::RequestBuilder<'_> {
    for (name, value) in DIGESTS {
        req = if via_backend {
            req.header("x-backend-add-header", format!("{name}: {value}"))
        } else {
            req.header(name, value)
        };
    }
    req
}

/// The digest headers a body can carry (RFC 9530, and the older two).
const DIGESTS: [(&str, &str); 4] = [
    (
        "content-digest",
        "sha-256=:RK/0qy18MlBSVnWgjwz6lZEWjP/lF5HF9bvEF8FabDg=:",
    ),
    (
        "repr-digest",
        "sha-256=:RK/0qy18MlBSVnWgjwz6lZEWjP/lF5HF9bvEF8FabDg=:",
    ),
    (
        "digest",
        "SHA-256=RK/0qy18MlBSVnWgjwz6lZEWjP/lF5HF9bvEF8FabDg=",
    ),
    ("content-md5", "2+5xPHdAgX2d37uY/DDpjg=="),
];

#[tokio::test]
async fn body_digests_go_where_lockstep_changes_the_body_and_stay_elsewhere() {
    let backend = Backend::start();
    seed_raw(&backend, "/articles/dg", "application/json", "{\"a\":1}").await;
    backend
        .seed("/articles/dw", serde_json::json!({"a": 1}))
        .await;
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();

    // A stamped read: the backend's digests no longer hold.
    let get = with_digests(client.get(lockstep.proxy_url_for("/articles/dg")), true)
        .send()
        .await;
    assert_eq!(get.text(), "{\"a\":1,\"version\":1}", "{get:?}");
    for (name, _) in DIGESTS {
        assert_eq!(get.header(name), None, "{name} on a stamped read: {get:?}");
    }
    // Off the versioned routes the body is the backend's, and so are they.
    let plain = with_digests(client.get(lockstep.proxy_url_for("/echo/dg")), true)
        .send()
        .await;
    for (name, value) in DIGESTS {
        assert_eq!(plain.header(name).as_deref(), Some(value), "{plain:?}");
    }

    // A write whose version member is taken out: the client's digests go.
    let cut = with_digests(
        client
            .request(Method::PATCH, lockstep.proxy_url_for("/articles/dw"))
            .header("content-type", "application/json")
            .body("{\"version\":1,\"a\":2}"),
        false,
    )
    .send()
    .await;
    assert_eq!(cut.status, 200, "{cut:?}");
    // A write that names its version in If-Match is forwarded as sent,
    // digests and all.
    let kept = with_digests(
        client
            .request(Method::PATCH, lockstep.proxy_url_for("/articles/dw"))
            .header("content-type", "application/json")
            .if_match(2)
            .body("{\"a\":3}"),
        false,
    )
    .send()
    .await;
    assert_eq!(kept.status, 200, "{kept:?}");
    let patches = received(&backend, "PATCH", "/articles/dw").await;
    assert_eq!(patches.len(), 2, "{patches:?}");
    assert_eq!(patches[0]["body"], "{\"a\":2}");
    assert_eq!(patches[1]["body"], "{\"a\":3}");
    for (name, value) in DIGESTS {
        assert!(
            patches[0]["headers"].get(name).is_none(),
            "{name}: {}",
            patches[0]
        );
        assert_eq!(
            patches[1]["headers"][name],
            serde_json::json!([value]),
            "{}",
            patches[1]
        );
    }
}
