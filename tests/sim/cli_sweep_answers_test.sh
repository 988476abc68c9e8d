#!/bin/sh
# `spillway sweep` answers "how much faster than plain unified memory, and which policy?":
# the CSV's speedup_vs_demand is demand's time in the same cell over the row's time (1 for
# demand itself), slowdown_vs_unlimited is time over compute, the table has the xdemand
# column, and one "best on" line per trace and link (by default the assumed pcie5 and the
# measured h200, each profile printed first) names the fastest policy a program can run
# (never the oracle) with its speed-up; without demand in the sweep the fields are empty.
#   cli_sweep_answers_test.sh SPILLWAY_CLI WORK_DIR SOURCE_DIR
set -eu
cli=$1 work=$2 src=$3
trace=$src/bench/traces/BERT_Base-b256.jsonl.gz
mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
"$cli" sweep "$trace" --capacity 0.667,0.5 --policy demand,sequential,learned,oracle --csv "$work/s.csv" > "$work/out.txt"
grep -q '  xdemand  ' "$work/out.txt" || fail "no xdemand column: $(head -1 "$work/out.txt")"
for link in pcie5 h200; do
  grep -q "^link $link: H2D " "$work/out.txt" || fail "no $link profile in the header: $(head -3 "$work/out.txt")"
done
[ "$(grep -c '^best on ' "$work/out.txt")" -eq 2 ] || fail "not one best line per link: $(cat "$work/out.txt")"
for link in pcie5 h200; do
  best=$(grep "^best on BERT_Base-b256 (none, $link): " "$work/out.txt") || fail "no best line on $link"
  case $best in
    "best on BERT_Base-b256 (none, $link): at 0.667 "*"x faster than demand; at 0.500 "*"x faster than demand") ;;
    *) fail "best line: $best" ;;
  esac
  case $best in *oracle*) fail "the oracle cannot be run by a program: $best" ;; esac
  /usr/bin/python3 - "$work/s.csv" "$best" "$link" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1], newline="")) if r["link"] == sys.argv[3]]
assert len(rows) == 8, len(rows)
demand = {r["capacity_bytes"]: int(r["time_ns"]) for r in rows if r["policy"] == "demand"}
for r in rows:
    want = demand[r["capacity_bytes"]] / int(r["time_ns"])
    got = float(r["speedup_vs_demand"])
    assert abs(got - want) < 1e-4, (r["policy"], got, want)
    assert abs(float(r["slowdown_vs_unlimited"]) - int(r["time_ns"]) / int(r["compute_ns"])) < 1e-4, r
    if r["policy"] == "demand":
        assert r["speedup_vs_demand"] == "1.0000", r["speedup_vs_demand"]
# The best line names, per capacity, the fastest runnable policy and its figure.
for frac in ("0.6670", "0.5000"):
    cell = [r for r in rows if r["capacity_frac"] == frac and r["policy"] != "oracle"]
    fastest = min(cell, key=lambda r: int(r["time_ns"]))
    text = f'at {float(frac):.3f} {fastest["policy"]}, {float(fastest["speedup_vs_demand"]):.2f}x faster than demand'
    assert text in sys.argv[2], (text, sys.argv[2])
PY
done
"$cli" sweep "$trace" --capacity 0.5 --policy learned --link pcie5 --csv "$work/n.csv" > "$work/n.txt"
grep -q '^best on BERT_Base-b256 (none, pcie5): at 0.500 learned, demand not swept$' "$work/n.txt" ||
  fail "without demand: $(grep '^best' "$work/n.txt")"
tail -1 "$work/n.csv" | grep -q ',,[0-9.]*$' || fail "speedup_vs_demand not empty without demand: $(tail -1 "$work/n.csv")"
# --recommend: one line per trace naming the runnable policy fastest in most capacities, as
# the sweep was given it,, and the replay command accepts that --policy value.
"$cli" sweep "$trace" --capacity 0.667,0.5 --policy demand,sequential,learned,oracle --link pcie5 --recommend --csv "$work/r.csv" > "$work/r.txt"
[ "$(grep -c '^recommended for ' "$work/r.txt")" -eq 1 ] || fail "not one recommendation: $(cat "$work/r.txt")"
rec=$(grep '^recommended for ' "$work/r.txt")
pick=$(/usr/bin/python3 - "$work/r.csv" "$rec" <<'PY'
import collections, csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1], newline="")) if r["policy"] != "oracle"]
wins = collections.Counter()
for frac in {r["capacity_frac"] for r in rows}:
    fastest = min((r for r in rows if r["capacity_frac"] == frac), key=lambda r: int(r["time_ns"]))
    wins[fastest["policy"]] += 1
best, n = wins.most_common(1)[0]
assert wins.most_common(2)[-1][1] < n or len(wins) == 1, wins  # (no tie in this trace)
want = f"recommended for BERT_Base-b256 (none, pcie5): spillway run --policy '{best}' (fastest at {n} of 2 capacities)"
assert sys.argv[2] == want, (sys.argv[2], want)
print(best)
PY
) || fail "recommendation: $rec"
"$cli" replay "$trace" --capacity 0.5 --policy "$pick" > /dev/null || fail "replay does not take --policy '$pick'"
# A capacity of the whole peak or more oversubscribes nothing: a bare number gets a warning
# naming the size it may have meant.
"$cli" sweep "$trace" --capacity 4 --policy demand --link pcie5 -q > /dev/null 2> "$work/w.txt" || fail "--capacity 4 failed"
grep -qx "spillway sweep: warning: --capacity 4 is 4x the trace's peak footprint: nothing is oversubscribed (a size takes a unit: 4GiB)" \
  "$work/w.txt" || fail "--capacity 4: $(cat "$work/w.txt")"
echo ok
