//! Loopback benchmark (filled in below).
