#!/usr/bin/env bash
# The hygiene gate CI runs before the tests: formatting (rustfmt.toml) and
# clippy with every warning an error, over every target of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
        echo "lint: installing the $component component"
        rustup component add "$component" || { echo "lint: cargo $component is missing and could not be installed" >&2; exit 1; }
    fi
done
echo "lint: cargo fmt --all -- --check"
cargo fmt --all -- --check
echo "lint: cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
echo "lint: clean"
