#!/usr/bin/env python3
"""A site launch wrapper of the common kind (test data): it reads a few options of its own
with argparse's parse_known_args and hands every other flag, unchecked, to the server.

    passthrough_wrapper.py [--server MODULE] [--dry-run] [SERVER FLAGS...]

Its --help lists only its own options; the server's flags appear nowhere in it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="launch.py",
        description="Start the inference server with this site's defaults. Any other flag is "
        "passed through to the server unchanged.",
    )
    parser.add_argument(
        "--server",
        default="orchestrator.lab.server",
        help="the server module to run (default: %(default)s)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the server's command line and exit"
    )
    own, rest = parser.parse_known_args()
    argv = [sys.executable, "-m", own.server, *rest]
    if own.dry_run:
        print(shlex.join(argv))
        return 0
    os.execv(sys.executable, argv)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
