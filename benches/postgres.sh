#!/usr/bin/env bash
# lockstep on PostgreSQL beside pgbench running the same statements directly,
# at 32 concurrent clients, on 127.0.0.1 only. Prints a Markdown report (also
# written to benches/results/postgres-latest.md).
#
#   benches/postgres.sh
#
# Rows:
#   1 lockstep lock API        benches/lock_load.rs: POST + DELETE /locks/{r}
#   2 pgbench lock SQL         lockstep's acquire + release statements (src/store/statements/locks.rs)
#   3 lockstep versioned PATCH wrk + benches/patch_items.lua: PATCH /items/<thread>, no precondition
#   4 pgbench version SQL      claim_existing + commit (src/store/statements/versions.rs)
#
# A throwaway PostgreSQL cluster is started in a temp dir on a free port with
# the durability defaults (fsync, synchronous_commit, full_page_writes all on),
# so lockstep and pgbench pay the same commit cost.
#
# Environment:
#   BENCH_DURATION=8        seconds per measured run (1..10)
#   BENCH_WARMUP=2          seconds of warm-up before each measured run (0..10)
#   BENCH_CLIENTS=32        concurrent clients for every row (1..100)
#   BENCH_SKIP_BUILD=1      use the existing target/release/lockstep
#   BENCH_SKIP_INSTALL=1    never call apt-get
#   BENCH_KEEP_TMP=1        keep the temp dir (configs, logs, pgbench scripts, raw output)
#   BENCH_OUT=FILE          where to write the report (default benches/results/postgres-latest.md)
#
# Needs: PostgreSQL server + pgbench + psql, nginx, wrk, curl, python3, cargo.

set -euo pipefail

LOG_TAG=pg-bench
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)

DURATION=${BENCH_DURATION:-8}
WARMUP=${BENCH_WARMUP:-2}
CLIENTS=${BENCH_CLIENTS:-32}
OUT=${BENCH_OUT:-$HERE/results/postgres-latest.md}
export LOCK_TTL_MS=30000 # lock_load --ttl-ms
WRITE_LEASE_MS=20000     # lockstep's default versioning.write_lease_ms

for v in DURATION WARMUP CLIENTS; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "BENCH_$v must be a whole number, got '${!v}'"
done
((DURATION >= 1 && DURATION <= 10)) || die "BENCH_DURATION must lie in 1..10 seconds (got $DURATION)"
((WARMUP <= 10)) || die "BENCH_WARMUP must lie in 0..10 seconds (got $WARMUP)"
((CLIENTS >= 1 && CLIENTS <= 100)) || die "BENCH_CLIENTS must lie in 1..100"

# ---------------------------------------------------------------- tools ----

find_pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

install_missing() {
    local pkgs=()
    command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || pkgs+=(NGINX)
    command -v wrk >/dev/null || pkgs+=(wrk)
    command -v curl >/dev/null || pkgs+=(curl)
    command -v python3 >/dev/null || pkgs+=(python3)
    [[ -n $(find_pg_bin) && -x $(find_pg_bin)/initdb ]] || pkgs+=(postgresql)
    { command -v psql && command -v pgbench; } >/dev/null || pkgs+=(postgresql-client)
    install_pkgs ${pkgs[@]+"${pkgs[@]}"}
}

install_missing
export PATH="$PATH:/usr/sbin:/sbin" # nginx lives in /usr/sbin
PG_BIN=$(find_pg_bin)
[[ -n $PG_BIN && -x $PG_BIN/initdb ]] || die "no PostgreSQL server binaries under /usr/lib/postgresql"
PGBENCH=$PG_BIN/pgbench
[[ -x $PGBENCH ]] || PGBENCH=$(command -v pgbench) || die "no pgbench"
PSQL=$PG_BIN/psql
[[ -x $PSQL ]] || PSQL=$(command -v psql) || die "no psql"

build_lockstep

# ------------------------------------------------------ temp dir, cleanup ----

PG_STARTED=0
make_tmp lockstep-pgbench

