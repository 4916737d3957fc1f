//! WebSocket upgrades: tunnelled both ways on unversioned routes, refused
//! on versioned ones, passed on as plain responses when the backend
//! declines, counted in the metrics, and closed by the drain timeout.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod versioned_support;

use std::time::{Duration, Instant};

use common::{eventually, Backend, Client, Lockstep};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio_tungstenite::tungstenite::{self, Message};
use versioned_support::{assert_problem, logged_header, received};

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens a WebSocket to `path` on the proxy listener.
async fn open(lockstep: &Lockstep, path: &str) -> Ws {
    let url = format!("ws://{}{path}", lockstep.proxy_addr());
    let (ws, resp) = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_tungstenite::connect_async(&url),
    )
    .await
    .unwrap_or_else(|_| panic!("no handshake answer from {url}"))
    .unwrap_or_else(|e| panic!("WebSocket handshake to {url} failed: {e}"));
    assert_eq!(resp.status(), 101, "{resp:?}");
    ws
}

/// The next data message, within a few seconds.
async fn next_message(ws: &mut Ws) -> Message {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .expect("no message within 5 s")
            .expect("the WebSocket ended")
            .expect("the WebSocket failed");
        if message.is_text() || message.is_binary() {
            return message;
        }
    }
}

/// The value of one sample in a Prometheus scrape.
async fn metric(client: &Client, lockstep: &Lockstep, series: &str) -> Option<f64> {
    let text = client
        .get(lockstep.admin_url_for("/metrics"))
        .send()
        .await
        .text();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.rsplit_once(' ').filter(|(s, _)| *s == series))
        .and_then(|(_, v)| v.parse().ok())
}

#[tokio::test]
async fn websocket_messages_are_echoed_through_lockstep_both_ways() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let mut ws = open(&lockstep, "/ws/echo").await;

    let sent: Vec<Message> = (0..6u8)
        .map(|i| {
            if i % 2 == 0 {
                Message::text(format!("message {i}: héllo"))
            } else {
                Message::binary(vec![i, 0, 0xff, 0x80, i])
            }
        })
        .collect();
    // All out first, then all back: the tunnel carries several messages
    // in flight at once, in order.
    for m in &sent {
        ws.send(m.clone()).await.expect("send through the tunnel");
    }
    for m in &sent {
        assert_eq!(&next_message(&mut ws).await, m);
    }
    // And one at a time, with a larger binary frame.
    let big = Message::binary(vec![7u8; 200 * 1024]);
    ws.send(big.clone()).await.unwrap();
    assert_eq!(next_message(&mut ws).await, big);
    ws.close(None).await.unwrap();
    while let Some(Ok(_)) = ws.next().await {}

    // The handshake reached the backend as a handshake: the two hop-by-hop
    // headers it needs were carried over the hop.
    let logged = received(&backend, "GET", "/ws/echo").await;
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(logged_header(&logged[0], "upgrade"), ["websocket"]);
    assert_eq!(logged_header(&logged[0], "connection"), ["upgrade"]);
    assert_eq!(logged_header(&logged[0], "sec-websocket-version"), ["13"]);
}

#[tokio::test]
async fn websocket_upgrades_on_item_and_collection_routes_get_400() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();

    for path in ["/articles/1", "/articles", "/Articles/1/", "/autos/x"] {
        let resp = client
            .get(lockstep.proxy_url_for(path))
            .header("connection", "Upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
            .send()
            .await;
        if path == "/Articles/1/" {
            // A path only a lenient backend reads as the item: refused
            // before anything else, as every alias is.
            assert_problem(&resp, 400, "ambiguous-path");
            continue;
        }
        let doc = assert_problem(&resp, 400, "invalid-request");
        assert!(
            doc["detail"].as_str().unwrap().contains("versioned route"),
            "{doc}"
        );
    }
    // A real WebSocket client sees the refusal as a failed handshake.
    let url = format!("ws://{}/articles/1", lockstep.proxy_addr());
    match tokio_tungstenite::connect_async(&url).await {
        Err(tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), 400),
        other => panic!("expected a refused handshake: {other:?}"),
    }
    for path in ["/articles/1", "/articles", "/autos/x"] {
        assert!(
            backend.log_for(path).await.is_empty(),
            "{path} reached the backend"
        );
    }

    // A plain read of the same item still works.
    let read = client.get(lockstep.proxy_url_for("/autos/x")).send().await;
    assert_eq!(read.status, 200, "{read:?}");
}

