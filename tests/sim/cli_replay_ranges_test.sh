#!/bin/sh
# `spillway replay --allocator spillway` says how much managed memory the sub-allocator's
# ranges took for the trace's peak footprint (fragmentation); the other views do not.
# A 100 MiB tensor takes a range of its own size, a 10 MiB one then a new 64 MiB range
# (Engine::kRangeBytes): 164 MiB for a peak of 110 MiB.
#   cli_replay_ranges_test.sh SPILLWAY_CLI WORK_DIR
set -eu
cli=$1 work=$2
mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
cat > "$work/two.jsonl" <<'T'
{"format":"spillway-trace","version":1,"source":"cli_replay_ranges_test.sh"}
{"ev":"alloc","id":0,"bytes":104857600}
{"ev":"alloc","id":1,"bytes":10485760}
{"ev":"kernel","name":"k","dur_ns":1000000,"reads":[0],"writes":[1]}
{"ev":"kernel","name":"k","dur_ns":1000000,"reads":[1],"writes":[0]}
T
"$cli" replay "$work/two.jsonl" --allocator spillway --capacity 0.5 > "$work/spillway.txt"
line=$(grep '^sub-allocator: ' "$work/spillway.txt") || fail "no sub-allocator line: $(cat "$work/spillway.txt")"
[ "$line" = "sub-allocator: 2 ranges, 164 MiB of managed memory for a peak footprint of 110 MiB (49.1% more)" ] || fail "$line"
"$cli" replay "$work/two.jsonl" --allocator none --capacity 0.5 > "$work/none.txt"
! grep -q '^sub-allocator' "$work/none.txt" || fail "the none view has no sub-allocator"
echo ok
