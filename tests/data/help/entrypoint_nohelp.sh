#!/bin/sh
# A container entrypoint with no help at all (test data): it parses no options, checks its
# environment and hands every argument to the server. `--help` is just another argument:
# without LAB_SCENARIO it prints one line on stderr and exits 64, before the server runs.
if [ -z "${LAB_SCENARIO:-}" ]; then
    echo "entrypoint: LAB_SCENARIO is not set" >&2
    exit 64
fi
exec python3 -m orchestrator.lab.server --scenario "$LAB_SCENARIO" "$@"
