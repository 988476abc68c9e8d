#!/usr/bin/env python3
"""Synthetic training-style loops whose footprints vary a little, as spillway traces (format v1):
the history's predictions fail now and then, which exercises how `learned` re-ranks chunks
after a failed prediction (docs/learned-policy.md §4).

Each trace: 48 blocks of 2 or 4 MiB; a loop of 32 kernels, each reading two fixed blocks and,
in a share P of its launches (0.1 or 0.3), one more block drawn at random; 12 steps of 50 us
kernels. 12 seeds x 2 shares = 24 traces, written into DIR.

  python3 bench/workloads/noisy_loops.py DIR
  build/bin/spillway sweep DIR/*.jsonl --policy learned --capacity 0.8,0.6,0.4 --link pcie3
"""
import random

from decode_loops import write_traces

CHUNK = 2 << 20


def noisy_loop(seed, extra_share, blocks=48, kernels=32, steps=12, kernel_ns=50_000):
    rng = random.Random(seed)
    events = [{"format": "spillway-trace", "version": 1, "source": f"synthetic noisy loop (seed {seed})"}]
    for b in range(blocks):
        events.append({"ev": "alloc", "id": b, "bytes": CHUNK * rng.choice([1, 1, 2]), "kind": "weight"})
    fixed = [[rng.randrange(blocks) for _ in range(2)] for _ in range(kernels)]
    for step in range(steps):
        events.append({"ev": "iter", "n": step})
        for k in range(kernels):
            reads = list(fixed[k])
            if rng.random() < extra_share:
                reads.append(rng.randrange(blocks))
            events.append({"ev": "kernel", "name": f"k{k}", "dur_ns": kernel_ns, "reads": reads, "writes": []})
    return events


def main():
    traces = {f"noisy-{seed}-{share}.jsonl": noisy_loop(seed, share) for seed in range(1, 13) for share in (0.1, 0.3)}
    write_traces("usage: noisy_loops.py DIR", traces)


if __name__ == "__main__":
    main()
