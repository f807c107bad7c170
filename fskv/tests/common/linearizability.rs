//! A linearizability checker for a history of one register (Wing & Gong's
//! search with Lowe's memoization, as Porcupine does it): is there a total
//! order of the operations, consistent with real time, in which every read
//! returns the value of the last write before it?
//!
//! | operation | in the history | may be left out of the order |
//! |---|---|---|
//! | write, acknowledged | `ret` = its return time | no |
//! | write, outcome unknown (error, timeout) | `ret` = `u64::MAX` (still pending) | yes — it may never have happened |
//! | read, returned a value (or "absent") | `ret` = its return time | no |
//! | read that failed | not recorded (it observed nothing) | — |
//!
//! Real time: an operation that returned before another was called must come
//! first. Histories of different registers are checked one at a time (a
//! register history is linearizable on its own iff the whole is, for
//! independent registers — P-compositionality).

use std::collections::HashSet;

/// What one operation did: a write of a value, or a read that saw a value
/// (`None`: the register did not exist).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegOp {
    Write(u64),
    Read(Option<u64>),
}

/// One operation with its invocation and response times (any monotonic
/// clock; `ret == u64::MAX`: no response, outcome unknown).
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub call: u64,
    pub ret: u64,
    pub op: RegOp,
}

/// Upper bound on the states the search visits before it gives up.
const MAX_STATES: usize = 5_000_000;

/// `Ok(())` if the history is linearizable from `initial`; otherwise a
/// description of the smallest prefix (by call time) that is not.
pub fn check_register(history: &[Event], initial: Option<u64>) -> Result<(), String> {
    let mut ops: Vec<Event> = history.iter().copied().filter(|e| !matches!(e.op, RegOp::Read(_)) || e.ret != u64::MAX).collect();
    ops.sort_by_key(|e| (e.call, e.ret));
    let n = ops.len();
    let words = n.div_ceil(64).max(1);
    let must: Vec<bool> = ops.iter().map(|e| e.ret != u64::MAX).collect();
    let remaining_must = must.iter().filter(|m| **m).count();
    let mut seen: HashSet<(Vec<u64>, Option<u64>)> = HashSet::new();
    // Depth-first search over (linearized set, register value).
    struct Frame {
        done: Vec<u64>,
        value: Option<u64>,
        left: usize,
    }
    let mut stack = vec![Frame { done: vec![0; words], value: initial, left: remaining_must }];
    let mut deepest = 0usize;
    while let Some(f) = stack.pop() {
        if f.left == 0 {
            return Ok(());
        }
        if !seen.insert((f.done.clone(), f.value)) {
            continue;
        }
        if seen.len() > MAX_STATES {
            return Err(format!("search gave up after {MAX_STATES} states ({n} operations)"));
        }
        let is_done = |i: usize| f.done[i / 64] >> (i % 64) & 1 == 1;
        // The earliest response among operations not yet placed: nothing
        // called after it may go before it.
        let min_ret = (0..n).filter(|i| !is_done(*i)).map(|i| ops[i].ret).min().unwrap_or(u64::MAX);
        let placed = n - (0..n).filter(|i| !is_done(*i)).count();
        deepest = deepest.max(placed);
        for i in 0..n {
            if is_done(i) || ops[i].call > min_ret {
                continue;
            }
            let next_value = match ops[i].op {
                RegOp::Write(v) => Some(v),
                RegOp::Read(v) if v == f.value => f.value,
                RegOp::Read(_) => continue,
            };
            let mut done = f.done.clone();
            done[i / 64] |= 1 << (i % 64);
            stack.push(Frame { done, value: next_value, left: f.left - usize::from(must[i]) });
        }
    }
    let around: Vec<String> =
        ops.iter().skip(deepest.saturating_sub(3)).take(8).map(|e| format!("{:?} [{}, {}]", e.op, e.call, e.ret)).collect();
    Err(format!("not linearizable: no order places more than {deepest} of {n} operations; around there: {around:?}"))
}
