#!/bin/sh
# A sweep run in parts (`spillway sweep --shard K/N`) and joined (`spillway merge`) gives the
# whole sweep's CSV byte for byte, whatever N (more parts than groups included: the extra
# parts are empty); bad parts and bad inputs are refused with one line naming them. (Small:
# the sanitizer builds run it too.)
#   cli_shard_test.sh SPILLWAY_CLI WORK_DIR SOURCE_DIR
set -eu
cli=$1 work=$2 src=$3
mkdir -p "$work"
# Two small traces of the same shape as a training step (layers' weights read forward and
# backward, each layer's activation alive until its backward): the test is about parts and
# joins, so the traces are kept small enough for the sanitizer builds.
make_trace() {  # OUT LAYERS BYTES_PER_BLOCK
  awk -v layers="$2" -v bytes="$3" 'BEGIN {
    print "{\"format\":\"spillway-trace\",\"version\":1,\"source\":\"cli_shard_test.sh\"}"
    for (l = 0; l < layers; l++) printf "{\"ev\":\"alloc\",\"id\":%d,\"bytes\":%d,\"kind\":\"weight\"}\n", l, bytes
    for (it = 0; it < 3; it++) {
      printf "{\"ev\":\"iter\",\"n\":%d}\n", it
      for (l = 0; l < layers; l++) {
        printf "{\"ev\":\"alloc\",\"id\":%d,\"bytes\":%d,\"kind\":\"activation\"}\n", 1000 + l, bytes * 2
        printf "{\"ev\":\"kernel\",\"name\":\"fwd\",\"dur_ns\":%d,\"reads\":[%d],\"writes\":[%d]}\n", 200000 + 1000 * l, l, 1000 + l
      }
      for (l = layers - 1; l >= 0; l--) {
        printf "{\"ev\":\"kernel\",\"name\":\"bwd\",\"dur_ns\":%d,\"reads\":[%d,%d],\"writes\":[%d]}\n", 400000, l, 1000 + l, l
        printf "{\"ev\":\"free\",\"id\":%d}\n", 1000 + l
      }
    }
  }' > "$1"
}
make_trace "$work/small-a.jsonl" 24 67108864
make_trace "$work/small-b.jsonl" 40 20971520
traces="$work/small-a.jsonl $work/small-b.jsonl"
fail() { echo "FAIL: $*"; exit 1; }
sweep() { "$cli" sweep $traces --policy demand,sequential --capacity 0.667,0.5 --link h200 --allocator none,spillway -q "$@"; }
sweep --csv "$work/full.csv" > "$work/full.txt"
rows=$(($(wc -l < "$work/full.csv") - 1))
[ "$rows" -eq 16 ] || fail "the whole sweep has $rows rows, not 2 traces x 2 capacities x 2 views x 2 policies"
for n in 3 10; do
  mkdir -p "$work/$n"
  parts=""
  k=1
  while [ "$k" -le "$n" ]; do
    sweep --shard "$k/$n" --csv "$work/$n/part$k.csv" > "$work/$n/part$k.txt"
    parts="$parts $work/$n/part$k.csv"
    k=$((k + 1))
  done
  "$cli" merge $parts --csv "$work/merged.csv" > "$work/merge.txt"
  grep -q "^merged $rows rows from $n files into " "$work/merge.txt" || fail "merge of $n parts: $(cat "$work/merge.txt")"
  cmp -s "$work/full.csv" "$work/merged.csv" || fail "$n parts merged differ from the whole sweep"
done
# 8 groups in 3 parts: 2, 3 and 3, each whole (demand in every cell: no speed-up left empty).
for k in 1 2 3; do
  [ "$(($(wc -l < "$work/3/part$k.csv") - 1))" -eq $((k == 1 ? 4 : 6)) ] || fail "part $k/3: $(wc -l < "$work/3/part$k.csv") lines"
  awk -F, 'NR > 1 && $(NF - 1) == "" { bad = 1 } END { exit bad }' "$work/3/part$k.csv" || fail "part $k/3 lost demand's cells"
done
[ "$(wc -l < "$work/10/part1.csv")" -eq 1 ] || fail "part 1/10 of 8 groups is not empty"
# Refusals: exit 2, one line naming what is wrong.
expect_refusal() {  # EXPECTED-TEXT COMMAND...
  text=$1
  shift
  if "$@" > "$work/out.txt" 2> "$work/err.txt"; then fail "accepted: $*"; else status=$?; fi
  [ "$status" -eq 2 ] || fail "exit $status, not 2: $*"
  [ "$(wc -l < "$work/err.txt")" -eq 1 ] || fail "not one line: $(cat "$work/err.txt")"
  grep -qF "$text" "$work/err.txt" || fail "message: $(cat "$work/err.txt"), expected $text"
}
for bad in 0/3 4/3 3 a/b 1/0 1/2x; do
  expect_refusal "invalid --shard '$bad': expected K/N" sweep --shard "$bad"
done
expect_refusal "part1.csv:2: the same cell" "$cli" merge "$work/3/part1.csv" "$work/3/part1.csv" --csv "$work/x.csv"
expect_refusal "full.txt:1: not a CSV of spillway sweep" "$cli" merge "$work/full.txt" --csv "$work/x.csv"
expect_refusal "cannot read $work/none.csv" "$cli" merge "$work/none.csv" --csv "$work/x.csv"
echo "ok"
