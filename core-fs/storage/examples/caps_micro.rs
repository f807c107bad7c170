//! Micro-benchmark of storage's chunk-capability check (docs/BENCHMARKS.md,
//! "Chunk capabilities"): `cargo run --release -p fskv-storage --example caps_micro [ITERATIONS]`.
//! Prints ns per check, cold (HMAC) and warm (per-connection cache hit),
//! median of 5 runs.

fn main() {
    let iterations: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    for _ in 0..5 {
        let (c, w) = fskv_storage::access::measure_check_ns(iterations);
        cold.push(c);
        warm.push(w);
    }
    cold.sort_by(f64::total_cmp);
    warm.sort_by(f64::total_cmp);
    println!("{iterations} checks x 5 runs (median): cold (HMAC-SHA256 + coverage) {:.0} ns, warm (cache hit) {:.0} ns", cold[2], warm[2]);
}
