#!/usr/bin/env bash
# User and kernel time per request, and the system calls behind the kernel
# time: lockstep's on the passthrough read, the checked PATCH and the lock
# pair, and its peers' on the same loads (nginx proxying the read and the
# PATCH, Redis running the lock recipe).
#
# Why: callgrind (benches/instructions.sh) counts user-space instructions
# only, yet under load about half of lockstep's CPU per request is spent in
# the kernel. This splits each server's CPU time into user and system time
# (from /proc, an untraced run) and counts the system calls it makes per
# request (strace -c, a second, traced run: counts only, as tracing slows
# every call). The load is the benchmark's: wrk -t2 -c64 for the reads (31 B,
# and a 2 KiB file), wrk -t32 -c32 with patch_items.lua for the PATCH,
# lock_load with 32 clients for the pairs, all on 127.0.0.1.
#
#   benches/kernel.sh                      # target/release/lockstep
#   KERNEL_OUT=report.md KERNEL_SECONDS=8 benches/kernel.sh
#
# Needs nginx, redis-server, wrk, strace, python3 and curl (installed when
# missing, as for run.sh; BENCH_SKIP_INSTALL=1 skips that), and the release
# binaries of lockstep and lock_load (built unless BENCH_SKIP_BUILD=1).
# About two minutes.
# shellcheck source=benches/common.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
LOG_TAG=kernel
source "$HERE/common.sh"

SECONDS_RUN=${KERNEL_SECONDS:-5}
OUT=${KERNEL_OUT:-/dev/stdout}

require_tools nginx redis-server wrk strace python3 curl
build_lockstep

make_tmp lockstep-kernel
read -r P_BACKEND P_PROXY P_LOCKSTEP P_ADMIN P_REDIS < <(free_ports 5)

# /p2k/1: a 2 KiB JSON file, served as nginx serves files (with ETag,
# Last-Modified and Accept-Ranges), for the 2 KiB passthrough rows.
mkdir -p "$TMP/www/p2k"
python3 -c 'import json, sys; sys.stdout.write(json.dumps({"id": "1", "pad": "x" * 2020}))' >"$TMP/www/p2k/1"
nginx_small_backend "$P_BACKEND" "location /p2k/ { root $TMP/www; }" | nginx_conf nginx-backend
{
    nginx_upstream "$P_BACKEND"
    nginx_proxy_server "$P_PROXY"
} | nginx_conf nginx-proxy
lockstep_items_conf "sqlite://$TMP/bench.db" >"$TMP/lockstep.toml"

start nginx-backend nginx -e "$TMP/nginx-backend/error.log" -p "$TMP/nginx-backend" -c "$TMP/nginx-backend/nginx.conf"
wait_http nginx-backend "$LAST_PID" "http://127.0.0.1:$P_BACKEND/"
start nginx-proxy nginx -e "$TMP/nginx-proxy/error.log" -p "$TMP/nginx-proxy" -c "$TMP/nginx-proxy/nginx.conf"
PROXY_GROUP=$LAST_PID
wait_http nginx-proxy "$LAST_PID" "http://127.0.0.1:$P_PROXY/"
mkdir -p "$TMP/redis"
start redis redis-server --bind 127.0.0.1 --port "$P_REDIS" --dir "$TMP/redis" \
    --save "" --appendonly no --daemonize no --protected-mode yes
REDIS_GROUP=$LAST_PID
wait_redis redis "$REDIS_GROUP" "$P_REDIS"

# load KIND SECONDS: one run of KIND's load; prints the requests it completed
# (pairs for the lock loads).
load() {
    local kind=$1 secs=$2 out=$TMP/load.txt
    case $kind in
    read-lockstep | read-nginx | read2k-lockstep | read2k-nginx)
        local port=$P_LOCKSTEP path=/plain/1
        [[ $kind == *-nginx ]] && port=$P_PROXY
        [[ $kind == read2k-* ]] && path=/p2k/1
        wrk -t2 -c64 -d"$secs" "http://127.0.0.1:$port$path" >"$out"
        awk '/requests in/ {print $1}' "$out"
        ;;
    patch-lockstep | patch-nginx)
        local port=$P_LOCKSTEP
        [[ $kind == patch-nginx ]] && port=$P_PROXY
        PATCH_IF_MATCH=1 wrk -t32 -c32 -d"$secs" -s "$HERE/patch_items.lua" "http://127.0.0.1:$port" >"$out" 2>&1
        local line
        line=$(grep '^PATCHES ' "$out") || die "$kind: patch_items.lua printed no summary"
        [[ $(kv "$line" bad) == 0 ]] || die "$kind: failed writes: $line"
        kv "$line" ok
        ;;
    lock-lockstep | lock-redis)
        local args=(--addr "127.0.0.1:$P_ADMIN")
        [[ $kind == lock-redis ]] && args=(--addr "127.0.0.1:$P_REDIS" --protocol redis)
        RUN=$((RUN + 1))
        timeout 60 "$LOCK_LOAD" "${args[@]}" --clients 32 --seconds "$secs" --run "k$RUN" >"$out" 2>&1 ||
            die "$kind: lock_load failed: $(tail -3 "$out")"
        local line
        line=$(grep '^LOCKS ' "$out") || die "$kind: lock_load printed no summary"
        kv "$line" pairs
        ;;
    esac
}
RUN=0

