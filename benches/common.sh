# shellcheck shell=bash
# Shell helpers shared by benches/run.sh, benches/postgres.sh and
# benches/log_cost.sh; sourced, not run. It holds what the scripts do alike:
# logging (log/die, tagged with $LOG_TAG), installing missing Debian packages,
# building and finding the lockstep binary, the temp dir with its EXIT cleanup
# of the servers started, starting servers (nginx_conf, nginx_upstream,
# nginx_proxy_server, start, free_ports,
# wait_http, lockstep_conf_head, start_lockstep, stop_lockstep,
# restart_lockstep), the lock API
# sanity check, report notes, the idle-CPU probe, and the small number and
# output parsers (kv, num, ratio, verdict, wrk_sockerr). What only one script
# needs stays in that script.
#
# The sourcing script sets LOG_TAG before calling log, and may define
# cleanup_hook, which cleanup runs after the servers are stopped and before the
# temp dir goes. It runs under the script's `set -euo pipefail`.

log() { printf '[%s] %s\n' "$LOG_TAG" "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# ---------------------------------------------------------------- tools ----

# install_pkgs PKG...: installs the Debian packages given (none: nothing to do);
# NGINX stands for nginx-light when the archive has it, else nginx.
install_pkgs() {
    local pkgs=("$@") nginx_pkg=nginx
    ((${#pkgs[@]} == 0)) && return 0
    [[ ${BENCH_SKIP_INSTALL:-0} == 1 ]] && die "missing tools (${pkgs[*]}) and BENCH_SKIP_INSTALL=1"
    command -v apt-get >/dev/null || die "missing tools (${pkgs[*]}) and no apt-get to install them"
    local sudo=()
    if ((EUID != 0)); then
        command -v sudo >/dev/null || die "missing tools (${pkgs[*]}); run as root or install them"
        sudo=(sudo)
    fi
    log "installing from Debian: ${pkgs[*]}"
    "${sudo[@]}" apt-get update -qq >&2
    # nginx-light (Debian <= 12) is the smallest build with what is needed here.
    if apt-cache policy nginx-light 2>/dev/null | grep -q 'Candidate: [0-9]'; then
        nginx_pkg=nginx-light
    fi
    pkgs=("${pkgs[@]/NGINX/$nginx_pkg}")
    # In containers policy-rc.d keeps the packaged services from starting;
    # nothing here uses them: every server is started on its own ports.
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >&2
}

# require_tools COMMAND...: installs the Debian package named after each
# missing command (nginx as install_pkgs picks it), then checks them all.
require_tools() {
    local tool missing=()
    for tool in "$@"; do
        command -v "$tool" >/dev/null || missing+=("${tool/#nginx/NGINX}")
    done
    ((${#missing[@]} == 0)) || install_pkgs "${missing[@]}"
    for tool in "$@"; do
        command -v "$tool" >/dev/null || die "$tool is missing"
    done
}

# build_lockstep: cargo build --release (unless BENCH_SKIP_BUILD=1), with the
# lock rows' load generator (benches/lock_load.rs); sets LOCKSTEP and
# LOCK_LOAD to the binaries.
build_lockstep() {
    local target_dir
    if [[ ${BENCH_SKIP_BUILD:-0} != 1 ]]; then
        log "cargo build --release (lockstep and the lock_load example)"
        (cd "$ROOT" && cargo build --release --bin lockstep --example lock_load >&2)
    fi
    target_dir=${CARGO_TARGET_DIR:-$ROOT/target}
    [[ $target_dir == /* ]] || target_dir=$ROOT/$target_dir
    LOCKSTEP=$target_dir/release/lockstep
    LOCK_LOAD=$target_dir/release/examples/lock_load
    [[ -x $LOCKSTEP ]] || die "no lockstep binary at $LOCKSTEP"
    [[ -x $LOCK_LOAD ]] || die "no lock_load binary at $LOCK_LOAD (cargo build --release --example lock_load)"
    # Flush what the build wrote, or its write-back slows the fsync-bound rows.
    sync
}

# ------------------------------------------------------ temp dir, cleanup ----

# make_tmp NAME: creates TMP (readable by nginx workers and the postgres user,
# which drop root), empties PIDS and sets the traps that run cleanup.
make_tmp() {
    TMP=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
    chmod 755 "$TMP"
    PIDS=()
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

cleanup() {
    local rc=$? pid
    trap - EXIT INT TERM
    # Each server was started as its own process group (setsid): signal the
    # group so nginx workers go with their master.
    for pid in ${PIDS[@]+"${PIDS[@]}"}; do
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in ${PIDS[@]+"${PIDS[@]}"}; do
        for _ in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL -- "-$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    if declare -F cleanup_hook >/dev/null; then
        cleanup_hook
    fi
    if [[ ${BENCH_KEEP_TMP:-0} == 1 ]]; then
        log "kept $TMP"
    else
        rm -rf "$TMP"
    fi
    exit "$rc"
}

# --------------------------------------------------------------- servers ----

# nginx_conf NAME: writes $TMP/NAME/nginx.conf, a foreground nginx with its
# files under $TMP/NAME, no access log, and the http{} body read from stdin.
nginx_conf() {
    local dir=$TMP/$1
    mkdir -p "$dir/tmp"
    {
        cat <<EOF
worker_processes auto;
daemon off;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $dir/tmp/body;
    proxy_temp_path $dir/tmp/proxy;
    fastcgi_temp_path $dir/tmp/fastcgi;
    uwsgi_temp_path $dir/tmp/uwsgi;
    scgi_temp_path $dir/tmp/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 60s;
EOF
        cat
        echo "}"
    } >"$dir/nginx.conf"
}

# nginx_upstream PORT: an http{} upstream "backend" on 127.0.0.1:PORT, with
# kept-alive connections (for nginx_conf's stdin).
nginx_upstream() {
    cat <<EOF
    upstream backend {
        server 127.0.0.1:$1;
        keepalive 64;
        keepalive_requests 1000000;
    }
EOF
}

# nginx_small_backend PORT [DIRECTIVE]: a server on 127.0.0.1:PORT answering
# every path with the benchmark's small JSON object (31 B); DIRECTIVE (say a
# location serving files) goes into the server block.
nginx_small_backend() {
    cat <<EOF
    server {
        listen 127.0.0.1:$1;
        default_type application/json;
        location / { return 200 '{"id":"1","title":"hello"}'; }
        ${2:-}
    }
EOF
}

# nginx_proxy_server PORT [DIRECTIVE]: a server on 127.0.0.1:PORT proxying
# everything to "backend" over HTTP/1.1 keep-alive; DIRECTIVE (say an
# access_log line) goes into the server block.
nginx_proxy_server() {
    cat <<EOF
    server {
        listen 127.0.0.1:$1;
        ${2:-}
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
EOF
}

# start NAME CMD... : runs CMD in its own session, logs to $TMP/NAME.log
start() {
    local name=$1
    shift
    setsid "$@" >>"$TMP/$name.log" 2>&1 </dev/null &
    PIDS+=("$!")
    LAST_PID=$!
}

free_ports() {
    python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# wait_http NAME PID URL: until URL answers 200 (30 s)
wait_http() {
    local name=$1 pid=$2 url=$3 code
    for _ in $(seq 1 300); do
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$url" || true)
        [[ $code == 200 ]] && return 0
        kill -0 "$pid" 2>/dev/null || {
            tail -20 "$TMP/$name.log" >&2 || true
            die "$name exited during start-up"
        }
        sleep 0.1
    done
    tail -20 "$TMP/$name.log" >&2 || true
    die "$name not ready at $url after 30 s"
}

# lockstep_conf_head DATABASE_URL: the [server], [upstream] and [database]
# sections every benchmark's lockstep.toml starts with (listeners on
# P_LOCKSTEP and P_ADMIN, the backend on P_BACKEND), on stdout; the script
# adds its own [log] and [[resources]].
lockstep_conf_head() {
    cat <<EOF
[server]
listen = "127.0.0.1:$P_LOCKSTEP"
admin_listen = "127.0.0.1:$P_ADMIN"
drain_timeout_ms = 2000

[upstream]
url = "http://127.0.0.1:$P_BACKEND"

[database]
url = "$1"
EOF
}

# lockstep_items_conf DATABASE_URL: a whole config, lockstep_conf_head's
# plus warn-level logs and one versioned route, /items/{id} (the PATCH rows).
lockstep_items_conf() {
    lockstep_conf_head "$1"
    cat <<EOF

[log]
level = "warn"

[[resources]]
pattern = "/items/{id}"
EOF
}

# start_lockstep: checks and serves $TMP/lockstep.toml, sets LOCKSTEP_PID and
# waits for /readyz on the admin port $P_ADMIN.
start_lockstep() {
    local var
    # The environment must not override the benchmark's configuration.
    while read -r var; do unset "$var"; done < <(compgen -e | grep '^LOCKSTEP_' || true)
    "$LOCKSTEP" check-config --config "$TMP/lockstep.toml" >&2 || die "lockstep rejected the benchmark config"
    start lockstep "$LOCKSTEP" serve --config "$TMP/lockstep.toml"
    LOCKSTEP_PID=$LAST_PID
    wait_http lockstep "$LOCKSTEP_PID" "http://127.0.0.1:$P_ADMIN/readyz"
}

# stop_lockstep: SIGTERM (a drained exit), waited for up to 10 s; nothing to
# do when none runs.
stop_lockstep() {
    [[ -n ${LOCKSTEP_PID:-} ]] || return 0
    kill -TERM "$LOCKSTEP_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$LOCKSTEP_PID" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$LOCKSTEP_PID" 2>/dev/null && die "lockstep did not exit within 10 s of SIGTERM"
    wait "$LOCKSTEP_PID" 2>/dev/null || true
    LOCKSTEP_PID=
}

# restart_lockstep: stops lockstep and starts it again on the same database
# and ports, so the next rows run in a fresh process: their peak RSS is then
# their own load's, not what earlier rows left in the allocator.
restart_lockstep() {
    stop_lockstep
    start_lockstep
}

# check_lock_api: one acquire (200) + release (204) on the admin listener.
check_lock_api() {
    local code
    code=$(curl -s -o "$TMP/check-lock.json" -w '%{http_code}' --max-time 5 -X POST \
        -H 'Content-Type: application/json' -d "{\"owner\":\"w0\",\"ttl_ms\":$LOCK_TTL_MS}" \
        "http://127.0.0.1:$P_ADMIN/locks/bench:sanity")
    [[ $code == 200 ]] || die "lock acquire answered $code: $(cat "$TMP/check-lock.json")"
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X DELETE -H 'Lock-Owner: w0' \
        "http://127.0.0.1:$P_ADMIN/locks/bench:sanity")
    [[ $code == 204 ]] || die "lock release answered $code"
}

# ---------------------------------------------------------------- notes ----

NOTES=()
note() { NOTES+=("$*"); }

# note_lockstep_log: a note per lockstep warning or error logged during the
# runs, grouped by message (the five most frequent), and one if it exited.
note_lockstep_log() {
    local count msg
    kill -0 "$LOCKSTEP_PID" 2>/dev/null || note "**lockstep exited during the run**; see its log."
    while read -r count msg; do
        note "lockstep logged $count × \`$msg\`"
    done < <(sed 's/\x1b\[[0-9;]*m//g' "$TMP/lockstep.log" |
        awk '$2 == "WARN" || $2 == "ERROR" {
                 line = $0; sub(/^[^ ]+ +/, "", line)
                 sub(/ [a-z_.]+=.*$/, "", line); print substr(line, 1, 100)
             }' | sort | uniq -c | sort -rn | head -5)
}

# lockstep_commit: the short commit, marked when src/ or the manifests differ
lockstep_commit() {
    local commit
    commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
    [[ -n $(git -C "$ROOT" status --porcelain -- src migrations Cargo.toml Cargo.lock 2>/dev/null) ]] &&
        commit="$commit + uncommitted changes"
    echo "$commit"
}

# ------------------------------------------------------------ measuring ----

# cpu_busy: % of CPU time used by anything over one second, while nothing of
# ours runs; other work on the machine skews every row.
cpu_busy() {
    local a b
    a=$(awk '/^cpu / {print $2 + $3 + $4 + $7 + $8, $5 + $6}' /proc/stat 2>/dev/null) || {
        echo "?"
        return 0
    }
    sleep 1
    b=$(awk '/^cpu / {print $2 + $3 + $4 + $7 + $8, $5 + $6}' /proc/stat)
    awk -v a="$a" -v b="$b" 'BEGIN {split(a, x, " "); split(b, y, " ");
        busy = y[1] - x[1]; idle = y[2] - x[2];
        printf "%.0f", (busy + idle > 0 ? 100 * busy / (busy + idle) : 0)}'
}

kv() { # kv LINE KEY: the value of KEY=value in LINE
    local pair
    for pair in $1; do
        [[ $pair == "$2="* ]] && {
            printf '%s\n' "${pair#*=}"
            return 0
        }
    done
    echo "n/a"
}

# wrk_sockerr FILE: socket errors (connect + read + write + timeout) in wrk's output
wrk_sockerr() {
    awk '/Socket errors:/ {gsub(/,/, ""); s = $4 + $6 + $8 + $10; f=1} END {print f ? s : 0}' "$1"
}

# Number formatting for the reports.
num() { awk -v v="$1" 'BEGIN {if (v ~ /^[0-9.]+$/) printf "%.0f", v; else print v}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && b > 0) printf "%.2f", a / b; else print "n/a"}'; }
verdict() { awk -v r="$1" -v t="$2" 'BEGIN {if (r == "n/a") print "n/a"; else if (r + 0 >= t + 0) print "meets"; else print "**below**"}'; }

CLK_TCK=$(getconf CLK_TCK)
# group_user_sys PGID: "USER SYSTEM", the CPU time (clock ticks) used so far
# by the processes of a process group; every server runs as its own group.
group_user_sys() {
    local pid t u=0 s=0
    for pid in $(pgrep -g "$1"); do
        t=$(awk '{sub(/^.*\) /, ""); print $12, $13}' "/proc/$pid/stat" 2>/dev/null) || continue
        [[ -n $t ]] || continue
        u=$((u + ${t% *}))
        s=$((s + ${t#* }))
    done
    echo "$u $s"
}

# group_ticks PGID: the same, user + system in one number.
group_ticks() {
    local t
    t=$(group_user_sys "$1")
    echo $((${t% *} + ${t#* }))
}

# wait_redis NAME PID PORT: waits (up to 30 s) for the Redis server NAME,
# started as PID, to answer PING on PORT.
wait_redis() {
    local name=$1 pid=$2 port=$3
    for _ in $(seq 1 300); do
        [[ $(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null || true) == PONG ]] && return 0
        kill -0 "$pid" 2>/dev/null || {
            tail -20 "$TMP/$name.log" >&2 || true
            die "$name exited during start-up"
        }
        sleep 0.1
    done
    die "$name not ready on port $port after 30 s"
}

# child_us FILE: the CPU time (user + system, µs) of a subshell's children,
# from the second line of bash's `times` output written to FILE.
child_us() {
    awk 'NR == 2 {
        t = 0
        for (i = 1; i <= 2; i++) { split($i, a, "m"); sub(/s$/, "", a[2]); t += a[1] * 60 + a[2] }
        printf "%.0f\n", t * 1000000; f = 1
    } END { if (!f) print 0 }' "$1"
}

# timed_client NAME OUT COMMAND...: runs a load generator with its output in
# OUT and sets LOAD_US to the CPU time (µs) it used (bash's `times` for the
# subshell's children); returns the command's status.
timed_client() {
    local name=$1 out=$2 rc=0
    shift 2
    (
        "$@" >"$out" 2>&1
        rc=$?
        times >"$TMP/times-$name.txt"
        exit $rc
    ) || rc=$?
    LOAD_US=$(child_us "$TMP/times-$name.txt")
    return $rc
}

# lock_load_run NAME ADDR CLIENTS [ARGS…]: benches/lock_load.rs (ARGS passed
# on, e.g. --protocol redis), a warm-up of WARMUP s
# (when > 0), then a measured run of DURATION s into $TMP/lock-NAME.txt
# (its LOCKS or PATCHES line); sets LOAD_US to the CPU time (µs) the load
# generator used in the measured run. With CPU_GROUP set, sets CPU_US to
# that process group's CPU time in the same run, and with BACKEND_GROUP set,
# BACKEND_US to the backend's.
lock_load_run() {
    local name=$1 addr=$2 clients=$3 before backend_before
    shift 3
    local extra=("$@")
    # ll PHASE SECONDS OUT: one lock_load run, its resources named after PHASE.
    ll() {
        timed_client "$name" "$3" timeout 60 "$LOCK_LOAD" --addr "$addr" --clients "$clients" \
            --seconds "$2" --run "$1-$name" --ttl-ms "$LOCK_TTL_MS" ${extra[@]+"${extra[@]}"} ||
            die "$name: lock_load ($1) failed: $(tail -5 "$3")"
    }
    if ((WARMUP > 0)); then
        log "$name: warm-up ${WARMUP}s"
        ll warmup "$WARMUP" "$TMP/warm-$name.txt"
    fi
    log "$name: lock_load --clients $clients --seconds $DURATION, $addr"
    [[ -n ${CPU_GROUP:-} ]] && before=$(group_ticks "$CPU_GROUP")
    [[ -n ${BACKEND_GROUP:-} ]] && backend_before=$(group_ticks "$BACKEND_GROUP")
    ll measure "$DURATION" "$TMP/lock-$name.txt"
    CPU_US=0
    BACKEND_US=0
    [[ -n ${CPU_GROUP:-} ]] && CPU_US=$((($(group_ticks "$CPU_GROUP") - before) * 1000000 / CLK_TCK))
    [[ -n ${BACKEND_GROUP:-} ]] &&
        BACKEND_US=$((($(group_ticks "$BACKEND_GROUP") - backend_before) * 1000000 / CLK_TCK))
    return 0
}
