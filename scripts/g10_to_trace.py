#!/usr/bin/python3
"""Converts a G10 workload (its kernel and tensor description files) into a Spillway trace.

G10 (Zhang et al., "G10: Enabling An Efficient Unified GPU Memory and Storage Architecture
with Smart Tensor Migrations", MICRO 2023; artifact: github.com/platformxlab/G10,
Apache-2.0) describes one training iteration of a DNN as a list of kernels and a list of
tensors. Its simulator (`gpg`) derives them from a network description
(frontend/Nets/*.txt) and per-kernel times measured on an A100 (results/MODEL/cudnnB.txt),
and writes them, before it simulates, to OUTPUT_FOLDER/statistics/kernels.config and
tensors.config (documented in its results/README.md). This script reads those two files
and writes spillway-trace v1 (docs/trace-format.md):

    scripts/g10_to_trace.py KERNELS TENSORS OUT.jsonl[.gz] [--iters 3] [--ghz 1.2]
                            [--kernel-times cudnnB.txt] [--workspace cudnnBWorkspace.txt]

    e.g. (in G10's tree) scripts/g10_to_trace.py \\
             results/BERT_Base/256-lru/statistics/kernels.config \\
             results/BERT_Base/256-lru/statistics/tensors.config BERT_Base-b256.jsonl.gz \\
             --kernel-times results/BERT_Base/cudnn256.txt \\
             --workspace results/BERT_Base/cudnn256Workspace.txt

To get the two files: build G10 (`make` in its src/, with flex and bison) and run
`./gpg CONFIG` with one of its simulation configs (resources/genconfigs.py writes them;
gpg reads a CNN's network file from standard input when that is not a terminal, so give
it `< ../frontend/Nets/MODEL.txt` when running it from a script). The statistics files are
written within seconds, before the simulation proper, which may then be stopped.

The format, as G10's code writes and reads it (read, not copied: src/analysis.cc
`Tensor::print`, `Tensor::Tensor`, `CUDAKernel::print`, `tensor_first_pass_liveness_analysis`,
`transformer_scheduling_kernels`, `layer_second_pass_scheduling_kernels`; src/analysis.h
`CUDAKernelType`; src/main.cc `loadKernelTimes`, `loadWorkspaceSizes` and the writing of
the statistics files):

  tensors.config, one line per tensor:
      tensor<ID> Is weight (global)?: <0|1>, Size in byte: <BYTES>, Range:<START>--<END>
    BYTES is already rounded up to 4 KiB pages (G10 sizes every tensor as fp32 elements x 4
    and aligns it to a page); "global" tensors are the weights (and, for transformers,
    every tensor of the network file numbered below its trans_borden), which live for the
    whole run; every other tensor is an intermediate of one iteration. Range is G10's own address
    layout (not used here).
  kernels.config, one block per kernel of ONE iteration, in launch order, IDs 0, 1, 2, ...:
      Kernel ID: <ID>, Name: <KernelType, e.g. Linear_Backward_Weight>
      Parent Layer ID:<L>; Name:<Conv2d|Linear|...>   (CNNs)  or
      Parent OP ID:<OP>; Name: <GatherV2|Dot|...>    (transformers)
      Execution Time: <CYCLES>                         (GPU cycles at GPU_frequency_GHz, 1.2)
      (N,C,H,W)                                        (layer kernels only)
      Input Tensors:
      <tensor lines as above>                          (read; an unordered set in G10)
      Output Tensors:
      <tensor lines as above>                          (written; may repeat an input)
      ____________________________________________________________________
  cudnnB.txt (G10's orig_kernel_time_file, optional here), one line per kernel:
      <ID> <MILLISECONDS> ms
    CYCLES = trunc(ms x GHz x 1e6), so passing it gives the measured times to the ns.
  Iterations: the files hold one iteration; G10's simulator runs the same kernel list
  num_iteration times (2 in its configs). The optimizer is in-place SGD: *Apply_Grad*
  kernels read a weight and its gradient and write the weight; there is no optimizer state.

What maps to what:
  * each kernel -> `kernel` with name "<KernelType>:op<OP>" or "<KernelType>:L<L>",
    reads = its input tensors, writes = its output tensors (ids sorted), dur_ns = the
    kernel-times file's ms x 1e6 if given, else round(CYCLES / GHz);
  * global tensor -> one `alloc` before its first use, never freed; kind "weight", or
    "other" when no *Apply_Grad* kernel updates it although the iteration trains
    (BatchNorm running statistics, constant operands such as Power's exponent);
  * other tensors -> in each iteration a fresh id, `alloc` right before the first kernel of
    the iteration that uses it, `free` right after the last kernel that uses it (G10's
    liveness analysis: death after the last read; a tensor written and never read lives
    for its one kernel). kind: "gradient" when the first kernel that writes it is a
    backward kernel (Backward, makeLoss, Add_MultiGredient, Apply_Grad), else "activation"
    (also when no kernel writes it: the batch, constants); "workspace" for the workspace
    tensors when --workspace names G10's workspace file (G10 appends a kernel's workspace
    to its outputs, after every tensor of the model: the output with the highest number);
  * new tensors of a kernel are allocated in G10's tensor order, frees after a kernel too;
    ids count from 0 in order of allocation; `iter` n starts each iteration; tensors of
    tensors.config that no kernel uses are left out (counted in the header).
  These are the conventions of the bundled G10 traces (bench/traces/README.md): converting
  G10's files for BERT_Base b256 and ResNet152 b1280 with --kernel-times and --workspace
  reproduces them event for event (ResNet152: but for the kind of BatchNorm's saved
  statistics, "workspace" there, "activation"/"gradient" here).
Approximated or lost: without --workspace, workspace tensors are plain outputs of their
kernel; G10's PF/InputPF kernel times (kernels slowed by page faults), its address layout
(Range) and its kernel-time variation and speed-up settings are not used; the times are
an A100's.

Errors in the input stop the script with one line, "g10_to_trace: FILE:LINE: what is
wrong", and exit status 2. Python 3 standard library only.
"""
import argparse
import decimal
import gzip
import io
import json
import os
import re
import sys
import zlib

