#!/usr/bin/env bash
# Benchmarks lockstep against its peers in one run, on 127.0.0.1 only, and
# prints a Markdown report (also written to benches/results/latest.md), with
# a chart of its ratio rows beside it (latest-ratios.svg, drawn by plot.sh).
#
#   benches/run.sh
#
# HTTP rows (wrk, GET, keep-alive):
#   1 direct backend          nginx answering a fixed JSON body
#   2 nginx reverse proxy     nginx proxy_pass (upstream keepalive) -> row 1's nginx
#   3 lockstep passthrough    GET /plain/1 through lockstep (matches no [[resources]])
#   4 lockstep versioned GET  GET /articles/1 through lockstep (versioned read, SQLite)
#  4c conditional GET         GET /articles/1 with a matching If-None-Match: 304 after the backend answered
#  4d conditional GET, table  GET /cached/1 (exclusive_writes = true), matching If-None-Match: 304
#                             from the version table, the backend not asked
#  4e versioned GET, drift    GET /drift/1: the same, plus the body hash and its check
# Lock rows (acquire+release pairs, one resource per client):
#   5 lockstep lock API       POST + DELETE /locks/{r} on the admin listener (SQLite)
#   6 SQLite direct           lockstep's own acquire/release SQL, no HTTP (Python)
#   7 Redis                   the Redis lock recipe, a round trip per half, by the
#                             same client as row 5: SET NX PX, then EVALSHA of an
#                             owner-checked DEL
#   8 Redis, fsync always     as 7 with appendonly yes, appendfsync always
#  7e Redis, one EVAL         redis-benchmark, both halves in one EVAL per pair (one
#                             round trip, which a lock user cannot do: its work goes
#                             between acquire and release)
#  8e as 7e, fsync always
# Write rows (PATCH, one item per client, benches/lock_load.rs --protocol patch):
#   9 nginx reverse proxy     PATCH /items/<n> through nginx to the backend (no check)
#  10 lockstep versioned PATCH PATCH /items/<n> with If-Match: the previous answer's
#                             ETag (SQLite: claim, forward, commit, both durable)
#
# Environment:
#   BENCH_DURATION=8        seconds per measured run (1..10)
#   BENCH_CONNECTIONS=64    wrk connections for the HTTP rows
#   BENCH_THREADS=2         wrk threads for the HTTP rows
#   BENCH_WARMUP=2          seconds of warm-up before each measured run (0..10)
#   BENCH_LOCK_CLIENTS=32   concurrent clients for the lock rows
#   BENCH_ROUNDS=1          run rows 1-6 this many times, interleaved, and report
#                           each row's median round (steadier ratios on a busy machine)
#   BENCH_SKIP_BUILD=1      use the existing target/release/lockstep
#   BENCH_SKIP_INSTALL=1    never call apt-get
#   BENCH_KEEP_TMP=1        keep the temp dir (configs, logs, raw wrk output)
#   BENCH_OUT=FILE          where to write the report (default benches/results/latest.md);
#                           the chart goes next to it, FILE less .md plus -ratios.svg
#
# Needs: nginx, wrk, redis-server + redis-benchmark, sqlite3, curl, python3,
# gnuplot (installed from Debian when missing), cargo. Not PostgreSQL.

set -euo pipefail

LOG_TAG=bench
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)

DURATION=${BENCH_DURATION:-8}
CONNECTIONS=${BENCH_CONNECTIONS:-64}
THREADS=${BENCH_THREADS:-2}
WARMUP=${BENCH_WARMUP:-2}
LOCK_CLIENTS=${BENCH_LOCK_CLIENTS:-32}
ROUNDS=${BENCH_ROUNDS:-1}
OUT=${BENCH_OUT:-$HERE/results/latest.md}
CHART=${OUT%.md}-ratios.svg # the report links it by its name: keep the two together
export LOCK_TTL_MS=30000 # lock_load --ttl-ms

for v in DURATION CONNECTIONS THREADS WARMUP LOCK_CLIENTS ROUNDS; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "BENCH_$v must be a whole number, got '${!v}'"
done
((DURATION >= 1 && DURATION <= 10)) || die "BENCH_DURATION must lie in 1..10 seconds (got $DURATION)"
((WARMUP <= 10)) || die "BENCH_WARMUP must lie in 0..10 seconds (got $WARMUP)"
((THREADS >= 1 && CONNECTIONS >= THREADS)) || die "need BENCH_CONNECTIONS >= BENCH_THREADS >= 1"
((LOCK_CLIENTS >= 1 && LOCK_CLIENTS <= 256)) || die "BENCH_LOCK_CLIENTS must lie in 1..256"
((ROUNDS >= 1 && ROUNDS <= 9)) || die "BENCH_ROUNDS must lie in 1..9"

# ---------------------------------------------------------------- tools ----

install_missing() {
    local pkgs=()
    command -v nginx >/dev/null || pkgs+=(NGINX)
    command -v wrk >/dev/null || pkgs+=(wrk)
    command -v redis-server >/dev/null || pkgs+=(redis-server)
    { command -v redis-cli && command -v redis-benchmark; } >/dev/null || pkgs+=(redis-tools)
    command -v sqlite3 >/dev/null || pkgs+=(sqlite3)
    command -v curl >/dev/null || pkgs+=(curl)
    command -v python3 >/dev/null || pkgs+=(python3)
    command -v gnuplot >/dev/null || pkgs+=(gnuplot-nox)
    install_pkgs ${pkgs[@]+"${pkgs[@]}"}
}

install_missing
export PATH="$PATH:/usr/sbin:/sbin" # nginx lives in /usr/sbin

build_lockstep

# ------------------------------------------------------ temp dir, cleanup ----

make_tmp lockstep-bench

read -r P_BACKEND P_PROXY P_LOCKSTEP P_ADMIN P_REDIS P_REDIS_FSYNC < <(free_ports 6)

# --------------------------------------------------------------- servers ----


# JSON objects for the rows that stamp bigger bodies: /b2k/1 (2 KiB),
# /b64k/1 (64 KiB) and /b1m/1 (1 MiB, just under lockstep's default
# max_body_bytes). /p2k/1, /p64k/1 and /p1m/1 serve the same files on paths
# that match no [[resources]] entry (lockstep passthrough).
mkdir -p "$TMP/www/b2k" "$TMP/www/b64k" "$TMP/www/b1m"
python3 - "$TMP/www" <<'PY'
import sys
for name, size in (("b2k", 2 * 1024), ("b64k", 64 * 1024), ("b1m", 1024 * 1024 - 64)):
    rows, n = [], 0
    head, tail = '{"id":"1","title":"hello","rows":[', '{}]}'
    while len(head) + len(tail) + sum(map(len, rows)) < size - 120:
        rows.append('{"n":%d,"price":%d.%02d,"big":184467440737095516%02d,"name":"item %d"},' % (n, n % 997, n % 100, n % 100, n))
        n += 1
    with open(f"{sys.argv[1]}/{name}/1", "w") as f:
        f.write(head + "".join(rows) + tail)
