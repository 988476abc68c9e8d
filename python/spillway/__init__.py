"""Spillway: CUDA device allocations as managed memory, with learned prefetch and eviction.

The wheel holds the shim (``lib/libspillway.so``, loaded with ``LD_PRELOAD``) and the
``spillway`` command (``bin/spillway``); ``spillway run -- CMD`` runs a program under the
shim. See docs/install.md in the source repository.
"""

import subprocess
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def library_path() -> Path:
    """The path of libspillway.so in this installation (for LD_PRELOAD)."""
    return _HERE / "lib" / "libspillway.so"


def command_path() -> Path:
    """The path of the spillway command's executable in this installation."""
    return _HERE / "bin" / "spillway"


def trace_torch(model: str, out: str, **options) -> Path:
    """Records a Spillway trace of a PyTorch model on the meta device (no GPU), as
    ``spillway trace torch MODEL OUT`` does, with this interpreter's torch.

    ``model`` is a built-in model (``gpt2-xl-train``, ...) or ``"MODULE:FACTORY"``, a function
    returning your ``torch.nn.Module``; each option is the command's, by its Python name:
    ``input_shape=[(64, 3, 224, 224)]`` (one shape per input of ``forward()``), ``iters=3``,
    ``mode="infer"``, ``input_dtype="long"``, ``optimizer="sgd"``, ``batch=8``, ...
    Returns the trace's path. Raises RuntimeError with the script's message when it fails
    (a bad model or option, or PyTorch missing)."""
    args = [sys.executable, str(_HERE / "share" / "spillway" / "trace_torch.py"), model, str(out)]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        # (input_shape: a list of shapes; one shape given alone is one input.)
        single = key == "input_shape" and isinstance(value, (tuple, list)) and value and isinstance(value[0], int)
        values = [value] if single or key != "input_shape" else value
        for v in values:
            args += [flag, ",".join(str(d) for d in v) if isinstance(v, (tuple, list)) else str(v)]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or [f"trace_torch.py exited with {done.returncode}"])[-1])
    return Path(out)