PAGE = 4096
MAX_BLOCK = 1 << 44      # trace v1: a block is at most 16 TiB
MAX_DUR_NS = 1 << 50     # trace v1: a kernel is at most 2^50 ns

TENSOR_RE = re.compile(
    r"tensor(\d+) Is weight \(global\)\?: (-?\d+), Size in byte: (-?\d+), Range:(-?\d+)--(-?\d+)")
KERNEL_RE = re.compile(r"Kernel ID: (\d+), Name: (\S+)")
PARENT_LAYER_RE = re.compile(r"Parent Layer ID:(\d+); Name:(.*)")
PARENT_OP_RE = re.compile(r"Parent OP ID:(\d+); Name: ?(.*)")
TIME_RE = re.compile(r"Execution Time: (-?\d+)")
SHAPE_RE = re.compile(r"\((-?\d+(?:,-?\d+)*)\)")
SEPARATOR_RE = re.compile(r"_{10,}")
TIMES_RE = re.compile(r"(\d+)\s+(\S+)\s+(\S+)")
BACKWARD_MARKERS = ("Backward", "makeLoss", "MultiGredient", "Apply_Grad")


class ConvertError(Exception):
    """Bad input: the message is printed as one line, the exit status is 2."""


def fail(path, line, what):
    raise ConvertError(f"{path}:{line}: {what}" if line else f"{path}: {what}")


