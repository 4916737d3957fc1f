#!/usr/bin/env python3
"""Lock acquire+release pairs run directly against SQLite, no HTTP, no lockstep.

The baseline for the lock row of benches/run.sh: N client threads, each with
its own connection and its own resource, each repeating

    acquire  (INSERT ... ON CONFLICT (resource) DO UPDATE ... WHERE ... RETURNING)
    release  (UPDATE locks SET owner = NULL ... WHERE ... RETURNING)

for a fixed time. The statements are read from lockstep's own source
(src/store/statements/locks.rs, with the SQLite clock expression from
src/store/sqlite.rs) so the baseline runs exactly the SQL lockstep runs; the
schema is lockstep's SQLite migration. Connection settings match lockstep's:
WAL journal, synchronous = FULL, busy_timeout = 5000 ms, foreign_keys on,
autocommit (each statement its own transaction, as sqlx runs them).

Caveats, printed with the result: CPython's GIL serialises the Python side of
the 32 clients (the sqlite3 module releases it while SQLite works, fsync
included, so the waits overlap), and this uses the system libsqlite3, which
may be an older version than the one bundled into lockstep.

Prints one line: `SQLITE key=value ...` for run.sh to parse.
"""

import argparse
import os
import re
import sqlite3
import sys
import threading
import time


RUST_STR = r'"((?:[^"\\]|\\.)*)"'


def rust_unescape(s: str) -> str:
    """The few Rust string-literal escapes the SQL uses."""
    s = re.sub(r"\\\n\s*", "", s)  # line continuation eats leading whitespace
    return s.replace('\\"', '"').replace("\\\\", "\\")


def extract(locks_rs: str, sqlite_rs: str):
    """Returns (acquire, release) as lockstep builds them for SQLite."""
    with open(locks_rs, encoding="utf-8") as f:
        src = f.read()
    with open(sqlite_rs, encoding="utf-8") as f:
        dialect = f.read()

    def one(pattern, text, what):
        m = re.search(pattern, text, re.S)
        if not m:
            raise ValueError(f"could not find {what}")
        return rust_unescape(m.group(1))

    now = one(r"now_ms:\s*" + RUST_STR, dialect, "now_ms in sqlite.rs")
    columns = one(r"const COLUMNS: &str = " + RUST_STR, src, "COLUMNS")
    own_live = one(r"let own_live = format!\(\s*" + RUST_STR, src, "own_live")
    # `name: Stmt::new("op", format!("…"))` (or a bare `format!`).
    stmt = r"\b{}: (?:Stmt::new\(\s*\"\w+\",\s*)?format!\(\s*"
    acquire = one(stmt.format("acquire") + RUST_STR, src, "acquire")
    release = one(stmt.format("release") + RUST_STR, src, "release")
    return build(now, columns, own_live, acquire, release)


def build(now, columns, own_live, acquire, release):
    own_live = own_live.replace("{now}", now)

    def fill(sql):
        sql = sql.replace("{own_live}", own_live).replace("{COLUMNS}", columns)
        sql = sql.replace("{now}", now)
        # Row-lock clauses are PostgreSQL's; SQLite's dialect leaves them empty.
        sql = sql.replace("{for_share}", "")
        if "{" in sql or "}" in sql:
            raise ValueError(f"unfilled placeholder in: {sql}")
        # sqlx binds $N by position; ?N is SQLite's spelling of the same.
        return re.sub(r"\$(\d+)", r"?\1", sql)

    return fill(acquire), fill(release)


