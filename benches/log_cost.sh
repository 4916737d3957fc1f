#!/usr/bin/env bash
# What logging costs, lockstep beside nginx, on 127.0.0.1 only:
#
#   benches/log_cost.sh
#
# One load, 31 B GET passthrough over keep-alive (wrk), through:
#   nginx as a reverse proxy, access_log off      (benches/run.sh's peer)
#   nginx as a reverse proxy, its default access log (combined format, a
#                                                  write(2) per request, to a file)
#   lockstep, log.level = "warn"                   (benches/run.sh's setting)
#   lockstep, level = "info", access_log = false
#   lockstep, the shipped [log] defaults           (info, an access line per request)
#   lockstep, the defaults with format = "json"    (the Helm chart's [log])
# Log output goes to files in the temp dir (lockstep's stderr, nginx's
# access.log), emptied between runs. Each round runs every configuration
# once, interleaved, lockstep restarted for each; the report gives each
# row's median round: requests/s, p99, and CPU time per request (lockstep:
# its process; nginx: master and workers summed), as Markdown on stdout and
# in BENCH_OUT.
#
# Environment:
#   BENCH_DURATION=5      seconds per measured run (1..30)
#   BENCH_WARMUP=1        seconds of warm-up before each (0..10)
#   BENCH_CONNECTIONS=32  wrk connections
#   BENCH_THREADS=2       wrk threads
#   BENCH_ROUNDS=3        rounds (1..9)
#   BENCH_SKIP_BUILD=1    use the existing target/release/lockstep
#   BENCH_SKIP_INSTALL=1  never call apt-get
#   BENCH_KEEP_TMP=1      keep the temp dir
#   BENCH_OUT=FILE        default benches/results/log-cost-latest.md
#
# Needs: nginx, wrk, curl, python3 (installed from Debian when missing), cargo.

set -euo pipefail

LOG_TAG=log-cost
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)

DURATION=${BENCH_DURATION:-5}
WARMUP=${BENCH_WARMUP:-1}
CONNECTIONS=${BENCH_CONNECTIONS:-32}
THREADS=${BENCH_THREADS:-2}
ROUNDS=${BENCH_ROUNDS:-3}
OUT=${BENCH_OUT:-$HERE/results/log-cost-latest.md}
[[ $DURATION =~ ^[0-9]+$ ]] && ((DURATION >= 1 && DURATION <= 30)) || die "BENCH_DURATION must be 1..30"
[[ $WARMUP =~ ^[0-9]+$ ]] && ((WARMUP <= 10)) || die "BENCH_WARMUP must be 0..10"
[[ $ROUNDS =~ ^[0-9]+$ ]] && ((ROUNDS >= 1 && ROUNDS <= 9)) || die "BENCH_ROUNDS must be 1..9"

missing=()
command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || missing+=(NGINX)
command -v wrk >/dev/null || missing+=(wrk)
command -v curl >/dev/null || missing+=(curl)
install_pkgs ${missing[@]+"${missing[@]}"}
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

build_lockstep
make_tmp lockstep-log-cost
read -r P_BACKEND P_PROXY P_PROXY_LOG P_LOCKSTEP P_ADMIN < <(free_ports 5)

# ------------------------------------------------------------ servers ----


nginx_conf backend <<EOF
    server {
        listen 127.0.0.1:$P_BACKEND;
        default_type application/json;
        location / { return 200 '{"id":"1","title":"hello","n":1}'; }
    }
EOF

# Two proxies in one nginx: the same proxying, without and with a log.
NGINX_ACCESS_LOG=$TMP/nginx-access.log
{
    nginx_upstream "$P_BACKEND"
    nginx_proxy_server "$P_PROXY"
    nginx_proxy_server "$P_PROXY_LOG" "access_log $NGINX_ACCESS_LOG;"
} | nginx_conf proxy

start nginx-backend "$NGINX" -c "$TMP/backend/nginx.conf"
wait_http nginx-backend "$LAST_PID" "http://127.0.0.1:$P_BACKEND/x"
start nginx-proxy "$NGINX" -c "$TMP/proxy/nginx.conf"
PROXY_SID=$LAST_PID
wait_http nginx-proxy "$PROXY_SID" "http://127.0.0.1:$P_PROXY/x"
wait_http nginx-proxy "$PROXY_SID" "http://127.0.0.1:$P_PROXY_LOG/x"

# lockstep_conf LOG_LINES: lockstep.toml with [log] set to LOG_LINES.
lockstep_conf() {
    {
        lockstep_conf_head "sqlite://$TMP/bench.db"
        cat <<EOF

[log]
$1

[[resources]]
pattern = "/articles/{id}"
EOF
    } >"$TMP/lockstep.toml"
}


# ----------------------------------------------------------- measuring ----

# cpu_ticks PID...: user + system clock ticks of the processes, summed.
cpu_ticks() {
    local pid total=0 t
    for pid in "$@"; do
        # Fields after "pid (comm) ": utime is the 12th, stime the 13th.
        t=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | awk '{print $12 + $13}') || t=0
        total=$((total + ${t:-0}))
    done
    echo "$total"
}

# to_ms VALUE: wrk's latency (980.00us, 2.11ms, 1.02s) in ms.
to_ms() {
    awk -v v="$1" 'BEGIN {
        if (v ~ /us$/) printf "%.2f", substr(v, 1, length(v) - 2) / 1000;
        else if (v ~ /ms$/) printf "%.2f", substr(v, 1, length(v) - 2);
        else if (v ~ /s$/) printf "%.2f", substr(v, 1, length(v) - 1) * 1000;
        else print "n/a" }'
}