ROWS=()
# measure KIND PGID LABEL: warm-up, an untraced run for user/sys time, and a
# traced run for the system calls.
measure() {
    local kind=$1 group=$2 label=$3 before after n traced pids=()
    log "$kind: warm-up, ${SECONDS_RUN}s untraced, 3s under strace"
    load "$kind" 2 >/dev/null
    before=$(group_user_sys "$group")
    n=$(load "$kind" "$SECONDS_RUN")
    after=$(group_user_sys "$group")
    local times
    times=$(awk -v a="$before" -v b="$after" -v n="$n" -v hz="$CLK_TCK" -v s="$SECONDS_RUN" 'BEGIN {
        split(a, x, " "); split(b, y, " ");
        printf "%.0f | %.1f | %.1f", n / s, (y[1] - x[1]) * 1e6 / hz / n, (y[2] - x[2]) * 1e6 / hz / n }')
    mapfile -t pids < <(pgrep -g "$group")
    strace -c -f -o "$TMP/strace-$kind.txt" "${pids[@]/#/-p}" 2>/dev/null &
    local tracer=$!
    sleep 0.5
    traced=$(load "$kind" 3)
    kill -INT "$tracer" 2>/dev/null || true
    wait "$tracer" 2>/dev/null || true
    local calls
    calls=$(awk -v n="$traced" '$4 ~ /^[0-9]+$/ && $NF != "total" {
            printf "%s %.2f\n", $NF, $4 / n }' "$TMP/strace-$kind.txt" |
        sort -k2 -rn | awk '$2 >= 0.01 {printf "%s`%s` %s", sep, $1, $2; sep = ", "}')
    ROWS+=("| $label | $times | ${calls:-none} |")
}

start_lockstep
LOCKSTEP_GROUP=$LOCKSTEP_PID
# A checked PATCH must answer 200 with an ETag, else the row measures nothing.
code=$(curl -s -o /dev/null -w '%{http_code}' -X PATCH -H 'Content-Type: application/json' \
    --data '{"title":"x"}' "http://127.0.0.1:$P_LOCKSTEP/items/sanity")
[[ $code == 200 ]] || die "PATCH /items/sanity through lockstep answered $code"

measure read-lockstep "$LOCKSTEP_GROUP" "lockstep, passthrough GET 31 B"
measure read-nginx "$PROXY_GROUP" "nginx proxy, the same GET"
measure read2k-lockstep "$LOCKSTEP_GROUP" "lockstep, passthrough GET 2 KiB"
measure read2k-nginx "$PROXY_GROUP" "nginx proxy, the same GET"
measure patch-lockstep "$LOCKSTEP_GROUP" "lockstep, checked PATCH (SQLite)"
measure patch-nginx "$PROXY_GROUP" "nginx proxy, the same PATCH"
measure lock-lockstep "$LOCKSTEP_GROUP" "lockstep, lock acquire + release (SQLite)"
measure lock-redis "$REDIS_GROUP" "Redis, the lock recipe (SET NX PX + EVALSHA)"
stop_lockstep

{
    echo "# User and kernel time per request"
    echo
    echo "$(date -u +%F), $(lockstep_commit), benches/kernel.sh: ${SECONDS_RUN} s untraced per row for the times" \
        "(the server's processes, from /proc), then 3 s under \`strace -c -f\` for the calls (counts per request;" \
        "the traced run is slower, its counts are not). Peers' rows count their own processes only" \
        "(nginx: master and workers; the backend and the load generators are not in any row)."
    echo
    echo "| server, load | requests/s | user µs | kernel µs | system calls per request (at least 0.01) |"
    echo "|---|---:|---:|---:|---|"
    printf '%s\n' "${ROWS[@]}"
} >"$OUT"
