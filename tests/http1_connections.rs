//! The proxy listener at the HTTP/1.1 connection level, as a client sees it
//! on the wire: keep-alive, pipelining, `Connection: close`, message framing
//! (HEAD, 204, 304, chunked, close-delimited, `Expect: 100-continue`),
//! HTTP/1.0, unparsable requests, the header read timeout and the drain on
//! SIGTERM.
//!
//! Every test speaks raw HTTP/1.1 over its own `TcpStream` and parses the
//! answers itself ([`Conn`]), so what is pinned here is the bytes, not what
//! a client library makes of them. Every final answer read is also checked
//! against the rules that hold for all of them ([`Conn::answer`]): exactly
//! one `Date`, and exactly one framing header except where the status or
//! the method rules a body out.
//!
//! Where a test says "as of the hyper-based server", it pins what the
//! listener did when it was served by hyper (1.x, through hyper-util's auto
//! builder), which a replacement must keep.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{raw_backend_closing, Backend, Lockstep};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The longest any single wait for bytes from lockstep may take.
const STEP: Duration = Duration::from_secs(5);

// ------------------------------------------------------------------ helpers

/// One parsed answer.
#[derive(Debug)]
struct Answer {
    /// `HTTP/1.1` or `HTTP/1.0`, as on the status line.
    version: String,
    status: u16,
    /// Names as sent (case kept), values with surrounding whitespace cut.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    framing: Framing,
    /// The status line and headers, as received, for failure messages.
    head: String,
}

/// How an answer's body was delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// No body by rule: a HEAD answer, 1xx, 204, 304.
    NoBody,
    Length(usize),
    Chunked,
    /// No length at all: the body runs to the close.
    UntilClose,
}

impl Answer {
    /// Every value of header `name` (case-insensitive).
    fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The only value of header `name`; panics if it repeats.
    fn header(&self, name: &str) -> Option<&str> {
        let all = self.all(name);
        assert!(all.len() <= 1, "{name} repeats: {}", self.head);
        all.first().copied()
    }

    /// Whether a comma-separated header lists `token` (case-insensitive).
    fn lists(&self, name: &str, token: &str) -> bool {
        self.all(name)
            .iter()
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    }

    /// The answer announces that the server closes the connection.
    fn says_close(&self) -> bool {
        self.lists("connection", "close")
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", self.head, self.text()))
    }

    /// The backend's `/echo` report of the request this answers.
    fn echo(&self) -> Value {
        assert_eq!(self.status, 200, "{self:?}");
        self.json()
    }

    /// Asserts an RFC 9457 problem with this status and type; returns it.
    fn problem(&self, status: u16, kind: &str) -> Value {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        let doc = self.json();
        assert_eq!(doc["type"], kind, "{doc}");
        assert_eq!(doc["status"], status, "{doc}");
        assert!(
            doc["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{doc}"
        );
        doc
    }
}

/// A client connection to lockstep, with what was read but not yet parsed.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {addr}: {e}"));
        stream.set_nodelay(true).unwrap();
        Conn {
            stream,
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: impl AsRef<[u8]>) {
        self.stream
            .write_all(bytes.as_ref())
            .await
            .expect("write to lockstep");
    }

    /// Reads once more into the buffer; `false` at the end of the stream.
    /// Panics when nothing comes within [`STEP`].
    async fn fill(&mut self, waiting_for: &str) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        match tokio::time::timeout(STEP, self.stream.read(&mut chunk)).await {
            Ok(Ok(0)) => false,
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
            Ok(Err(e)) => panic!(
                "reading {waiting_for}: {e}; received so far: {:?}",
                String::from_utf8_lossy(&self.buf)
            ),
            Err(_) => panic!(
                "nothing more within {STEP:?} while waiting for {waiting_for}; received so far: {:?}",
                String::from_utf8_lossy(&self.buf)
            ),
        }
    }

    /// Takes `n` bytes from the front of the buffer, reading as needed.
    async fn take(&mut self, n: usize, what: &str) -> Vec<u8> {
        while self.buf.len() < n {
            assert!(self.fill(what).await, "the connection closed inside {what}");
        }
        self.buf.drain(..n).collect()
    }

    /// Takes one CRLF-terminated line, without its CRLF.
    async fn line(&mut self, what: &str) -> String {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = self.buf.drain(..i + 2).collect();
                return String::from_utf8_lossy(&line[..i]).into_owned();
            }
            assert!(self.fill(what).await, "the connection closed inside {what}");
        }
    }

    /// Reads the next answer (an interim 1xx included) to a request made
    /// with `method`, and checks the rules every final answer follows.
    async fn answer(&mut self, method: &str) -> Answer {
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            assert!(
                self.fill("an answer's head").await,
                "the connection closed before an answer's head was complete; received: {:?}",
                String::from_utf8_lossy(&self.buf)
            );
        };
        let head_bytes: Vec<u8> = self.buf.drain(..head_end).collect();
        let head = String::from_utf8(head_bytes).expect("an answer's head is ASCII");
        let mut lines = head.trim_end_matches("\r\n").split("\r\n");
        let status_line = lines.next().unwrap();
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap().to_owned();
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        assert!(
            version == "HTTP/1.1" || version == "HTTP/1.0",
            "bad status line {status_line:?}"
        );
        let headers: Vec<(String, String)> = lines
            .map(|line| {
                let (name, value) = line
                    .split_once(':')
                    .unwrap_or_else(|| panic!("bad header line {line:?} in {head}"));
                assert!(
                    !name.is_empty() && !name.contains([' ', '\t']),
                    "bad header name in {line:?}"
                );
                (name.to_owned(), value.trim().to_owned())
            })
            .collect();
        let mut answer = Answer {
            version,
            status,
            headers,
            body: Vec::new(),
            framing: Framing::NoBody,
            head,
        };

        let chunked = answer.header("transfer-encoding").map(|te| {
            te.rsplit(',')
                .next()
                .unwrap()
                .trim()
                .eq_ignore_ascii_case("chunked")
        });
        answer.framing = if method == "HEAD" || status < 200 || status == 204 || status == 304 {
            Framing::NoBody
        } else if let Some(chunked) = chunked {
            if chunked {
                Framing::Chunked
            } else {
                Framing::UntilClose
            }
        } else if let Some(len) = answer.header("content-length") {
            Framing::Length(
                len.parse()
                    .unwrap_or_else(|_| panic!("bad content-length: {}", answer.head)),
            )
        } else {
            Framing::UntilClose
        };
        match answer.framing {
            Framing::NoBody => {}
            Framing::Length(n) => answer.body = self.take(n, "a body").await,
            Framing::Chunked => loop {
                let size_line = self.line("a chunk size").await;
                let size = size_line.split(';').next().unwrap().trim();
                let size = usize::from_str_radix(size, 16)
                    .unwrap_or_else(|_| panic!("bad chunk size line {size_line:?}"));
                if size == 0 {
                    // Trailers, up to the empty line.
                    while !self.line("the trailer section").await.is_empty() {}
                    break;
                }
                let data = self.take(size, "a chunk").await;
                answer.body.extend_from_slice(&data);
                assert_eq!(self.take(2, "a chunk's CRLF").await, b"\r\n");
            },
            Framing::UntilClose => {
                while self.fill("a body that runs to the close").await {}
                answer.body = std::mem::take(&mut self.buf);
            }
        }
        if status >= 200 {
            check_wire_rules(&answer, method);
        }
        answer
    }

    /// Reads one final answer per method, in order.
    async fn answers(&mut self, methods: &[&str]) -> Vec<Answer> {
        let mut answers = Vec::new();
        for method in methods {
            answers.push(self.answer(method).await);
        }
        answers
    }

    /// Asserts that no more bytes come and the server closes the
    /// connection (a FIN, or a reset) within `limit`; returns how long that
    /// took.
    async fn closed_within(&mut self, limit: Duration) -> Duration {
        assert!(
            self.buf.is_empty(),
            "bytes past the last answer: {:?}",
            String::from_utf8_lossy(&self.buf)
        );
        let started = Instant::now();
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout(limit, self.stream.read(&mut chunk)).await {
            Ok(Ok(0)) => {}
            Ok(Err(e)) if e.kind() == ErrorKind::ConnectionReset => {}
            Ok(Ok(n)) => panic!(
                "expected the connection to close, got bytes: {:?}",
                String::from_utf8_lossy(&chunk[..n])
            ),
            Ok(Err(e)) => panic!("expected the connection to close, got {e}"),
            Err(_) => panic!("the connection is still open after {limit:?}"),
        }
        started.elapsed()
    }

    async fn closed(&mut self) {
        self.closed_within(STEP).await;
    }

    /// Asserts that nothing has arrived yet, without waiting.
    fn nothing_yet(&mut self) {
        assert!(self.buf.is_empty());
        let mut chunk = [0u8; 1024];
        match self.stream.try_read(&mut chunk) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Ok(0) => panic!("the connection closed"),
            Ok(n) => panic!("bytes arrived: {:?}", String::from_utf8_lossy(&chunk[..n])),
            Err(e) => panic!("{e}"),
        }
    }
}

