//! Benchmark (filled in below).