PY

nginx_conf nginx-backend <<EOF
    server {
        listen 127.0.0.1:$P_BACKEND;
        default_type application/json;
        location / { return 200 '{"id":"1","title":"hello"}'; }
        location /b2k/ { root $TMP/www; }
        location /b64k/ { root $TMP/www; }
        location /b1m/ { root $TMP/www; }
        location /v64k/ { root $TMP/www; try_files /b64k/1 =404; }
        location /p2k/ { alias $TMP/www/b2k/; }
        location /p64k/ { alias $TMP/www/b64k/; }
        location /p1m/ { alias $TMP/www/b1m/; }
    }
EOF

{
    nginx_upstream "$P_BACKEND"
    nginx_proxy_server "$P_PROXY"
} | nginx_conf nginx-proxy

{
    lockstep_conf_head "sqlite://$TMP/bench.db"
    cat <<EOF

[log]
level = "warn"

[[resources]]
pattern = "/articles/{id}"

[[resources]]
pattern = "/b2k/{id}"

[[resources]]
pattern = "/b64k/{id}"

[[resources]]
pattern = "/b1m/{id}"

[[resources]]
pattern = "/v64k/{id}"

[[resources]]
pattern = "/items/{id}"

[[resources]]
pattern = "/drift/{id}"
detect_drift = true

[[resources]]
pattern = "/cached/{id}"
exclusive_writes = true
EOF
} >"$TMP/lockstep.toml"

for name in nginx-backend nginx-proxy; do
    nginx -t -q -e "$TMP/$name/error.log" -p "$TMP/$name" -c "$TMP/$name/nginx.conf" 2>"$TMP/$name.check" ||
        {
            cat "$TMP/$name.check" >&2
            die "$name: bad config"
        }
done

log "starting nginx backend on :$P_BACKEND and nginx proxy on :$P_PROXY"
start nginx-backend nginx -e "$TMP/nginx-backend/error.log" -p "$TMP/nginx-backend" -c "$TMP/nginx-backend/nginx.conf"
BACKEND_GROUP=$LAST_PID
wait_http nginx-backend "$LAST_PID" "http://127.0.0.1:$P_BACKEND/"
start nginx-proxy nginx -e "$TMP/nginx-proxy/error.log" -p "$TMP/nginx-proxy" -c "$TMP/nginx-proxy/nginx.conf"
PROXY_GROUP=$LAST_PID
wait_http nginx-proxy "$LAST_PID" "http://127.0.0.1:$P_PROXY/"

log "starting lockstep on :$P_LOCKSTEP (admin :$P_ADMIN)"
start_lockstep

log "starting redis on :$P_REDIS (no persistence) and :$P_REDIS_FSYNC (appendfsync always)"
mkdir -p "$TMP/redis" "$TMP/redis-fsync"
start redis redis-server --bind 127.0.0.1 --port "$P_REDIS" --dir "$TMP/redis" \
    --save "" --appendonly no --daemonize no --protected-mode yes
REDIS_GROUP=$LAST_PID
wait_redis redis "$LAST_PID" "$P_REDIS"
start redis-fsync redis-server --bind 127.0.0.1 --port "$P_REDIS_FSYNC" --dir "$TMP/redis-fsync" \
    --save "" --appendonly yes --appendfsync always --daemonize no --protected-mode yes
REDIS_FSYNC_GROUP=$LAST_PID
wait_redis redis-fsync "$LAST_PID" "$P_REDIS_FSYNC"

# ---------------------------------------------------------- sanity checks ----

# check_get NAME URL: must be 200 with the backend's body; sets CHECK_ETAG
# ("none" when absent) and CHECK_BODY
check_get() {
    local name=$1 url=$2 hdr code
    hdr=$TMP/check-$name.headers
    CHECK_BODY=$(curl -s -D "$hdr" --max-time 5 "$url") || die "$name: GET $url failed"
    code=$(awk 'NR==1 {print $2}' "$hdr")
    [[ $code == 200 ]] || die "$name: GET $url answered $code: $CHECK_BODY"
    [[ $CHECK_BODY == *'"title":"hello"'* ]] || die "$name: GET $url: unexpected body $CHECK_BODY"
    CHECK_ETAG=$(awk 'tolower($1)=="etag:" {sub(/\r$/, "", $2); print $2}' "$hdr")
    CHECK_ETAG=${CHECK_ETAG:-none}
}

check_get backend "http://127.0.0.1:$P_BACKEND/articles/1"
check_get nginx-proxy "http://127.0.0.1:$P_PROXY/articles/1"
check_get passthrough "http://127.0.0.1:$P_LOCKSTEP/plain/1"
[[ $CHECK_ETAG == none ]] || die "passthrough GET /plain/1 carries ETag $CHECK_ETAG: it is being versioned"
check_get versioned "http://127.0.0.1:$P_LOCKSTEP/articles/1"
[[ $CHECK_ETAG == '"1"' ]] || die "versioned GET /articles/1 carries ETag ${CHECK_ETAG}, expected \"1\""
[[ $CHECK_BODY == *'"version":1'* ]] || die "versioned GET /articles/1 body has no version: $CHECK_BODY"
note "Sanity: \`GET /plain/1\` through lockstep has no ETag; \`GET /articles/1\` has \`ETag: \"1\"\` and body \`$CHECK_BODY\`."
# Twice: the first read records the body's hash, the second finds it unchanged.
for _ in 1 2; do
    check_get versioned-drift "http://127.0.0.1:$P_LOCKSTEP/drift/1"
    [[ $CHECK_ETAG == '"1"' ]] || die "detect_drift GET /drift/1 carries ETag ${CHECK_ETAG}, expected \"1\" (an unchanged body must not bump)"
    [[ $CHECK_BODY == *'"version":1'* ]] || die "detect_drift GET /drift/1 body has no version: $CHECK_BODY"
done
# The large bodies must come back byte for byte, plus the version member:
# on an item's first read, on the next (its scan reused), and for the items
# of row 4f. check_stamped PATH FILE: GET PATH is FILE with "version":1.
check_stamped() {
    check_get "nginx-proxy-${1%%/*}" "http://127.0.0.1:$P_PROXY/$1"
    check_get "versioned-${1%%/*}" "http://127.0.0.1:$P_LOCKSTEP/$1"
    [[ $CHECK_ETAG == '"1"' ]] || die "versioned GET /$1 carries ETag ${CHECK_ETAG}, expected \"1\""
    want=$(<"$TMP/www/$2")
    want="${want%\}},\"version\":1}"
    [[ $CHECK_BODY == "$want" ]] || die "versioned GET /$1 is not the backend's bytes with \"version\":1 appended"
}
for big in b2k b64k b1m b2k b64k b1m; do check_stamped "$big/1" "$big/1"; done
check_stamped v64k/1 b64k/1
check_stamped v64k/2 b64k/1
# The conditional rows must be answered 304 with the version as ETag.
for path in articles cached; do
    hdr=$TMP/check-conditional-$path.headers
    curl -s -o /dev/null -D "$hdr" --max-time 5 -H 'If-None-Match: "1"' "http://127.0.0.1:$P_LOCKSTEP/$path/1" ||
        die "conditional GET /$path/1 failed"
    [[ $(awk 'NR==1 {print $2}' "$hdr") == 304 ]] || die "conditional GET /$path/1: $(head -1 "$hdr"), expected 304"
    grep -qi '^etag: "1"' "$hdr" || die "conditional GET /$path/1 has no ETag \"1\""