/// The rules every final answer on the proxy listener follows:
///
/// * exactly one `Date`, an IMF-fixdate;
/// * a 204 carries neither `Content-Length` nor `Transfer-Encoding`
///   (RFC 9110 §8.6, RFC 9112 §6.1); a 304 and a HEAD answer no
///   `Transfer-Encoding`, and a 304 no `Content-Length` either (what
///   lockstep sends: RFC 9110 §8.6 would allow the 200's length);
/// * any other HTTP/1.1 answer exactly one framing header: one
///   `Content-Length`, or `Transfer-Encoding: chunked`; never both
///   (RFC 9112 §6.2), and never a body that runs to the close;
/// * an HTTP/1.0 answer never `Transfer-Encoding` (RFC 9112 §6.1).
fn check_wire_rules(answer: &Answer, method: &str) {
    let dates = answer.all("date");
    assert_eq!(dates.len(), 1, "exactly one Date: {}", answer.head);
    assert!(
        dates[0].len() == 29 && dates[0].ends_with(" GMT"),
        "Date is not an IMF-fixdate: {}",
        answer.head
    );
    let lengths = answer.all("content-length");
    let codings = answer.all("transfer-encoding");
    assert!(
        lengths.len() <= 1 && codings.len() <= 1,
        "a repeated framing header: {}",
        answer.head
    );
    assert!(
        lengths.is_empty() || codings.is_empty(),
        "Content-Length and Transfer-Encoding together: {}",
        answer.head
    );
    if answer.version == "HTTP/1.0" {
        assert!(
            codings.is_empty(),
            "Transfer-Encoding to HTTP/1.0: {}",
            answer.head
        );
    }
    match answer.status {
        204 => assert!(
            lengths.is_empty() && codings.is_empty(),
            "a 204 with a framing header: {}",
            answer.head
        ),
        304 => assert!(
            lengths.is_empty() && codings.is_empty(),
            "a 304 with a framing header: {}",
            answer.head
        ),
        _ if method == "HEAD" => assert!(
            codings.is_empty(),
            "a HEAD answer with Transfer-Encoding: {}",
            answer.head
        ),
        _ if answer.version == "HTTP/1.1" => {
            assert!(
                lengths.len() + codings.len() == 1,
                "an HTTP/1.1 answer without a framing header: {}",
                answer.head
            );
            if let Some(coding) = codings.first() {
                assert_eq!(*coding, "chunked", "{}", answer.head);
            }
        }
        _ => {}
    }
}

/// `GET {path}` with a Host, keep-alive (HTTP/1.1's default).
fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: lockstep.test\r\n\r\n")
}

/// A request with a Content-Length body.
fn with_body(method: &str, path: &str, headers: &str, body: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: lockstep.test\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Asserts `answer` is the backend's `/echo` report of `method path` with
/// this body, and returns the report.
fn assert_echo(answer: &Answer, method: &str, path: &str, body: &str) -> Value {
    let report = answer.echo();
    assert_eq!(report["method"], method, "{report}");
    assert_eq!(report["path"], path, "{report}");
    assert_eq!(report["body"], body, "{report}");
    assert_eq!(report["body_len"], body.len(), "{report}");
    report
}

/// Asserts `answer` is the versioned read of an `/autos/{id}` item at
/// version `version`.
fn assert_versioned_read(answer: &Answer, id: &str, version: u64) {
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        answer.header("etag"),
        Some(format!("\"{version}\"").as_str()),
        "{answer:?}"
    );
    assert_eq!(answer.json(), json!({"id": id, "version": version}));
}

/// Asserts every answer is a keep-alive HTTP/1.1 answer.
fn assert_kept_alive(answers: &[Answer]) {
    for answer in answers {
        assert_eq!(answer.version, "HTTP/1.1", "{answer:?}");
        assert!(!answer.says_close(), "{answer:?}");
    }
}

/// The test backend, lockstep in front of it, and a connection to
/// lockstep's proxy listener.
async fn connected() -> (Backend, Lockstep, Conn) {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let conn = Conn::open(lockstep.proxy_addr()).await;
    (backend, lockstep, conn)
}

/// A connection to `addr` that was answered once and kept alive: idle.
async fn kept_alive_after_one_read(addr: SocketAddr) -> Conn {
    let mut idle = Conn::open(addr).await;
    idle.send(get("/echo/idle")).await;
    let answer = idle.answer("GET").await;
    assert!(!answer.says_close(), "{answer:?}");
    idle
}

/// The backend's log entries for `path`.
async fn backend_saw(backend: &Backend, path: &str) -> Vec<Value> {
    backend.log_for(path).await
}

// -------------------------------------------------------------------- tests

