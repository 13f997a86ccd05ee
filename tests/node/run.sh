#!/usr/bin/env bash
# run.sh - runs the Node.js client test of monolith-ps (ps_client.test.js).
#   MT_PS_BIN=/path/to/monolith-ps tests/node/run.sh
# Installs @grpc/grpc-js and @grpc/proto-loader from package-lock.json (npm ci) when
# tests/node/node_modules is missing (or incomplete, or older than the lock file), then runs
# the test with Node's test runner.
# Exits non-zero if node/npm are missing, the install fails or any test fails.
set -euo pipefail
cd "$(dirname "$0")"

for tool in node npm; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "run.sh: $tool missing: install Node.js 20 with npm (nodejs npm)" >&2
        exit 1
    fi
done

# npm writes node_modules/.package-lock.json last: without it an install was interrupted.
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    echo "run.sh: installing packages (npm ci)"
    # --ignore-scripts: the packages are plain JavaScript; nothing needs an install script.
    npm ci --no-audit --no-fund --ignore-scripts
fi

if [ -n "${MT_PS_BIN:-}" ]; then
    export MT_PS_BIN
    echo "run.sh: MT_PS_BIN=$MT_PS_BIN"
fi
# The test's temporary files go under a directory of this script's, removed even if the test
# process is killed before it can clean up.
TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/mt-node-test-XXXXXX")
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
node --test ps_client.test.js