done

# A checked PATCH through lockstep bumps the version; a stale one gets 409.
for want in '200 "2"' '409 "2"'; do
    hdr=$TMP/check-patch.headers
    curl -s -o "$TMP/check-patch.body" -D "$hdr" --max-time 5 -X PATCH -H 'Content-Type: application/json' \
        -H 'If-Match: "1"' -d '{"title":"bench"}' "http://127.0.0.1:$P_LOCKSTEP/items/sanity" ||
        die "PATCH /items/sanity failed"
    got="$(awk 'NR==1 {print $2}' "$hdr") $(awk 'tolower($1)=="etag:" {sub(/\r$/, "", $2); print $2}' "$hdr")"
    [[ $got == "$want" ]] || die "PATCH /items/sanity with If-Match \"1\": got '$got', expected '$want'"
done
note "Sanity: \`PATCH /items/sanity\` with \`If-Match: \"1\"\` through lockstep answered 200 with \`ETag: \"2\"\`, and the same again 409."

check_lock_api

REDIS_LUA="local ok = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', $LOCK_TTL_MS) if ok and redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
for port in "$P_REDIS" "$P_REDIS_FSYNC"; do
    r=$(redis-cli -h 127.0.0.1 -p "$port" EVAL "$REDIS_LUA" 1 lock:sanity w1)
    [[ $r == 1 ]] || die "redis lock script on :$port returned '$r', expected 1"
done

# ------------------------------------------------------------ measuring ----

BUSY_START=$(cpu_busy)

ms() { awk -v v="$1" 'BEGIN {if (v ~ /^[0-9.]+$/) printf "%.2f", v; else print v}'; }

# Parsers for wrk's text output.
wrk_rps() { awk '/^Requests\/sec:/ {print $2; f=1} END {if (!f) print "0"}' "$1"; }
wrk_p99_ms() {
    awk '/Latency Distribution/ {f=1}
         f && $1 == "99%" {
             v = $2
             if (v ~ /us$/) { sub(/us$/, "", v); v = v / 1000 }
             else if (v ~ /ms$/) { sub(/ms$/, "", v) }
             else if (v ~ /m$/) { sub(/m$/, "", v); v = v * 60000 }
             else if (v ~ /s$/) { sub(/s$/, "", v); v = v * 1000 }
             printf "%.2f\n", v; found = 1; exit
         }
         END { if (!found) print "n/a" }' "$1"
}
wrk_non2xx() { awk -F': *' '/Non-2xx or 3xx responses/ {print $2; f=1} END {if (!f) print 0}' "$1"; }

# wrk_run NAME THREADS CONNECTIONS URL [wrk options...]: warm-up, then the
# measured run into $TMP/wrk-NAME.txt. With CPU_GROUP set, sets CPU_US to the
# CPU time (µs) that process group used during the measured run; BACKEND_US
# is the same for the nginx backend, LOAD_US for wrk itself (the load
# generator shares the 2 CPUs with the servers: its share is part of the
# budget every row is measured in).
wrk_run() {
    local name=$1 t=$2 c=$3 url=$4 before
    shift 4
    if ((WARMUP > 0)); then
        log "$name: warm-up ${WARMUP}s"
        wrk -t"$t" -c"$c" -d"${WARMUP}s" "$@" "$url" >"$TMP/warm-$name.txt" 2>&1 ||
            die "$name: wrk warm-up failed: $(tail -5 "$TMP/warm-$name.txt")"
    fi
    log "$name: wrk -t$t -c$c -d${DURATION}s $url"
    [[ -n ${CPU_GROUP:-} ]] && before=$(group_ticks "$CPU_GROUP")
    backend_before=$(group_ticks "$BACKEND_GROUP")
    timed_client "$name" "$TMP/wrk-$name.txt" \
        wrk -t"$t" -c"$c" -d"${DURATION}s" --latency "$@" "$url" ||
        die "$name: wrk failed: $(tail -5 "$TMP/wrk-$name.txt")"
    CPU_US=0
    [[ -n ${CPU_GROUP:-} ]] && CPU_US=$((($(group_ticks "$CPU_GROUP") - before) * 1000000 / CLK_TCK))
    BACKEND_US=$((($(group_ticks "$BACKEND_GROUP") - backend_before) * 1000000 / CLK_TCK))
    return 0
}
wrk_requests() { awk '/ requests in / {print $1; f=1} END {if (!f) print 0}' "$1"; }
# sum_us A B: A + B, or n/a when either is not a number
sum_us() { awk -v a="$1" -v b="$2" 'BEGIN {if (a ~ /^[0-9]+$/ && b ~ /^[0-9]+$/) print a + b; else print "n/a"}'; }
# per_unit MICROSECONDS COUNT: µs per request (or pair), whole
per_unit() { awk -v u="$1" -v n="$2" 'BEGIN {if (n > 0) printf "%.0f", u / n; else print "n/a"}'; }

# Figures per "row:round". FAILS counts non-2xx answers (or failed SQL) and
# SOCKERR socket errors.
declare -A RPS P99 FAILS SOCKERR CPU PEAK BCPU LCPU
STATUSES=()

# Peak RSS of a process group during one row: the kernel's high-water mark
# (VmHWM) is reset before the warm-up (clear_refs 5) and read after the
# measured run, summed over the group's processes (nginx: master + workers).
peak_reset() {
    local pid
    for pid in $(pgrep -g "$1"); do echo 5 >"/proc/$pid/clear_refs" 2>/dev/null || true; done
}
peak_kib() {
    local pid sum=0 k
    for pid in $(pgrep -g "$1"); do
        k=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null) || continue
        sum=$((sum + ${k:-0}))
    done
    echo "$sum"
}
mib() { awk -v k="$1" 'BEGIN {if (k > 0) printf "%.1f MiB", k / 1024; else print "n/a"}'; }