#[tokio::test]
async fn an_upgrade_the_backend_declines_is_a_plain_response_and_other_protocols_are_ignored() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();

    // The backend's /echo knows nothing of WebSockets: it answers 200.
    let resp = client
        .get(lockstep.proxy_url_for("/echo/ws"))
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .send()
        .await;
    assert_eq!(resp.status, 200, "{resp:?}");
    let echoed = resp.json();
    assert_eq!(echoed["path"], "/echo/ws");
    assert_eq!(
        echoed["headers"]["upgrade"],
        json!(["websocket"]),
        "{echoed}"
    );
    assert_eq!(
        echoed["headers"]["connection"],
        json!(["upgrade"]),
        "{echoed}"
    );
    // The client connection goes on as HTTP.
    let again = client
        .get(lockstep.proxy_url_for("/echo/after"))
        .send()
        .await;
    assert_eq!(again.status, 200, "{again:?}");

    // A handshake the WebSocket endpoint refuses (no key): its 426 passes on.
    let refused = client
        .get(lockstep.proxy_url_for("/ws/echo"))
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .send()
        .await;
    assert_eq!(refused.status, 426, "{refused:?}");

    // A 101 that does not answer the key (a backend that lets its caller
    // pick the status) is no WebSocket handshake: 502, no tunnel.
    for accept in [None, Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")] {
        let mut req = client
            .get(lockstep.proxy_url_for("/echo/forced"))
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-key", "AQIDBAUGBwgJCgsMDQ4PEA==")
            .header("sec-websocket-version", "13")
            .header("x-backend-status", "101")
            .header("x-backend-add-header", "upgrade: websocket")
            .header("x-backend-add-header", "connection: upgrade");
        if let Some(accept) = accept {
            req = req.header(
                "x-backend-add-header",
                format!("sec-websocket-accept: {accept}"),
            );
        }
        let forced = req.send().await;
        assert_eq!(forced.status, 502, "accept {accept:?}: {forced:?}");
        assert!(forced.text().contains("Sec-WebSocket-Accept"), "{forced:?}");
    }

    // h2c would carry later HTTP/2 requests past every check: not
    // tunnelled, the request goes on without its Upgrade.
    let h2c = client
        .get(lockstep.proxy_url_for("/echo/h2c"))
        .header("connection", "Upgrade, HTTP2-Settings")
        .header("upgrade", "h2c")
        .header("http2-settings", "AAMAAABkAARAAAAAAAIAAAAA")
        .send()
        .await;
    assert_eq!(h2c.status, 200, "{h2c:?}");
    let echoed = h2c.json();
    assert!(echoed["headers"].get("upgrade").is_none(), "{echoed}");
    assert!(
        echoed["headers"].get("http2-settings").is_none(),
        "{echoed}"
    );
    // And on a versioned route it is an ordinary read.
    let read = client
        .get(lockstep.proxy_url_for("/autos/h"))
        .header("connection", "Upgrade, HTTP2-Settings")
        .header("upgrade", "h2c")
        .send()
        .await;
    assert_eq!(read.status, 200, "{read:?}");
    assert_eq!(read.etag().as_deref(), Some("\"1\""), "{read:?}");
}

#[tokio::test]
async fn metrics_count_upgrades_and_open_tunnels() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let client = Client::new();
    let tunnelled = "lockstep_upgrades_total{outcome=\"tunnelled\"}";
    let open_now = "lockstep_upgrade_tunnels_open";
    assert_eq!(metric(&client, &lockstep, tunnelled).await, Some(0.0));
    assert_eq!(metric(&client, &lockstep, open_now).await, Some(0.0));

    let mut ws = open(&lockstep, "/ws/echo").await;
    ws.send(Message::text("ping")).await.unwrap();
    assert_eq!(next_message(&mut ws).await, Message::text("ping"));
    assert_eq!(metric(&client, &lockstep, tunnelled).await, Some(1.0));
    assert_eq!(metric(&client, &lockstep, open_now).await, Some(1.0));
    assert_eq!(
        metric(
            &client,
            &lockstep,
            "lockstep_http_requests_total{kind=\"passthrough\",method=\"GET\",status=\"101\"}"
        )
        .await,
        Some(1.0)
    );

    // The client closes and reads the backend's close, but keeps its
    // socket: the tunnel still ends once the backend has closed its side.
    ws.close(None).await.unwrap();
    while let Some(Ok(_)) = ws.next().await {}
    eventually(
        Duration::from_secs(15),
        "the tunnel gauge back at 0",
        || {
            let (client, lockstep) = (&client, &lockstep);
            async move { (metric(client, lockstep, open_now).await == Some(0.0)).then_some(()) }
        },
    )
    .await;

    // A declined upgrade is counted as such.
    let declined = client
        .get(lockstep.proxy_url_for("/echo/no-ws"))
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .send()
        .await;
    assert_eq!(declined.status, 200, "{declined:?}");
    assert_eq!(
        metric(
            &client,
            &lockstep,
            "lockstep_upgrades_total{outcome=\"declined\"}"
        )
        .await,
        Some(1.0)
    );
}

#[tokio::test]
async fn the_drain_closes_an_open_tunnel_at_the_drain_timeout_and_exits_0() {
    let backend = Backend::start();
    let mut lockstep = Lockstep::builder()
        .upstream(backend.url())
        .server_toml("drain_timeout_ms = 1500")
        .start();
    let mut ws = open(&lockstep, "/ws/echo").await;
    ws.send(Message::text("before")).await.unwrap();
    assert_eq!(next_message(&mut ws).await, Message::text("before"));

    let signalled = Instant::now();
    lockstep.terminate();
    // The tunnel is in flight like any request: it still works while the
    // drain runs.
    ws.send(Message::text("during the drain")).await.unwrap();
    assert_eq!(
        next_message(&mut ws).await,
        Message::text("during the drain")
    );

    let status = lockstep.wait_exit(Duration::from_secs(10)).await;
    let took = signalled.elapsed();
    assert_eq!(status.code(), Some(0), "exit status after the drain");
    assert!(
        took >= Duration::from_millis(1400),
        "the open tunnel was not waited for as an in-flight request: {took:?}"
    );
    assert!(
        took < Duration::from_millis(1500) + Duration::from_secs(3),
        "an open tunnel held the drain past its timeout: {took:?}"
    );
    // The client learns that the tunnel is gone.
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) => return,
                Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the tunnel stayed open after lockstep exited");
}
