#!/bin/sh
# A mistyped command line gets one line on stderr that names what is wrong and, where one is
# near, the accepted word meant; status 2; and output paths are refused before a run starts.
#   cli_errors_test.sh SPILLWAY SCRATCH_DIR SOURCE_DIR
set -u
spillway=$1
scratch=$2
bench=$3/bench/traces/BERT_Base-b256.jsonl.gz
failures=0
mkdir -p "$scratch"

# expect 'EXPECTED STDERR' ARGS...: `spillway ARGS` exits 2, prints nothing on stdout and
# exactly the expected line on stderr.
expect() {
  want=$1
  shift
  out=$("$spillway" "$@" 2>"$scratch/err")
  status=$?
  err=$(cat "$scratch/err")
  if [ "$status" -ne 2 ] || [ -n "$out" ] || [ "$err" != "$want" ]; then
    echo "FAIL: spillway $*"
    echo "  status $status (want 2), stdout '$out'"
    echo "  stderr: $err"
    echo "  want:   $want"
    failures=$((failures + 1))
  fi
}

commands="run, info, sweep, replay, merge, policies, trace"
expect "spillway: unknown command 'frobnicate'; the commands are $commands" frobnicate
expect "spillway: unknown command 'sweeep' (did you mean sweep?); the commands are $commands" sweeep x
expect "spillway: a command is required: $commands (spillway --help)"
expect "spillway: unknown option '--bogus'; a command comes first: $commands (spillway --help)" --bogus
expect "spillway info: unknown option '--bugdet' (did you mean --budget?)" info --bugdet 4GiB
expect "spillway sweep: unknown option '--capacty' (did you mean --capacity?)" sweep "$bench" --capacty 0.5
expect "spillway replay: unknown option '--polcy=learned' (did you mean --policy?)" replay "$bench" --polcy=learned
expect "spillway policies: unknown option '--jsn' (did you mean --json?)" policies --jsn
# The sweep runs several links (pcie5,h200 by default; pcie5 alone when a figure is replaced
# and no --link given); a replaced link figure needs one.
expect "spillway: --h2d-bandwidth, --d2h-bandwidth, --fault-batch-us and --fault-slowdown replace one link's figures: give one --link" \
  sweep "$bench" --link pcie5,h200 --h2d-bandwidth 10
expect "spillway: replay takes one --link (spillway sweep runs several)" replay "$bench" --link pcie5,h200
expect "spillway: unknown link 'pcie9': expected pcie3, pcie4, pcie5, c2c or h200" sweep "$bench" --link pcie5,pcie9
expect "spillway: invalid --call-shape 'maybe': expected on or off" replay "$bench" --call-shape maybe
expect "spillway run: '--total' is not an option of spillway run; a program's own options go after --: spillway run [OPTIONS] -- PROGRAM [ARGS...]" \
  run python3 train.py --total 5
expect "spillway run: unknown option '--budgte' (did you mean --budget?)" run --budgte 4GiB -- true
expect "spillway run: no program given: spillway run [OPTIONS] -- PROGRAM [ARGS...]" run
# Output paths: refused at once, before any trace is read.
expect "spillway: --csv $scratch/no/such/x.csv: there is no folder $scratch/no/such" sweep "$bench" --csv "$scratch/no/such/x.csv"
expect "spillway: --plot $scratch/no/p.png: there is no folder $scratch/no" sweep "$bench" --plot "$scratch/no/p.png"
expect "spillway: --csv $scratch: is a folder, not a file" sweep "$bench" --csv "$scratch"
expect "spillway: --timeline $scratch/no/t.json: there is no folder $scratch/no" replay "$bench" --timeline "$scratch/no/t.json"
# Usage lines name the command, not the path it was started by.
if ! "$spillway" sweep --help | grep -qx 'Usage: spillway sweep \[OPTIONS\] traces\.\.\.'; then
  echo "FAIL: spillway sweep --help: usage line"
  failures=$((failures + 1))
fi
[ "$failures" -eq 0 ] && echo "all command-line errors as expected"
[ "$failures" -eq 0 ]
