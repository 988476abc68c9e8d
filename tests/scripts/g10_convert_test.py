#!/usr/bin/python3
"""Tests of scripts/g10_to_trace.py (G10's kernels.config + tensors.config -> trace v1) on the
hand-written excerpt in tests/data/g10/mlp/ (a 2-layer MLP, forward and backward): the
events exactly, and the one-line errors for malformed input. Standard library only.

    /usr/bin/python3 tests/scripts/g10_convert_test.py [-v]
"""
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "g10_to_trace.py")
DATA = os.path.join(ROOT, "tests", "data", "g10", "mlp")
KERNELS = os.path.join(DATA, "kernels.config")
TENSORS = os.path.join(DATA, "tensors.config")
TIMES = os.path.join(DATA, "kernel_times.txt")
WORKSPACE = os.path.join(DATA, "workspace.txt")

W1, B1, W2, C = 16777216, 16384, 16384000, 4096   # the global tensors' sizes
X, H, Y, WS = 262144, 1048576, 258048, 8192        # input, hidden, output (63 pages), workspace


def alloc(i, nbytes, kind):
    return {"ev": "alloc", "id": i, "bytes": nbytes, "kind": kind}


def kernel(name, dur, reads, writes):
    return {"ev": "kernel", "name": name, "dur_ns": dur, "reads": reads, "writes": writes}


def free(i):
    return {"ev": "free", "id": i}


# Kernel times in ns: from kernel_times.txt (ms x 1e6), and from the cycles at 1.2 GHz.
DUR_MS = [52224, 10240, 49152, 4096, 47104, 48000, 20480, 10240, 3072, 2000, 51200, 20480]
DUR_CYCLES = [52223, 10240, 49152, 4096, 47103, 48000, 20480, 10240, 3072, 2000, 51200, 20480]
NAMES = ["Linear_Forward:L0", "ReLU_Forward:L1", "Linear_Forward:L2", "makeLoss:L2",
         "Linear_Backward_Weight:L2", "Linear_Backward_Input:L2", "Linear_Apply_Grad_Weight:L2",
         "ReLU_Backward:L1", "Linear_Backward_Bias:L0", "Linear_Apply_Grad_Bias:L0",
         "Linear_Backward_Weight:L0", "Linear_Apply_Grad_Weight:L0"]


def expected_events(dur, ws_kind="workspace"):
    """The trace of 2 iterations, written out by hand (not derived by the converter's rules)."""
    d, n = dur, NAMES
    return [
        {"ev": "iter", "n": 0},
        # kernel 0 uses G10 tensors 0 (x), 1 (W1), 2 (b1), 3 (h1), 14 (workspace): ids 0..4
        alloc(0, X, "activation"), alloc(1, W1, "weight"), alloc(2, B1, "weight"),
        alloc(3, H, "activation"), alloc(4, WS, ws_kind),
        kernel(n[0], d[0], [0, 1, 2], [3, 4]), free(4),
        alloc(5, H, "activation"),                                   # tensor4: relu(h1)
        kernel(n[1], d[1], [3], [5]),
        alloc(6, W2, "weight"), alloc(7, Y, "activation"),           # tensor5 W2, tensor6 y
        kernel(n[2], d[2], [5, 6], [7]),
        alloc(8, Y, "gradient"), alloc(9, C, "other"),               # tensor7 dy, tensor15 constant
        kernel(n[3], d[3], [7, 9], [8]), free(7),
        alloc(10, W2, "gradient"),                                   # tensor8 dW2
        kernel(n[4], d[4], [5, 8], [10]), free(5),
        alloc(11, H, "gradient"),                                    # tensor9 d relu(h1)
        kernel(n[5], d[5], [6, 8], [11]), free(8),
        kernel(n[6], d[6], [6, 10], [6]), free(10),
        alloc(12, H, "gradient"),                                    # tensor10 dh1
        kernel(n[7], d[7], [3, 11], [12]), free(3), free(11),
        alloc(13, B1, "gradient"),                                   # tensor11 db1
        kernel(n[8], d[8], [12], [13]),
        kernel(n[9], d[9], [2, 13], [2]), free(13),
        alloc(14, W1, "gradient"),                                   # tensor12 dW1
        kernel(n[10], d[10], [0, 12], [14]), free(0), free(12),
        kernel(n[11], d[11], [1, 14], [1]), free(14),
        {"ev": "iter", "n": 1},
        # the weights (1, 2, 6) and the constant (9) persist; the rest get fresh ids
        alloc(15, X, "activation"), alloc(16, H, "activation"), alloc(17, WS, ws_kind),
        kernel(n[0], d[0], [1, 2, 15], [16, 17]), free(17),
        alloc(18, H, "activation"),
        kernel(n[1], d[1], [16], [18]),
        alloc(19, Y, "activation"),
        kernel(n[2], d[2], [6, 18], [19]),
        alloc(20, Y, "gradient"),
        kernel(n[3], d[3], [9, 19], [20]), free(19),
        alloc(21, W2, "gradient"),
        kernel(n[4], d[4], [18, 20], [21]), free(18),
        alloc(22, H, "gradient"),
        kernel(n[5], d[5], [6, 20], [22]), free(20),
        kernel(n[6], d[6], [6, 21], [6]), free(21),
        alloc(23, H, "gradient"),
        kernel(n[7], d[7], [16, 22], [23]), free(16), free(22),
        alloc(24, B1, "gradient"),
        kernel(n[8], d[8], [23], [24]),
        kernel(n[9], d[9], [2, 24], [2]), free(24),
        alloc(25, W1, "gradient"),
        kernel(n[10], d[10], [15, 23], [25]), free(15), free(23),
        kernel(n[11], d[11], [1, 25], [1]), free(25),
    ]


