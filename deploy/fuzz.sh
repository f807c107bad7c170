#!/usr/bin/env bash
# Builds and runs the libFuzzer targets of every parser of untrusted input
# (docs/security.md, "Fuzzing"). Not part of CI.
#
#   deploy/fuzz.sh                 # every target, 10 M executions each
#   deploy/fuzz.sh kv_batch        # one target, 10 M executions
#   deploy/fuzz.sh all 1000000     # every target, 1 M executions each
#   deploy/fuzz.sh list            # the targets and their crates
#
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz --locked`).
# Targets build with overflow checks and debug assertions (`-a`), without a
# sanitizer (safe Rust) except the USRBIO ring target (AddressSanitizer: it
# reads shared memory through raw pointers). One target runs at a time on one
# core, `nice`d. Everything it writes is under target/: fuzz builds
# (target/fuzz), corpora (target/fuzz-corpus/TARGET, kept between runs),
# crash inputs (target/fuzz-artifacts/TARGET-crash-*), logs
# (target/fuzz-logs/TARGET.log). A crash stops the script with the input's
# path; replay it with `target/fuzz/x86_64-unknown-linux-gnu/release/TARGET FILE`.
# Environment: FUZZ_NICE (default 10), FUZZ_ARGS (extra libFuzzer flags).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# target  fuzz crate directory  sanitizer
targets="
frame_decoder      core-fs/rpc/fuzz          none
rpc_messages       core-fs/rpc/fuzz          none
rpc_side_channels  core-fs/rpc/fuzz          none
kv_keys            gateway-kv/fuzz           none
kv_batch           gateway-kv/fuzz           none
kv_fields          gateway-kv/fuzz           none
mq_records         gateway-mq/fuzz           none
mq_sqs             gateway-mq/fuzz           none
request_fields     gateway-s3/fuzz           none
gateway_auth       gateway/fuzz              none
usrbio_names       client/usrbio/fuzz        none
usrbio_ring        client/usrbio/fuzz        address
chunk_records      core-fs/chunk-engine/fuzz none
"

want=${1:-all}
runs=${2:-10000000}
if [[ $want == list ]]; then
    echo "$targets" | awk 'NF { printf "%-18s %s (sanitizer %s)\n", $1, $2, $3 }'
    exit 0
fi
if ! [[ $runs =~ ^[0-9]+$ ]]; then
    echo "fuzz: RUNS must be a number of executions (got $runs)" >&2
    exit 2
fi
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz: needs a nightly toolchain (rustup toolchain install nightly)" >&2
    exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: needs cargo-fuzz (cargo install cargo-fuzz --locked)" >&2
    exit 1
fi

selected=$(echo "$targets" | awk -v w="$want" 'NF && (w == "all" || $1 == w)')
if [[ -z $selected ]]; then
    echo "fuzz: no target $want (deploy/fuzz.sh list)" >&2
    exit 2
fi

mkdir -p target/fuzz-corpus target/fuzz-artifacts target/fuzz-logs
summary=()
while read -r name dir sanitizer; do
    # The fuzz crates are outside the workspace; build them with the
    # workspace's dependency versions (their own lockfile is not kept).
    cp Cargo.lock "$dir/Cargo.lock"
    echo "fuzz: building $name ($dir, sanitizer $sanitizer)"
    # Targets of one sanitizer share target/fuzz (ASan builds go to their own).
    tdir=target/fuzz
    [[ $sanitizer == none ]] || tdir=target/fuzz-$sanitizer
    nice -n "${FUZZ_NICE:-10}" cargo +nightly fuzz build --fuzz-dir "$dir" -s "$sanitizer" -a --target-dir "$tdir" "$name"
    bin=$root/$tdir/x86_64-unknown-linux-gnu/release/$name
    corpus=target/fuzz-corpus/$name
    mkdir -p "$corpus"
    log=target/fuzz-logs/$name.log
    echo "fuzz: running $name for $runs executions (log $log)"
    start=$(date +%s)
    # shellcheck disable=SC2086
    if ! nice -n "${FUZZ_NICE:-10}" "$bin" -runs="$runs" -print_final_stats=1 \
        -artifact_prefix="target/fuzz-artifacts/$name-" ${FUZZ_ARGS:-} "$corpus" >"$log" 2>&1; then
        tail -n 40 "$log"
        echo "fuzz: $name FAILED; the input is target/fuzz-artifacts/$name-* (log $log)" >&2
        exit 1
    fi
    secs=$(($(date +%s) - start))
    execs=$(awk '/stat::number_of_executed_units/ { print $2 }' "$log")
    rate=$(awk '/stat::average_exec_per_sec/ { print $2 }' "$log")
    summary+=("$(printf '%-18s %12s executions %6ss %8s exec/s' "$name" "$execs" "$secs" "$rate")")
    echo "fuzz: ${summary[-1]}"
done <<<"$selected"
echo "fuzz: done"
printf '  %s\n' "${summary[@]}"