def read_lines(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        fail(path, 0, f"cannot open: {e.strerror or e}")
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            fail(path, 0, f"damaged gzip stream: {e}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(path, 0, f"not UTF-8 text (byte {e.start})")
    return text.splitlines()


class Tensor:
    __slots__ = ("g10_id", "is_global", "size", "line")

    def __init__(self, g10_id, is_global, size, line):
        self.g10_id, self.is_global, self.size, self.line = g10_id, is_global, size, line


def parse_tensor_line(path, lineno, text):
    m = TENSOR_RE.fullmatch(text.strip())
    if not m:
        fail(path, lineno, "malformed tensor line: expected "
             f"'tensorN Is weight (global)?: 0|1, Size in byte: BYTES, Range:A--B', got {text.strip()[:80]!r}")
    g10_id, glob, size, start, end = (int(g) for g in m.groups())
    if glob not in (0, 1):
        fail(path, lineno, f"tensor{g10_id}: 'Is weight (global)?' must be 0 or 1, not {glob}")
    if size <= 0:
        fail(path, lineno, f"tensor{g10_id}: size {size} bytes: a tensor must have at least one byte")
    if size > MAX_BLOCK:
        fail(path, lineno, f"tensor{g10_id}: size {size} bytes exceeds the 16 TiB ({MAX_BLOCK}) a trace block may have")
    return Tensor(g10_id, bool(glob), size, lineno)


def parse_tensors(path):
    tensors = {}
    for lineno, text in enumerate(read_lines(path), 1):
        if not text.strip():
            continue
        t = parse_tensor_line(path, lineno, text)
        if t.g10_id in tensors:
            fail(path, lineno, f"tensor{t.g10_id} is listed twice (first on line {tensors[t.g10_id].line})")
        tensors[t.g10_id] = t
    if not tensors:
        fail(path, 0, "no tensors: expected lines 'tensorN Is weight (global)?: ...'")
    return tensors


class Kernel:
    __slots__ = ("kid", "kind", "parent", "cycles", "inputs", "outputs", "line", "dur_ns")

    def __init__(self, kid, kind, line):
        self.kid, self.kind, self.line = kid, kind, line
        self.parent, self.cycles, self.dur_ns = "", None, None
        self.inputs, self.outputs = [], []


def parse_kernels(path, tensors, tensors_path):
    lines = read_lines(path)
    kernels = []
    k = None
    section = None  # None, "in", "out"
    for lineno, raw in enumerate(lines, 1):
        text = raw.strip()
        if not text:
            continue
        if k is None:
            m = KERNEL_RE.fullmatch(text)
            if not m:
                fail(path, lineno, f"expected 'Kernel ID: N, Name: TYPE', got {text[:80]!r}")
            kid = int(m.group(1))
            if kid != len(kernels):
                fail(path, lineno, f"kernel ID {kid} out of order: expected {len(kernels)} "
                     "(G10 numbers the kernels of an iteration 0, 1, 2, ... in launch order)")
            k = Kernel(kid, m.group(2), lineno)
            section = None
            continue
        if SEPARATOR_RE.fullmatch(text):
            if k.cycles is None:
                fail(path, lineno, f"kernel {k.kid} has no 'Execution Time:' line")
            if section != "out":
                fail(path, lineno, f"kernel {k.kid} has no 'Output Tensors:' line")
            if not k.inputs and not k.outputs:
                fail(path, lineno, f"kernel {k.kid} uses no tensor")
            kernels.append(k)
            k = None
            continue
        if text == "Input Tensors:":
            if section is not None:
                fail(path, lineno, f"kernel {k.kid}: a second 'Input Tensors:' line")
            if k.cycles is None:
                fail(path, lineno, f"kernel {k.kid}: 'Input Tensors:' before 'Execution Time:'")
            section = "in"
            continue
        if text == "Output Tensors:":
            if section != "in":
                fail(path, lineno, f"kernel {k.kid}: 'Output Tensors:' without 'Input Tensors:' before it")
            section = "out"
            continue
        if section is not None:
            if KERNEL_RE.fullmatch(text):
                fail(path, lineno, f"kernel {k.kid} has no closing line of underscores before the next kernel")
            t = parse_tensor_line(path, lineno, text)
            known = tensors.get(t.g10_id)
            if known is None:
                fail(path, lineno, f"tensor{t.g10_id} is not in {tensors_path}")
            if (known.is_global, known.size) != (t.is_global, t.size):
                fail(path, lineno, f"tensor{t.g10_id} differs from {tensors_path}:{known.line} "
                     f"(global {int(t.is_global)} vs {int(known.is_global)}, {t.size} vs {known.size} bytes)")
            lst = k.inputs if section == "in" else k.outputs
            if t.g10_id not in lst:
                lst.append(t.g10_id)
            continue
        m = PARENT_OP_RE.fullmatch(text)
        if m:
            k.parent = f"op{m.group(1)}"
            continue
        m = PARENT_LAYER_RE.fullmatch(text)
        if m:
            k.parent = f"L{m.group(1)}"
            continue
        m = TIME_RE.fullmatch(text)
        if m:
            if k.cycles is not None:
                fail(path, lineno, f"kernel {k.kid}: a second 'Execution Time:' line")
            cycles = int(m.group(1))
            if cycles < 0:
                fail(path, lineno, f"kernel {k.kid}: execution time {cycles} cycles is negative "
                     "(G10 writes -1 when it had no kernel times)")
            k.cycles = cycles
            continue
        if SHAPE_RE.fullmatch(text) and k.cycles is not None:
            continue  # the parent layer's (N,C,H,W): not needed
        fail(path, lineno, f"kernel {k.kid}: unexpected line {text[:80]!r}")
    if k is not None:
        fail(path, len(lines), f"kernel {k.kid} (line {k.line}) has no closing line of underscores: is the file cut short?")
    if not kernels:
        fail(path, 0, "no kernels: expected blocks starting 'Kernel ID: 0, Name: ...'")
    return kernels


def per_kernel_lines(path, kernels, unit, form, noun, valid=lambda value: True):
    """The lines of one of G10's per-kernel files ('ID VALUE UNIT', IDs 0, 1, 2, ..., one per
    kernel): yields (lineno, kernel id, value text); stops with one line on a malformed line,
    an ID out of order, or a count other than the kernels file's."""
    n = 0
    for lineno, raw in enumerate(read_lines(path), 1):
        text = raw.strip()
        if not text:
            continue
        m = TIMES_RE.fullmatch(text)
        if not m or m.group(3) != unit or not valid(m.group(2)):
            fail(path, lineno, f"expected '{form}', got {text[:80]!r}")
        kid = int(m.group(1))
        if kid != n:
            fail(path, lineno, f"kernel ID {kid} out of order: expected {n}")
        if n >= len(kernels):
            fail(path, lineno, f"more {noun} than the {len(kernels)} kernels of the kernels file")
        n += 1
        yield lineno, kid, m.group(2)
    if n != len(kernels):
        fail(path, 0, f"{n} {noun} for the {len(kernels)} kernels of the kernels file")


def parse_kernel_times(path, kernels):
    """G10's orig_kernel_time_file: 'ID MILLISECONDS ms' per kernel, IDs 0, 1, 2, ..."""
    for lineno, kid, value in per_kernel_lines(path, kernels, "ms", "ID MILLISECONDS ms", "kernel times"):
        try:
            ms = decimal.Decimal(value)
        except decimal.InvalidOperation:
            fail(path, lineno, f"kernel {kid}: {value!r} is not a number of milliseconds")
        if not ms.is_finite() or ms < 0:
            fail(path, lineno, f"kernel {kid}: time {value} ms must be a non-negative number")
        ns = int((ms * 1000000).to_integral_value(rounding=decimal.ROUND_HALF_EVEN))
        if ns > MAX_DUR_NS:
            fail(path, lineno, f"kernel {kid}: {value} ms exceeds the 2^50 ns a trace kernel may take")
        kernels[kid].dur_ns = ns


def parse_workspace(path, kernels, tensors):
    """G10's workspace_size_file: 'ID BYTES B' per kernel. G10 (main.cc loadWorkspaceSizes)
    makes a new non-global tensor of that size for each kernel with BYTES > 0 and adds it to
    the kernel's outputs, after every tensor of the model: it is the kernel's output with
    the highest tensor number. Returns the set of those tensors' G10 ids."""
    users = {}
    for k in kernels:
        for g in k.inputs + k.outputs:
            users.setdefault(g, set()).add(k.kid)
    found = set()
    for lineno, kid, value in per_kernel_lines(path, kernels, "B", "ID BYTES B", "workspace sizes", str.isdigit):
        nbytes = int(value)
        if nbytes == 0:
            continue
        k = kernels[kid]
        g = max(k.outputs) if k.outputs else None
        pages = -(-nbytes // PAGE) * PAGE
        if (g is None or tensors[g].is_global or tensors[g].size != pages or users[g] != {kid}
                or g in k.inputs):
            fail(path, lineno, f"kernel {kid} has a {nbytes}-byte workspace, but its last output tensor "
                 f"is not a {pages}-byte tensor of that kernel alone (a workspace file of another run?)")
        found.add(g)
    return found


def kind_of(kernel_type):
    return "gradient" if any(m in kernel_type for m in BACKWARD_MARKERS) else "activation"


def convert(kernels, tensors, iters, workspace=frozenset()):
    """Returns (events, stats). Events are dicts in trace order, without the header."""
    first_use, last_use, first_writer = {}, {}, {}
    for k in kernels:
        for g in k.inputs + k.outputs:
            first_use.setdefault(g, k.kid)
            last_use[g] = k.kid
        for g in k.outputs:
            first_writer.setdefault(g, k.kind)
    # free after the kernel of last use: frees_after[kid] = tensors that die there
    frees_after = {}
    for g, kid in last_use.items():
        if not tensors[g].is_global:
            frees_after.setdefault(kid, []).append(g)
    trained = {g for k in kernels if "Apply_Grad" in k.kind for g in k.outputs}
    kinds = {}
    for g in first_use:
        if g in workspace:
            kinds[g] = "workspace"
        elif tensors[g].is_global:
            kinds[g] = "weight" if g in trained or not trained else "other"
        elif g in first_writer:
            kinds[g] = kind_of(first_writer[g])
        else:
            kinds[g] = "activation"

    events = []
    next_id = 0
    weight_ids = {}
    live_bytes = 0
    peak_per_iter = []
    kinds_count = {}
    for it in range(iters):
        events.append({"ev": "iter", "n": it})
        ids = {}
        peak = live_bytes
        for k in kernels:
            for g in sorted(set(k.inputs) | set(k.outputs)):
                t = tensors[g]
                if t.is_global:
                    if g in weight_ids:
                        continue
                    weight_ids[g] = next_id
                elif first_use[g] == k.kid:
                    ids[g] = next_id
                else:
                    continue
                events.append({"ev": "alloc", "id": next_id, "bytes": t.size, "kind": kinds[g]})
                kinds_count[kinds[g]] = kinds_count.get(kinds[g], 0) + 1
                next_id += 1
                live_bytes += t.size
            peak = max(peak, live_bytes)

            def tid(g):
                return weight_ids[g] if tensors[g].is_global else ids[g]
            events.append({"ev": "kernel", "name": f"{k.kind}:{k.parent}" if k.parent else k.kind,
                           "dur_ns": k.dur_ns,
                           "reads": sorted(tid(g) for g in k.inputs),
                           "writes": sorted(tid(g) for g in k.outputs)})
            for g in sorted(frees_after.get(k.kid, ())):
                events.append({"ev": "free", "id": ids[g]})
            for g in frees_after.get(k.kid, ()):
                live_bytes -= tensors[g].size
        peak_per_iter.append(peak)
    # A tensor written after its last read is written and then dropped: legal, but odd.
    last_read = {}
    for k in kernels:
        for g in k.inputs:
            last_read[g] = k.kid
    odd = sum(1 for g, kid in last_use.items()
              if not tensors[g].is_global and g in last_read and last_read[g] < kid)
    stats = {
        "tensors": next_id,
        "kernels_per_iter": len(kernels),
        "compute_ns_per_iter": sum(k.dur_ns for k in kernels),
        "peak_live_bytes": max(peak_per_iter),
        "peak_live_bytes_per_iter": peak_per_iter,
        "alloc_by_kind": dict(sorted(kinds_count.items())),
        "g10_tensors": len(tensors),
        "g10_tensors_unreferenced": len(tensors) - len(first_use),
        "g10_nonglobal_written_after_last_read": odd,
    }
    return events, stats


def write_trace(out, header, events):
    body = io.StringIO()
    body.write(json.dumps(header, separators=(",", ":")) + "\n")
    for e in events:
        body.write(json.dumps(e, separators=(",", ":")) + "\n")
    data = body.getvalue().encode("utf-8")
    if out.endswith(".zst") or out.endswith(".zstd"):
        raise ConvertError(f"{out}: zstd output needs a library Python lacks: name it .jsonl or .jsonl.gz")
    if out.endswith(".gz"):
        data = gzip.compress(data, compresslevel=6, mtime=0)
    try:
        with open(out, "wb") as f:
            f.write(data)
    except OSError as e:
        raise ConvertError(f"{out}: cannot write: {e.strerror or e}")


def positive_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer")
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {v}")
    return v


def positive_float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number")
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return v


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="g10_to_trace",
        description="Convert G10's kernels.config + tensors.config into spillway-trace v1.")
    ap.add_argument("kernels", help="G10's statistics/kernels.config")
    ap.add_argument("tensors", help="G10's statistics/tensors.config")
    ap.add_argument("out", help="output trace: .jsonl, or .jsonl.gz (gzip)")
    ap.add_argument("--iters", type=positive_int, default=3, help="training iterations to write (default 3)")
    ap.add_argument("--ghz", type=positive_float, default=1.2,
                    help="G10's GPU_frequency_GHz, to turn 'Execution Time' cycles into ns (default 1.2)")
    ap.add_argument("--kernel-times", metavar="FILE",
                    help="G10's orig_kernel_time_file (cudnnB.txt, 'ID MS ms' lines): exact times instead of cycles")
    ap.add_argument("--workspace", metavar="FILE",
                    help="G10's workspace_size_file (cudnnBWorkspace.txt, 'ID BYTES B' lines): marks workspace tensors")
    ap.add_argument("--source", help="text for the header's 'source' (default: says what was converted)")
    args = ap.parse_args(argv)
    try:
        tensors = parse_tensors(args.tensors)
        kernels = parse_kernels(args.kernels, tensors, args.tensors)
        if args.kernel_times:
            parse_kernel_times(args.kernel_times, kernels)
        else:
            for k in kernels:
                k.dur_ns = int(round(k.cycles / args.ghz))
                if k.dur_ns > MAX_DUR_NS:
                    fail(args.kernels, k.line, f"kernel {k.kid}: {k.cycles} cycles exceed the 2^50 ns a trace kernel may take")
        workspace = parse_workspace(args.workspace, kernels, tensors) if args.workspace else set()
        events, stats = convert(kernels, tensors, args.iters, workspace)
        files = [os.path.basename(args.kernels), os.path.basename(args.tensors)]
        for extra in (args.kernel_times, args.workspace):
            if extra:
                files.append(os.path.basename(extra))
        header = {
            "format": "spillway-trace", "version": 1,
            "source": args.source or ("converted from G10's format (platformxlab/G10) by scripts/g10_to_trace.py: "
                                      + ", ".join(files)),
            "g10_kernels_file": files[0], "g10_tensors_file": files[1],
            "durations": (f"from {os.path.basename(args.kernel_times)} (ms)" if args.kernel_times
                          else f"'Execution Time' cycles / {args.ghz} GHz"),
            "sizes": "G10's page-aligned (4 KiB) tensor sizes",
            "iterations": args.iters,
        }
        header.update(stats)
        write_trace(args.out, header, events)
    except ConvertError as e:
        print(f"g10_to_trace: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
