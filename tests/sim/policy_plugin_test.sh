#!/bin/sh
# A policy plugin (spillway/policy_plugin.h), built as a user would: Spillway's headers and
# package installed (`cmake --install --component dev`), examples/policy-plugin configured
# against them. The same plugin then runs in the simulator, where next-launch with depth=1
# must give the built-in sequential:depth=1's time in every cell (it decides the same way),
# and in front of a program under the shim (fake driver); a bad path, a file that is no
# plugin and parameters the plugin refuses are refused with one line naming them.
#   policy_plugin_test.sh SPILLWAY_CLI BUILD_DIR SOURCE_DIR WORK_DIR SHIM FAKECUDA_DIR PER_TENSOR_PROGRAM
set -eu
cli=$1 build=$2 src=$3 work=$4 shim=$5 fake=$6 program=$7
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" --component dev > "$work/install.txt" || fail "install: $(cat "$work/install.txt")"
# (The plugin is built with the compiler that built Spillway: the layout check compares both.)
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
cmake -S "$src/examples/policy-plugin" -B "$work/plugin" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=Release > "$work/configure.txt" 2>&1 || fail "configure: $(cat "$work/configure.txt")"
cmake --build "$work/plugin" > "$work/build.txt" 2>&1 || fail "build: $(cat "$work/build.txt")"
plugin=$work/plugin/libnext_launch.so
[ -f "$plugin" ] || fail "no $plugin"

# The simulator: the plugin against the built-in policy it mirrors, cell by cell.
"$cli" sweep "$src/bench/traces/resnet50-train-b512.jsonl.gz" --policy "sequential:depth=1,$plugin:depth=1,$plugin:depth=3" \
  --capacity 0.667,0.5 --link h200 --allocator none,spillway -q --csv "$work/s.csv" > "$work/sweep.txt" || fail "sweep: $(cat "$work/sweep.txt")"
/usr/bin/python3 - "$work/s.csv" "$plugin" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1], newline="")))
plugin = sys.argv[2]
cell = lambda r: (r["allocator"], r["capacity_bytes"])
seq = {cell(r): r["time_ns"] for r in rows if r["policy"] == "sequential:depth=1"}
one = {cell(r): r["time_ns"] for r in rows if r["policy"] == plugin + ":depth=1"}
three = {cell(r): r["time_ns"] for r in rows if r["policy"] == plugin + ":depth=3"}
assert len(seq) == 4 and one == seq, (seq, one)
assert three != one, "depth=3 decides otherwise"
assert all(r["policy_params"] == r["policy"] for r in rows if r["policy"].startswith(plugin)), rows
PY

# Refusals: exit 2 and one line naming the file and what is wrong.
expect_refusal() {  # EXPECTED-TEXT SPEC
  if "$cli" sweep "$src/bench/traces/resnet50-train-b512.jsonl.gz" --policy "$2" -q > "$work/out.txt" 2> "$work/err.txt"; then
    fail "accepted: $2"
  else
    status=$?
  fi
  [ "$status" -eq 2 ] || fail "exit $status, not 2: $2"
  [ "$(wc -l < "$work/err.txt")" -eq 1 ] || fail "not one line: $(cat "$work/err.txt")"
  grep -qF "$1" "$work/err.txt" || fail "message: $(cat "$work/err.txt"), expected $1"
}
expect_refusal "policy plugin $plugin refused 'depth=0': expected depth=N with N in 1..64" "$plugin:depth=0"
expect_refusal "cannot load policy plugin $work/none.so: " "$work/none.so"
expect_refusal "$shim is not a Spillway policy plugin: it lacks spillway_policy_plugin_abi" "$shim"

# The shim: the same plugin in front of a program (fake driver), its data checked by the program.
LD_LIBRARY_PATH=$fake LD_PRELOAD="${SPILLWAY_TEST_PRELOAD_FIRST:+$SPILLWAY_TEST_PRELOAD_FIRST:}$shim" \
  FAKECUDA_GPU_MEMORY=16777216 SPILLWAY_BUDGET=12MiB SPILLWAY_POLICY="$plugin:depth=2" SPILLWAY_REPORT="$work/r.json" \
  "$program" gather 6 > "$work/run.txt" 2>&1 || fail "run: $(cat "$work/run.txt")"
grep -qx ok "$work/run.txt" || fail "the program's checks: $(cat "$work/run.txt")"
grep -q "policy next-launch" "$work/run.txt" || fail "not run under the plugin: $(cat "$work/run.txt")"
/usr/bin/python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["policy"] == "next-launch" and r["calls"]["h2d"]["calls"] > 0, r' "$work/r.json"
LD_LIBRARY_PATH=$fake LD_PRELOAD="${SPILLWAY_TEST_PRELOAD_FIRST:+$SPILLWAY_TEST_PRELOAD_FIRST:}$shim" \
  SPILLWAY_POLICY="$plugin:depth=x" "$program" gather 2 > "$work/bad.txt" 2>&1 || fail "a refused plugin stopped the program: $(cat "$work/bad.txt")"
grep -q "invalid value '$plugin:depth=x' for SPILLWAY_POLICY: policy plugin $plugin refused 'depth=x'.*; Spillway passes every call through" "$work/bad.txt" \
  || fail "refusal in the shim: $(cat "$work/bad.txt")"
echo ok
