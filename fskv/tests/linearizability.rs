//! The register linearizability checker used by the network-namespace
//! cluster test (`tests/common/linearizability.rs`), on histories whose
//! answer is known.

mod common;

use common::linearizability::{check_register, Event, RegOp};

fn ev(call: u64, ret: u64, op: RegOp) -> Event {
    Event { call, ret, op }
}

const PENDING: u64 = u64::MAX;

#[test]
fn sequential_history_is_linearizable() {
    let h = [ev(0, 1, RegOp::Read(None)), ev(2, 3, RegOp::Write(1)), ev(4, 5, RegOp::Read(Some(1))), ev(6, 7, RegOp::Write(2))];
    assert!(check_register(&h, None).is_ok());
}

#[test]
fn overlapping_write_may_be_seen_or_not() {
    // Write(1) overlaps both reads: one sees the old value, the later one the new.
    let h = [ev(0, 10, RegOp::Write(1)), ev(1, 2, RegOp::Read(None)), ev(3, 4, RegOp::Read(Some(1)))];
    assert!(check_register(&h, None).is_ok());
}

#[test]
fn stale_read_after_a_completed_write_is_caught() {
    let h = [ev(0, 1, RegOp::Write(1)), ev(2, 3, RegOp::Write(2)), ev(4, 5, RegOp::Read(Some(1)))];
    let e = check_register(&h, None).unwrap_err();
    assert!(e.contains("not linearizable"), "{e}");
}

#[test]
fn reads_going_back_in_time_are_caught() {
    // Concurrent with a write, the first read sees the new value, a later read the old one.
    let h = [ev(0, 100, RegOp::Write(1)), ev(1, 2, RegOp::Read(Some(1))), ev(3, 4, RegOp::Read(None))];
    assert!(check_register(&h, None).is_err());
}

#[test]
fn a_pending_write_may_have_happened_or_not() {
    // Unknown outcome, seen by a read.
    let seen = [ev(0, PENDING, RegOp::Write(7)), ev(5, 6, RegOp::Read(Some(7)))];
    assert!(check_register(&seen, None).is_ok());
    // Unknown outcome, never seen.
    let unseen = [ev(0, PENDING, RegOp::Write(7)), ev(5, 6, RegOp::Read(None)), ev(7, 8, RegOp::Read(None))];
    assert!(check_register(&unseen, None).is_ok());
    // But it cannot appear after a later acknowledged write was read... and then vanish.
    let flicker =
        [ev(0, PENDING, RegOp::Write(7)), ev(1, 2, RegOp::Write(8)), ev(3, 4, RegOp::Read(Some(7))), ev(5, 6, RegOp::Read(Some(8)))];
    assert!(check_register(&flicker, None).is_err());
}

#[test]
fn a_value_never_written_is_caught() {
    let h = [ev(0, 1, RegOp::Write(1)), ev(2, 3, RegOp::Read(Some(99)))];
    assert!(check_register(&h, None).is_err());
}

#[test]
fn many_concurrent_clients_are_checked_quickly() {
    // 4 clients, 200 operations each, every write read back by its own client.
    let mut h = Vec::new();
    let mut t = 0u64;
    for round in 0..200u64 {
        let base = t;
        for c in 0..4u64 {
            let v = round * 4 + c;
            h.push(ev(base + c, base + 10 + c, RegOp::Write(v)));
        }
        // After all four writes returned, a read sees the one linearized last
        // among them; the checker must find that order (the last to start here).
        h.push(ev(base + 20, base + 21, RegOp::Read(Some(round * 4 + 3))));
        t = base + 30;
    }
    let start = std::time::Instant::now();
    assert!(check_register(&h, None).is_ok());
    assert!(start.elapsed() < std::time::Duration::from_secs(10), "took {:?}", start.elapsed());
}
