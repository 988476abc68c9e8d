#!/usr/bin/env python3
"""A PyTorch program that knows nothing of Spillway: it allocates `--total` bytes of CUDA
tensors (by default three times `--budget`), computes on every one of them, and checks the
results. Under `spillway run --budget 4GiB` the tensors are managed memory, which this
script confirms by asking the driver (cuPointerGetAttribute IS_MANAGED) about each one.

    python3 torch_oversubscribe.py [--total 12GiB] [--tensor 512MiB]
"""
import argparse
import ctypes
import sys
import time

import torch

from workload_sizes import size


def is_managed(ptr):
    cuda = ctypes.CDLL("libcuda.so.1")
    value = ctypes.c_uint(0)
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8
    rc = cuda.cuPointerGetAttribute(ctypes.byref(value), CU_POINTER_ATTRIBUTE_IS_MANAGED, ctypes.c_uint64(ptr))
    return rc == 0 and value.value == 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--total", type=size, default=12 << 30)
    ap.add_argument("--tensor", type=size, default=512 << 20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_oversubscribe: no CUDA device", file=sys.stderr)
        return 77
    n = max(1, args.total // args.tensor)
    elems = args.tensor // 4
    t0 = time.perf_counter()
    tensors = []
    for i in range(n):
        tensors.append(torch.full((elems,), float(i + 1), device="cuda", dtype=torch.float32))
    torch.cuda.synchronize()
    t_alloc = time.perf_counter() - t0
    managed = sum(is_managed(t.data_ptr()) for t in tensors)
    # Compute on every tensor, twice (the second pass finds the data wherever the first left it).
    t0 = time.perf_counter()
    ok = True
    for rep in range(2):
        for i, t in enumerate(tensors):
            t.mul_(2.0).add_(1.0)
    torch.cuda.synchronize()
    for i, t in enumerate(tensors):
        expect = ((i + 1) * 2 + 1) * 2 + 1
        got = t[:: max(1, elems // 1024)].float()
        if not torch.all(got == expect).item():
            print(f"tensor {i}: wrong values (expected {expect})")
            ok = False
    t_compute = time.perf_counter() - t0
    print(f"torch {torch.__version__}: {n} tensors x {args.tensor / 2**20:.0f} MiB = {n * args.tensor / 2**30:.2f} GiB; "
          f"{managed}/{n} managed; alloc+fill {t_alloc:.2f} s, compute {t_compute:.2f} s; "
          f"torch reserved {torch.cuda.memory_reserved() / 2**30:.2f} GiB; {'OK' if ok else 'WRONG RESULTS'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
