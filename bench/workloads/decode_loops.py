#!/usr/bin/env python3
"""Synthetic LLM decode loops as spillway traces (format v1), for sweeping `learned` on loops
just over the GPU (docs/learned-policy.md §4).

Two shapes, written into DIR:
  layers-L-K.jsonl   a transformer layer per step: 8 launches over its weights (qkv 3 chunks,
                     proj 1, mlp 2 + 2) and a KV chunk, and 5 activation chunks that every
                     launch touches; kernels of K ns (layer norms and GELU 5 us)
  weights-L-M-K.jsonl one launch per layer reading M MiB of weights and a 2 MiB activation
Each loops over all layers 16 (layers) or 12 (weights) times.

  python3 bench/workloads/decode_loops.py DIR
  build/bin/spillway sweep DIR/*.jsonl --policy learned,demand,oracle --capacity 0.95,0.9,0.8,0.6 --link h200
"""
import json
import os
import sys

MIB = 1 << 20
CHUNK = 2 * MIB


def layers(layer_count, kernel_ns, steps=16):
    events = [{"format": "spillway-trace", "version": 1, "source": "synthetic decode loop (layers)"}]
    next_id = 0

    def alloc(nbytes, kind):
        nonlocal next_id
        events.append({"ev": "alloc", "id": next_id, "bytes": nbytes, "kind": kind})
        next_id += 1
        return next_id - 1

    x, x1, h, q = alloc(CHUNK, "activation"), alloc(CHUNK, "activation"), alloc(2 * CHUNK, "activation"), alloc(CHUNK, "activation")
    weights = [
        {"qkv": alloc(3 * CHUNK, "weight"), "proj": alloc(CHUNK, "weight"), "m1": alloc(2 * CHUNK, "weight"),
         "m2": alloc(2 * CHUNK, "weight"), "kv": alloc(CHUNK, "activation")}
        for _ in range(layer_count)
    ]

    def kernel(name, reads, writes, ns=kernel_ns):
        events.append({"ev": "kernel", "name": name, "dur_ns": ns, "reads": reads, "writes": writes})

    for step in range(steps):
        events.append({"ev": "iter", "n": step})
        for w in weights:
            kernel("ln", [x], [x1], 5000)
            kernel("qkv", [x1, w["qkv"]], [q])
            kernel("attn", [q, w["kv"]], [x1, w["kv"]])
            kernel("proj", [x1, w["proj"]], [x])
            kernel("ln", [x], [x1], 5000)
            kernel("mlp1", [x1, w["m1"]], [h])
            kernel("gelu", [h], [h], 5000)
            kernel("mlp2", [h, w["m2"]], [x])
    return events


def weights_only(layer_count, layer_mib, kernel_ns, steps=12):
    events = [{"format": "spillway-trace", "version": 1, "source": "synthetic decode loop (weights)"},
              {"ev": "alloc", "id": 0, "bytes": CHUNK, "kind": "activation"}]
    for layer in range(layer_count):
        events.append({"ev": "alloc", "id": 1 + layer, "bytes": layer_mib * MIB, "kind": "weight"})
    for step in range(steps):
        events.append({"ev": "iter", "n": step})
        for layer in range(layer_count):
            events.append({"ev": "kernel", "name": "layer", "dur_ns": kernel_ns, "reads": [1 + layer, 0], "writes": [0]})
    return events


def write_traces(usage, traces):
    """Writes {file name: events} as JSON lines into the directory named by the one argument."""
    if len(sys.argv) != 2:
        sys.exit(usage)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, events in traces.items():
        with open(os.path.join(out, name), "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in events)
    print(f"{len(traces)} traces in {out}")


def main():
    traces = {f"layers-24-{ns}.jsonl": layers(24, ns) for ns in (5000, 20000, 50000, 200000, 1000000)}
    for count, mib, ns in ((32, 64, 50000), (32, 64, 500000), (24, 128, 200000), (32, 16, 20000)):
        traces[f"weights-{count}-{mib}-{ns}.jsonl"] = weights_only(count, mib, ns)
    write_traces("usage: decode_loops.py DIR", traces)


if __name__ == "__main__":
    main()