#[tokio::test]
async fn keep_alive_serves_sequential_requests_on_one_connection() {
    let backend = Backend::start();
    backend.seed("/things/1", json!({"a": 1})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let mut conn = Conn::open(lockstep.proxy_addr()).await;

    conn.send(get("/echo/first")).await;
    let first = conn.answer("GET").await;
    assert_echo(&first, "GET", "/echo/first", "");

    conn.send(get("/autos/1")).await;
    let read = conn.answer("GET").await;
    assert_versioned_read(&read, "1", 1);

    conn.send(get("/things/1")).await;
    let item = conn.answer("GET").await;
    assert_eq!(item.status, 200, "{item:?}");
    assert_eq!(item.json(), json!({"a": 1}));
    assert_eq!(item.header("etag"), Some("\"backend-1\""), "{item:?}");

    // Still open: a fourth request on it is answered too.
    conn.send(get("/echo/fourth")).await;
    let fourth = conn.answer("GET").await;
    assert_echo(&fourth, "GET", "/echo/fourth", "");
    assert_kept_alive(&[first, read, item, fourth]);
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let (_backend, _lockstep, mut conn) = connected().await;

    // The first is the slowest: a server that answers requests in the
    // order they finish instead of the order they came would show it.
    conn.send(format!(
        "GET /echo/p1 HTTP/1.1\r\nHost: lockstep.test\r\nX-Backend-Delay-Ms: 300\r\n\r\n{}{}",
        get("/autos/2"),
        get("/echo/p3")
    ))
    .await;
    let answers = conn.answers(&["GET", "GET", "GET"]).await;
    assert_echo(&answers[0], "GET", "/echo/p1", "");
    assert_versioned_read(&answers[1], "2", 1);
    assert_echo(&answers[2], "GET", "/echo/p3", "");
    assert_kept_alive(&answers);

    // Ten more in one write, and the connection still serves after them.
    let burst: String = (0..10).map(|i| get(&format!("/echo/b{i}"))).collect();
    conn.send(burst).await;
    for i in 0..10 {
        let answer = conn.answer("GET").await;
        assert_echo(&answer, "GET", &format!("/echo/b{i}"), "");
    }
    conn.send(get("/echo/after")).await;
    assert_echo(&conn.answer("GET").await, "GET", "/echo/after", "");
}

#[tokio::test]
async fn requests_arriving_a_byte_at_a_time_are_parsed_whole() {
    let (_backend, _lockstep, mut conn) = connected().await;

    // Two pipelined requests, the first with a chunked body carrying a
    // chunk extension, written one byte per write: every boundary (inside
    // the request line, a header, a CRLF, a chunk size, between the
    // requests) can fall between two reads of the server.
    let requests = format!(
        "POST /echo/bytewise HTTP/1.1\r\nHost: lockstep.test\r\nTransfer-Encoding: chunked\r\n\r\n\
         3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\n\r\n{}",
        get("/echo/bytewise2")
    );
    for byte in requests.as_bytes() {
        conn.send([*byte]).await;
    }
    let answers = conn.answers(&["POST", "GET"]).await;
    assert_echo(&answers[0], "POST", "/echo/bytewise", "abcde");
    assert_echo(&answers[1], "GET", "/echo/bytewise2", "");
    assert_kept_alive(&answers);
}

#[tokio::test]
async fn connection_close_is_answered_with_close_and_then_the_connection_closes() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let addr = lockstep.proxy_addr();

    for connection in ["close", "Keep-Alive, CLOSE"] {
        let mut conn = Conn::open(addr).await;
        // A request pipelined after the close is never served.
        conn.send(format!(
            "GET /echo/cc HTTP/1.1\r\nHost: lockstep.test\r\nConnection: {connection}\r\n\r\n{}",
            get("/echo/never")
        ))
        .await;
        let answer = conn.answer("GET").await;
        assert_echo(&answer, "GET", "/echo/cc", "");
        assert!(answer.says_close(), "Connection: {connection}: {answer:?}");
        conn.closed().await;
    }
    assert!(backend_saw(&backend, "/echo/never").await.is_empty());

    // The same after a keep-alive request on the same connection.
    let mut conn = Conn::open(addr).await;
    conn.send(get("/autos/1")).await;
    let first = conn.answer("GET").await;
    assert!(!first.says_close(), "{first:?}");
    conn.send("GET /autos/1 HTTP/1.1\r\nHost: lockstep.test\r\nConnection: close\r\n\r\n")
        .await;
    let last = conn.answer("GET").await;
    assert_versioned_read(&last, "1", 1);
    assert!(last.says_close(), "{last:?}");
    conn.closed().await;
}