def peak_live(events):
    sizes, live, peak = {}, 0, 0
    for e in events:
        if e["ev"] == "alloc":
            sizes[e["id"]] = e["bytes"]
            live += e["bytes"]
            peak = max(peak, live)
        elif e["ev"] == "free":
            live -= sizes[e["id"]]
    return peak


def read_trace(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    assert lines[-1] == "", "the trace must end with a newline"
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:-1]]


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="g10_convert_test.")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_script(self, *args, python=sys.executable):
        return subprocess.run([python, SCRIPT, *args], capture_output=True, text=True, timeout=60)

    def convert(self, *extra, out="out.jsonl", python=sys.executable):
        out = os.path.join(self.tmp, out)
        r = self.run_script(KERNELS, TENSORS, out, *extra, python=python)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        return read_trace(out)


class Convert(Base):
    def test_events_exact_with_times_and_workspace(self):
        header, events = self.convert("--iters", "2", "--kernel-times", TIMES, "--workspace", WORKSPACE)
        want = expected_events(DUR_MS)
        self.assertEqual(len(events), len(want))
        for i, (got, exp) in enumerate(zip(events, want)):
            self.assertEqual(got, exp, f"event {i}")

    def test_events_exact_from_cycles(self):
        # Without the times file: 'Execution Time' cycles / 1.2 GHz, to the nearest ns; without
        # the workspace file the workspace is an ordinary output of its (forward) kernel.
        _, events = self.convert("--iters", "2")
        self.assertEqual(events, expected_events(DUR_CYCLES, ws_kind="activation"))

    def test_ghz(self):
        _, events = self.convert("--iters", "1", "--ghz", "2")
        durs = [e["dur_ns"] for e in events if e["ev"] == "kernel"]
        self.assertEqual(durs, [31334, 6144, 29491, 2458, 28262, 28800, 12288, 6144, 1843, 1200, 30720, 12288])

    def test_header(self):
        header, events = self.convert("--kernel-times", TIMES, "--workspace", WORKSPACE, out="out.jsonl.gz")
        self.assertEqual(header["format"], "spillway-trace")
        self.assertEqual(header["version"], 1)
        self.assertIn("G10", header["source"])
        for name in ("kernels.config", "tensors.config", "kernel_times.txt", "workspace.txt"):
            self.assertIn(name, header["source"])
        self.assertEqual(header["iterations"], 3)                    # the default
        self.assertEqual(header["kernels_per_iter"], 12)
        self.assertEqual(header["compute_ns_per_iter"], sum(DUR_MS))
        self.assertEqual(header["g10_tensors"], 16)
        self.assertEqual(header["g10_tensors_unreferenced"], 1)      # tensor13
        self.assertEqual(header["tensors"], 4 + 3 * 11)              # 3 weights + 1 constant, 11 per iteration
        self.assertEqual(sum(e["ev"] == "kernel" for e in events), 36)
        self.assertEqual([e["n"] for e in events if e["ev"] == "iter"], [0, 1, 2])
        self.assertEqual(header["peak_live_bytes"], peak_live(events))
        self.assertEqual(header["peak_live_bytes"], peak_live(expected_events(DUR_MS)))
        self.assertEqual(header["alloc_by_kind"],
                         {"activation": 12, "gradient": 18, "other": 1, "weight": 3, "workspace": 3})

    def test_gzip_and_plain_agree(self):
        h1, e1 = self.convert(out="a.jsonl")
        h2, e2 = self.convert(out="a.jsonl.gz")
        self.assertEqual((h1, e1), (h2, e2))
        with open(os.path.join(self.tmp, "a.jsonl.gz"), "rb") as f:
            self.assertEqual(f.read(2), b"\x1f\x8b")

    def test_every_block_is_live_when_used(self):
        # The rules of docs/trace-format.md the reader enforces, checked on the output.
        _, events = self.convert("--iters", "3", "--kernel-times", TIMES)
        live = set()
        for e in events:
            if e["ev"] == "alloc":
                self.assertNotIn(e["id"], live)
                live.add(e["id"])
            elif e["ev"] == "free":
                self.assertIn(e["id"], live)
                live.remove(e["id"])
            elif e["ev"] == "kernel":
                for i in e["reads"] + e["writes"]:
                    self.assertIn(i, live)
        self.assertEqual(live, {1, 2, 6, 9})   # only the weights and the constant outlive the run

    def test_python3_on_path(self):
        # The script must run with /usr/bin/python3 and with the python3 on PATH.
        for python in ("/usr/bin/python3", shutil.which("python3")):
            if python and os.path.exists(python):
                _, events = self.convert("--iters", "2", "--kernel-times", TIMES, "--workspace", WORKSPACE,
                                         python=python)
                self.assertEqual(events, expected_events(DUR_MS), python)


