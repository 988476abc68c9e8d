"""``python -m spillway ARGS`` and the ``spillway`` console script: run the spillway command."""

import os
import sys

from . import command_path


def main() -> None:
    exe = command_path()
    if not os.access(exe, os.X_OK):
        sys.stderr.write(f"spillway: the command is missing from this installation ({exe})\n")
        sys.exit(2)
    # `spillway sweep --plot` runs its plot script with the interpreter that installed the
    # wheel (matplotlib: pip install 'spillway-cuda[plot]'), unless told otherwise.
    os.environ.setdefault("SPILLWAY_PYTHON", sys.executable)
    # The executable replaces this process: exit status, signals and stdio are its own.
    os.execv(exe, [str(exe), *sys.argv[1:]])


if __name__ == "__main__":
    main()
