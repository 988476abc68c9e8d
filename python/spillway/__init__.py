"""Spillway: CUDA device allocations as managed memory, with learned prefetch and eviction.

The wheel holds the shim (``lib/libspillway.so``, loaded with ``LD_PRELOAD``) and the
``spillway`` command (``bin/spillway``); ``spillway run -- CMD`` runs a program under the
shim. See docs/install.md in the source repository.
"""

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def library_path() -> Path:
    """The path of libspillway.so in this installation (for LD_PRELOAD)."""
    return _HERE / "lib" / "libspillway.so"


def command_path() -> Path:
    """The path of the spillway command's executable in this installation."""
    return _HERE / "bin" / "spillway"
