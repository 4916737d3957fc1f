#!/usr/bin/env bash
# Instructions per request: lockstep's user-space work on each path, counted
# by valgrind (callgrind), and nginx's on the same proxied read.
#
# Why: the throughput rows of benches/run.sh swing by ±20 % between rounds on
# a shared 2-CPU host (steal time, other guests' caches), more than most
# single changes to the request path are worth. An instruction count does
# not depend on the host: the same binary and the same requests give the
# same count to within a fraction of a percent, so a change can be judged
# in one run (A/B: pass a second binary). What it does not see: system calls'
# kernel time, waiting, and the cost of memory traffic (a copy of many bytes
# can be a few instructions), so it complements the timed rows, never
# replaces them.
#
# Each row runs the server under callgrind twice, with N and with 3N
# sequential requests on one kept-alive connection (after 200 to warm up),
# and reports (I(3N) - I(N)) / 2N: start-up, shutdown and the warm-up cancel
# out. Every thread is counted (the proxy workers, SQLite's group commit).
#
#   benches/instructions.sh                      # target/release/lockstep
#   benches/instructions.sh path/to/other/lockstep   # A/B: the second column
#   INSTR_REQUESTS=500 INSTR_OUT=report.md benches/instructions.sh
#
# Needs valgrind, nginx, python3 and curl (installed when missing, as for
# run.sh; BENCH_SKIP_INSTALL=1 skips that), about 3 minutes per binary.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
LOG_TAG=instructions
# shellcheck source=benches/common.sh
source "$HERE/common.sh"

N=${INSTR_REQUESTS:-1000}
[[ $N =~ ^[0-9]+$ && $N -ge 50 ]] || die "INSTR_REQUESTS must be a number ≥ 50"
OTHER=${1:-}
[[ -z $OTHER || -x $OTHER ]] || die "not an executable: $OTHER"

require_tools valgrind callgrind_annotate nginx python3 curl
build_lockstep

make_tmp lockstep-instructions
read -r P_BACKEND P_PROXY P_LOCKSTEP P_ADMIN < <(free_ports 4)

# /p2k/1: a 2 KiB JSON file, served as nginx serves files (with ETag,
# Last-Modified and Accept-Ranges), for the 2 KiB passthrough row.
mkdir -p "$TMP/www/p2k"
python3 -c 'import json, sys; sys.stdout.write(json.dumps({"id": "1", "pad": "x" * 2020}))' >"$TMP/www/p2k/1"
nginx_small_backend "$P_BACKEND" "location /p2k/ { root $TMP/www; }" | nginx_conf nginx-backend
{
    nginx_upstream "$P_BACKEND"
    nginx_proxy_server "$P_PROXY"
} | nginx_conf nginx-proxy
start nginx-backend nginx -e "$TMP/nginx-backend/error.log" -p "$TMP/nginx-backend" -c "$TMP/nginx-backend/nginx.conf"
wait_http nginx-backend "$LAST_PID" "http://127.0.0.1:$P_BACKEND/"

{
    lockstep_conf_head "sqlite://$TMP/bench.db"
    cat <<EOF

[log]
level = "warn"

[[resources]]
pattern = "/articles/{id}"

[[resources]]
pattern = "/items/{id}"
EOF
} >"$TMP/lockstep.toml"

