//! A lean load generator for the lock benchmark: acquire + release pairs,
//! from one thread, on lockstep's lock API or on Redis.
//!
//! Why not only wrk: to alternate `POST` and `DELETE` on one connection,
//! `benches/lock_pairs.lua` needs a wrk thread per connection, and 32 such
//! threads cost about as much CPU as lockstep itself on the 2 CPUs the
//! benchmark shares between server and client. redis-benchmark, the peer's
//! client, drives its 32 connections from one thread. This client does the
//! same for HTTP (one thread, one event loop, a connection per client), so
//! the lock rows compare servers, not load generators.
//!
//! Why it speaks Redis too: a lock user acquires, does its work, then
//! releases, so a pair is two round trips on lockstep and on Redis alike.
//! redis-benchmark can only repeat one command, so to measure Redis as a
//! lock is used it would have to do both halves in one `EVAL`, one round
//! trip per pair, which no lock user can. With `--protocol redis` the same
//! client, with the same connections and pacing, runs the usual Redis lock
//! recipe instead (`SET key owner NX PX ttl`, then the owner-checked delete
//! as a script, by `EVALSHA` as client libraries send it).
//!
//!     lock_load --addr 127.0.0.1:9090 --clients 32 --seconds 8 --run NAME [--ttl-ms 30000]
//!               [--protocol http|redis|patch]
//!
//! Client `i` alternates, on its own connection and its own resource,
//!     POST   /locks/bench:NAME:i   {"owner":"wi","ttl_ms":TTL}  -> 200
//!     DELETE /locks/bench:NAME:i   Lock-Owner: wi               -> 204
//! or, on Redis,
//!     SET bench:NAME:i wi NX PX TTL                             -> +OK  (counted as 200)
//!     EVALSHA <release> 1 bench:NAME:i wi                       -> :1   (counted as 204)
//! (a refused acquire, nil, counts as 409; a release that found another
//! owner, :0, as 404), and the run ends with one line:
//!     LOCKS pairs=N post_ok=N post_bad=N del_ok=N del_bad=N statuses=409:3 seconds=S p99_ms=X
//! p99 is over single requests (round trips), as wrk reports it.
//!
//! `--protocol patch` drives the benchmark's write rows the same way, for
//! the same reason (one wrk thread per connection, which a per-connection
//! `If-Match` needed, cost the lockstep row twice the client CPU per
//! request of the nginx row on the 2 shared CPUs). Client `i` sends, one
//! after another on its own connection,
//!     PATCH /items/i   {"title":"bench"}   If-Match: <the last answer's ETag>
//! (no `If-Match` on its first request, nor after an answer without an
//! `ETag`, as from a plain nginx proxy), and the run ends with one line:
//!     PATCHES ok=N bad=N statuses=409:3 seconds=S p99_ms=X

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Args {
    addr: String,
    clients: usize,
    seconds: f64,
    run: String,
    ttl_ms: u64,
    protocol: Protocol,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http,
    Redis,
    Patch,
}

/// The owner-checked release of the Redis lock recipe: delete the key only
/// while it still holds the caller's owner.
const REDIS_RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

fn args() -> Result<Args, String> {
    let mut a = Args {
        addr: "127.0.0.1:9090".into(),
        clients: 32,
        seconds: 8.0,
        run: "run".into(),
        ttl_ms: 30_000,
        protocol: Protocol::Http,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--addr" => a.addr = value,
            "--clients" => a.clients = value.parse().map_err(|e| bad(&e))?,
            "--seconds" => a.seconds = value.parse().map_err(|e| bad(&e))?,
            "--run" => a.run = value,
            "--ttl-ms" => a.ttl_ms = value.parse().map_err(|e| bad(&e))?,
            "--protocol" => {
                a.protocol = match value.as_str() {
                    "http" => Protocol::Http,
                    "redis" => Protocol::Redis,
                    "patch" => Protocol::Patch,
                    _ => return Err(bad(&"expected http, redis or patch")),
                }
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.clients == 0 || a.seconds.is_nan() || a.seconds <= 0.0 {
        return Err("--clients and --seconds must be positive".into());
    }
    Ok(a)
}

#[derive(Default)]
struct Tally {
    pairs: u64,
    post_ok: u64,
    post_bad: u64,
    del_ok: u64,
    del_bad: u64,
    statuses: BTreeMap<u16, u64>,
    /// Microseconds per request.
    latencies: Vec<u32>,
}

/// One HTTP/1.1 exchange on a keep-alive connection: writes `request`,
/// reads one response (status line, headers, a `Content-Length` body) and
/// returns its status and its `ETag`. `buf` carries bytes read past the
/// response.
async fn exchange(
    conn: &mut TcpStream,
    request: &[u8],
    buf: &mut Vec<u8>,
) -> std::io::Result<(u16, Option<String>)> {
    conn.write_all(request).await?;
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        read_more(conn, buf).await?;
    };
    let head = std::str::from_utf8(&buf[..head_end]).map_err(std::io::Error::other)?;
    let status: u16 = head
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line in {head:?}")))?;
    let header = |wanted: &str| {
        head.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(name, _)| name.eq_ignore_ascii_case(wanted))
            .map(|(_, v)| v.trim())
    };
    let length: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let etag = header("etag").map(str::to_owned);
    while buf.len() < head_end + length {
        read_more(conn, buf).await?;
    }
    buf.drain(..head_end + length);
    Ok((status, etag))
}

