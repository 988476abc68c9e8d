#!/bin/sh
# A policy plugin (spillway/policy_plugin.h), built as a user would: Spillway's headers and
# package installed (`cmake --install --component dev`), examples/policy-plugin configured
# against them. The same plugin then runs in the simulator, where next-launch with depth=1
# must give the built-in sequential:depth=1's time in every cell (it decides the same way),
# and in front of a program under the shim (fake driver). Refused with one line naming them:
# a bad path, files that are no plugin (a library without the entry points, a text file),
# plugins built for another ABI version or layout, a factory that makes nothing without
# saying why, and parameters the plugin refuses. A path may hold a ':'.
#   policy_plugin_test.sh SPILLWAY_CLI BUILD_DIR SOURCE_DIR WORK_DIR SHIM FAKECUDA_DIR PER_TENSOR_PROGRAM
set -eu
cli=$1 build=$2 src=$3 work=$4 shim=$5 fake=$6 program=$7
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" --component dev > "$work/install.txt" || fail "install: $(cat "$work/install.txt")"
# (The plugin is built with the compiler and generator that built Spillway: the layout check
# compares both builds, and Ninja is what scripts/bootstrap installs.)
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
generator=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$build/CMakeCache.txt")
cmake -S "$src/examples/policy-plugin" -B "$work/plugin" -G "$generator" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release > "$work/configure.txt" 2>&1 || fail "configure: $(cat "$work/configure.txt")"
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
echo "not a library" > "$work/text.so"
expect_refusal "cannot load policy plugin $work/text.so: " "$work/text.so"
expect_refusal "$fake/libcuda.so.1 is not a Spillway policy plugin: it lacks spillway_policy_plugin_abi" "$fake/libcuda.so.1"
# Plugins written by hand against the header: another ABI version, another layout, a factory
# that makes nothing and says nothing.
hand_plugin() {  # NAME ABI LAYOUT MAKE-BODY
  cat > "$work/$1.cpp" <<CPP
#include <dlfcn.h>
#include <spillway/policy_plugin.h>
extern "C" __attribute__((visibility("default"))) std::uint32_t spillway_policy_plugin_abi() { return $2; }
extern "C" __attribute__((visibility("default"))) std::uint64_t spillway_policy_plugin_layout() { return $3; }
extern "C" __attribute__((visibility("default"))) spillway::Policy* spillway_policy_plugin_make(const char*, char*, std::size_t) { $4 }
CPP
  "$cxx" -std=c++20 -shared -fPIC -I"$work/prefix/include" -o "$work/lib$1.so" "$work/$1.cpp" -ldl || fail "compile $1"
}
hand_plugin old_abi 999 "spillway::policy_plugin_layout()" "return nullptr;"
hand_plugin other_layout "spillway::kPolicyPluginAbi" 1 "return nullptr;"
hand_plugin silent "spillway::kPolicyPluginAbi" "spillway::policy_plugin_layout()" "return nullptr;"
expect_refusal "policy plugin $work/libold_abi.so was built for plugin ABI 999, this Spillway has 1" "$work/libold_abi.so"
expect_refusal "policy plugin $work/libother_layout.so lays out the Policy's types differently (layout 0x1, " "$work/libother_layout.so"
expect_refusal "policy plugin $work/libsilent.so refused '': no reason given" "$work/libsilent.so"
# A folder with ':' in its name.
mkdir -p "$work/a:b" && cp "$plugin" "$work/a:b/"
"$cli" sweep "$src/bench/traces/resnet50-train-b512.jsonl.gz" --policy "$work/a:b/libnext_launch.so:depth=1" --capacity 0.5 -q \
  > "$work/colon.txt" 2>&1 || fail "a path with ':': $(cat "$work/colon.txt")"

# The shim: the same plugin in front of a program (fake driver), its data checked by the program.
LD_LIBRARY_PATH=$fake LD_PRELOAD="${SPILLWAY_TEST_PRELOAD_FIRST:+$SPILLWAY_TEST_PRELOAD_FIRST:}$shim" \
  FAKECUDA_GPU_MEMORY=16777216 SPILLWAY_BUDGET=12MiB SPILLWAY_POLICY="$plugin:depth=2" SPILLWAY_REPORT="$work/r.json" \
  "$program" gather 6 > "$work/run.txt" 2>&1 || fail "run: $(cat "$work/run.txt")"
grep -qx ok "$work/run.txt" || fail "the program's checks: $(cat "$work/run.txt")"
grep -q "policy next-launch" "$work/run.txt" || fail "not run under the plugin: $(cat "$work/run.txt")"
/usr/bin/python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["policy"] == "next-launch" and r["calls"]["h2d"]["calls"] > 0, r' "$work/r.json"
LD_LIBRARY_PATH=$fake LD_PRELOAD="${SPILLWAY_TEST_PRELOAD_FIRST:+$SPILLWAY_TEST_PRELOAD_FIRST:}$shim" \
  SPILLWAY_POLICY="$plugin:depth=x" "$program" gather 2 > "$work/bad.txt" 2>&1 || fail "a refused plugin stopped the program: $(cat "$work/bad.txt")"
# A factory that calls the driver (a hooked entry point) while the shim starts: it reaches the
# driver itself, and nothing waits for the state being made (20 s: a hang fails the test).
hand_plugin calls_cuda "spillway::kPolicyPluginAbi" "spillway::policy_plugin_layout()" \
  "using F = int (*)(size_t*, size_t*); size_t f = 0, t = 0; if (auto g = (F)dlsym(RTLD_DEFAULT, \"cuMemGetInfo_v2\")) g(&f, &t); return nullptr;"
LD_LIBRARY_PATH=$fake LD_PRELOAD="${SPILLWAY_TEST_PRELOAD_FIRST:+$SPILLWAY_TEST_PRELOAD_FIRST:}$shim" \
  SPILLWAY_POLICY="$work/libcalls_cuda.so" timeout 20 "$program" gather 2 > "$work/cuda.txt" 2>&1 || fail "a factory calling CUDA: $(cat "$work/cuda.txt")"
grep -q "policy plugin $work/libcalls_cuda.so refused '': no reason given" "$work/cuda.txt" \
  || fail "refusal of a factory calling CUDA: $(cat "$work/cuda.txt")"
grep -q "invalid value '$plugin:depth=x' for SPILLWAY_POLICY: policy plugin $plugin refused 'depth=x'.*; Spillway passes every call through" "$work/bad.txt" \
  || fail "refusal in the shim: $(cat "$work/bad.txt")"
echo ok