# The client: COUNT requests of KIND, one after another on one connection;
# a PATCH sends the ETag of the previous answer as If-Match (a checked
# write), a lock "request" is a pair (acquire, then release by its owner,
# on the admin listener), and any other answer than 200 (204 for a
# release) stops the measurement.
cat >"$TMP/client.py" <<'EOF'
import http.client, sys
port, kind, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
etag = None
for _ in range(count):
    if kind == "passthrough":
        conn.request("GET", "/plain/1")
    elif kind == "passthrough2k":
        conn.request("GET", "/p2k/1")
    elif kind == "read":
        conn.request("GET", "/articles/1")
    elif kind == "lock":
        conn.request("POST", "/locks/instructions", body='{"owner":"w","ttl_ms":30000}',
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            sys.exit(f"lock acquire: answered {resp.status}")
        conn.request("DELETE", "/locks/instructions", headers={"Lock-Owner": "w"})
    else:
        headers = {"Content-Type": "application/json"}
        if etag:
            headers["If-Match"] = etag
        conn.request("PATCH", "/items/instructions", body='{"title":"bench"}', headers=headers)
    resp = conn.getresponse()
    resp.read()
    if resp.status != (204 if kind == "lock" else 200):
        sys.exit(f"{kind}: answered {resp.status}")
    etag = resp.getheader("ETag")
EOF

# Servers started by count run in its command substitution's subshell, out
# of cleanup's sight: their pids go to a file, which this stops on any exit.
cleanup_hook() {
    [[ -f $TMP/counted.pids ]] || return 0
    while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done <"$TMP/counted.pids"
}

# count SERVER KIND REQUESTS: the instructions the server (every thread)
# executed, from start to exit, serving 200 + REQUESTS requests of KIND.
# SERVER is "nginx" or a lockstep binary.
count() {
    local server=$1 kind=$2 requests=$3 out=$TMP/callgrind.$RANDOM pid port
    if [[ $server == nginx ]]; then
        port=$P_PROXY
        start nginx-proxy valgrind --tool=callgrind --callgrind-out-file="$out" \
            nginx -e "$TMP/nginx-proxy/error.log" -p "$TMP/nginx-proxy" -c "$TMP/nginx-proxy/nginx.conf" \
            -g 'master_process off;'
        pid=$LAST_PID
        echo "$pid" >>"$TMP/counted.pids"
        wait_http nginx-proxy "$pid" "http://127.0.0.1:$P_PROXY/"
    else
        port=$P_LOCKSTEP
        [[ $kind == lock ]] && port=$P_ADMIN
        rm -f "$TMP/bench.db" "$TMP/bench.db-wal" "$TMP/bench.db-shm"
        start lockstep valgrind --tool=callgrind --callgrind-out-file="$out" \
            "$server" serve --config "$TMP/lockstep.toml"
        pid=$LAST_PID
        echo "$pid" >>"$TMP/counted.pids"
        wait_http lockstep "$pid" "http://127.0.0.1:$P_ADMIN/readyz"
    fi
    python3 "$TMP/client.py" "$port" "$kind" 200 || die "$kind warm-up failed"
    python3 "$TMP/client.py" "$port" "$kind" "$requests" || die "$kind run failed"
    kill -TERM "$pid"
    for _ in $(seq 1 300); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && die "$server did not exit within 30 s of SIGTERM"
    wait "$pid" 2>/dev/null || true
    # One file per process; its summary line counts every thread.
    awk '/^summary:/ { print $2 }' "$out"
}

# per_request SERVER KIND: instructions per request, as the header explains.
per_request() {
    local small large
    small=$(count "$1" "$2" "$N")
    large=$(count "$1" "$2" $((3 * N)))
    python3 -c "print(round(($large - $small) / (2 * $N)))"
}

declare -A A B
log "counting $LOCKSTEP, $N and $((3 * N)) requests per row"
for kind in passthrough passthrough2k read patch lock; do
    A[$kind]=$(per_request "$LOCKSTEP" "$kind")
    log "$kind: ${A[$kind]} instructions per request"
    if [[ -n $OTHER ]]; then
        B[$kind]=$(per_request "$OTHER" "$kind")
        log "$kind (B): ${B[$kind]} instructions per request"
    fi
done
declare -A NGINX
for kind in passthrough passthrough2k; do
    NGINX[$kind]=$(per_request nginx "$kind")
    log "nginx proxy, $kind: ${NGINX[$kind]} instructions per request"
done

report() {
    echo "# Instructions per request"
    echo
    echo "$(date -u +%Y-%m-%d), $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)," \
        "callgrind, $N and $((3 * N)) sequential requests on one connection, every thread counted" \
        "(benches/instructions.sh). Kernel time is not in these numbers."
    echo
    if [[ -n $OTHER ]]; then
        echo "| row | request | A: $LOCKSTEP | B: $OTHER | B / A |"
        echo "|---|---|---:|---:|---:|"
    else
        echo "| row | request | lockstep | nginx proxy |"
        echo "|---|---|---:|---:|"
    fi
    local kind request
    for kind in passthrough passthrough2k read patch lock; do
        case $kind in
        passthrough) request="GET /plain/1 (31 B)" ;;
        passthrough2k) request="GET /p2k/1 (a 2 KiB file)" ;;
        read) request="versioned GET /articles/1" ;;
        patch) request="checked PATCH /items/… with If-Match (SQLite)" ;;
        lock) request="lock acquire + release, one pair (SQLite)" ;;
        esac
        if [[ -n $OTHER ]]; then
            echo "| $kind | $request | ${A[$kind]} | ${B[$kind]} | $(python3 -c "print(f'{${B[$kind]} / ${A[$kind]}:.3f}')") |"
        elif [[ -n ${NGINX[$kind]:-} ]]; then
            echo "| $kind | $request | ${A[$kind]} | ${NGINX[$kind]} |"
        else
            echo "| $kind | $request | ${A[$kind]} | |"
        fi
    done
    if [[ -n $OTHER ]]; then
        echo
        echo "nginx proxying the same GET /plain/1: ${NGINX[passthrough]} instructions per request;" \
            "GET /p2k/1: ${NGINX[passthrough2k]}."
    fi
}
if [[ -n ${INSTR_OUT:-} ]]; then
    report | tee "$INSTR_OUT"
else
    report
fi
