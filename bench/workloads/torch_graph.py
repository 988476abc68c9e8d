#!/usr/bin/env python3
"""A PyTorch program that knows nothing of Spillway and replays a captured CUDA graph: a chain
of `--layers` linear layers whose weights total `--total` bytes, captured once with
torch.cuda.graph (its activations in the graph's private memory pool) and replayed
`--replays` times on fresh inputs; every replay's output is checked against the same chain
run eagerly. Under `spillway run --framework-allocator keep --budget 4GiB` the weights and
the graph's pool are managed memory behind PyTorch's caching allocator.

    python3 torch_graph.py [--total 8GiB] [--layers 16] [--replays 5]
"""
import argparse
import sys
import time

import torch

from workload_sizes import size


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--total", type=size, default=8 << 30)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_graph: no CUDA device", file=sys.stderr)
        return 77
    dim = int((args.total / args.layers / 4) ** 0.5) // 64 * 64
    weights = [torch.randn(dim, dim, device="cuda") / dim ** 0.5 for _ in range(args.layers)]

    def chain(x):
        for w in weights:
            x = torch.tanh(x @ w)
        return x

    static_in = torch.randn(args.batch, dim, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs asks
        for _ in range(2):
            chain(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = chain(static_in)
    t0 = time.perf_counter()
    worst = 0.0
    for i in range(args.replays):
        static_in.copy_(torch.randn(args.batch, dim, device="cuda"))
        graph.replay()
        want = chain(static_in)
        worst = max(worst, (static_out - want).abs().max().item())
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    print(f"dim={dim} layers={args.layers} weights={args.layers * dim * dim * 4 / 2**30:.2f}GiB "
          f"replays={args.replays} seconds={elapsed:.2f} max_abs_diff={worst:.2e}")
    if worst > 1e-3:
        print("torch_graph: a replay's output differs from the eager chain", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
