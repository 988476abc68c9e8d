"""Sizes on the command lines of the workloads: 512MiB, 8GiB, 1.5GB, 4096 (bytes)."""
import argparse
import re

UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


def size(text):
    """Bytes in `text`; an argparse error naming the text when it is not a size."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in UNITS:
        raise argparse.ArgumentTypeError(f"cannot read size {text!r} (use e.g. 512MiB, 8GiB)")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])