measure_http() { # measure_http ROW ROUND URL PGID-OF-THE-HOP [wrk options...]
    local row=$1 r=$2 url=$3 group=$4 f
    shift 4
    peak_reset "$group"
    CPU_GROUP=$group wrk_run "$row-$r" "$THREADS" "$CONNECTIONS" "$url" "$@"
    PEAK[$row:$r]=$(peak_kib "$group")
    f=$TMP/wrk-$row-$r.txt
    CPU[$row:$r]=$(per_unit "$CPU_US" "$(wrk_requests "$f")")
    BCPU[$row:$r]=$(per_unit "$BACKEND_US" "$(wrk_requests "$f")")
    LCPU[$row:$r]=$(per_unit "$LOAD_US" "$(wrk_requests "$f")")
    RPS[$row:$r]=$(wrk_rps "$f")
    P99[$row:$r]=$(wrk_p99_ms "$f")
    FAILS[$row:$r]=$(wrk_non2xx "$f")
    SOCKERR[$row:$r]=$(wrk_sockerr "$f")
}

# Lock pairs: benches/lock_load.rs, one thread driving LOCK_CLIENTS
# connections, as redis-benchmark drives Redis's; through lockstep's lock
# API, or (rows 7 and 8) Redis's lock recipe with the same client.
measure_locks() { # measure_locks ROW ROUND ADDR PGID [lock_load args…]
    local row=$1 r=$2 addr=$3 group=$4 f line
    shift 4
    peak_reset "$group"
    CPU_GROUP=$group lock_load_run "$row-$r" "$addr" "$LOCK_CLIENTS" "$@"
    f=$TMP/lock-$row-$r.txt
    PEAK[$row:$r]=$(peak_kib "$group")
    line=$(grep '^LOCKS ' "$f") || die "lock_load printed no summary"
    CPU[$row:$r]=$(per_unit "$CPU_US" "$(kv "$line" pairs)")
    LCPU[$row:$r]=$(per_unit "$LOAD_US" "$(kv "$line" pairs)")
    RPS[$row:$r]=$(awk -v p="$(kv "$line" pairs)" -v s="$(kv "$line" seconds)" \
        'BEGIN {printf "%.1f", (s > 0 ? p / s : 0)}')
    P99[$row:$r]=$(kv "$line" p99_ms)
    FAILS[$row:$r]=$(($(kv "$line" post_bad) + $(kv "$line" del_bad)))
    SOCKERR[$row:$r]=0
    [[ $(kv "$line" statuses) == none ]] || STATUSES+=("$row: $(kv "$line" statuses)")
}

# PATCH writes, one item per client: benches/lock_load.rs --protocol patch,
# one thread driving LOCK_CLIENTS connections (each sends the ETag of its
# last answer as If-Match), through the nginx proxy (no ETag, so no check)
# or lockstep (checked).
measure_patch() { # measure_patch ROW ROUND ADDR PGID-OF-THE-HOP
    local row=$1 r=$2 addr=$3 group=$4 f line
    peak_reset "$group"
    CPU_GROUP=$group lock_load_run "$row-$r" "$addr" "$LOCK_CLIENTS" --protocol patch
    f=$TMP/lock-$row-$r.txt
    PEAK[$row:$r]=$(peak_kib "$group")
    line=$(grep '^PATCHES ' "$f") || die "lock_load printed no PATCHES summary"
    CPU[$row:$r]=$(per_unit "$CPU_US" "$(kv "$line" ok)")
    BCPU[$row:$r]=$(per_unit "$BACKEND_US" "$(kv "$line" ok)")
    LCPU[$row:$r]=$(per_unit "$LOAD_US" "$(kv "$line" ok)")
    RPS[$row:$r]=$(awk -v p="$(kv "$line" ok)" -v s="$(kv "$line" seconds)" \
        'BEGIN {printf "%.1f", (s > 0 ? p / s : 0)}')
    P99[$row:$r]=$(kv "$line" p99_ms)
    FAILS[$row:$r]=$(kv "$line" bad)
    SOCKERR[$row:$r]=0
    [[ $(kv "$line" statuses) == none ]] || STATUSES+=("$row: $(kv "$line" statuses)")
}

# The same SQL straight against SQLite, a fresh database each round.
measure_sqlite() { # measure_sqlite ROUND
    local r=$1 line
    log "sqlite-direct-$r: $LOCK_CLIENTS Python threads, ${WARMUP}s warm-up + ${DURATION}s"
    line=$(python3 "$HERE/sqlite_locks.py" --db "$TMP/direct-$r.db" \
        --schema "$ROOT/migrations/sqlite" \
        --locks-rs "$ROOT/src/store/statements/locks.rs" --sqlite-rs "$ROOT/src/store/sqlite.rs" \
        --clients "$LOCK_CLIENTS" --duration "$DURATION" --warmup "$WARMUP" \
        --ttl-ms "$LOCK_TTL_MS" 2>"$TMP/sqlite-direct-$r.log" | grep '^SQLITE ') ||
        die "sqlite_locks.py failed: $(tail -5 "$TMP/sqlite-direct-$r.log")"
    RPS[sqlite:$r]=$(kv "$line" pairs_per_s)
    P99[sqlite:$r]=$(kv "$line" p99_ms)
    FAILS[sqlite:$r]=$(($(kv "$line" acquire_refused) + $(kv "$line" release_missed) + $(kv "$line" errors)))
    SOCKERR[sqlite:$r]=0
    CPU[sqlite:$r]=$(kv "$line" cpu_us_per_pair)
    S_VERSION=$(kv "$line" sqlite_version)
}

# lockstep_http ROW ROUND URL [wrk args…]: one lockstep row, in a freshly
# started lockstep, so that the row's peak RSS is its own load's.
lockstep_http() {
    local row=$1 round=$2 url=$3
    shift 3
    restart_lockstep
    measure_http "$row" "$round" "$url" "$LOCKSTEP_PID" "$@"
}