def connect(path):
    # isolation_level=None: autocommit, every statement its own transaction.
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 5000")
    conn.execute("PRAGMA journal_mode = WAL").fetchall()
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def percentile(sorted_values, p):
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, int(round(p / 100.0 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--schema", required=True,
                    help="lockstep's SQLite migrations: a directory (every *.sql, in order) or one file")
    ap.add_argument("--locks-rs", required=True)
    ap.add_argument("--sqlite-rs", required=True)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--ttl-ms", type=int, default=30000)
    ap.add_argument("--print-sql", action="store_true")
    args = ap.parse_args()

    # No fallback copy: a copy kept here went stale as the source changed,
    # and a row that measures other statements than lockstep's is worse
    # than no row.
    try:
        acquire, release = extract(args.locks_rs, args.sqlite_rs)
    except (OSError, ValueError) as e:
        sys.exit(f"sqlite_locks.py: cannot read lockstep's statements: {e}")
    source = "extracted"
    if args.print_sql:
        print(f"-- acquire\n{acquire};\n-- release\n{release};", file=sys.stderr)

    setup = connect(args.db)
    if os.path.isdir(args.schema):
        scripts = sorted(os.path.join(args.schema, n) for n in os.listdir(args.schema)
                         if n.endswith(".sql"))
    else:
        scripts = [args.schema]
    for path in scripts:
        with open(path, encoding="utf-8") as f:
            setup.executescript(f.read())
    setup.close()
    # As many parameters as the statement binds: resource, owner, TTL, and
    # (once locks carry one) an empty label, which the SQL turns into NULL.
    acquire_params = max(int(n) for n in re.findall(r"\?(\d+)", acquire))

    phase = {"measuring": False, "stop": False}
    lock = threading.Lock()
    totals = {"pairs": 0, "acquire_refused": 0, "release_missed": 0, "errors": 0}
    error_kinds = {}
    latencies = []  # per statement, seconds, measuring phase only
    start_barrier = threading.Barrier(args.clients + 1)

    def client(i):
        try:
            conn = connect(args.db)
        except sqlite3.Error as e:
            print(f"sqlite_locks.py: client {i} could not connect: {e}", file=sys.stderr)
            start_barrier.abort()
            return
        resource, owner = f"bench:{i}", f"w{i}"
        pairs = refused = missed = errors = 0
        lat = []
        kinds = {}
        try:
            start_barrier.wait()
        except threading.BrokenBarrierError:
            return
        while not phase["stop"]:
            measuring = phase["measuring"]
            try:
                t0 = time.perf_counter()
                params = (resource, owner, args.ttl_ms, "")[:acquire_params]
                got = conn.execute(acquire, params).fetchall()
                t1 = time.perf_counter()
                if not got:
                    refused += measuring
                    continue
                gone = conn.execute(release, (resource, owner)).fetchall()
                t2 = time.perf_counter()
            except sqlite3.Error as e:
                if measuring:
                    errors += 1
                    n, waited = kinds.get(str(e), (0, 0.0))
                    kinds[str(e)] = (n + 1, waited + time.perf_counter() - t0)
                continue
            if not measuring:
                continue
            lat.append(t1 - t0)
            lat.append(t2 - t1)
            if gone:
                pairs += 1
            else:
                missed += 1
        conn.close()
        with lock:
            totals["pairs"] += pairs
            totals["acquire_refused"] += refused
            totals["release_missed"] += missed
            totals["errors"] += errors
            latencies.extend(lat)
            for k, (n, waited) in kinds.items():
                n0, waited0 = error_kinds.get(k, (0, 0.0))
                error_kinds[k] = (n0 + n, waited0 + waited)

    threads = [threading.Thread(target=client, args=(i,), daemon=True)
               for i in range(1, args.clients + 1)]
    for t in threads:
        t.start()
    try:
        start_barrier.wait(timeout=60)
    except threading.BrokenBarrierError:
        phase["stop"] = True
        sys.exit("sqlite_locks.py: the clients did not all start")
    time.sleep(args.warmup)
    # Counting starts at the flip; a pair in flight at the flip is not
    # counted, one in flight at the stop is counted: the two edges cancel.
    phase["measuring"] = True
    began = time.perf_counter()
    cpu_began = time.process_time()  # the whole process: SQLite's work included
    time.sleep(args.duration)
    phase["stop"] = True
    elapsed = time.perf_counter() - began
    cpu = time.process_time() - cpu_began
    for t in threads:
        t.join(timeout=30)

    latencies.sort()
    fields = {
        "pairs_per_s": f"{totals['pairs'] / elapsed:.1f}",
        "pairs": totals["pairs"],
        "seconds": f"{elapsed:.2f}",
        "p99_ms": f"{percentile(latencies, 99) * 1000:.3f}",
        "cpu_us_per_pair": f"{cpu * 1e6 / totals['pairs']:.0f}" if totals["pairs"] else "n/a",
        "acquire_refused": totals["acquire_refused"],
        "release_missed": totals["release_missed"],
        "errors": totals["errors"],
        "clients": args.clients,
        "statements": source,
        "sqlite_version": sqlite3.sqlite_version,
    }
    print("SQLITE " + " ".join(f"{k}={v}" for k, v in fields.items()))
    # e.g. "3 × database is locked (after 5.0 s on average)": SQLITE_BUSY once
    # busy_timeout ran out.
    for k, (n, waited) in sorted(error_kinds.items(), key=lambda kv: -kv[1][0]):
        print(f"sqlite_locks.py: {n} × {k} (after {waited / n:.1f} s on average)", file=sys.stderr)


if __name__ == "__main__":
    main()