class Errors(Base):
    """Malformed input: exit 2, one line 'g10_to_trace: FILE:LINE: ...', no traceback, no output."""

    def variant(self, name, src, old, new, count=1):
        with open(src, encoding="utf-8") as f:
            text = f.read()
        self.assertEqual(text.count(old), count, f"{old!r} in {src}")
        path = os.path.join(self.tmp, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace(old, new))
        return path

    def assert_error(self, args, expected):
        out = os.path.join(self.tmp, "out.jsonl")
        r = self.run_script(*args[:2], out, *args[2:])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertNotIn("Traceback", r.stderr)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
        self.assertEqual(r.stderr.rstrip("\n"), "g10_to_trace: " + expected)
        self.assertFalse(os.path.exists(out), "no output on error")

    def test_missing_file(self):
        missing = os.path.join(self.tmp, "nope.config")
        self.assert_error([KERNELS, missing], f"{missing}: cannot open: No such file or directory")

    def test_malformed_tensor_line(self):
        bad = self.variant("tensors.config", TENSORS, "tensor6 Is weight (global)?: 0, Size in byte: 258048,",
                           "tensor6 Is weight (global)?: 0, Size in byte: 258k,", count=1)
        self.assert_error([KERNELS, bad],
                          f"{bad}:7: malformed tensor line: expected 'tensorN Is weight (global)?: 0|1, "
                          "Size in byte: BYTES, Range:A--B', got 'tensor6 Is weight (global)?: 0, "
                          "Size in byte: 258k, Range:2359296--2617344'")

    def test_zero_size_tensor(self):
        bad = self.variant("tensors.config", TENSORS, "Size in byte: 4096, Range:33177600",
                           "Size in byte: 0, Range:33177600")
        self.assert_error([KERNELS, bad], f"{bad}:16: tensor15: size 0 bytes: a tensor must have at least one byte")

    def test_duplicate_tensor(self):
        bad = self.variant("tensors.config", TENSORS, "tensor13 Is", "tensor12 Is")
        self.assert_error([KERNELS, bad], f"{bad}:14: tensor12 is listed twice (first on line 13)")

    def test_unknown_tensor(self):
        bad = self.variant("kernels.config", KERNELS, "Output Tensors:\ntensor4 Is",
                           "Output Tensors:\ntensor99 Is")
        self.assert_error([bad, TENSORS], f"{bad}:20: tensor99 is not in {TENSORS}")

    def test_size_differs(self):
        bad = self.variant("kernels.config", KERNELS, "Output Tensors:\ntensor4 Is weight (global)?: 0, Size in byte: 1048576",
                           "Output Tensors:\ntensor4 Is weight (global)?: 0, Size in byte: 1052672")
        self.assert_error([bad, TENSORS], f"{bad}:20: tensor4 differs from {TENSORS}:5 "
                          "(global 0 vs 0, 1052672 vs 1048576 bytes)")

    def test_kernel_out_of_order(self):
        bad = self.variant("kernels.config", KERNELS, "Kernel ID: 2,", "Kernel ID: 3,")
        self.assert_error([bad, TENSORS], f"{bad}:22: kernel ID 3 out of order: expected 2 "
                          "(G10 numbers the kernels of an iteration 0, 1, 2, ... in launch order)")

    def test_negative_time(self):
        bad = self.variant("kernels.config", KERNELS, "Execution Time: 58982", "Execution Time: -1")
        self.assert_error([bad, TENSORS], f"{bad}:24: kernel 2: execution time -1 cycles is negative "
                          "(G10 writes -1 when it had no kernel times)")

    def test_cut_short(self):
        with open(KERNELS, encoding="utf-8") as f:
            lines = f.read().split("\n")
        bad = os.path.join(self.tmp, "kernels.config")
        with open(bad, "w", encoding="utf-8") as f:   # without the last output line and the closing line
            f.write("\n".join(lines[:-3]))
        self.assert_error([bad, TENSORS], f"{bad}:{len(lines) - 3}: kernel 11 (line {len(lines) - 10}) has no "
                          "closing line of underscores: is the file cut short?")

    def test_missing_separator_between_kernels(self):
        bad = self.variant("kernels.config", KERNELS, "_" * 68 + "\nKernel ID: 5,", "Kernel ID: 5,")
        self.assert_error([bad, TENSORS], f"{bad}:51: kernel 4 has no closing line of underscores before the next kernel")

    def test_unexpected_line(self):
        bad = self.variant("kernels.config", KERNELS, "Execution Time: 12288\n(64,4096,1,1)",
                           "Execution Time: 12288\nRuntime: 3", count=2)
        self.assert_error([bad, TENSORS], f"{bad}:16: kernel 1: unexpected line 'Runtime: 3'")

    def test_kernel_times_count(self):
        bad = self.variant("times.txt", TIMES, "0011 0.020480 ms\n", "")
        self.assert_error([KERNELS, TENSORS, "--kernel-times", bad],
                          f"{bad}: 11 kernel times for the 12 kernels of the kernels file")

    def test_kernel_times_unit(self):
        bad = self.variant("times.txt", TIMES, "0003 0.004096 ms", "0003 4.096 us")
        self.assert_error([KERNELS, TENSORS, "--kernel-times", bad],
                          f"{bad}:4: expected 'ID MILLISECONDS ms', got '0003 4.096 us'")

    def test_workspace_mismatch(self):
        bad = self.variant("ws.txt", WORKSPACE, "0002 0 B", "0002 5000 B")
        self.assert_error([KERNELS, TENSORS, "--workspace", bad],
                          f"{bad}:3: kernel 2 has a 5000-byte workspace, but its last output tensor is not a "
                          "8192-byte tensor of that kernel alone (a workspace file of another run?)")

    def test_not_utf8(self):
        bad = os.path.join(self.tmp, "tensors.config")
        with open(bad, "wb") as f:
            f.write(b"tensor0 Is weight \xff")
        self.assert_error([KERNELS, bad], f"{bad}: not UTF-8 text (byte 18)")

    def test_damaged_gzip(self):
        with open(TENSORS, "rb") as f:
            data = gzip.compress(f.read(), mtime=0)
        bad = os.path.join(self.tmp, "tensors.config.gz")
        with open(bad, "wb") as f:
            f.write(data[:10] + bytes(5) + data[15:])
        r = self.run_script(KERNELS, bad, os.path.join(self.tmp, "o.jsonl"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        self.assertTrue(r.stderr.startswith(f"g10_to_trace: {bad}: damaged gzip stream: "), r.stderr)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)

    def test_gzip_input(self):
        # G10's files may be kept compressed: a gzip file is read as its content.
        gz = os.path.join(self.tmp, "tensors.config.gz")
        with open(TENSORS, "rb") as f, open(gz, "wb") as g:
            g.write(gzip.compress(f.read()))
        out = os.path.join(self.tmp, "o.jsonl")
        r = self.run_script(KERNELS, gz, out, "--iters", "2", "--kernel-times", TIMES, "--workspace", WORKSPACE)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(read_trace(out)[1], expected_events(DUR_MS))

    def test_bad_option(self):
        r = self.run_script(KERNELS, TENSORS, os.path.join(self.tmp, "o.jsonl"), "--iters", "0")
        self.assertEqual(r.returncode, 2)
        self.assertNotIn("Traceback", r.stderr)
        self.assertIn("--iters: must be at least 1, not 0", r.stderr)


if __name__ == "__main__":
    unittest.main()