for ((round = 1; round <= ROUNDS; round++)); do
    ((ROUNDS == 1)) || log "round $round of $ROUNDS"
    # lockstep starts afresh before each of its rows: see restart_lockstep.
    measure_http direct "$round" "http://127.0.0.1:$P_BACKEND/articles/1" "$BACKEND_GROUP"
    measure_http nginx "$round" "http://127.0.0.1:$P_PROXY/articles/1" "$PROXY_GROUP"
    lockstep_http passthrough "$round" "http://127.0.0.1:$P_LOCKSTEP/plain/1"
    lockstep_http versioned "$round" "http://127.0.0.1:$P_LOCKSTEP/articles/1"
    lockstep_http versioneddrift "$round" "http://127.0.0.1:$P_LOCKSTEP/drift/1"
    measure_http nginx2k "$round" "http://127.0.0.1:$P_PROXY/b2k/1" "$PROXY_GROUP"
    lockstep_http passthrough2k "$round" "http://127.0.0.1:$P_LOCKSTEP/p2k/1"
    lockstep_http versioned2k "$round" "http://127.0.0.1:$P_LOCKSTEP/b2k/1"
    measure_http nginx64k "$round" "http://127.0.0.1:$P_PROXY/b64k/1" "$PROXY_GROUP"
    lockstep_http passthrough64k "$round" "http://127.0.0.1:$P_LOCKSTEP/p64k/1"
    lockstep_http versioned64k "$round" "http://127.0.0.1:$P_LOCKSTEP/b64k/1"
    lockstep_http versioned64kcold "$round" "http://127.0.0.1:$P_LOCKSTEP/v64k/" \
        -s "$HERE/distinct_items.lua"
    measure_http nginx1m "$round" "http://127.0.0.1:$P_PROXY/b1m/1" "$PROXY_GROUP"
    lockstep_http passthrough1m "$round" "http://127.0.0.1:$P_LOCKSTEP/p1m/1"
    lockstep_http versioned1m "$round" "http://127.0.0.1:$P_LOCKSTEP/b1m/1"
    lockstep_http conditional "$round" "http://127.0.0.1:$P_LOCKSTEP/articles/1" \
        -H 'If-None-Match: "1"'
    lockstep_http conditional_table "$round" "http://127.0.0.1:$P_LOCKSTEP/cached/1" \
        -H 'If-None-Match: "1"'
    restart_lockstep
    measure_locks locks "$round" "127.0.0.1:$P_ADMIN" "$LOCKSTEP_PID"
    measure_locks redis "$round" "127.0.0.1:$P_REDIS" "$REDIS_GROUP" --protocol redis
    measure_locks redisfsync "$round" "127.0.0.1:$P_REDIS_FSYNC" "$REDIS_FSYNC_GROUP" --protocol redis
    measure_sqlite "$round"
    measure_patch nginxpatch "$round" "127.0.0.1:$P_PROXY" "$PROXY_GROUP"
    restart_lockstep
    measure_patch patch "$round" "127.0.0.1:$P_LOCKSTEP" "$LOCKSTEP_PID"
done

# A row's figures are those of its median round by throughput (the lower
# middle one for an even count); failures are summed over all rounds.
for row in direct nginx passthrough versioned versioneddrift nginx2k passthrough2k versioned2k nginx64k passthrough64k versioned64k versioned64kcold nginx1m passthrough1m versioned1m conditional conditional_table locks redis redisfsync sqlite nginxpatch patch; do
    median=$(for ((r = 1; r <= ROUNDS; r++)); do echo "${RPS[$row:$r]} $r"; done |
        sort -g | awk -v n="$ROUNDS" 'NR == int((n + 1) / 2) {print $2}')
    RPS[$row]=${RPS[$row:$median]}
    P99[$row]=${P99[$row:$median]}
    CPU[$row]=${CPU[$row:$median]}
    BCPU[$row]=${BCPU[$row:$median]:-n/a}
    LCPU[$row]=${LCPU[$row:$median]:-n/a}
    PEAK[$row]=${PEAK[$row:$median]:-0}
    fails=0 sockerr=0
    for ((r = 1; r <= ROUNDS; r++)); do
        fails=$((fails + ${FAILS[$row:$r]}))
        sockerr=$((sockerr + ${SOCKERR[$row:$r]}))
    done
    FAILS[$row]=$fails
    SOCKERR[$row]=$sockerr
done
L_STATUSES=$(IFS=,; echo "${STATUSES[*]:-none}")
if ((ROUNDS > 1)); then
    per_round=""
    for row in direct nginx passthrough versioned versioneddrift nginx2k passthrough2k versioned2k nginx64k passthrough64k versioned64k versioned64kcold nginx1m passthrough1m versioned1m conditional conditional_table locks redis redisfsync sqlite nginxpatch patch; do
        per_round+="$row"
        for ((r = 1; r <= ROUNDS; r++)); do per_round+=" $(num "${RPS[$row:$r]}")"; done
        per_round+="; "
    done
    note "Throughput of each round, in order: ${per_round%; }."
    # paired ROW PEER: the ratio ROW / PEER of each round, then their median.
    # A round measures the peer and lockstep one after the other, so the
    # ratio within a round leaves out the host's drift between rounds,
    # which the medians of the rows (the tables above) keep.
    paired() {
        local r list=() median
        for ((r = 1; r <= ROUNDS; r++)); do list+=("$(ratio "$(num "${RPS[$1:$r]}")" "$(num "${RPS[$2:$r]}")")"); done
        median=$(printf '%s\n' "${list[@]}" | grep -v n/a | sort -n | awk '{v[NR] = $1} END {if (NR) print v[int((NR + 1) / 2)]; else print "n/a"}')
        echo "${list[*]} (median $median)"
    }
    note "Passthrough / nginx proxy paired by round, in order: 31 B $(paired passthrough nginx); 2 KiB $(paired passthrough2k nginx2k); 64 KiB $(paired passthrough64k nginx64k). A round measures nginx and lockstep one after the other, so its ratio leaves out the host's drift between rounds; the tables' ratios are of each row's median round."
fi
while read -r count msg; do
    note "SQLite direct: $count × $msg"