# measure ROW URL PID...: warm-up, then a measured run; appends
# "rps p99_ms cpu_us" to $TMP/ROW.rounds.
measure() {
    local row=$1 url=$2 t0 t1 reqs rps p99 tck out=$TMP/$1.wrk
    shift 2
    ((WARMUP > 0)) && wrk -t"$THREADS" -c"$CONNECTIONS" -d"${WARMUP}s" "$url" >/dev/null 2>&1
    t0=$(cpu_ticks "$@")
    wrk --latency -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" "$url" >"$out" 2>&1
    t1=$(cpu_ticks "$@")
    reqs=$(awk '/requests in/ {print $1; exit}' "$out")
    rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
    p99=$(to_ms "$(awk '$1 == "99%" {print $2}' "$out")")
    tck=$(getconf CLK_TCK)
    [[ -n $reqs && $reqs -gt 0 ]] || die "$row: wrk completed no request: $(cat "$out")"
    local errors non2xx
    non2xx=$(awk '/Non-2xx/ {n = $NF} END {print n + 0}' "$out")
    errors=$(($(wrk_sockerr "$out") + non2xx))
    ((errors == 0)) || note "$row: $errors socket errors or non-2xx answers in one round"
    echo "$rps $p99 $(awk -v d="$((t1 - t0))" -v t="$tck" -v n="$reqs" 'BEGIN {printf "%.1f", d * 1e6 / t / n}')" \
        >>"$TMP/$row.rounds"
    log "$row: $rps req/s, p99 $p99 ms"
}

# median ROW COLUMN: the median round's value in COLUMN (1 rps, 2 p99, 3 cpu)
median() {
    awk -v c="$2" '{print $c}' "$TMP/$1.rounds" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'
}

declare -A LOGCONF=(
    [lockstep-warn]='level = "warn"'
    [lockstep-info]=$'level = "info"\naccess_log = false'
    [lockstep-default]='' # the shipped [log]: level "info", access_log true
    [lockstep-json]='format = "json"' # the chart's [log]
)

BUSY=$(cpu_busy)
for round in $(seq 1 "$ROUNDS"); do
    log "round $round of $ROUNDS"
    : >"$NGINX_ACCESS_LOG"
    mapfile -t nginx_pids < <(pgrep -s "$PROXY_SID")
    measure nginx-off "http://127.0.0.1:$P_PROXY/p" "${nginx_pids[@]}"
    measure nginx-log "http://127.0.0.1:$P_PROXY_LOG/p" "${nginx_pids[@]}"
    for row in lockstep-warn lockstep-info lockstep-default lockstep-json; do
        stop_lockstep
        : >"$TMP/lockstep.log"
        lockstep_conf "${LOGCONF[$row]}"
        start_lockstep
        measure "$row" "http://127.0.0.1:$P_LOCKSTEP/p" "$LOCKSTEP_PID"
        if [[ $row == lockstep-default ]]; then
            lines=$(grep -c 'passthrough request' "$TMP/lockstep.log" || true)
            ((lines > 0)) || die "the default configuration logged no access line"
        fi
    done
    # The access lines really were written: one per request, give or take
    # those in flight when wrk stopped.
    lines=$(grep -c '"message":"passthrough request"' "$TMP/lockstep.log" || true)
    ((lines > 0)) || die "the JSON configuration logged no access line"
done
stop_lockstep

row_line() { # row_line ROW LABEL
    local rps
    rps=$(median "$1" 1)
    echo "| $2 | $(num "$rps") | $(median "$1" 2) | $(median "$1" 3) |" \
        "$(ratio "$rps" "$(median nginx-off 1)") | $(ratio "$rps" "$(median nginx-log 1)") |"
}

report() {
    echo "# What logging costs: lockstep beside nginx"
    echo
    echo "$(date -u +%Y-%m-%d), lockstep $(lockstep_commit), $(nproc) cores, CPU $BUSY% busy before the runs."
    echo "31 B GET passthrough, wrk -t$THREADS -c$CONNECTIONS, ${DURATION} s per run after ${WARMUP} s of warm-up;"
    echo "median of $ROUNDS interleaved rounds (\`benches/log_cost.sh\`). Log output goes to files."
    echo
    echo "| configuration | requests/s | p99 ms | CPU µs per request | / nginx, no log | / nginx, default log |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: |"
    row_line nginx-off "nginx proxy, \`access_log off\`"
    row_line nginx-log "nginx proxy, its default access log (combined, a write per request)"
    row_line lockstep-warn "lockstep, \`level = \"warn\"\` (as in \`benches/run.sh\`)"
    row_line lockstep-info "lockstep, \`level = \"info\"\`, \`access_log = false\`"
    row_line lockstep-default "lockstep, the shipped defaults (info, an access line per request)"
    row_line lockstep-json "lockstep, the defaults with \`format = \"json\"\` (the Helm chart's)"
    echo
    echo "Compare like with like: lockstep at \`warn\` with nginx without a log,"
    echo "the shipped defaults with nginx's default access log. CPU: lockstep's"
    echo "process, or nginx's master and workers summed, over the measured run."
    if ((${#NOTES[@]} > 0)); then
        echo
        for n in "${NOTES[@]}"; do echo "* $n"; done
    fi
}

mkdir -p "$(dirname "$OUT")"
report | tee "$OUT"
log "report written to $OUT"
