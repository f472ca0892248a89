#!/usr/bin/env bash
# One benchmark of this build against a baseline build's, side by side in one run:
#   scripts/bench/ab.sh model|analyzer THIS_BIN BASE_BIN
# BENCH_ROUNDS rounds (default 5); each round runs both binaries, one after the other, and
# the order flips every round (this, base; base, this; ...), so that a slow spell of a
# shared machine hits both alike. Prints every round's numbers, then per number the median
# of each side and this/base. Rates (events/s): above 1 is faster; ns per query: below 1 is.
#   model:    alloc/free events/s (best of the bench's own 3 passes) and largest_free_span
#             ns/query at 10 / 1,000 / 100,000 gaps, from the bench's JSON line.
#   analyzer: one capture of BENCH_EVENTS events (default 20,000,000, about 1.3 GB in
#             $TMPDIR; check `df`) written once by THIS_BIN, replayed by both with
#             `--rounds 1`: raw read, read + Model::apply, and the full analysis, in M events/s
#             (printed to 0.1 M: 0.5 % at 20 M/s).
# BENCH_PIN=CPU runs both under `taskset -c CPU`. Used by scripts/bench/run.sh when
# BENCH_BASELINE_DIR is set.
set -euo pipefail
part=${1:?model or analyzer} this=${2:?this build\'s bench binary} base=${3:?the baseline\'s bench binary}
rounds=${BENCH_ROUNDS:-5}
pin=()
[ -n "${BENCH_PIN:-}" ] && pin=(taskset -c "$BENCH_PIN")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

case "$part" in
    model)
        names=(events_per_s span_ns_10 span_ns_1000 span_ns_100000)
        # The numbers of one run, in the order of `names`.
        measure() {
            "${pin[@]}" "$1" | grep '^{' | jq -r '[.model_events_per_s, .model_span_ns["10"],
                .model_span_ns["1000"], .model_span_ns["100000"]] | @tsv'
        }
        ;;
    analyzer)
        names=(raw_read_M_per_s apply_M_per_s replay_M_per_s)
        "$this" --events "${BENCH_EVENTS:-20000000}" --dir "$tmp" --keep --rounds 1 >"$tmp/gen.txt"
        capture=$(sed -n 's/^kept //p' "$tmp/gen.txt")
        [ -f "$capture" ] || { echo "bench-ab: no capture written: $(cat "$tmp/gen.txt")" >&2; exit 1; }
        cat "$capture" >/dev/null # in the page cache before the first timed round
        measure() {
            "${pin[@]}" "$1" --file "$capture" --rounds 1 | awk '
                /^raw read/     { raw = $4 }
                /^read \+ apply/ { apply = $5 }
                /^read \+ model/ { full = $5 }
                END { printf "%s\t%s\t%s\n", raw, apply, full }'
        }
        ;;
    *) echo "bench-ab: unknown part $part (model or analyzer)" >&2; exit 2 ;;
esac

echo "$part: this build ($this) against the baseline ($base), $rounds rounds, order flipped each round"
printf '%-6s %-5s' round side
printf ' %16s' "${names[@]}"
echo
for r in $(seq "$rounds"); do
    if ((r % 2)); then order=(this base); else order=(base this); fi
    for side in "${order[@]}"; do
        bin=$this
        [ "$side" = base ] && bin=$base
        line=$(measure "$bin")
        [ -n "$(echo "$line" | tr -d '[:space:]')" ] || { echo "bench-ab: $bin printed no numbers" >&2; exit 1; }
        echo "$line" >>"$tmp/$side.tsv"
        printf '%-6s %-5s' "$r" "$side"
        printf ' %16s' $line
        echo
    done
done
# Median of column $2 of file $1.
median() { cut -f "$2" "$1" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
printf '%-18s %16s %16s %10s\n' median this base this/base
for i in "${!names[@]}"; do
    t=$(median "$tmp/this.tsv" $((i + 1))) b=$(median "$tmp/base.tsv" $((i + 1)))
    printf '%-18s %16s %16s %10s\n' "${names[$i]}" "$t" "$b" "$(awk -v t="$t" -v b="$b" 'BEGIN { printf "%.3f", b ? t / b : 0 }')"
done
