#!/bin/sh
# Hostile input through the command line: each bad input is one line on stderr naming what
# is wrong, and a non-zero status; never a crash, a hang or status 0.
#   cli_hostile_test.sh SPILLWAY SCRATCH_DIR SOURCE_DIR CASE
# CASE: traces (deep nesting, a NUL, a line over 16 MiB; sweep --jobs 2 and replay),
# full (every output to /dev/full), state-memory (one rule for the variable and every
# --state-memory), output-names (spillway run's removal of earlier per-rank files).
# Exit 77 (ctest's SKIP_RETURN_CODE) where the system lacks what a case needs.
set -u
spillway=$1
scratch=$2
source=$3
case_name=$4
bench=$source/bench/traces/BERT_Base-b256.jsonl.gz
regressions=$source/tests/fuzz/regressions/trace
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# expect STATUS 'EXPECTED STDERR' COMMAND...: runs COMMAND (stdout dropped) and checks its
# status and that stderr is exactly the one expected line. expect_full_stdout: the same with
# stdout into /dev/full.
expect_with_stdout() {
  stdout=$1
  want_status=$2
  want_err=$3
  shift 3
  shown="$*"
  [ "$stdout" = /dev/null ] || shown="$* >$stdout"
  got=$("$@" 2>&1 >"$stdout")
  status=$?
  [ "$status" -eq "$want_status" ] || fail "status $status, not $want_status: $shown"
  [ "$got" = "$want_err" ] || fail "stderr of $shown:
  got:  $got
  want: $want_err"
}
expect() { expect_with_stdout /dev/null "$@"; }
expect_full_stdout() { expect_with_stdout /dev/full "$@"; }

rm -rf "$scratch"
mkdir -p "$scratch" || exit 1

case $case_name in
traces)
  deep=$regressions/deep-nesting-in-ranges.jsonl.gz
  nul=$regressions/nul-then-garbage.jsonl
  long=$source/tests/fuzz/slow/trace/line-over-16MiB.jsonl.gz
  for cmd in "sweep --jobs 2 -q" replay; do
    # shellcheck disable=SC2086
    expect 2 "spillway: $deep:3: nesting deeper than 64" "$spillway" $cmd "$deep"
    # shellcheck disable=SC2086
    expect 2 "spillway: $nul:2: NUL byte at byte 20 of the line (a trace is text: binary or damaged data?)" "$spillway" $cmd "$nul"
    # shellcheck disable=SC2086
    expect 2 "spillway: $long:2: line longer than 16777216 bytes (16 MiB, the format's limit; binary or damaged data?)" \
      "$spillway" $cmd "$long"
  done
  # Several traces read by two workers: the first bad one in the order given, one line.
  expect 2 "spillway: $long:2: line longer than 16777216 bytes (16 MiB, the format's limit; binary or damaged data?)" \
    "$spillway" sweep --jobs 2 -q "$bench" "$long" "$deep" "$nul"
  ;;
full)
  [ -w /dev/full ] || { echo "no /dev/full"; exit 77; }
  full="spillway: cannot write /dev/full: No space left on device"
  expect 1 "$full" "$spillway" replay "$bench" --policy demand --timeline /dev/full
  expect 1 "$full" "$spillway" sweep "$bench" --policy demand --capacity 0.5 -q --csv /dev/full
  # (A path that cannot be opened is refused before the run, as a bad option: status 2.)
  expect 2 "spillway: --timeline $scratch/no-such-dir/t.json: there is no folder $scratch/no-such-dir" \
    "$spillway" replay "$bench" --policy demand --timeline "$scratch/no-such-dir/t.json"
  out="spillway: cannot write standard output: No space left on device"
  expect_full_stdout 1 "$out" "$spillway" sweep "$bench" --policy demand --capacity 0.5 -q
  expect_full_stdout 1 "$out" "$spillway" replay "$bench" --policy demand
  expect_full_stdout 1 "$out" "$spillway" policies --json
  expect_full_stdout 1 "$out" "$spillway" info --json
  expect_full_stdout 1 "$out" "$spillway" --help
  ;;
state-memory)
  accepted="expected a size such as 256MiB or 1GiB (at least 16MiB), or 'unlimited' (no bound)"
  for v in 16MiB 1GiB 17000000 unlimited UNLIMITED " unlimited "; do
    expect 0 "" env SPILLWAY_STATE_MEMORY="$v" "$spillway" info --json
    expect 0 "" "$spillway" info --json --state-memory "$v"
    expect 0 "" "$spillway" run --state-memory "$v" -- true
    expect 0 "" "$spillway" replay "$bench" --policy learned --state-memory "$v"
  done
  for v in 8MiB 16777215 0 -1 lots unlimitedx inf 50%; do
    err="invalid value '$v' for SPILLWAY_STATE_MEMORY: $accepted"
    expect 2 "spillway: $err (from the environment)" env SPILLWAY_STATE_MEMORY="$v" "$spillway" info --json
    expect 2 "spillway: $err" "$spillway" info --json --state-memory "$v"
    expect 2 "spillway: $err" "$spillway" run --state-memory "$v" -- true
    expect 2 "spillway: --state-memory: $err" "$spillway" replay "$bench" --state-memory "$v"
    expect 2 "spillway: --state-memory: $err" "$spillway" sweep "$bench" -q --state-memory "$v"
  done
  ;;
output-names)
  # Regular-expression metacharacters in the name, and 100 ranks in a row before an x: a
  # backtracking matcher takes 2^100 steps on a 200-digit file name.
  odd='r((%r[*+?\{.^$|.json'
  : >"$scratch/r((1[*+?\{.^\$|.json"
  : >"$scratch/r((42[*+?\{.^\$|.json"
  : >"$scratch/r((x[*+?\{.^\$|.json"
  : >"$scratch/r(1[*+?\{.^\$|.json"
  digits=$(printf '%0200d' 1)
  : >"$scratch/${digits}"
  : >"$scratch/${digits}x"
  : >"$scratch/keep.json"
  ranks=$(printf '%%r%.0s' $(seq 100))x
  expect 0 "" "$spillway" run --report "$scratch/$odd" --trace "$scratch/$ranks" -- true
  for gone in "r((1[*+?\{.^\$|.json" "r((42[*+?\{.^\$|.json" "${digits}x"; do
    [ -e "$scratch/$gone" ] && fail "$gone was not removed"
  done
  for kept in "r((x[*+?\{.^\$|.json" "r(1[*+?\{.^\$|.json" "${digits}" keep.json; do
    [ -e "$scratch/$kept" ] || fail "$kept was removed"
  done
  ;;
*)
  echo "unknown case $case_name"
  exit 2
  ;;
esac
rm -rf "$scratch"
[ "$failures" -eq 0 ] || exit 1
echo "ok: $case_name"
