//! The sparse index of a segment (`<base>-<epoch>.idx`): one 16-byte entry
//! each time at least `index_interval_bytes` of batches were appended since
//! the last entry. It serves both lookups — by offset and by timestamp.
//! Pure: no I/O.
//!
//! | bytes | field |
//! |---|---|
//! | 4 | `rel_offset` u32: base offset of a batch minus the segment's base |
//! | 4 | `position` u32: byte position of that batch in the segment |
//! | 8 | `max_ts_before` i64: largest record timestamp of every batch before `position` (-1: none) |
//!
//! The index is written next to the log in the same flush, but it is only
//! a hint: a reader checks every batch it reads (length, magic, CRC), uses
//! entries only below the segment's committed end, and scans forward from
//! an entry. A missing or short index makes lookups scan from position 0.

pub const INDEX_ENTRY_BYTES: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub rel_offset: u32,
    pub position: u32,
    pub max_ts_before: i64,
}

impl IndexEntry {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.rel_offset.to_le_bytes());
        out.extend_from_slice(&self.position.to_le_bytes());
        out.extend_from_slice(&self.max_ts_before.to_le_bytes());
    }
}

/// Decodes entries; a trailing partial entry is ignored, and so is every
/// entry from the first one that does not move forward (garbage).
pub fn decode(bytes: &[u8]) -> Vec<IndexEntry> {
    let mut out: Vec<IndexEntry> = Vec::with_capacity(bytes.len() / INDEX_ENTRY_BYTES);
    for c in bytes.chunks_exact(INDEX_ENTRY_BYTES) {
        let e = IndexEntry {
            rel_offset: u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            position: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            max_ts_before: i64::from_le_bytes([c[8], c[9], c[10], c[11], c[12], c[13], c[14], c[15]]),
        };
        if let Some(last) = out.last() {
            if e.rel_offset <= last.rel_offset || e.position <= last.position {
                break;
            }
        } else if e.position == 0 && e.rel_offset == 0 && e.max_ts_before == 0 {
            break; // zeros: nothing written
        }
        out.push(e);
    }
    out
}

/// The position to scan from for `rel_offset`: the last entry at or below
/// it whose position is below `committed_bytes`, else 0.
pub fn position_for_offset(entries: &[IndexEntry], rel_offset: u64, committed_bytes: u64) -> (u64, u64) {
    let mut best = (0u64, 0u64);
    for e in entries {
        if u64::from(e.rel_offset) > rel_offset || u64::from(e.position) >= committed_bytes {
            break;
        }
        best = (u64::from(e.rel_offset), u64::from(e.position));
    }
    best
}

/// The position to scan from for the first record with timestamp >= `ts`:
/// the last entry before which no record reaches `ts`, else 0.
pub fn position_for_time(entries: &[IndexEntry], ts: i64, committed_bytes: u64) -> u64 {
    let mut best = 0u64;
    for e in entries {
        if e.max_ts_before >= ts || u64::from(e.position) >= committed_bytes {
            break;
        }
        best = u64::from(e.position);
    }
    best
}

/// Decides when the writer adds an entry.
#[derive(Clone, Debug, Default)]
pub struct IndexBuilder {
    pub interval_bytes: u64,
    last_position: Option<u64>,
    max_ts: i64,
}

impl IndexBuilder {
    pub fn new(interval_bytes: u64, max_ts: i64) -> Self {
        IndexBuilder { interval_bytes, last_position: None, max_ts }
    }

    /// A batch at `position` of the segment with `rel_offset` and its
    /// largest timestamp: returns the entry to append, if one is due.
    pub fn on_batch(&mut self, rel_offset: u64, position: u64, batch_max_ts: i64) -> Option<IndexEntry> {
        let due = match self.last_position {
            None => position > 0,
            Some(last) => position >= last + self.interval_bytes,
        } && position >= self.interval_bytes;
        let entry = (due && rel_offset <= u64::from(u32::MAX) && position <= u64::from(u32::MAX)).then_some(IndexEntry {
            rel_offset: rel_offset as u32,
            position: position as u32,
            max_ts_before: self.max_ts,
        });
        if entry.is_some() {
            self.last_position = Some(position);
        }
        self.max_ts = self.max_ts.max(batch_max_ts);
        entry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_lookup_and_garbage() {
        let mut b = IndexBuilder::new(100, -1);
        let mut bytes = Vec::new();
        // Batches of 60 bytes, 2 records each, timestamps 10, 20, 30...
        for i in 0..10u64 {
            if let Some(e) = b.on_batch(i * 2, i * 60, (i as i64 + 1) * 10) {
                e.encode(&mut bytes);
            }
        }
        let entries = decode(&bytes);
        assert_eq!(entries.iter().map(|e| e.position).collect::<Vec<_>>(), vec![120, 240, 360, 480]);
        assert_eq!(entries[0].max_ts_before, 20);
        assert_eq!(position_for_offset(&entries, 9, 10_000), (8, 240));
        assert_eq!(position_for_offset(&entries, 1, 10_000), (0, 0));
        // Entries past the committed end are not used.
        assert_eq!(position_for_offset(&entries, 19, 300), (8, 240));
        assert_eq!(position_for_time(&entries, 25, 10_000), 120);
        assert_eq!(position_for_time(&entries, 5, 10_000), 0);
        // Garbage after valid entries is cut; a partial entry is ignored.
        let mut g = bytes.clone();
        IndexEntry { rel_offset: 1, position: 5, max_ts_before: 0 }.encode(&mut g);
        g.push(7);
        assert_eq!(decode(&g), entries);
        assert!(decode(&[0u8; 32]).is_empty());
    }
}
