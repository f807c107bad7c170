#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build, and run
# `fskv up` (a single-node cluster under ./data). Extra arguments go to
# `fskv up`, e.g. ./deploy/up.sh --data /srv/fskv --base-port 9000
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install-deps.sh
echo "up: building fskv (release) ..."
cargo build --release -p fskv
exec ./target/release/fskv up "$@"