#[tokio::test]
async fn head_answers_carry_no_body_and_the_length_of_the_get() {
    let backend = Backend::start();
    backend.seed("/things/1", json!({"a": 1})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let mut conn = Conn::open(lockstep.proxy_addr()).await;

    // Sequentially: each HEAD answer is followed by nothing.
    let mut lengths = Vec::new();
    for path in ["/autos/1", "/things/1"] {
        conn.send(get(path)).await;
        let full = conn.answer("GET").await;
        assert_eq!(full.status, 200, "{full:?}");
        conn.send(format!(
            "HEAD {path} HTTP/1.1\r\nHost: lockstep.test\r\n\r\n"
        ))
        .await;
        let head = conn.answer("HEAD").await;
        assert_eq!(head.status, 200, "{head:?}");
        assert!(head.body.is_empty());
        assert_eq!(
            head.header("content-length"),
            Some(full.body.len().to_string().as_str()),
            "HEAD {path}: the GET's length: {head:?}"
        );
        assert_eq!(head.header("etag"), full.header("etag"), "{head:?}");
        assert_eq!(
            head.header("content-type"),
            full.header("content-type"),
            "{head:?}"
        );
        lengths.push(full.body.len());
    }
    // A GET the backend answers chunked: its HEAD has no length at all
    // (a `content-length: 0` would claim the GET's body is empty).
    conn.send("HEAD /bytes/100 HTTP/1.1\r\nHost: lockstep.test\r\n\r\n")
        .await;
    let unknown = conn.answer("HEAD").await;
    assert_eq!(unknown.status, 200, "{unknown:?}");
    assert_eq!(unknown.header("content-length"), None, "{unknown:?}");
    conn.send(get("/echo/after-heads")).await;
    assert_echo(&conn.answer("GET").await, "GET", "/echo/after-heads", "");

    // Pipelined: HEADs between GETs in one write.
    conn.send(format!(
        "HEAD /autos/1 HTTP/1.1\r\nHost: lockstep.test\r\n\r\n{}\
         HEAD /bytes/100 HTTP/1.1\r\nHost: lockstep.test\r\n\r\n\
         HEAD /things/1 HTTP/1.1\r\nHost: lockstep.test\r\n\r\n{}",
        get("/autos/1"),
        get("/echo/last")
    ))
    .await;
    let answers = conn.answers(&["HEAD", "GET", "HEAD", "HEAD", "GET"]).await;
    assert_eq!(
        answers[0].header("content-length"),
        Some(lengths[0].to_string().as_str())
    );
    assert_versioned_read(&answers[1], "1", 1);
    assert_eq!(answers[2].header("content-length"), None);
    assert_eq!(
        answers[3].header("content-length"),
        Some(lengths[1].to_string().as_str())
    );
    assert_echo(&answers[4], "GET", "/echo/last", "");
    assert_kept_alive(&answers);
}

#[tokio::test]
async fn answers_204_and_304_have_no_body_and_keep_the_connection_in_step() {
    let backend = Backend::start();
    backend.seed("/things/1", json!({"a": 1})).await;
    backend.seed("/things/2", json!({"a": 2})).await;
    let lockstep = Lockstep::in_front_of(&backend);
    let mut conn = Conn::open(lockstep.proxy_addr()).await;

    let requests = [
        // The backend's own 204 (a DELETE).
        ("DELETE", "DELETE /things/2 HTTP/1.1\r\nHost: lockstep.test\r\n\r\n".to_owned()),
        // A backend 204 built with a body and a Content-Length: neither
        // may reach the client.
        ("GET", "GET /echo/f HTTP/1.1\r\nHost: lockstep.test\r\nX-Backend-Status: 204\r\n\r\n".to_owned()),
        // lockstep's own 304 to a versioned read whose version matches.
        ("GET", "GET /autos/1 HTTP/1.1\r\nHost: lockstep.test\r\nIf-None-Match: \"1\"\r\n\r\n".to_owned()),
        // The backend's 304s: bodiless, and built with a body.
        ("GET", "GET /things/1 HTTP/1.1\r\nHost: lockstep.test\r\nX-Backend-Apply-Then-Status: 304\r\n\r\n".to_owned()),
        ("GET", "GET /echo/f HTTP/1.1\r\nHost: lockstep.test\r\nX-Backend-Status: 304\r\n\r\n".to_owned()),
        // The same versioned 304 for a HEAD.
        ("HEAD", "HEAD /autos/1 HTTP/1.1\r\nHost: lockstep.test\r\nIf-None-Match: \"1\"\r\n\r\n".to_owned()),
    ];
    let expected = [204, 204, 304, 304, 304, 304];

    // One at a time, then all pipelined in one write.
    for (i, (method, request)) in requests.iter().enumerate() {
        conn.send(request).await;
        let answer = conn.answer(method).await;
        assert_eq!(answer.status, expected[i], "{request}: {answer:?}");
        if i == 0 {
            // The item is gone now; DELETE it again below as a 404.
            backend.seed("/things/2", json!({"a": 2})).await;
        }
    }
    conn.send(get("/echo/between")).await;
    assert_echo(&conn.answer("GET").await, "GET", "/echo/between", "");

    let all: String = requests.iter().map(|(_, r)| r.as_str()).collect();
    conn.send(format!("{all}{}", get("/echo/after"))).await;
    let methods: Vec<&str> = requests.iter().map(|(m, _)| *m).chain(["GET"]).collect();
    let answers = conn.answers(&methods).await;
    for (answer, status) in answers.iter().zip(expected) {
        assert_eq!(answer.status, status, "{answer:?}");
        assert!(answer.body.is_empty());
    }
    for versioned in [&answers[2], &answers[5]] {
        assert_eq!(versioned.header("etag"), Some("\"1\""), "{versioned:?}");
    }
    assert_echo(&answers[6], "GET", "/echo/after", "");
    assert_kept_alive(&answers);
}

#[tokio::test]
async fn chunked_answers_reach_the_client_whole_and_the_connection_is_reused() {
    let (_backend, _lockstep, mut conn) = connected().await;

    // The backend answers chunked: so does lockstep, byte for byte.
    conn.send(get("/bytes/100000")).await;
    let big = conn.answer("GET").await;
    assert_eq!(big.status, 200, "{big:?}");
    assert_eq!(big.framing, Framing::Chunked, "{big:?}");
    assert_eq!(big.body.len(), 100_000);
    assert!(big.body.iter().all(|b| *b == b'x'));

    // A streamed echo of a chunked upload: no length known either way.
    conn.send(
        "POST /mirror HTTP/1.1\r\nHost: lockstep.test\r\nTransfer-Encoding: chunked\r\n\r\n\
         5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    )
    .await;
    let mirrored = conn.answer("POST").await;
    assert_eq!(mirrored.status, 200, "{mirrored:?}");
    assert_eq!(mirrored.framing, Framing::Chunked, "{mirrored:?}");
    assert_eq!(mirrored.text(), "hello world");

    // An empty chunked body, pipelined with a read.
    conn.send(format!("{}{}", get("/bytes/0"), get("/autos/1")))
        .await;
    let answers = conn.answers(&["GET", "GET"]).await;
    assert_eq!(answers[0].status, 200, "{:?}", answers[0]);
    assert!(answers[0].body.is_empty());
    assert_versioned_read(&answers[1], "1", 1);
    assert_kept_alive(&[big, mirrored]);
    assert_kept_alive(&answers);
}

#[tokio::test]
async fn an_answer_that_runs_to_the_backends_close_is_framed_for_the_client() {
    // No Content-Length, no Transfer-Encoding: the body ends where the
    // backend closes (RFC 9112 §6.3, rule 8).
    let upstream = raw_backend_closing(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the close",
        true,
    )
    .await;
    let lockstep = Lockstep::builder()
        .upstream(format!("http://{upstream}"))
        .start();
    let mut conn = Conn::open(lockstep.proxy_addr()).await;

    // The client gets it with a framing of its own (chunked, since the
    // length is not known when the head goes out), so its connection
    // stays usable; twice, pipelined, to prove it.
    conn.send(format!("{}{}", get("/plain/1"), get("/plain/2")))
        .await;
    let answers = conn.answers(&["GET", "GET"]).await;
    for answer in &answers {
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.framing, Framing::Chunked, "{answer:?}");
        assert_eq!(answer.text(), "until the close");
    }
    assert_kept_alive(&answers);

    // HTTP/1.0 cannot have chunked: the answer runs to the close there too.
    let mut conn = Conn::open(lockstep.proxy_addr()).await;
    conn.send("GET /plain/3 HTTP/1.0\r\n\r\n").await;
    let answer = conn.answer("GET").await;
    assert_eq!(answer.version, "HTTP/1.0", "{answer:?}");
    assert_eq!(answer.framing, Framing::UntilClose, "{answer:?}");
    assert_eq!(answer.text(), "until the close");
}

#[tokio::test]
async fn http10_requests_are_answered_in_http10_and_closed_unless_kept_alive() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    let addr = lockstep.proxy_addr();

    // Without keep-alive: answered (status line HTTP/1.0, with a length,
    // no Connection header), then closed; a pipelined request is dropped.
    let mut conn = Conn::open(addr).await;
    conn.send("GET /echo/old HTTP/1.0\r\n\r\nGET /echo/never HTTP/1.0\r\n\r\n")
        .await;
    let answer = conn.answer("GET").await;
    assert_eq!(answer.version, "HTTP/1.0", "{answer:?}");
    assert_eq!(answer.all("connection"), Vec::<&str>::new(), "{answer:?}");
    assert!(matches!(answer.framing, Framing::Length(_)), "{answer:?}");
    assert_echo(&answer, "GET", "/echo/old", "");
    conn.closed().await;
    assert!(backend_saw(&backend, "/echo/never").await.is_empty());

    // With `Connection: keep-alive` (as of the hyper-based server): the
    // answer is HTTP/1.0 and says `connection: keep-alive`, and the
    // connection stays open for the next request (RFC 9112 §9.3, the
    // HTTP/1.0 keep-alive mechanism of RFC 2068 §19.7.1), a HEAD among
    // them; the first without keep-alive is the last.
    let mut conn = Conn::open(addr).await;
    conn.send("GET /autos/1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        .await;
    let kept = conn.answer("GET").await;
    assert_eq!(kept.version, "HTTP/1.0", "{kept:?}");
    assert_eq!(kept.header("connection"), Some("keep-alive"), "{kept:?}");
    assert_versioned_read(&kept, "1", 1);
    conn.send(
        "HEAD /autos/1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n\
         GET /echo/ka HTTP/1.0\r\nConnection: keep-alive\r\n\r\n\
         GET /echo/last HTTP/1.0\r\n\r\n",
    )
    .await;
    let answers = conn.answers(&["HEAD", "GET", "GET"]).await;
    assert_eq!(answers[0].status, 200, "{:?}", answers[0]);
    assert_eq!(answers[0].header("content-length"), Some("22"));
    assert_eq!(answers[0].header("connection"), Some("keep-alive"));
    assert_echo(&answers[1], "GET", "/echo/ka", "");
    assert_eq!(answers[1].header("connection"), Some("keep-alive"));
    assert_echo(&answers[2], "GET", "/echo/last", "");
    assert_eq!(answers[2].all("connection"), Vec::<&str>::new());
    for answer in &answers {
        assert_eq!(answer.version, "HTTP/1.0", "{answer:?}");
    }
    conn.closed().await;

    // A body of unknown length cannot be chunked for HTTP/1.0: it runs to
    // the close, keep-alive or not.
    let mut conn = Conn::open(addr).await;
    conn.send("GET /bytes/1000 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        .await;
    let streamed = conn.answer("GET").await;
    assert_eq!(streamed.version, "HTTP/1.0", "{streamed:?}");
    assert_eq!(streamed.framing, Framing::UntilClose, "{streamed:?}");
    assert_eq!(streamed.body, vec![b'x'; 1000]);

    // HTTP/1.0 has no transfer codings: such a request's framing is
    // faulty (RFC 9112 §6.1), so 400 and close.
    let mut conn = Conn::open(addr).await;
    conn.send("POST /echo/te HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        .await;
    let refused = conn.answer("POST").await;
    refused.problem(400, "invalid-request");
    assert!(refused.says_close(), "{refused:?}");
    conn.closed().await;
    assert!(backend_saw(&backend, "/echo/te").await.is_empty());
}

#[tokio::test]
async fn requests_with_bodies_between_gets_keep_the_connection_in_step() {
    let (backend, _lockstep, mut conn) = connected().await;
    let json = "Content-Type: application/json\r\n";

    // One at a time: GETs, PUT (passthrough), POST (passthrough create),
    // PATCH (a versioned write), GET.
    conn.send(get("/echo/m1")).await;
    assert_echo(&conn.answer("GET").await, "GET", "/echo/m1", "");
    conn.send(get("/autos/3")).await;
    assert_versioned_read(&conn.answer("GET").await, "3", 1);
    conn.send(with_body("PUT", "/echo/m2", "", "hello")).await;
    assert_echo(&conn.answer("PUT").await, "PUT", "/echo/m2", "hello");
    conn.send(with_body("POST", "/things", json, "{\"id\":\"t1\"}"))
        .await;
    let created = conn.answer("POST").await;
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(created.header("location"), Some("/things/t1"));
    conn.send(with_body(
        "PATCH",
        "/autos/3",
        &format!("{json}If-Match: \"1\"\r\n"),
        "{\"n\":1}",
    ))
    .await;
    let patched = conn.answer("PATCH").await;
    assert_eq!(patched.status, 200, "{patched:?}");
    assert_eq!(patched.header("etag"), Some("\"2\""), "{patched:?}");
    conn.send(get("/echo/m3")).await;
    assert_echo(&conn.answer("GET").await, "GET", "/echo/m3", "");

    // Pipelined in one write: a Content-Length body, a chunked body, a
    // GET carrying a body, and a write lockstep refuses before reading its
    // body (an ambiguous versioned path): the bytes of every body are
    // consumed, never read as the next request.
    conn.send(format!(
        "{}{}POST /echo/p2 HTTP/1.1\r\nHost: lockstep.test\r\nTransfer-Encoding: chunked\r\n\r\n\
         4\r\nwxyz\r\n0\r\n\r\n{}{}{}{}",
        get("/echo/p1"),
        with_body(
            "PUT",
            "/echo/p1b",
            "",
            "GET /echo/smuggled HTTP/1.1\r\n\r\n"
        ),
        with_body("GET", "/echo/p3", "", "abc"),
        with_body(
            "PATCH",
            "/articles/a%2Fb",
            &format!("{json}If-Match: \"1\"\r\n"),
            "{\"x\":\"GET /echo/smuggled HTTP/1.1\"}"
        ),
        with_body("POST", "/echo/p5", "", "{}"),
        get("/echo/p6"),
    ))
    .await;
    let answers = conn
        .answers(&["GET", "PUT", "POST", "GET", "PATCH", "POST", "GET"])
        .await;
    assert_echo(&answers[0], "GET", "/echo/p1", "");
    assert_echo(
        &answers[1],
        "PUT",
        "/echo/p1b",
        "GET /echo/smuggled HTTP/1.1\r\n\r\n",
    );
    assert_echo(&answers[2], "POST", "/echo/p2", "wxyz");
    assert_echo(&answers[3], "GET", "/echo/p3", "abc");
    answers[4].problem(400, "ambiguous-path");
    assert_echo(&answers[5], "POST", "/echo/p5", "{}");
    assert_echo(&answers[6], "GET", "/echo/p6", "");
    assert_kept_alive(&answers);
    assert!(backend_saw(&backend, "/echo/smuggled").await.is_empty());
}

#[tokio::test]
async fn the_header_read_timeout_closes_idle_and_stalled_connections() {
    let backend = Backend::start();
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .server_toml("header_read_timeout_ms = 300")
        .start();
    let addr = lockstep.proxy_addr();
    // Time is the subject here: each case on its own connection, all at
    // once, each closed by the server between ~300 ms and 5 s.
    let early = Duration::from_millis(200);
    let late = Duration::from_secs(5);

    let idle_after_an_answer = async {
        let mut conn = Conn::open(addr).await;
        conn.send(get("/echo/idle")).await;
        let answer = conn.answer("GET").await;
        assert!(!answer.says_close(), "{answer:?}");
        // Nothing comes back, not even a 408: just the close.
        conn.closed_within(late).await
    };
    let partial_head = async {
        let mut conn = Conn::open(addr).await;
        conn.send("GET /echo/partial HTTP/1.1\r\nHost: lockstep.test\r\n")
            .await;
        conn.closed_within(late).await
    };
    let one_byte = async {
        let mut conn = Conn::open(addr).await;
        conn.send("G").await;
        conn.closed_within(late).await
    };
    // A body, unlike a head, may take longer than the timeout, and so
    // may the answer; then the connection idles out as usual.
    let slow_body_and_slow_answer = async {
        let mut conn = Conn::open(addr).await;
        conn.send(
            "PUT /echo/slow HTTP/1.1\r\nHost: lockstep.test\r\nX-Backend-Delay-Ms: 500\r\n\
             Content-Length: 4\r\n\r\nab",
        )
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        conn.send("cd").await;
        let answer = conn.answer("PUT").await;
        assert_echo(&answer, "PUT", "/echo/slow", "abcd");
        conn.closed_within(late).await
    };
    // A connection that never sends a byte, on either listener (the admin
    // one is served by hyper from the first byte on).
    let never_a_byte = async {
        let mut conn = Conn::open(addr).await;
        conn.closed_within(late).await
    };
    let never_a_byte_on_admin = async {
        let mut conn = Conn::open(lockstep.admin_addr()).await;
        conn.closed_within(late).await
    };
    let (idle, partial, byte, slow, silent, silent_admin) = tokio::join!(
        idle_after_an_answer,
        partial_head,
        one_byte,
        slow_body_and_slow_answer,
        never_a_byte,
        never_a_byte_on_admin
    );
    for (what, took) in [
        ("idle after an answer", idle),
        ("a partial head", partial),
        ("one byte", byte),
        ("idle after a slow request", slow),
        ("never a byte", silent),
        ("never a byte, admin listener", silent_admin),
    ] {
        assert!(took >= early, "{what}: closed after only {took:?}");
    }
    assert!(backend_saw(&backend, "/echo/partial").await.is_empty());
}

#[tokio::test]
async fn unparsable_requests_get_a_400_problem_and_the_connection_closes() {
    let backend = Backend::start();
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .server_toml("max_header_bytes = 8192")
        .start();
    let addr = lockstep.proxy_addr();

    for (what, request) in [
        (
            "extra word on the request line",
            "GET /echo/x HTTP/1.1 extra\r\nHost: a\r\n\r\n",
        ),
        ("no target or version", "BLAH\r\n\r\n"),
        (
            "obs-fold (RFC 9112 §5.2)",
            "GET /echo/x HTTP/1.1\r\nHost: a\r\nX-Fold: a\r\n b\r\n\r\n",
        ),
        (
            "space before the colon (RFC 9112 §5.1)",
            "GET /echo/x HTTP/1.1\r\nHost: a\r\nX-Sp : a\r\n\r\n",
        ),
        (
            "a transfer coding other than chunked last (RFC 9112 §6.3)",
            "POST /echo/x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\nabc",
        ),
        (
            "a Content-Length list (RFC 9110 §8.6 lets a server refuse it)",
            "POST /echo/x HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\nabc",
        ),
        (
            "a signed Content-Length",
            "POST /echo/x HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\nabc",
        ),
    ] {
        let mut conn = Conn::open(addr).await;
        // A well-formed request pipelined after it is never served.
        conn.send(format!("{request}{}", get("/echo/never"))).await;
        let answer = conn.answer("GET").await;
        assert_eq!(answer.version, "HTTP/1.1", "{what}: {answer:?}");
        let doc = answer.problem(400, "invalid-request");
        assert_eq!(doc["title"], "Invalid request", "{what}");
        assert!(answer.says_close(), "{what}: {answer:?}");
        assert_eq!(answer.header("cache-control"), Some("no-store"), "{what}");
        conn.closed().await;
    }

    // A head over server.max_header_bytes: 431; one well under it passes.
    let mut conn = Conn::open(addr).await;
    conn.send(format!(
        "GET /echo/big HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "a".repeat(6000)
    ))
    .await;
    let fits = conn.answer("GET").await;
    assert_eq!(
        fits.echo()["headers"]["x-big"][0].as_str().unwrap().len(),
        6000
    );
    conn.send(format!(
        "GET /echo/too-big HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "a".repeat(9000)
    ))
    .await;
    let too_big = conn.answer("GET").await;
    too_big.problem(431, "invalid-request");
    assert!(too_big.says_close(), "{too_big:?}");
    conn.closed().await;

    let seen = backend.log().await;
    assert!(
        seen.iter().all(|e| e["path"] == "/echo/big"),
        "only the request that fits reached the backend: {seen:?}"
    );
}

#[tokio::test]
async fn content_length_with_transfer_encoding_is_read_chunked_and_closes() {
    let (backend, _lockstep, mut conn) = connected().await;
    // RFC 9112 §6.1: read by Transfer-Encoding alone (or refused), and
    // the connection closed after the answer either way, so nothing after
    // it can be smuggled in. As of the hyper-based server: read chunked.
    conn.send(format!(
        "POST /echo/clte HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n\
         3\r\nabc\r\n0\r\n\r\n{}",
        get("/echo/never")
    ))
    .await;
    let answer = conn.answer("POST").await;
    let report = assert_echo(&answer, "POST", "/echo/clte", "abc");
    assert_eq!(report["headers"]["content-length"], Value::Null, "{report}");
    assert!(answer.says_close(), "{answer:?}");
    conn.closed().await;
    assert!(backend_saw(&backend, "/echo/never").await.is_empty());
}

#[tokio::test]
async fn expect_100_continue_gets_the_interim_answer_before_the_body() {
    let (backend, lockstep, mut conn) = connected().await;

    // A passthrough PUT, then a versioned one, on the same connection.
    for (path, headers, body) in [
        ("/echo/e", "", "hello"),
        (
            "/autos/9",
            "Content-Type: application/json\r\n",
            "{\"n\":9}",
        ),
    ] {
        conn.send(format!(
            "PUT {path} HTTP/1.1\r\nHost: a\r\n{headers}Expect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            body.len()
        ))
        .await;
        let interim = conn.answer("PUT").await;
        assert_eq!(interim.status, 100, "{path}: {interim:?}");
        assert_eq!(interim.version, "HTTP/1.1");
        assert!(interim.headers.is_empty(), "{path}: {interim:?}");
        conn.nothing_yet();
        conn.send(body).await;
        let last = conn.answer("PUT").await;
        assert_eq!(last.status, 200, "{path}: {last:?}");
        assert!(!last.says_close(), "{last:?}");
        if path == "/echo/e" {
            assert_echo(&last, "PUT", "/echo/e", "hello");
        } else {
            assert_eq!(last.header("etag"), Some("\"2\""), "{last:?}");
        }
    }
    conn.send(get("/echo/after")).await;
    assert_echo(&conn.answer("GET").await, "GET", "/echo/after", "");

    // A write lockstep refuses before it wants the body (a stale
    // If-Match): the final answer comes at once, with no 100 before it,
    // and since the body was neither asked for nor read the connection
    // then closes (as of the hyper-based server: without announcing it).
    let mut conn = Conn::open(lockstep.proxy_addr()).await;
    conn.send(
        "PATCH /autos/1 HTTP/1.1\r\nHost: a\r\nIf-Match: \"77\"\r\nExpect: 100-continue\r\n\
         Content-Type: application/json\r\nContent-Length: 2\r\n\r\n",
    )
    .await;
    let refused = conn.answer("PATCH").await;
    refused.problem(409, "conflict");
    conn.closed().await;
    assert!(backend
        .log_for("/autos/1")
        .await
        .iter()
        .all(|e| e["method"] == "GET"));
}

#[tokio::test]
async fn sigterm_closes_idle_connections_and_finishes_the_request_in_flight() {
    let backend = Backend::start();
    let mut lockstep = Lockstep::in_front_of(&backend);
    let addr = lockstep.proxy_addr();

    let mut idle = kept_alive_after_one_read(addr).await;

    let mut busy = Conn::open(addr).await;
    busy.send("GET /echo/slow HTTP/1.1\r\nHost: a\r\nX-Backend-Delay-Ms: 1500\r\n\r\n")
        .await;
    common::eventually(STEP, "the slow request at the backend", || {
        let backend = &backend;
        async move { (!backend.log_for("/echo/slow").await.is_empty()).then_some(()) }
    })
    .await;

    lockstep.terminate();
    // The idle connection closes at once, with nothing written to it,
    // while the slow answer is still on its way.
    idle.closed().await;
    busy.nothing_yet();
    // The request in flight gets its whole answer, which says the
    // connection closes after it, and then it does.
    let slow = busy.answer("GET").await;
    assert_echo(&slow, "GET", "/echo/slow", "");
    assert!(slow.says_close(), "{slow:?}");
    busy.closed().await;
    let status = lockstep.wait_exit(STEP).await;
    assert_eq!(status.code(), Some(0), "exit status after the drain");
}

#[tokio::test]
async fn every_answer_has_one_date_and_one_framing_header() {
    let (_backend, lockstep, mut conn) = connected().await;
    let json = "Content-Type: application/json\r\n";

    // [`Conn::answer`] checks the rules on each; here, one answer of each
    // kind, all on one connection: lockstep's own problems among them.
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        ("GET", get("/echo/d"), 200, None),
        ("GET", get("/autos/1"), 200, None),
        ("GET", get("/things/none"), 404, None),
        ("GET", get("/bytes/10"), 200, None),
        ("GET", get("/articles/a%2Fb"), 400, Some("ambiguous-path")),
        (
            "PATCH",
            with_body(
                "PATCH",
                "/autos/1",
                &format!("{json}If-Match: \"77\"\r\n"),
                "{}",
            ),
            409,
            Some("conflict"),
        ),
        (
            "CONNECT",
            "CONNECT b.example:80 HTTP/1.1\r\nHost: b.example:80\r\n\r\n".into(),
            405,
            Some("method-not-allowed"),
        ),
        (
            "GET",
            "GET /echo/d HTTP/1.1\r\n\r\n".into(),
            400,
            Some("invalid-request"),
        ),
        (
            "POST",
            with_body("POST", "/things", json, "{\"id\":\"d\"}"),
            201,
            None,
        ),
    ];
    for (method, request, status, problem) in &cases {
        conn.send(request).await;
        let answer = conn.answer(method).await;
        assert_eq!(answer.status, *status, "{request}: {answer:?}");
        if let Some(kind) = problem {
            answer.problem(*status, kind);
        }
        assert!(!answer.says_close(), "{request}: {answer:?}");
    }
    // The answer to an unparsable request too (a connection of its own).
    let mut conn = Conn::open(lockstep.proxy_addr()).await;
    conn.send("BLAH\r\n\r\n").await;
    conn.answer("GET").await.problem(400, "invalid-request");
}

#[tokio::test]
async fn host_is_required_once_and_a_bad_host_keeps_the_connection() {
    let (backend, _lockstep, mut conn) = connected().await;

    // RFC 9112 §3.2: 400 for an HTTP/1.1 request without Host and for two
    // Host lines. It is lockstep's answer, not the parser's: the request
    // was read whole, so (as of the hyper-based server) the connection is
    // kept and the next pipelined request is served.
    conn.send(format!(
        "GET /echo/nohost HTTP/1.1\r\n\r\n\
         GET /echo/twohosts HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n{}",
        get("/echo/fine")
    ))
    .await;
    let answers = conn.answers(&["GET", "GET", "GET"]).await;
    let doc = answers[0].problem(400, "invalid-request");
    assert!(doc["detail"].as_str().unwrap().contains("Host"), "{doc}");
    let doc = answers[1].problem(400, "invalid-request");
    assert!(doc["detail"].as_str().unwrap().contains("Host"), "{doc}");
    assert_echo(&answers[2], "GET", "/echo/fine", "");
    assert_kept_alive(&answers);
    assert!(backend_saw(&backend, "/echo/nohost").await.is_empty());
    assert!(backend_saw(&backend, "/echo/twohosts").await.is_empty());
}

#[tokio::test]
async fn method_case_header_case_and_whitespace() {
    let (_backend, _lockstep, mut conn) = connected().await;

    // Methods are case-sensitive (RFC 9110 §9.1). As of the hyper-based
    // server a lower-case `get` on a passthrough path goes to the backend
    // as the method `get`, and on a versioned path it is refused (a
    // backend reading it as GET would get around the version check).
    conn.send(format!(
        "get /echo/lower HTTP/1.1\r\nHost: a\r\n\r\nget /autos/1 HTTP/1.1\r\nHost: a\r\n\r\n{}",
        get("/echo/upper")
    ))
    .await;
    let answers = conn.answers(&["get", "get", "GET"]).await;
    assert_echo(&answers[0], "get", "/echo/lower", "");
    let doc = answers[1].problem(400, "invalid-request");
    assert!(doc["detail"].as_str().unwrap().contains("\"get\""), "{doc}");
    assert_echo(&answers[2], "GET", "/echo/upper", "");
    assert_kept_alive(&answers);

    // Header names in any case, values with spaces and tabs around them:
    // the backend gets the value without them (RFC 9112 §5.1).
    conn.send(
        "GET /echo/spaces HTTP/1.1\r\nhOsT: a\r\nX-MiXeD-CaSe:   padded value   \r\nX-Tab:\tv\t\r\n\r\n",
    )
    .await;
    let report = conn.answer("GET").await.echo();
    assert_eq!(
        report["headers"]["x-mixed-case"],
        json!(["padded value"]),
        "{report}"
    );
    assert_eq!(report["headers"]["x-tab"], json!(["v"]), "{report}");
    assert_eq!(report["headers"]["host"], json!(["a"]), "{report}");

    // An empty line before a request line is skipped (RFC 9112 §2.2
    // SHOULD), and, as of the hyper-based server, a bare LF is taken as a
    // line end (RFC 9112 §2.2 MAY).
    conn.send("\r\nGET /echo/crlf HTTP/1.1\r\nHost: a\r\n\r\nGET /echo/lf HTTP/1.1\nHost: a\n\n")
        .await;
    let answers = conn.answers(&["GET", "GET"]).await;
    assert_echo(&answers[0], "GET", "/echo/crlf", "");
    assert_echo(&answers[1], "GET", "/echo/lf", "");
    assert_kept_alive(&answers);
}

#[tokio::test]
async fn absolute_form_and_asterisk_form_targets() {
    let (backend, _lockstep, mut conn) = connected().await;

    // An absolute-form target names the host (RFC 9112 §3.2.2); `OPTIONS
    // *` is passed on (the fixture answers it 404, its own answer); `*`
    // with another method is lockstep's 400. The connection serves on.
    conn.send(format!(
        "GET http://t.example:81/echo/abs HTTP/1.1\r\nHost: other.example\r\n\r\n\
         OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n\
         PUT * HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{{}}{}",
        get("/echo/after")
    ))
    .await;
    let answers = conn.answers(&["GET", "OPTIONS", "PUT", "GET"]).await;
    let report = assert_echo(&answers[0], "GET", "/echo/abs", "");
    assert_eq!(
        report["headers"]["host"],
        json!(["t.example:81"]),
        "{report}"
    );
    assert_eq!(answers[1].status, 404, "{:?}", answers[1]);
    assert_eq!(answers[1].json(), json!({"error": "not found"}));
    answers[2].problem(400, "invalid-request");
    assert_echo(&answers[3], "GET", "/echo/after", "");
    assert_kept_alive(&answers);
    let options: Vec<Value> = backend
        .log()
        .await
        .into_iter()
        .filter(|e| e["method"] == "OPTIONS")
        .collect();
    assert_eq!(options.len(), 1, "{options:?}");
    assert_eq!(options[0]["path"], "*", "{options:?}");
}

#[tokio::test]
async fn a_transfer_coding_besides_one_chunked_is_refused_before_the_backend() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    // The HTTP layer takes the chunked coding off and would leave the rest
    // on a body the backend then gets without `Transfer-Encoding` (a
    // hop-by-hop header): refused, as a list not ending in chunked is.
    for (coding, path) in [
        ("gzip, chunked", "/echo/gzip"),
        ("chunked, chunked", "/echo/twice"),
        ("deflate\r\nTransfer-Encoding: chunked", "/echo/split"),
        ("gzip, chunked", "/autos/1"),
    ] {
        let mut conn = Conn::open(lockstep.proxy_addr()).await;
        conn.send(format!(
            "PUT {path} HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n\
             Transfer-Encoding: {coding}\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n"
        ))
        .await;
        let answer = conn.answer("PUT").await;
        let doc = answer.problem(400, "invalid-request");
        assert!(
            doc["detail"]
                .as_str()
                .unwrap()
                .contains("Transfer-Encoding"),
            "{coding}: {doc}"
        );
        assert!(backend_saw(&backend, path).await.is_empty(), "{coding}");
    }
    // One chunked coding alone is the ordinary case.
    let mut conn = Conn::open(lockstep.proxy_addr()).await;
    conn.send(
        "PUT /echo/plain HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )
    .await;
    let answer = conn.answer("PUT").await;
    assert_echo(&answer, "PUT", "/echo/plain", "abc");
}

#[tokio::test]
async fn a_request_whose_head_is_still_arriving_when_the_drain_begins_is_answered() {
    let backend = Backend::start();
    let mut lockstep = Lockstep::in_front_of(&backend);
    let addr = lockstep.proxy_addr();

    let mut idle = kept_alive_after_one_read(addr).await;
    // Half a head of each kind: one with a body (served by hyper once
    // handed over) and one without (served by lockstep's own loop).
    let mut with_body = Conn::open(addr).await;
    with_body
        .send("POST /echo/draining HTTP/1.1\r\nHost: a\r\nContent-Le")
        .await;
    let mut without = Conn::open(addr).await;
    without.send("GET /echo/draining-get HTTP/1.1\r\nHo").await;

    lockstep.terminate();
    // The drain has begun once the idle connection is closed.
    idle.closed().await;
    with_body.send("ngth: 5\r\n\r\nhello").await;
    without.send("st: a\r\n\r\n").await;
    let posted = with_body.answer("POST").await;
    assert_echo(&posted, "POST", "/echo/draining", "hello");
    assert!(posted.says_close(), "{posted:?}");
    with_body.closed().await;
    let got = without.answer("GET").await;
    assert_echo(&got, "GET", "/echo/draining-get", "");
    assert!(got.says_close(), "{got:?}");
    without.closed().await;
    let status = lockstep.wait_exit(STEP).await;
    assert_eq!(status.code(), Some(0), "exit status after the drain");
}

#[tokio::test]
async fn http2_begins_only_at_a_connections_first_byte() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    // RFC 9113 §3.4: the preface opens a connection; after an HTTP/1.1
    // request it is an HTTP/1.1 error, and the connection closes without
    // a single HTTP/2 frame.
    let mut conn = Conn::open(lockstep.proxy_addr()).await;
    conn.send(format!(
        "{}PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        get("/echo/first")
    ))
    .await;
    let first = conn.answer("GET").await;
    assert_echo(&first, "GET", "/echo/first", "");
    // Any byte now (an HTTP/2 SETTINGS frame) fails this.
    conn.closed().await;
}

#[tokio::test]
async fn a_backends_header_lines_reach_the_client_in_order_less_the_hop_by_hop_ones() {
    // Lines in the backend's case and order; among them every hop-by-hop
    // kind, one named by `Connection`, and a cookie on either side of them.
    let upstream = raw_backend_closing(
        b"HTTP/1.1 200 OK\r\n\
          Set-Cookie: a=1\r\n\
          X-Order: 1\r\n\
          Connection: X-Private\r\n\
          Set-Cookie: b=2\r\n\
          X-Private: secret\r\n\
          Keep-Alive: timeout=5\r\n\
          Proxy-Connection: keep-alive\r\n\
          Upgrade: h2c\r\n\
          Trailer: X-T\r\n\
          TE: trailers\r\n\
          Date: Mon, 07 Dec 2026 01:02:03 GMT\r\n\
          ETag: \"b\"\r\n\
          Content-Length: 5\r\n\
          \r\n\
          hello",
        false,
    )
    .await;
    let lockstep = Lockstep::builder()
        .upstream(format!("http://{upstream}"))
        .start();
    let kept = [
        ("set-cookie", "a=1"),
        ("x-order", "1"),
        ("set-cookie", "b=2"),
        ("date", "Mon, 07 Dec 2026 01:02:03 GMT"),
        ("etag", "\"b\""),
        ("content-length", "5"),
    ];
    let lines = |answer: &Answer| -> Vec<(String, String)> { answer.headers.clone() };
    let expected: Vec<(String, String)> = kept
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();

    // HTTP/1.1, a GET and a HEAD on one connection: the backend's order,
    // names in lower case, its own Date (and no second one), the length.
    let mut conn = Conn::open(lockstep.proxy_addr()).await;
    conn.send(format!(
        "{}HEAD /plain/2 HTTP/1.1\r\nHost: x\r\n\r\n",
        get("/plain/1")
    ))
    .await;
    let answers = conn.answers(&["GET", "HEAD"]).await;
    for answer in &answers {
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(lines(answer), expected, "{}", answer.head);
    }
    assert_eq!(answers[0].text(), "hello");
    assert_eq!(answers[1].framing, Framing::NoBody);
    assert_kept_alive(&answers);

    // HTTP/1.0, served by hyper from a header map: the same lines, those
    // of one name still in their order.
    let mut conn = Conn::open(lockstep.proxy_addr()).await;
    conn.send("GET /plain/3 HTTP/1.0\r\n\r\n").await;
    let answer = conn.answer("GET").await;
    let mut got = lines(&answer);
    let mut want = expected.clone();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(got, want, "{}", answer.head);
    assert_eq!(answer.text(), "hello");
}

/// A HEAD and a GET, pipelined on one connection to a lockstep in front of
/// a backend that answers every request with `answer`, and a HEAD in
/// HTTP/1.0 (hyper's server) on another: their answers.
async fn head_then_get(answer: &'static [u8]) -> Vec<Answer> {
    let upstream = raw_backend_closing(answer, false).await;
    let lockstep = Lockstep::builder()
        .upstream(format!("http://{upstream}"))
        .start();
    let mut conn = Conn::open(lockstep.proxy_addr()).await;
    conn.send(format!(
        "HEAD /plain/1 HTTP/1.1\r\nHost: x\r\n\r\n{}",
        get("/plain/2")
    ))
    .await;
    let mut answers = conn.answers(&["HEAD", "GET"]).await;
    let mut conn = Conn::open(lockstep.proxy_addr()).await;
    conn.send("HEAD /plain/3 HTTP/1.0\r\n\r\n").await;
    answers.push(conn.answer("HEAD").await);
    answers
}

#[tokio::test]
async fn a_head_answer_carries_one_valid_content_length() {
    // Two equal lines: one number, and the connection goes on (the GET
    // pipelined after the HEAD is answered).
    let answers =
        head_then_get(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2, 2\r\n\r\nok")
            .await;
    assert_eq!(answers[0].status, 200, "{answers:?}");
    assert_eq!(
        answers[0].all("content-length"),
        ["2"],
        "{}",
        answers[0].head
    );
    assert_eq!(answers[0].framing, Framing::NoBody);
    assert_eq!(answers[1].text(), "ok");
    assert_kept_alive(&answers[..2]);
    assert_eq!(answers[2].version, "HTTP/1.0", "{:?}", answers[2]);
    assert_eq!(answers[2].status, 200, "{:?}", answers[2]);
    assert_eq!(
        answers[2].all("content-length"),
        ["2"],
        "{}",
        answers[2].head
    );

    // Two different numbers: a 502 to a HEAD, as to a GET (RFC 9112 §6.3).
    let answers =
        head_then_get(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok").await;
    assert_eq!(answers[0].status, 502, "{answers:?}");
    answers[1].problem(502, "bad-gateway");
    assert_eq!(answers[2].status, 502, "{answers:?}");
}

/// An answer given before the request's body was read whole (here a 413
/// from the declared length, with most of the body still to come) says
/// that the connection closes, on both listeners, and then it closes: a
/// client must not send its next request on it.
#[tokio::test]
async fn an_answer_that_leaves_the_body_unread_says_the_connection_closes() {
    let backend = Backend::start();
    let lockstep = Lockstep::in_front_of(&backend);
    // Over the lock API's 16 KiB, and over the proxy's 1 MiB default.
    let cases = [
        (lockstep.admin_addr(), "PATCH /locks/big", 17 * 1024),
        (lockstep.proxy_addr(), "PUT /autos/big", 2 * 1024 * 1024),
    ];
    for (addr, request, length) in cases {
        let mut conn = Conn::open(addr).await;
        conn.send(format!(
            "{request} HTTP/1.1\r\nHost: lockstep.test\r\nContent-Type: application/json\r\n\
             Content-Length: {length}\r\n\r\n{}",
            " ".repeat(1000)
        ))
        .await;
        let answer = conn.answer("PATCH").await;
        assert_eq!(answer.status, 413, "{request}: {answer:?}");
        assert!(answer.says_close(), "{request}: {answer:?}");
        conn.closed().await;
    }
}

/// Everything the connection still delivers, read as fast as it comes
/// until the end (a close or a reset), at most `STEP` per read.
async fn rest_of(stream: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match tokio::time::timeout(STEP, stream.read(&mut buf)).await {
            Ok(Ok(0)) => return got,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Ok(Err(e)) if e.kind() == ErrorKind::ConnectionReset => return got,
            Ok(Err(e)) => panic!("reading: {e}"),
            Err(_) => panic!(
                "the connection stayed open {STEP:?} after {} bytes",
                got.len()
            ),
        }
    }
}

#[tokio::test]
async fn a_client_that_stops_reading_is_closed_and_a_slow_reader_is_not() {
    let backend = Backend::start();
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .server_toml("idle_timeout_ms = 1000")
        .start();
    let addr = lockstep.proxy_addr();
    // Far more than the socket buffers between lockstep and the client
    // hold: a client that reads nothing stalls lockstep's writes.
    const STALLED: usize = 256 << 20;
    // The slow reader's answer: several times what a full buffer holds, so
    // the reader's pauses stall lockstep's writes too.
    const SLOW: usize = 24 << 20;
    // The plain GET is lockstep's own loop's; `TE` hands it to hyper's.
    for (server, extra) in [("h1 loop", ""), ("hyper", "TE: trailers\r\n")] {
        let stalled = async {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let request = format!(
                "GET /bytes/{STALLED} HTTP/1.1\r\nHost: lockstep.test\r\n{extra}\
                 Connection: close\r\n\r\n"
            );
            stream.write_all(request.as_bytes()).await.unwrap();
            // Nothing read for longer than the timeout.
            tokio::time::sleep(Duration::from_millis(2500)).await;
            let got = rest_of(&mut stream).await;
            assert!(
                got.starts_with(b"HTTP/1.1 200"),
                "{server}: {:?}",
                &got[..got.len().min(200)]
            );
            assert!(
                got.len() < STALLED,
                "{server}: {} bytes arrived: the stalled answer was never cut",
                got.len()
            );
        };
        let slow = async {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let request = format!(
                "GET /bytes/{SLOW} HTTP/1.1\r\nHost: lockstep.test\r\n{extra}\
                 Connection: close\r\n\r\n"
            );
            stream.write_all(request.as_bytes()).await.unwrap();
            let started = Instant::now();
            let mut got = Vec::new();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                // A pause well within the timeout after each read: the
                // download as a whole takes several times the timeout.
                tokio::time::sleep(Duration::from_millis(150)).await;
                match tokio::time::timeout(STEP, stream.read(&mut buf)).await {
                    Ok(Ok(0)) => break,
                    Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
                    other => panic!("{server}: slow reader after {} bytes: {other:?}", got.len()),
                }
            }
            let head_end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            assert!(got.starts_with(b"HTTP/1.1 200"), "{server}");
            assert!(
                got.ends_with(b"0\r\n\r\n"),
                "{server}: the chunked answer was cut"
            );
            assert!(got.len() - head_end > SLOW, "{server}: {} bytes", got.len());
            assert!(
                started.elapsed() > Duration::from_millis(2000),
                "{server}: the download took only {:?}, not long enough to test anything",
                started.elapsed()
            );
        };
        tokio::join!(stalled, slow);
    }
    // lockstep serves on.
    let mut conn = Conn::open(addr).await;
    conn.send(get("/echo/after")).await;
    assert_echo(&conn.answer("GET").await, "GET", "/echo/after", "");
}
