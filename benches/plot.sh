#!/usr/bin/env bash
# Draws the ratio rows of a benchmark report as a horizontal bar chart (SVG,
# with gnuplot): one bar per ratio, its target drawn across it, green where
# the ratio meets its target, red where it misses, grey where it has none.
# A reader sees at a glance what the ratio tables say.
#
#   benches/plot.sh REPORT.md [OUT.svg]   every "| ratio … |" table of REPORT;
#                                          OUT defaults to REPORT less .md plus
#                                          -ratios.svg (latest.md → latest-ratios.svg)
#   benches/plot.sh --rows OUT.svg [TITLE] rows on stdin: LABEL<TAB>VALUE<TAB>TARGET
#
# TARGET is "≥ 0.8" or "≤ 2"; anything else ("trend", "none", "") is no
# target. A row whose value is not a number ("n/a") is left out.
# benches/run.sh runs the report form on the report it has just written.
# Needs gnuplot (Debian: gnuplot-nox).
set -euo pipefail

die() {
    echo "plot.sh: $*" >&2
    exit 1
}

# report_rows REPORT: the rows of every ratio table of REPORT, as
# LABEL<TAB>VALUE<TAB>TARGET (a table without a target column gives "").
report_rows() {
    awk -F'|' '
        function trim(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
        /^\| *ratio/ { table = 1; next }
        table && /^\|[-: |]+$/ { next }
        table && /^\|/ { print trim($2) "\t" trim($3) "\t" (NF > 5 ? trim($4) : ""); next }
        { table = 0 }' "$1"
}

# plot_rows OUT TITLE: draws the rows on stdin (LABEL<TAB>VALUE<TAB>TARGET)
# into the SVG file OUT.
plot_rows() {
    local out=$1 title=$2 data n xmax
    command -v gnuplot >/dev/null || die "gnuplot is missing (Debian: apt-get install gnuplot-nox)"
    # y (top row highest), value, target (NaN: none), colour, label, where
    # the value's figure goes.
    data=$(awk -F'\t' '
        $2 ~ /^[0-9]+(\.[0-9]+)?$/ {
            n++
            label[n] = $1; value[n] = $2; target[n] = "NaN"; colour[n] = 10066329 # grey
            if (($3 ~ /^(≥|>=)/ || $3 ~ /^(≤|<=)/) && match($3, /[0-9]+(\.[0-9]+)?/)) {
                t = substr($3, RSTART, RLENGTH)
                target[n] = t
                meets = ($3 ~ /^(≥|>=)/) ? ($2 + 0 >= t + 0) : ($2 + 0 <= t + 0)
                colour[n] = meets ? 3050327 : 12597547 # green, red
            }
        }
        END {
            for (i = 1; i <= n; i++) {
                gsub(/"/, "", label[i])
                # The figure goes right of the bar or the target, whichever ends later.
                at = (target[i] != "NaN" && target[i] + 0 > value[i] + 0) ? target[i] : value[i]
                printf "%d\t%s\t%s\t%d\t%s\t%s\n", n - i + 1, value[i], target[i], colour[i], label[i], at
            }
        }')
    [[ -n $data ]] || die "no ratio rows with a value to draw"
    n=$(wc -l <<<"$data")
    # Room for the largest value or target and its printed figure.
    xmax=$(awk -F'\t' '{m = ($2 > m) ? $2 : m; if ($3 != "NaN" && $3 > m) m = $3}
        END {m = m * 1.15; if (m < 1.2) m = 1.2; printf "%.2f", m}' <<<"$data")
    title=${title//\"/}
    gnuplot <<EOF
set terminal svg size 1100,$((90 + 26 * n)) dynamic noenhanced font "sans,12" background rgb "white"
set output "$out"
set datafile separator "\t"
set title "$title"
set xlabel "ratio (1 = as fast or as big as the reference)"
set xrange [0:$xmax]
set yrange [0.4:$n.6]
set border 3
set xtics nomirror
set ytics nomirror scale 0
set grid xtics lc rgb "#dddddd"
set key outside right top vertical noautotitle
set arrow from 1, graph 0 to 1, graph 1 nohead dashtype 2 lc rgb "#555555" back
\$rows << EOD
$data
EOD
plot \$rows using (0):1:(0):2:(\$1 - 0.35):(\$1 + 0.35):4:ytic(5) with boxxyerror fs solid 0.85 noborder lc rgb variable, \
     \$rows using 3:(\$1 - 0.45):(0):(0.9) with vectors nohead lw 3 lc rgb "black" title "target", \
     \$rows using 6:1:(sprintf("%.2f", \$2)) with labels left offset char 0.6,0, \
     keyentry with boxes fs solid 0.85 lc rgb "#2e8b57" title "meets", \
     keyentry with boxes fs solid 0.85 lc rgb "#c0392b" title "misses", \
     keyentry with boxes fs solid 0.85 lc rgb "#999999" title "no target"
EOF
    [[ -s $out ]] || die "gnuplot wrote nothing to $out"
}

case ${1:-} in
--rows)
    [[ -n ${2:-} ]] || die "usage: plot.sh --rows OUT.svg [TITLE] < rows"
    plot_rows "$2" "${3:-ratios}"
    ;;
"" | -h | --help)
    sed -n '2,15s/^# \{0,1\}//p' "$0"
    [[ -n ${1:-} ]] || exit 1
    ;;
*)
    report=$1
    [[ -f $report ]] || die "no report $report"
    out=${2:-${report%.md}-ratios.svg}
    title=$(sed -n '1s/^# *//p' "$report")
    report_rows "$report" | plot_rows "$out" "${title:-ratios}: ratios"
    echo "plot.sh: $out"
    ;;
esac
