#!/bin/sh
# `spillway trace torch`: a model of the user's own (MODULE:FACTORY) recorded on the meta
# device replays in the simulator; a bad factory, a missing --input-shape and an unknown
# framework are one line and status 2. Without PyTorch for the interpreter it runs, the one
# line names that interpreter and how to install it (CI's machine has no torch).
#   cli_trace_test.sh SPILLWAY_CLI WORK_DIR
set -u
cli=$1 work=$2
mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
cat > "$work/mynets.py" <<'PY'
import torch.nn as nn


def mlp():
    return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))


def three():
    return 3
PY
cd "$work" || exit 1
"$cli" trace tensorflow x > out.txt 2> err.txt; [ $? -eq 2 ] || fail "an unknown framework is not status 2"
grep -q "^spillway trace: unknown framework 'tensorflow' (accepted: torch)" err.txt || fail "$(cat err.txt)"
"$cli" trace torch mynets:mlp t.jsonl.gz --input-shape 64,1024 --iters 2 > out.txt 2> err.txt
status=$?
if grep -q "PyTorch is not installed for " err.txt; then
  [ $status -eq 2 ] || fail "torch missing: status $status"
  [ "$(wc -l < err.txt)" -eq 1 ] || fail "torch missing: not one line: $(cat err.txt)"
  echo "ok (no PyTorch here: the message checked)"
  exit 0
fi
[ $status -eq 0 ] || fail "trace: status $status: $(cat err.txt)"
grep -q "^t.jsonl.gz: [0-9]* kernels, [0-9]* storages; next: spillway sweep t.jsonl.gz$" err.txt || fail "no summary line: $(cat err.txt)"
"$cli" replay t.jsonl.gz --policy learned --capacity 0.5 > replay.txt || fail "the trace does not replay"
grep -q "^kernels [1-9]" replay.txt || fail "replay: $(cat replay.txt)"
"$cli" trace torch mynets:three x.jsonl.gz --input-shape 4 2> err.txt; [ $? -eq 2 ] || fail "a factory returning 3: not status 2"
grep -qx "spillway trace torch: mynets.three() returned int, not a torch.nn.Module" err.txt || fail "$(cat err.txt)"
"$cli" trace torch mynets:mlp x.jsonl.gz 2> err.txt; [ $? -eq 2 ] || fail "no --input-shape: not status 2"
grep -q "^spillway trace torch: --input-shape is required" err.txt || fail "$(cat err.txt)"
"$cli" trace torch nosuch:make x.jsonl.gz --input-shape 4 2> err.txt; [ $? -eq 2 ] || fail "no such module: not status 2"
grep -q "^spillway trace torch: cannot load nosuch:make: No module named 'nosuch'" err.txt || fail "$(cat err.txt)"
# An input the model cannot take: one line naming the shapes, no traceback, no trace left.
"$cli" trace torch mynets:mlp bad.jsonl.gz --input-shape 64,7 2> err.txt; [ $? -eq 2 ] || fail "a bad input shape: not status 2"
[ "$(wc -l < err.txt)" -eq 1 ] || fail "a bad input shape: not one line: $(cat err.txt)"
grep -q "^spillway trace torch: mynets:mlp's forward() failed on inputs of shape 64,7 (float32): RuntimeError: " err.txt ||
  fail "$(cat err.txt)"
[ ! -e bad.jsonl.gz ] || fail "a trace was left after the failure"
echo ok
