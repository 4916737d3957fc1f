//! A lean load generator for the lock benchmark: acquire + release pairs on
//! lockstep's lock API, from one thread.
//!
//! Why not only wrk: to alternate `POST` and `DELETE` on one connection,
//! `benches/lock_pairs.lua` needs a wrk thread per connection, and 32 such
//! threads cost about as much CPU as lockstep itself on the 2 CPUs the
//! benchmark shares between server and client. redis-benchmark, the peer's
//! client, drives its 32 connections from one thread. This client does the
//! same for HTTP (one thread, one event loop, a connection per client), so
//! the lock rows compare servers, not load generators.
//!
//!     lock_load --addr 127.0.0.1:9090 --clients 32 --seconds 8 --run NAME [--ttl-ms 30000]
//!
//! Client `i` alternates, on its own connection and its own resource,
//!     POST   /locks/bench:NAME:i   {"owner":"wi","ttl_ms":TTL}  -> 200
//!     DELETE /locks/bench:NAME:i   Lock-Owner: wi               -> 204
//! and the run ends with one line in the format `lock_pairs.lua` prints:
//!     LOCKS pairs=N post_ok=N post_bad=N del_ok=N del_bad=N statuses=409:3 seconds=S p99_ms=X
//! p99 is over single requests, as wrk reports it.

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
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        addr: "127.0.0.1:9090".into(),
        clients: 32,
        seconds: 8.0,
        run: "run".into(),
        ttl_ms: 30_000,
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
/// returns its status. `buf` carries bytes read past the response.
async fn exchange(conn: &mut TcpStream, request: &[u8], buf: &mut Vec<u8>) -> std::io::Result<u16> {
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
    let length: usize = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        read_more(conn, buf).await?;
    }
    buf.drain(..head_end + length);
    Ok(status)
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

async fn client(a: std::rc::Rc<Args>, id: usize, until: Instant) -> std::io::Result<Tally> {
    let resource = format!("bench:{}:{id}", a.run);
    let owner = format!("w{id}");
    let body = format!("{{\"owner\":\"{owner}\",\"ttl_ms\":{}}}", a.ttl_ms);
    let acquire = format!(
        "POST /locks/{resource} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        a.addr,
        body.len()
    )
    .into_bytes();
    let release = format!(
        "DELETE /locks/{resource} HTTP/1.1\r\nHost: {}\r\nLock-Owner: {owner}\r\n\r\n",
        a.addr
    )
    .into_bytes();
    let mut conn = TcpStream::connect(&a.addr).await?;
    conn.set_nodelay(true)?;
    let mut buf = Vec::with_capacity(8192);
    let mut t = Tally::default();
    while Instant::now() < until {
        let start = Instant::now();
        let status = exchange(&mut conn, &acquire, &mut buf).await?;
        t.latencies.push(start.elapsed().as_micros() as u32);
        let acquired = status == 200;
        if acquired {
            t.post_ok += 1;
        } else {
            t.post_bad += 1;
            *t.statuses.entry(status).or_default() += 1;
        }
        let start = Instant::now();
        let status = exchange(&mut conn, &release, &mut buf).await?;
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
    println!(
        "LOCKS pairs={} post_ok={} post_bad={} del_ok={} del_bad={} statuses={statuses} seconds={seconds:.2} p99_ms={p99:.3}",
        all.pairs, all.post_ok, all.post_bad, all.del_ok, all.del_bad
    );
    std::process::ExitCode::SUCCESS
}