async fn read_more(conn: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let mut chunk = [0u8; 4096];
    let n = conn.read(&mut chunk).await?;
    if n == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

/// A Redis command in RESP: an array of bulk strings.
fn resp(parts: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", parts.len()).into_bytes();
    for p in parts {
        out.extend_from_slice(format!("${}\r\n{p}\r\n", p.len()).as_bytes());
    }
    out
}

/// One Redis reply, as far as this client needs it.
#[derive(Debug, PartialEq)]
enum Reply {
    Simple(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
}

/// One Redis exchange: writes `request`, reads one reply (an error reply
/// ends the run: it means the set-up is wrong, not that a lock was held).
async fn redis_exchange(
    conn: &mut TcpStream,
    request: &[u8],
    buf: &mut Vec<u8>,
) -> std::io::Result<Reply> {
    conn.write_all(request).await?;
    let line_end = loop {
        if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
            break i;
        }
        read_more(conn, buf).await?;
    };
    let line = std::str::from_utf8(&buf[1..line_end])
        .map_err(std::io::Error::other)?
        .to_owned();
    let number = || {
        line.parse::<i64>()
            .map_err(|_| std::io::Error::other(format!("bad Redis reply line {line:?}")))
    };
    let (reply, used) = match buf.first() {
        Some(b'+') => (Reply::Simple(line.clone()), line_end + 2),
        Some(b':') => (Reply::Int(number()?), line_end + 2),
        Some(b'$') => match usize::try_from(number()?) {
            Err(_) => (Reply::Nil, line_end + 2),
            Ok(len) => {
                let end = line_end + 2 + len + 2;
                while buf.len() < end {
                    read_more(conn, buf).await?;
                }
                (Reply::Bulk(buf[line_end + 2..end - 2].to_vec()), end)
            }
        },
        Some(b'-') => {
            return Err(std::io::Error::other(format!(
                "Redis answered an error: {line}"
            )))
        }
        _ => {
            return Err(std::io::Error::other(format!(
                "unexpected Redis reply {line:?}"
            )))
        }
    };
    buf.drain(..used);
    Ok(reply)
}

/// The two requests of a pair, in the protocol the run speaks.
enum Pair {
    Http { acquire: Vec<u8>, release: Vec<u8> },
    Redis { acquire: Vec<u8>, release: Vec<u8> },
}

impl Pair {
    /// Connects, and (Redis) loads the release script on that connection.
    async fn open(a: &Args, id: usize) -> std::io::Result<(Self, TcpStream, Vec<u8>)> {
        let resource = format!("bench:{}:{id}", a.run);
        let owner = format!("w{id}");
        let mut conn = TcpStream::connect(&a.addr).await?;
        conn.set_nodelay(true)?;
        let mut buf = Vec::with_capacity(8192);
        let pair = match a.protocol {
            Protocol::Http => {
                let body = format!("{{\"owner\":\"{owner}\",\"ttl_ms\":{}}}", a.ttl_ms);
                let acquire = format!(
                    "POST /locks/{resource} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    a.addr,
                    body.len()
                );
                let release = format!(
                    "DELETE /locks/{resource} HTTP/1.1\r\nHost: {}\r\nLock-Owner: {owner}\r\n\r\n",
                    a.addr
                );
                Pair::Http {
                    acquire: acquire.into_bytes(),
                    release: release.into_bytes(),
                }
            }
            Protocol::Patch => {
                return Err(std::io::Error::other("a PATCH client has no pair"));
            }
            Protocol::Redis => {
                let load = resp(&["SCRIPT", "LOAD", REDIS_RELEASE]);
                let sha = match redis_exchange(&mut conn, &load, &mut buf).await? {
                    Reply::Bulk(sha) => String::from_utf8(sha).map_err(std::io::Error::other)?,
                    other => {
                        return Err(std::io::Error::other(format!(
                            "SCRIPT LOAD answered {other:?}"
                        )))
                    }
                };
                let ttl = a.ttl_ms.to_string();
                Pair::Redis {
                    acquire: resp(&["SET", &resource, &owner, "NX", "PX", &ttl]),
                    release: resp(&["EVALSHA", &sha, "1", &resource, &owner]),
                }
            }
        };
        Ok((pair, conn, buf))
    }

    /// One round trip of the pair; its outcome as the HTTP status it
    /// stands for.
    async fn run(
        &self,
        release: bool,
        conn: &mut TcpStream,
        buf: &mut Vec<u8>,
    ) -> std::io::Result<u16> {
        match self {
            Pair::Http {
                acquire,
                release: r,
            } => Ok(exchange(conn, if release { r } else { acquire }, buf)
                .await?
                .0),
            Pair::Redis {
                acquire,
                release: r,
            } if !release => Ok(match redis_exchange(conn, acquire, buf).await? {
                Reply::Simple(ok) if ok == "OK" => 200,
                Reply::Nil => 409,
                other => return Err(std::io::Error::other(format!("SET NX answered {other:?}"))),
            }),
            Pair::Redis { release: r, .. } => Ok(match redis_exchange(conn, r, buf).await? {
                Reply::Int(1) => 204,
                Reply::Int(0) => 404,
                other => {
                    return Err(std::io::Error::other(format!(
                        "the release answered {other:?}"
                    )))
                }
            }),
        }
    }
}

/// One PATCH client: its own item, each write checked against the ETag of
/// the last answer (`ok` and `bad` counted as `post_ok`, `post_bad`).
async fn patch_client(a: std::rc::Rc<Args>, id: usize, until: Instant) -> std::io::Result<Tally> {
    const BODY: &str = r#"{"title":"bench"}"#;
    let mut conn = TcpStream::connect(&a.addr).await?;
    conn.set_nodelay(true)?;
    let mut buf = Vec::with_capacity(8192);
    let mut t = Tally::default();
    let mut etag: Option<String> = None;
    while Instant::now() < until {
        let if_match = etag
            .as_deref()
            .map(|e| format!("If-Match: {e}\r\n"))
            .unwrap_or_default();
        let request = format!(
            "PATCH /items/{id} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n{if_match}\r\n{BODY}",
            a.addr,
            BODY.len()
        );
        let start = Instant::now();
        let (status, tag) = exchange(&mut conn, request.as_bytes(), &mut buf).await?;
        t.latencies.push(start.elapsed().as_micros() as u32);
        etag = tag;
        if status == 200 {
            t.post_ok += 1;
        } else {
            t.post_bad += 1;
            *t.statuses.entry(status).or_default() += 1;
        }
    }
    Ok(t)
}

async fn client(a: std::rc::Rc<Args>, id: usize, until: Instant) -> std::io::Result<Tally> {
    if a.protocol == Protocol::Patch {
        return patch_client(a, id, until).await;
    }
    let (pair, mut conn, mut buf) = Pair::open(&a, id).await?;
    let mut t = Tally::default();
    while Instant::now() < until {
        let start = Instant::now();
        let status = pair.run(false, &mut conn, &mut buf).await?;
        t.latencies.push(start.elapsed().as_micros() as u32);
        let acquired = status == 200;
        if acquired {
            t.post_ok += 1;
        } else {
            t.post_bad += 1;
            *t.statuses.entry(status).or_default() += 1;
        }
        let start = Instant::now();
        let status = pair.run(true, &mut conn, &mut buf).await?;
        t.latencies.push(start.elapsed().as_micros() as u32);
        if status == 204 {
            t.del_ok += 1;
            t.pairs += u64::from(acquired);
        } else {
            t.del_bad += 1;
            *t.statuses.entry(status).or_default() += 1;
        }
    }
    Ok(t)
}

fn main() -> std::process::ExitCode {
    let a = match args() {
        Ok(a) => std::rc::Rc::new(a),
        Err(e) => {
            eprintln!("lock_load: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lock_load: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let local = tokio::task::LocalSet::new();
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(a.seconds);
    let results = local.block_on(&runtime, async {
        let tasks: Vec<_> = (1..=a.clients)
            .map(|id| tokio::task::spawn_local(client(a.clone(), id, until)))
            .collect();
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(t.await);
        }
        out
    });
    let seconds = started.elapsed().as_secs_f64();
    let mut all = Tally::default();
    for r in results {
        let t = match r {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                eprintln!("lock_load: a client failed: {e}");
                return std::process::ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("lock_load: a client panicked: {e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        all.pairs += t.pairs;
        all.post_ok += t.post_ok;
        all.post_bad += t.post_bad;
        all.del_ok += t.del_ok;
        all.del_bad += t.del_bad;
        for (s, n) in t.statuses {
            *all.statuses.entry(s).or_default() += n;
        }
        all.latencies.extend(t.latencies);
    }
    all.latencies.sort_unstable();
    let p99 = match all.latencies.len() {
        0 => 0.0,
        n => f64::from(all.latencies[(n * 99).div_ceil(100) - 1]) / 1000.0,
    };
    let statuses = if all.statuses.is_empty() {
        "none".to_string()
    } else {
        all.statuses
            .iter()
            .map(|(s, n)| format!("{s}:{n}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    if a.protocol == Protocol::Patch {
        println!(
            "PATCHES ok={} bad={} statuses={statuses} seconds={seconds:.2} p99_ms={p99:.3}",
            all.post_ok, all.post_bad
        );
    } else {
        println!(
            "LOCKS pairs={} post_ok={} post_bad={} del_ok={} del_bad={} statuses={statuses} seconds={seconds:.2} p99_ms={p99:.3}",
            all.pairs, all.post_ok, all.post_bad, all.del_ok, all.del_bad
        );
    }
    std::process::ExitCode::SUCCESS
}
