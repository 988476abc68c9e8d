#!/usr/bin/env python3
"""A Triton kernel on PyTorch tensors, knowing nothing of Spillway. Triton loads
libcuda.so.1 itself and launches through the driver; under `spillway run` the tensors it
works on are managed memory. Checks the result and prints whether the tensors are managed.

    python3 triton_add.py [--elements N]
"""
import argparse
import ctypes
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def is_managed(ptr):
    value = ctypes.c_uint(0)
    rc = ctypes.CDLL("libcuda.so.1").cuPointerGetAttribute(ctypes.byref(value), 8, ctypes.c_uint64(ptr))
    return rc == 0 and value.value == 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=int, default=1 << 28)
    n = ap.parse_args().elements
    x = torch.rand(n, device="cuda")
    y = torch.rand(n, device="cuda")
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    torch.cuda.synchronize()
    ok = torch.allclose(out, x + y)
    managed = sum(is_managed(t.data_ptr()) for t in (x, y, out))
    print(f"triton {triton.__version__}: {n} elements ({3 * n * 4 / 2**30:.2f} GiB), {managed}/3 tensors managed, "
          f"{'OK' if ok else 'WRONG RESULTS'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