# initdb and postgres refuse to run as root.
run_pg() {
    if ((EUID == 0)); then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

# cleanup_hook: run by cleanup (common.sh) once the servers are stopped
cleanup_hook() {
    if ((PG_STARTED)); then
        run_pg "$PG_BIN/pg_ctl" -D "$TMP/pg/data" -m fast -w stop >/dev/null 2>&1 ||
            run_pg "$PG_BIN/pg_ctl" -D "$TMP/pg/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
}

read -r P_PG P_BACKEND P_LOCKSTEP P_ADMIN < <(free_ports 4)

# ------------------------------------------------------------ PostgreSQL ----

mkdir -p "$TMP/pg"
((EUID == 0)) && chown postgres "$TMP/pg"
log "initdb + pg_ctl start on 127.0.0.1:$P_PG (durability defaults)"
run_pg "$PG_BIN/initdb" -D "$TMP/pg/data" -U postgres --auth=trust -E UTF8 >"$TMP/initdb.log" 2>&1 ||
    {
        tail -20 "$TMP/initdb.log" >&2
        die "initdb failed"
    }
PG_STARTED=1
run_pg "$PG_BIN/pg_ctl" -D "$TMP/pg/data" -l "$TMP/pg/log" -w -o \
    "-p $P_PG -k $TMP/pg -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null ||
    {
        tail -20 "$TMP/pg/log" >&2 || true
        die "PostgreSQL did not start"
    }
psql_db() { # psql_db DB [psql args...]
    local db=$1
    shift
    "$PSQL" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$P_PG" -U postgres -d "$db" "$@"
}
psql_db postgres -c 'CREATE DATABASE bench' -c 'CREATE DATABASE direct'
PG_VERSION=$(psql_db postgres -At -c 'SHOW server_version')
PG_DURABILITY=$(psql_db postgres -At -c "SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings
    WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes', 'wal_sync_method')")
# pgbench gets its own database with lockstep's schema, triggers included
# (applied from the same migration files lockstep embeds).
for f in "$ROOT"/migrations/postgres/*.sql; do
    psql_db direct -f "$f" >/dev/null || die "applying $f to the direct database failed"
done

# ---------------------------------------------------- nginx + lockstep ----

mkdir -p "$TMP/nginx-backend/tmp"
cat >"$TMP/nginx-backend/nginx.conf" <<EOF
worker_processes auto;
daemon off;
pid $TMP/nginx-backend/nginx.pid;
error_log $TMP/nginx-backend/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $TMP/nginx-backend/tmp/body;
    proxy_temp_path $TMP/nginx-backend/tmp/proxy;
    fastcgi_temp_path $TMP/nginx-backend/tmp/fastcgi;
    uwsgi_temp_path $TMP/nginx-backend/tmp/uwsgi;
    scgi_temp_path $TMP/nginx-backend/tmp/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 60s;
    server {
        listen 127.0.0.1:$P_BACKEND;
        default_type application/json;
        location / { return 200 '{"id":"1","title":"hello"}'; }
    }
}
EOF
nginx -t -q -e "$TMP/nginx-backend/error.log" -p "$TMP/nginx-backend" -c "$TMP/nginx-backend/nginx.conf" \
    2>"$TMP/nginx-backend.check" || {
    cat "$TMP/nginx-backend.check" >&2
    die "nginx-backend: bad config"
}
log "starting nginx backend on :$P_BACKEND"
start nginx-backend nginx -e "$TMP/nginx-backend/error.log" -p "$TMP/nginx-backend" -c "$TMP/nginx-backend/nginx.conf"
wait_http nginx-backend "$LAST_PID" "http://127.0.0.1:$P_BACKEND/"

lockstep_items_conf "postgres://postgres@127.0.0.1:$P_PG/bench" >"$TMP/lockstep.toml"

log "starting lockstep on :$P_LOCKSTEP (admin :$P_ADMIN), database postgres://…:$P_PG/bench"
start_lockstep
# The pool size lockstep uses: [database] max_connections of the shipped config (its default).
DB_MAX_CONN=$(awk '/^\[/ {sec = $0} sec == "[database]" && $1 == "max_connections" {print $3; exit}' \
    "$ROOT/config/lockstep.toml" 2>/dev/null || true)
[[ -n $(psql_db bench -At -c "SELECT 1 FROM pg_tables WHERE tablename = 'versions'") ]] ||
    die "lockstep did not migrate the bench database"

# ---------------------------------------------------------- sanity checks ----

check_lock_api
for want in 2 3; do
    body=$(curl -s -D "$TMP/check-patch.headers" --max-time 5 -X PATCH -H 'Content-Type: application/json' \
        -d '{"title":"sanity"}' "http://127.0.0.1:$P_LOCKSTEP/items/sanity")
    code=$(awk 'NR==1 {print $2}' "$TMP/check-patch.headers")
    etag=$(awk 'tolower($1)=="etag:" {sub(/\r$/, "", $2); print $2}' "$TMP/check-patch.headers")
    [[ $code == 200 ]] || die "PATCH /items/sanity answered $code: $body"
    [[ $etag == "\"$want\"" ]] || die "PATCH /items/sanity #$want: ETag '$etag', expected \"$want\" (not versioned?)"
done
note "Sanity: a lock acquire/release through lockstep gave 200/204; two unchecked \`PATCH /items/sanity\` gave 200 with \`ETag: \"2\"\` then \`\"3\"\` (a key without a row is at 1) (last body \`$body\`)."

# ---------------------------------------------- the SQL lockstep sends ----

# Extracts the acquire/release and claim_existing/commit format! strings from
# the source, expands {now}, {for_share}, {own_live} and {COLUMNS} as the
# PostgreSQL dialect does, and writes them as KEY<TAB>SQL lines.
python3 - "$ROOT/src/store/statements/locks.rs" "$ROOT/src/store/statements/versions.rs" "$ROOT/src/store/postgres.rs" \
    >"$TMP/statements.tsv" <<'EOF' || die "could not read lockstep's SQL from src/store"
import re, sys

locks, versions, postgres = (open(p).read() for p in sys.argv[1:4])

def rust_str(lit):
    # lit is the body of a Rust "..." literal: line continuations and escapes
    out, i = [], 0
    while i < len(lit):
        c = lit[i]
        if c == "\\":
            n = lit[i + 1]
            if n == "\n":
                i += 2
                while i < len(lit) and lit[i] in " \t\n":
                    i += 1
                continue
            out.append({"n": "\n", "t": "\t", '"': '"', "\\": "\\"}[n])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)

LIT = r'"((?:[^"\\]|\\.|\\\n)*)"'

def fmt(src, name, sep=":"):
    # `name: Stmt::new("op", format!("…"))` or `name = format!("…")`.
    stmt = r'(?:Stmt::new\(\s*"\w+",\s*)?'
    m = re.search(r"\b" + name + r"\s*" + sep + r"\s*" + stmt + r"format!\(\s*" + LIT, src, re.S)
    if not m:
        # `fn name(now: &str, guard: Option<&str>) -> String { … format!("UPDATE …") }`:
        # the statement a function builds (called without a guard: {guard} empty).
        m = re.search(r"\bfn " + name + r"\([^)]*\)\s*->\s*String\s*\{.*?format!\(\s*(?=\"(?:UPDATE|INSERT|DELETE|SELECT))" + LIT, src, re.S)
    if not m:
        sys.exit(f"no {name} format! string")
    return rust_str(m.group(1))

def field(src, name):
    m = re.search(r"\b" + name + r':\s*' + LIT, src, re.S)
    if not m:
        sys.exit(f"no {name} in postgres.rs")
    return rust_str(m.group(1))

now = field(postgres, "now_ms")
for_share = field(postgres, "for_share")
m = re.search(r'const COLUMNS: &str = ' + LIT, locks)
columns = rust_str(m.group(1))
own_live = fmt(locks, "let own_live", "=").format(now=now)
subst = dict(now=now, for_share=for_share, own_live=own_live, COLUMNS=columns, guard="")
out = {
    "lock_acquire": fmt(locks, "acquire"),
    "lock_release": fmt(locks, "release"),
    "version_claim_existing": fmt(versions, "claim_existing"),
    "version_commit": fmt(versions, "commit"),
}
for k, v in out.items():
    v = v.format(**subst)
    if "{" in v or "}" in v or "\n" in v:
        sys.exit(f"{k}: unexpanded text in {v!r}")
    print(f"{k}\t{v}")
EOF
sql_of() { awk -F'\t' -v k="$1" '$1 == k {print $2}' "$TMP/statements.tsv"; }
# sub_params SQL P1 P2 [P3 [P4]]: $N -> PN, textually (none of the values holds a '$')
sub_params() {
    local sql=$1 i=1
    shift
    for p in "$@"; do
        sql=${sql//"\$$i"/"$p"}
        i=$((i + 1))
    done
    printf '%s\n' "$sql"
}

RES="('pgbench:' || :client_id)"
OWNER="('w' || :client_id)"
{
    echo "-- acquire + release, each its own autocommit transaction (no BEGIN), as lockstep runs them;"
    echo "-- the 4th parameter is the label, empty as from a client that gives none (lock_pairs.lua)"
    echo "$(sub_params "$(sql_of lock_acquire)" "$RES" "$OWNER" "$LOCK_TTL_MS" "''");"
    echo "$(sub_params "$(sql_of lock_release)" "$RES" "$OWNER");"
} >"$TMP/locks.sql"

KEY="('pgbench/' || :client_id)"
LEASE="('lease-' || :client_id)"
EXPECTED="(SELECT version + (CASE WHEN lease_id IS NULL THEN 0 ELSE 1 END) FROM versions WHERE key = $KEY)"
{
    echo "-- claim_existing + commit, each its own autocommit transaction; the 4th parameter (expected) is the current"
    echo "-- effective version read by a subselect (the unchecked form: versions move between transactions)"
    echo "$(sub_params "$(sql_of version_claim_existing)" "$KEY" "$LEASE" "$WRITE_LEASE_MS" "$EXPECTED");"
    echo "$(sub_params "$(sql_of version_commit)" "$KEY" "$LEASE");"
} >"$TMP/versions.sql"
cat "$TMP/locks.sql" "$TMP/versions.sql" | grep -v '^--' | grep -q '\$[0-9]' && die "unbound parameter left in the pgbench scripts"

# Every pgbench client's version row exists at version 1 (claim_existing
# needs it), free.
psql_db direct -c "INSERT INTO versions (key, version, updated_at)
    SELECT 'pgbench/' || g, 1, (EXTRACT(EPOCH FROM now()) * 1000)::BIGINT FROM generate_series(0, $((CLIENTS - 1))) g"

# One pgbench transaction by hand, so a broken statement fails here, loudly.
for f in locks versions; do
    "$PGBENCH" -n -c 1 -j 1 -t 1 -f "$TMP/$f.sql" -h 127.0.0.1 -p "$P_PG" -U postgres direct \
        >"$TMP/pgbench-check-$f.txt" 2>&1 || die "pgbench $f.sql failed: $(tail -5 "$TMP/pgbench-check-$f.txt")"
done
[[ $(psql_db direct -At -c "SELECT owner IS NULL AND fencing_token = 1 FROM locks WHERE resource = 'pgbench:0'") == t ]] ||
    die "pgbench locks.sql: the check transaction did not acquire and release pgbench:0"
[[ $(psql_db direct -At -c "SELECT version = 2 AND lease_id IS NULL FROM versions WHERE key = 'pgbench/0'") == t ]] ||
    die "pgbench versions.sql: the check transaction did not claim and commit pgbench/0"

# ------------------------------------------------------------ measuring ----

BUSY_START=$(cpu_busy)

# wrk_run NAME URL [wrk options...]: warm-up, then the measured run into
# $TMP/wrk-NAME.txt; one thread per connection.
wrk_run() {
    local name=$1 url=$2
    shift 2
    if ((WARMUP > 0)); then
        log "$name: warm-up ${WARMUP}s"
        timeout 30 wrk -t"$CLIENTS" -c"$CLIENTS" -d"${WARMUP}s" "$@" "$url" \
            >"$TMP/warm-$name.txt" 2>&1 || die "$name: wrk warm-up failed: $(tail -5 "$TMP/warm-$name.txt")"
    fi
    log "$name: wrk -t$CLIENTS -c$CLIENTS -d${DURATION}s $url"
    timeout 30 wrk -t"$CLIENTS" -c"$CLIENTS" -d"${DURATION}s" --latency "$@" "$url" \
        >"$TMP/wrk-$name.txt" 2>&1 || die "$name: wrk failed: $(tail -5 "$TMP/wrk-$name.txt")"
}

# pgbench_run NAME SCRIPT: warm-up, then the measured run; prints "tps txns p99_ms failed"
pgbench_run() {
    local name=$1 script=$2 f total=0
    local conn=(-h 127.0.0.1 -p "$P_PG" -U postgres direct)
    if ((WARMUP > 0)); then
        log "$name: pgbench warm-up ${WARMUP}s"
        timeout 30 "$PGBENCH" -n -c "$CLIENTS" -j 2 -T "$WARMUP" -f "$script" "${conn[@]}" >"$TMP/warm-$name.txt" 2>&1 ||
            die "$name: pgbench warm-up failed: $(tail -5 "$TMP/warm-$name.txt")"
        total=$(awk '/number of transactions actually processed:/ {print $NF; exit}' "$TMP/warm-$name.txt" | cut -d/ -f1)
    fi
    f=$TMP/pgbench-$name.txt
    log "$name: pgbench -n -c $CLIENTS -j 2 -T $DURATION -f $(basename "$script")"
    # -l: a per-transaction log, for the p99 latency
    (cd "$TMP" && timeout 30 "$PGBENCH" -n -c "$CLIENTS" -j 2 -T "$DURATION" -f "$script" \
        -l --log-prefix="$TMP/txlog-$name" "${conn[@]}") \
        >"$f" 2>&1 || die "$name: pgbench failed: $(tail -5 "$f")"
    local tps txns p99 failed
    tps=$(awk '/^tps = / {print $3}' "$f" | tail -1)
    txns=$(awk '/number of transactions actually processed:/ {print $NF; exit}' "$f" | cut -d/ -f1)
    failed=$(awk '/number of failed transactions:/ {print $5; f=1} END {if (!f) print 0}' "$f")
    # log line: client_id transaction_no time_us script_no time_epoch time_us_frac
    p99=$(cat "$TMP"/txlog-"$name"* 2>/dev/null | awk '{print $3}' | sort -n |
        awk '{v[NR] = $1} END {if (NR) printf "%.3f", v[int(NR * 0.99 + 0.999999)] / 1000; else print "n/a"}')
    echo "${tps:-0} ${txns:-0} $((total + ${txns:-0})) $p99 $failed"
}

# 1. lockstep lock pairs
lock_load_run locks "127.0.0.1:$P_ADMIN" "$CLIENTS"
line=$(grep '^LOCKS ' "$TMP/lock-locks.txt") || die "lock_load printed no summary"
L_RPS=$(awk -v p="$(kv "$line" pairs)" -v s="$(kv "$line" seconds)" 'BEGIN {printf "%.1f", (s > 0 ? p / s : 0)}')
L_P99=$(kv "$line" p99_ms)
L_FAILS=$(($(kv "$line" post_bad) + $(kv "$line" del_bad)))
L_STATUSES=$(kv "$line" statuses)
L_SOCKERR=0 # lock_load stops the run at the first one

# 2. pgbench lock statements
read -r PL_TPS PL_TXNS PL_ALL PL_P99 PL_FAILED < <(pgbench_run pg-locks "$TMP/locks.sql")
# Every acquire that took a released row raised its token by one (the check
# transaction made pgbench:0's first); every release left owner NULL.
read -r PL_TOKENS PL_HELD < <(psql_db direct -At -F ' ' -c \
    "SELECT COALESCE(SUM(fencing_token), 0) - 1, COUNT(*) FILTER (WHERE owner IS NOT NULL) FROM locks WHERE resource LIKE 'pgbench:%'")

# 3. lockstep versioned writes
wrk_run patches "http://127.0.0.1:$P_LOCKSTEP" -s "$HERE/patch_items.lua" --timeout 10s
line=$(grep '^PATCHES ' "$TMP/wrk-patches.txt") || die "patch_items.lua printed no summary"
W_RPS=$(awk -v p="$(kv "$line" ok)" -v s="$(kv "$line" seconds)" 'BEGIN {printf "%.1f", (s > 0 ? p / s : 0)}')
W_P99=$(kv "$line" p99_ms)
W_FAILS=$(kv "$line" bad)
W_STATUSES=$(kv "$line" statuses)
W_SOCKERR=$(wrk_sockerr "$TMP/wrk-patches.txt")
W_OK_ALL=$(($(kv "$line" ok) + $( ((WARMUP > 0)) && kv "$(grep '^PATCHES ' "$TMP/warm-patches.txt")" ok || echo 0)))
read -r W_BUMPS W_LEASED < <(psql_db bench -At -F ' ' -c \
    "SELECT COALESCE(SUM(version - 1), 0), COUNT(*) FILTER (WHERE lease_id IS NOT NULL) FROM versions WHERE key ~ '^items/[0-9]+$'")

# 4. pgbench version statements
read -r PV_TPS PV_TXNS PV_ALL PV_P99 PV_FAILED < <(pgbench_run pg-versions "$TMP/versions.sql")
read -r PV_BUMPS PV_LEASED < <(psql_db direct -At -F ' ' -c \
    "SELECT COALESCE(SUM(version - 1), 0) - 1, COUNT(*) FILTER (WHERE lease_id IS NOT NULL) FROM versions WHERE key LIKE 'pgbench/%'")

note_lockstep_log

# ---------------------------------------------------------------- report ----

BUSY_END=$(cpu_busy)
if awk -v a="$BUSY_START" -v b="$BUSY_END" 'BEGIN {exit !((a ~ /^[0-9]+$/ && a > 10) || (b ~ /^[0-9]+$/ && b > 10))}'; then
    note "**Other work was using the CPUs** (${BUSY_START}% busy before the runs, ${BUSY_END}% after," \
        "with all of ours idle): rerun on an idle machine before trusting these numbers."
fi
((PL_TOKENS == PL_ALL && PL_HELD == 0)) ||
    note "**pgbench lock check failed**: $PL_ALL transactions (warm-up + measured) but the pgbench rows' tokens add up to $PL_TOKENS acquires, $PL_HELD rows still held."
((PV_BUMPS == PV_ALL && PV_LEASED == 0)) ||
    note "**pgbench version check failed**: $PV_ALL transactions (warm-up + measured) but the pgbench rows moved $PV_BUMPS versions, $PV_LEASED rows still leased."
((W_BUMPS >= W_OK_ALL && W_LEASED == 0)) ||
    note "**lockstep version check failed**: $W_OK_ALL PATCHes answered 200 but the \`items/N\` rows moved $W_BUMPS versions, $W_LEASED rows still leased."

R_L=$(ratio "$L_RPS" "$PL_TPS")
R_W=$(ratio "$W_RPS" "$PV_TPS")
commit=$(lockstep_commit)

mkdir -p "$(dirname "$OUT")"
{
    echo "# lockstep on PostgreSQL vs pgbench, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "lockstep \`$commit\` (release build), PostgreSQL $PG_VERSION ($PG_DURABILITY), $(nproc) CPUs," \
        "everything on 127.0.0.1 on this one machine (load generators included); other work kept the CPUs" \
        "${BUSY_START}% busy before the runs and ${BUSY_END}% after. $CLIENTS concurrent clients in every row," \
        "each on its own lock resource or version key (no contention between clients);" \
        "${DURATION} s measured after a ${WARMUP} s warm-up at the same load."
    echo
    echo "| # | row | ops/s | p99 latency | failures | how |"
    echo "|---|---|---:|---:|---:|---|"
    echo "| 1 | lockstep lock API, pairs/s | $(num "$L_RPS") | $L_P99 ms per request | $((L_FAILS + L_SOCKERR)) | \`benches/lock_load.rs\` (one thread, a connection per client): \`POST /locks/{r}\` → 200 then \`DELETE /locks/{r}\` → 204 on the admin listener |"
    echo "| 2 | pgbench, lock SQL, pairs/s | $(num "$PL_TPS") | $PL_P99 ms per pair | $PL_FAILED | \`pgbench -n -c $CLIENTS -j 2 -T $DURATION\`: lockstep's \`acquire\` then \`release\` statement, each its own autocommit transaction |"
    echo "| 3 | lockstep versioned PATCH, writes/s | $(num "$W_RPS") | $W_P99 ms per request | $((W_FAILS + W_SOCKERR)) | wrk -t$CLIENTS -c$CLIENTS + \`benches/patch_items.lua\`: \`PATCH /items/<thread>\` without a precondition → 200, backend nginx |"
    echo "| 4 | pgbench, version SQL, writes/s | $(num "$PV_TPS") | $PV_P99 ms per write | $PV_FAILED | \`pgbench -n -c $CLIENTS -j 2 -T $DURATION\`: \`claim_existing\` then \`commit\`, each its own autocommit transaction |"
    echo
    echo "| ratio (ops/s) | value | target | |"
    echo "|---|---:|---:|---|"
    echo "| lock pairs: lockstep / pgbench (1 / 2) | $R_L | ≥ 0.8 | $(verdict "$R_L" 0.8) |"
    echo "| versioned writes: lockstep / pgbench (3 / 4) | $R_W | ≥ 0.5 | $(verdict "$R_W" 0.5) |"
    echo
    echo "## Notes"
    echo
    echo "- The pgbench statements are read from \`src/store/statements/locks.rs\` and \`src/store/statements/versions.rs\` with" \
        "\`{now}\` = \`(EXTRACT(EPOCH FROM now()) * 1000)::BIGINT\` and \`{for_share}\` = \` FOR SHARE\` as in" \
        "\`src/store/postgres.rs\`; \`\$1..\$4\` become per-client literals: resource \`'pgbench:' || :client_id\`," \
        "owner \`'w' || :client_id\`, ttl $LOCK_TTL_MS; key \`'pgbench/' || :client_id\`, lease \`'lease-' || :client_id\`," \
        "lease $WRITE_LEASE_MS ms. pgbench runs them in its default simple-query protocol (text substituted into each" \
        "statement, parsed and planned every time); lockstep (sqlx) uses prepared statements, so" \
        "pgbench pays parse + plan on every statement and lockstep does not (\`-M prepared\` would narrow that; the" \
        "documented pgbench command is kept). They run in a" \
        "separate database with lockstep's schema and triggers (the same migration files), so pgbench's" \
        "releases fire the same \`pg_notify\` triggers lockstep's do."
    echo "- **Versions differ in one way**: lockstep binds \`\$4\` (the expected version) to the version it" \
        "read just before; pgbench, which cannot carry a value from one transaction to the next, binds it to" \
        "\`(SELECT version + (CASE WHEN lease_id IS NULL THEN 0 ELSE 1 END) FROM versions WHERE key = …)\`" \
        "inside the claim. And an unchecked PATCH through lockstep runs three statements, not two: the" \
        "\`current\` SELECT that reads the version, then \`claim_existing\`, then (after the backend answered)" \
        "\`commit\`; pgbench runs only the two writes. The rows were created at version 1 before the runs."
    echo "- Lock calls through lockstep that did not answer 200 / 204: $L_FAILS (statuses: $L_STATUSES);" \
        "socket errors: $L_SOCKERR. PATCHes that did not answer 200: $W_FAILS (statuses: $W_STATUSES);" \
        "socket errors: $W_SOCKERR."
    echo "- Checked in the database after the runs: the pgbench lock rows' fencing tokens add up to" \
        "$PL_TOKENS acquires for $PL_ALL transactions run (warm-up + measured), $PL_HELD left held;" \
        "the pgbench version rows moved $PV_BUMPS versions for $PV_ALL transactions, $PV_LEASED left leased;" \
        "lockstep's \`items/N\` rows moved $W_BUMPS versions for $W_OK_ALL PATCHes answered 200" \
        "(more is possible: wrk drops requests in flight when it stops and lockstep still completes them), $W_LEASED left leased."
    echo "- lockstep talks to PostgreSQL through a pool of \`[database] max_connections\` (default ${DB_MAX_CONN:-16})" \
        "connections; pgbench opens one connection per client ($CLIENTS)."
    echo "- Every statement is its own transaction with a synchronous commit (WAL flush) on both sides: the" \
        "rows are bounded by PostgreSQL's group commit on this disk, and the ratios are the cost of lockstep's" \
        "HTTP, pool and (row 3) backend round trip on top."
    echo "- All processes share $(nproc) CPUs: lock_load (one thread), wrk ($CLIENTS threads) or pgbench (2) compete with PostgreSQL and" \
        "lockstep; compare rows and ratios within one run."
    for n in ${NOTES[@]+"${NOTES[@]}"}; do echo "- $n"; done
} >"$OUT"

cat "$OUT"
log "report written to $OUT"