done < <(cat "$TMP"/sqlite-direct-*.log |
    awk '/^sqlite_locks.py: [0-9]+ × / {n = $2; sub(/^[^×]*× /, ""); sum[$0] += n}
         END {for (m in sum) print sum[m], m}' | sort -rn)

# Redis: redis-benchmark runs a count, not a time, so size the runs from a
# short probe: probe -> warm-up of ~WARMUP s -> measured run of ~DURATION s.
# Prints "rps p99_ms client_us server_us" of the measured run, the last two
# the CPU time per pair of redis-benchmark and of the Redis server.
redis_bench() { # redis_bench NAME PORT GROUP
    local name=$1 port=$2 group=$3 n rps row before
    # rb N: "rps p99_ms" of one run of N pairs. The CSV's test name holds
    # commas, so split on the quoted separator ("," between fields).
    rb() {
        (
            timeout 15 redis-benchmark -h 127.0.0.1 -p "$port" -c "$LOCK_CLIENTS" -n "$1" \
                -r 1000000 --csv EVAL "$REDIS_LUA" 1 'lock:__rand_int__' w1 2>>"$TMP/$name-bench.log"
            times >"$TMP/times-$name.txt"
        ) | awk -F'","' 'NR > 1 && NF == 8 {printf "%s %s\n", $2, $7}' || true
    }
    row=$(rb 2000)
    [[ -n $row ]] || {
        echo "n/a n/a"
        return 0
    }
    rps=${row%%[. ]*}
    if ((WARMUP > 0)); then
        n=$((rps * WARMUP > 1000 ? rps * WARMUP : 1000))
        log "$name: warm-up, $n pairs (~${WARMUP}s)"
        row=$(rb "$n")
        [[ -n $row ]] && rps=${row%%[. ]*}
    fi
    n=$((rps * DURATION > 1000 ? rps * DURATION : 1000))
    log "$name: redis-benchmark -c $LOCK_CLIENTS -n $n (~${DURATION}s)"
    before=$(group_ticks "$group")
    row=$(rb "$n")
    echo "${row:-n/a n/a} $(per_unit "$(child_us "$TMP/times-$name.txt")" "$n")" \
        "$(per_unit "$((($(group_ticks "$group") - before) * 1000000 / CLK_TCK))" "$n")"
}
read -r R_PAIRS_S R_P99 R_CLIENT_US R_SERVER_US < <(redis_bench redis-eval "$P_REDIS" "$REDIS_GROUP")
read -r RF_PAIRS_S RF_P99 RF_CLIENT_US RF_SERVER_US < <(redis_bench redis-eval-fsync "$P_REDIS_FSYNC" "$REDIS_FSYNC_GROUP")

# What the runs left in lockstep's database.
DB_MODE=$(sqlite3 "$TMP/bench.db" 'PRAGMA journal_mode;' 2>/dev/null || echo "?")
DB_VERSIONS=$(sqlite3 "$TMP/bench.db" 'SELECT count(*) FROM versions;' 2>/dev/null || echo "?")
DB_LOCKS=$(sqlite3 "$TMP/bench.db" 'SELECT count(*) FROM locks;' 2>/dev/null || echo "?")
note_lockstep_log

# ---------------------------------------------------------------- report ----

BUSY_END=$(cpu_busy)
if awk -v a="$BUSY_START" -v b="$BUSY_END" 'BEGIN {exit !((a ~ /^[0-9]+$/ && a > 10) || (b ~ /^[0-9]+$/ && b > 10))}'; then
    note "**Other work was using the CPUs** (${BUSY_START}% busy before the runs, ${BUSY_END}% after," \
        "with all of ours idle): it competed with every row; rerun on an idle machine before trusting these numbers."
fi


S_SOURCE_TEXT="read from \`src/store/statements/locks.rs\`"
R_PT=$(ratio "${RPS[passthrough]}" "${RPS[nginx]}")
R_VG=$(ratio "${RPS[versioned]}" "${RPS[nginx]}")
R_VG2K=$(ratio "${RPS[versioned2k]}" "${RPS[nginx2k]}")
R_PT2K=$(ratio "${RPS[passthrough2k]}" "${RPS[nginx2k]}")
R_VP=$(ratio "${RPS[versioned]}" "${RPS[passthrough]}")
R_VP2K=$(ratio "${RPS[versioned2k]}" "${RPS[passthrough2k]}")
R_VP64=$(ratio "${RPS[versioned64k]}" "${RPS[passthrough64k]}")
R_VP1M=$(ratio "${RPS[versioned1m]}" "${RPS[passthrough1m]}")
R_MEM64=$(ratio "${PEAK[versioned64k]}" "${PEAK[nginx64k]}")
R_VGD=$(ratio "${RPS[versioneddrift]}" "${RPS[versioned]}")
R_VG64=$(ratio "${RPS[versioned64k]}" "${RPS[nginx64k]}")
R_VGC64=$(ratio "${RPS[versioned64kcold]}" "${RPS[nginx64k]}")
R_VPC64=$(ratio "${RPS[versioned64kcold]}" "${RPS[passthrough64k]}")
R_VG1M=$(ratio "${RPS[versioned1m]}" "${RPS[nginx1m]}")
R_CT=$(ratio "${RPS[conditional_table]}" "${RPS[conditional]}")
R_CTN=$(ratio "${RPS[conditional_table]}" "${RPS[nginx]}")
R_LS=$(ratio "${RPS[locks]}" "${RPS[sqlite]}")
R_LR=$(ratio "${RPS[locks]}" "${RPS[redis]}")
R_LRF=$(ratio "${RPS[locks]}" "${RPS[redisfsync]}")
R_LRE=$(ratio "${RPS[locks]}" "$R_PAIRS_S")
R_LREF=$(ratio "${RPS[locks]}" "$RF_PAIRS_S")
R_PATCH=$(ratio "${RPS[patch]}" "${RPS[nginxpatch]}")

commit=$(lockstep_commit)
nginx_v=$(nginx -v 2>&1 | sed 's/.*nginx\///')
redis_v=$(redis-server --version | sed -n 's/.* v=\([^ ]*\).*/\1/p')
bundled=$(grep -h -m1 '#define SQLITE_VERSION ' "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/libsqlite3-sys-*/sqlite3/sqlite3.h 2>/dev/null |
    head -1 | awk '{gsub(/"/, "", $3); print $3}' || true)
if ((ROUNDS == 1)); then
    rounds_text="one round"
else
    rounds_text="$ROUNDS rounds of the HTTP rows and rows 5–8; each row shows its median round by throughput, failures summed over all rounds"
fi

http_line() { # http_line N LABEL REQUEST ROW
    echo "| $1 | $2 | \`$3\` | $(num "${RPS[$4]}") | $(ms "${P99[$4]}") ms | ${CPU[$4]} µs | ${BCPU[$4]} µs | ${LCPU[$4]} µs | $(mib "${PEAK[$4]}") | ${FAILS[$4]} | ${SOCKERR[$4]} |"
}
http_head() { # http_head THROUGHPUT-LABEL [LOAD-GENERATOR]
    echo "| # | row | request | $1 | p99 latency | CPU per request | backend CPU per request | ${2:-wrk} CPU per request | peak RSS | non-2xx | socket errors |"
    echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
}

mkdir -p "$(dirname "$OUT")"
{
    echo "# lockstep benchmark, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "lockstep \`$commit\` (release build), $(nproc) CPUs, everything on 127.0.0.1 on this one machine" \
        "(load generator included); other work kept the CPUs ${BUSY_START}% busy before the runs and" \
        "${BUSY_END}% after. nginx $nginx_v, Redis $redis_v, wrk $(wrk -v 2>&1 | awk 'NR==1 {print $2}'); $rounds_text."
    echo
    echo "![ratios]($(basename "$CHART"))"
    echo
    echo "Every ratio of the tables below as a bar, its target drawn across it: green meets the target," \
        "red misses it, grey has none (drawn by \`benches/plot.sh\` from this report)."
    echo
    echo "## HTTP: GET through each hop"
    echo
    echo "wrk -t$THREADS -c$CONNECTIONS -d${DURATION}s --latency, after a ${WARMUP} s warm-up at the same load."
    echo
    http_head req/s
    http_line 1 "direct backend (nginx)" "GET /articles/1" direct
    http_line 2 "nginx reverse proxy → backend" "GET /articles/1" nginx
    http_line 3 "lockstep passthrough → backend" "GET /plain/1" passthrough
    http_line 4 "lockstep versioned GET → backend" "GET /articles/1" versioned
    http_line 4e "lockstep versioned GET, detect_drift → backend" "GET /drift/1" versioneddrift
    echo
    echo "| ratio (req/s) | value | target | |"
    echo "|---|---:|---:|---|"
    echo "| lockstep passthrough / nginx proxy (3 / 2) | $R_PT | ≥ 0.9 | $(verdict "$R_PT" 0.9) |"
    echo "| lockstep versioned GET / nginx proxy (4 / 2) | $R_VG | ≥ 0.8 | $(verdict "$R_VG" 0.8) |"
    echo "| lockstep versioned GET / lockstep passthrough (4 / 3) | $R_VP | ≥ 0.6 | $(verdict "$R_VP" 0.6) |"
    echo "| detect_drift GET / versioned GET (4e / 4) | $R_VGD | none | |"
    echo
    echo "### Large JSON bodies"
    echo
    echo "The same load on one JSON object of 2 KiB, 64 KiB and 1 MiB (just under \`max_body_bytes\`):" \
        "lockstep validates the whole body and appends \`\"version\":1\`, byte-exact. The passthrough rows" \
        "fetch the same file on a path no \`[[resources]]\` entry matches. Rows 4k, 4a and 4b read one item" \
        "over and over, and its body does not change: after the first read, each read is compared with the" \
        "body that item was last stamped from and reuses that scan (the plan cache, \`docs/performance.md\`)." \
        "Row 4f reads a different item every time (\`benches/distinct_items.lua\`), so every body is" \
        "validated in full, as on an item's first read or after it changed."
    echo
    http_head req/s
    http_line 2k "nginx reverse proxy → backend, 2 KiB" "GET /b2k/1" nginx2k
    http_line 3k "lockstep passthrough → backend, 2 KiB" "GET /p2k/1" passthrough2k
    http_line 4k "lockstep versioned GET → backend, 2 KiB" "GET /b2k/1" versioned2k
    http_line 2a "nginx reverse proxy → backend, 64 KiB" "GET /b64k/1" nginx64k
    http_line 3a "lockstep passthrough → backend, 64 KiB" "GET /p64k/1" passthrough64k
    http_line 4a "lockstep versioned GET → backend, 64 KiB" "GET /b64k/1" versioned64k
    http_line 4f "lockstep versioned GET → backend, 64 KiB, a new item each read" "GET /v64k/<n>" versioned64kcold
    http_line 2b "nginx reverse proxy → backend, 1 MiB" "GET /b1m/1" nginx1m
    http_line 3b "lockstep passthrough → backend, 1 MiB" "GET /p1m/1" passthrough1m
    http_line 4b "lockstep versioned GET → backend, 1 MiB" "GET /b1m/1" versioned1m
    echo
    echo "| ratio | value | target | |"
    echo "|---|---:|---:|---|"
    echo "| passthrough / nginx proxy, 2 KiB (3k / 2k) | $R_PT2K | | |"
    echo "| versioned GET / nginx proxy, 2 KiB (4k / 2k) | $R_VG2K | ≥ 0.8 | $(verdict "$R_VG2K" 0.8) |"
    echo "| versioned GET / passthrough, 2 KiB (4k / 3k) | $R_VP2K | ≥ 0.6 | $(verdict "$R_VP2K" 0.6) |"
    echo "| versioned GET / nginx proxy, 64 KiB (4a / 2a) | $R_VG64 | ≥ 0.5 | $(verdict "$R_VG64" 0.5) |"
    echo "| versioned GET / passthrough, 64 KiB (4a / 3a) | $R_VP64 | ≥ 0.6 | $(verdict "$R_VP64" 0.6) |"
    echo "| versioned GET, a new item each read / nginx proxy, 64 KiB (4f / 2a) | $R_VGC64 | none | |"
    echo "| versioned GET, a new item each read / passthrough, 64 KiB (4f / 3a) | $R_VPC64 | none | |"
    echo "| versioned GET / nginx proxy, 1 MiB (4b / 2b) | $R_VG1M | trend | |"
    echo "| versioned GET / passthrough, 1 MiB (4b / 3b) | $R_VP1M | ≥ 0.6 | $(verdict "$R_VP1M" 0.6) |"
    echo "| peak RSS, lockstep versioned / nginx proxy, 64 KiB (4a / 2a) | $R_MEM64 | ≤ 2 | $(awk -v r="$R_MEM64" 'BEGIN {if (r == "n/a") print "n/a"; else if (r + 0 <= 2) print "meets"; else print "**above**"}') |"
    echo
    echo "### Conditional GET: If-None-Match naming the current version"
    echo
    echo "Both answer 304 with \`ETag: \"1\"\`. Without \`exclusive_writes\` lockstep asks the backend first" \
        "(it must learn whether the item still exists); with it, the version table answers alone."
    echo
    http_head req/s
    http_line 4c "lockstep conditional GET → backend" "GET /articles/1" conditional
    http_line 4d "lockstep conditional GET, exclusive_writes (no backend)" "GET /cached/1" conditional_table
    echo
    echo "| ratio (req/s) | value |"
    echo "|---|---:|"
    echo "| from the table / after the backend (4d / 4c) | $R_CT |"
    echo "| from the table / nginx proxy (4d / 2) | $R_CTN |"
    echo
    echo "## Locks: acquire + release pairs"
    echo
    echo "$LOCK_CLIENTS concurrent clients, each on its own resource (no contention between clients)," \
        "${DURATION} s after a ${WARMUP} s warm-up."
    echo
    echo "| # | row | pairs/s | p99 latency | failures | how |"
    echo "|---|---|---:|---:|---:|---|"
    echo "| 5 | lockstep lock API (SQLite) | $(num "${RPS[locks]}") | $(ms "${P99[locks]}") ms per request | $((FAILS[locks] + SOCKERR[locks])) | \`benches/lock_load.rs\` (one thread, a connection per client, like redis-benchmark): \`POST /locks/{r}\` → 200 then \`DELETE /locks/{r}\` → 204 on the admin listener; lockstep used ${CPU[locks]} µs of CPU per pair and lock_load ${LCPU[locks]} µs, peak RSS $(mib "${PEAK[locks]}") |"
    echo "| 6 | SQLite direct | $(num "${RPS[sqlite]}") | $(ms "${P99[sqlite]}") ms per statement | ${FAILS[sqlite]} | \`benches/sqlite_locks.py\`: lockstep's acquire and release SQL ($S_SOURCE_TEXT), a thread and a connection per client, WAL + synchronous=FULL + busy_timeout 5000; the Python process used ${CPU[sqlite]} µs of CPU per pair |"
    echo "| 7 | Redis, no persistence | $(num "${RPS[redis]}") | $(ms "${P99[redis]}") ms per request | $((FAILS[redis] + SOCKERR[redis])) | the same client with \`--protocol redis\`: \`SET bench:…:i wi NX PX 30000\` → OK, then \`EVALSHA\` of the owner-checked delete → 1, a round trip each as in row 5 (the Redis lock recipe); Redis used ${CPU[redis]} µs of CPU per pair and lock_load ${LCPU[redis]} µs |"
    echo "| 8 | Redis, appendfsync always | $(num "${RPS[redisfsync]}") | $(ms "${P99[redisfsync]}") ms per request | $((FAILS[redisfsync] + SOCKERR[redisfsync])) | as 7 with \`appendonly yes\`, \`appendfsync always\` (durable like row 5); Redis used ${CPU[redisfsync]} µs of CPU per pair and lock_load ${LCPU[redisfsync]} µs |"
    echo "| 7e | Redis, both halves in one EVAL | $(num "$R_PAIRS_S") | $(ms "$R_P99") ms per pair | n/a | redis-benchmark: one \`EVAL\` per pair (SET NX PX, then DEL if still ours), random keys, no persistence: one round trip per pair, which a lock user cannot do (its work goes between acquire and release); Redis used $R_SERVER_US µs of CPU per pair and redis-benchmark $R_CLIENT_US µs |"
    echo "| 8e | as 7e, appendfsync always | $(num "$RF_PAIRS_S") | $(ms "$RF_P99") ms per pair | n/a | Redis used $RF_SERVER_US µs of CPU per pair and redis-benchmark $RF_CLIENT_US µs |"
    echo
    echo "| ratio (pairs/s) | value | target | |"
    echo "|---|---:|---:|---|"
    echo "| lockstep / SQLite direct (5 / 6) | $R_LS | ≥ 0.5 | $(verdict "$R_LS" 0.5) |"
    echo "| lockstep / Redis (5 / 7) | $R_LR | ≥ 0.3 | $(verdict "$R_LR" 0.3) |"
    echo "| lockstep / Redis fsync always (5 / 8) | $R_LRF | none | |"
    echo "| lockstep / Redis, one EVAL per pair (5 / 7e) | $R_LRE | none | |"
    echo "| lockstep / Redis, one EVAL per pair, fsync always (5 / 8e) | $R_LREF | none | |"
    echo
    echo "## Writes: PATCH, one item per client"
    echo
    echo "$LOCK_CLIENTS concurrent clients (\`benches/lock_load.rs --protocol patch\`: one thread, a connection per client, as for the lock rows)," \
        "each PATCHing its own \`/items/<n>\` with \`{\"title\":\"bench\"}\` and the ETag of its last answer as \`If-Match\`," \
        "${DURATION} s after a ${WARMUP} s warm-up; the backend answers 200."
    echo
    http_head writes/s lock_load
    http_line 9 "nginx reverse proxy → backend (no check)" "PATCH /items/<n>" nginxpatch
    http_line 10 "lockstep versioned PATCH, If-Match (SQLite)" "PATCH /items/<n>" patch
    echo
    echo "| ratio (writes/s) | value | target | |"
    echo "|---|---:|---:|---|"
    echo "| lockstep versioned PATCH / nginx proxy PATCH (10 / 9) | $R_PATCH | ≥ 0.3 | $(verdict "$R_PATCH" 0.3) |"
    echo
    echo "Row 10 sends each client's last ETag as \`If-Match\`, so every write is checked: claimed (a conditional" \
        "\`UPDATE\`, durable), forwarded, and committed (a second durable statement), with group commit on SQLite" \
        "(\`synchronous = FULL\`). Its p99 target is 5 ms."
    echo
    echo "## Notes"
    echo
    echo "- CPU per request: CPU time used during the measured run by the process that is the last hop in" \
        "front of wrk (row 1 the nginx backend, rows 2 and 9 the nginx proxy, rows 3–4e and 10 lockstep), per request;" \
        "backend CPU per request: the same for the nginx backend behind it; wrk CPU per request: the load generator's own" \
        "(bash's \`times\` for wrk's process). Together they are the profile of each scenario: where the 2 CPUs went;" \
        "the rest is the kernel's work outside these processes (softirqs, the disk's writeback) and idle time."
    echo "- The CPU a lock pair costs in all, server and client: lockstep + lock_load $(sum_us "${CPU[locks]}" "${LCPU[locks]}") µs" \
        "(row 5), Redis + lock_load $(sum_us "${CPU[redis]}" "${LCPU[redis]}") µs (row 7) and" \
        "$(sum_us "${CPU[redisfsync]}" "${LCPU[redisfsync]}") µs (row 8), Redis + redis-benchmark $(sum_us "$R_SERVER_US" "$R_CLIENT_US") µs (row 7e) and" \
        "$(sum_us "$RF_SERVER_US" "$RF_CLIENT_US") µs (row 8e). On 2 CPUs shared by server and client, pairs/s is" \
        "bounded by 2 s over that sum: a lock row reaches a given ratio to Redis only if its whole budget, load generator" \
        "included, is at most the inverse of that ratio times Redis's."
    echo "- Peak RSS: the kernel's high-water mark (VmHWM) of that hop's processes, reset before the row's" \
        "warm-up and read after its measured run (nginx: master and workers summed; lockstep: its one process)."
    echo "- lockstep is restarted (SIGTERM, then started again on the same database) before each of its rows" \
        "(the lock row and the PATCH row included). The allocator keeps memory it once used, so without the restart a" \
        "row's peak RSS would start from what the rows before it left resident; with it, a row's peak is its own load's."
    echo "- Lock calls through lockstep that did not answer 200 / 204: ${FAILS[locks]} (statuses: $L_STATUSES);" \
        "socket errors: ${SOCKERR[locks]}. SQLite direct: ${FAILS[sqlite]} acquires or releases that returned no row or failed."
    echo "- lockstep's database after the runs: journal_mode=$DB_MODE, $DB_VERSIONS rows in \`versions\`" \
        "(versioned reads write nothing; a detect_drift read writes once per version, to record its hash), $DB_LOCKS rows in \`locks\`."
    echo "- SQLite direct runs in CPython: the GIL serialises the Python side of the $LOCK_CLIENTS clients" \
        "(the sqlite3 module releases it while SQLite works, fsync included). It uses the system SQLite $S_VERSION;" \
        "lockstep uses the SQLite bundled by sqlx (${bundled:-version unknown}) and a pool of" \
        "\`[database] max_connections\` (default 16) connections, where the direct run has $LOCK_CLIENTS."
    echo "- Both SQLite rows fsync the WAL on every commit (synchronous=FULL), two commits per pair:" \
        "on one file they are bounded by the disk's fsync rate, and their ratio is the cost of lockstep's HTTP + pool on top."
    echo "- Rows 5, 7 and 8 make two round trips per pair, as a lock user does (acquire, work, release), with one" \
        "client program; rows 7e and 8e do both halves in one round trip (redis-benchmark repeats one command)," \
        "Redis's best case. Rows 7 and 7e keep nothing on disk; 8 and 8e fsync the append-only file before replying."
    echo "- All processes share $(nproc) CPUs: the load generator competes with the servers, so absolute" \
        "numbers are lower than on separate machines; compare rows and ratios within one run."
    for n in ${NOTES[@]+"${NOTES[@]}"}; do echo "- $n"; done
} >"$OUT"
"$HERE/plot.sh" "$OUT" "$CHART" >/dev/null || die "plot.sh could not draw $CHART from $OUT"

cat "$OUT"
log "report written to $OUT, its chart to $CHART"
