//! Write channels: what makes a client's retry apply once, however late it
//! arrives. A chunk remembers the request tags of its last few committed
//! versions only (`fskv_chunk_engine::RECENT_COMMITS`), so a retry arriving
//! after more writes than that (the first attempt committed, its answer was
//! lost, other clients wrote the chunk meanwhile) was applied again and put
//! old bytes over newer ones. 3FS closes this with per-client channels; so
//! does this table.
//!
//! A client holds one channel (`WriteChannel::id`) from a write's first
//! attempt to its last and gives each write of a channel a higher `seq`.
//! Every target remembers, per (client, channel), the last write it
//! committed there: its `seq`, chunk and answer. At a head, a client write
//! meets the table before the CRAQ step, under the chunk's lock:
//!
//! | the channel's entry here | meaning | answer |
//! |---|---|---|
//! | none, or an older `seq` | a new write | the CRAQ step (recorded when it acks) |
//! | the same `seq`, same chunk | a retry of a committed write | the recorded answer as a duplicate; nothing applied |
//! | a newer `seq` | the client finished with this write before its later one | `Superseded` (`Cancelled`: nobody waits for it) |
//!
//! Each target that commits a forwarded update records it too, so a retry
//! that reaches a new head after the old one failed is recognised there.
//! The table is in memory: after a restart, retries are recognised by the
//! recent tags alone (as before). A `user:` principal's writes carry no
//! channel (the service drops it): a client id is the client's own claim,
//! and a channel with a high `seq` under another client's id would make
//! that client's writes refused. Bounds: channel ids below
//! `MAX_WRITE_CHANNELS`, at most [`MAX_CHANNEL_ENTRIES`] entries; when full,
//! the clients used least recently lose theirs (down to 90% of the bound).

use crate::craq::Applied;
use fskv_proto::storage::{WriteChannel, MAX_WRITE_CHANNELS};
use fskv_types::ChunkId;
use parking_lot::Mutex;
use std::collections::HashMap;

/// Entries (client, channel) one service remembers (~64 bytes each).
pub const MAX_CHANNEL_ENTRIES: usize = 262_144;

/// What the table says of a client write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Not committed here before: run it.
    New,
    /// Committed here before (a retry): answer this, as a duplicate.
    Duplicate(Applied),
    /// The client has gone on to write `latest` on this channel.
    Superseded { latest: u64 },
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    seq: u64,
    chunk: ChunkId,
    applied: Applied,
}

#[derive(Default)]
struct ClientEntries {
    used_tick: u64,
    by_channel: HashMap<u32, Entry>,
}

#[derive(Default)]
struct Table {
    tick: u64,
    entries: usize,
    clients: HashMap<u64, ClientEntries>,
}

/// The per-service table of write channels (module docs).
pub struct ChannelTable {
    table: Mutex<Table>,
    max_entries: usize,
}

impl Default for ChannelTable {
    fn default() -> ChannelTable {
        ChannelTable::new()
    }
}

impl ChannelTable {
    pub fn new() -> ChannelTable {
        ChannelTable::with_max_entries(MAX_CHANNEL_ENTRIES)
    }

    pub fn with_max_entries(max_entries: usize) -> ChannelTable {
        ChannelTable { table: Mutex::new(Table::default()), max_entries: max_entries.max(1) }
    }

    /// Whether `channel` can be used at all (the client's error otherwise).
    pub fn valid(channel: WriteChannel) -> bool {
        channel.id < MAX_WRITE_CHANNELS
    }

    /// The table's word on `client`'s write of `chunk` on `channel`.
    pub fn check(&self, client: u64, channel: WriteChannel, chunk: ChunkId) -> Seen {
        let t = self.table.lock();
        let Some(e) = t.clients.get(&client).and_then(|c| c.by_channel.get(&channel.id)) else { return Seen::New };
        if e.seq > channel.seq {
            Seen::Superseded { latest: e.seq }
        } else if e.seq == channel.seq && e.chunk == chunk {
            Seen::Duplicate(Applied { duplicate: true, ..e.applied })
        } else {
            Seen::New
        }
    }

    /// Records that `client`'s write of `chunk` on `channel` committed here
    /// with `applied` (an older `seq` than the entry's is ignored).
    pub fn record(&self, client: u64, channel: WriteChannel, chunk: ChunkId, applied: Applied) {
        if !Self::valid(channel) {
            return;
        }
        let mut guard = self.table.lock();
        let t = &mut *guard;
        t.tick += 1;
        let tick = t.tick;
        let c = t.clients.entry(client).or_default();
        c.used_tick = tick;
        match c.by_channel.get_mut(&channel.id) {
            Some(e) if e.seq > channel.seq => {}
            Some(e) => *e = Entry { seq: channel.seq, chunk, applied },
            None => {
                c.by_channel.insert(channel.id, Entry { seq: channel.seq, chunk, applied });
                t.entries += 1;
            }
        }
        if t.entries <= self.max_entries {
            return;
        }
        // Down to 90%, so that a full table sorts its clients once per
        // many new entries, not on each (the writing client stays).
        let keep = self.max_entries - self.max_entries / 10;
        let mut by_age: Vec<(u64, u64)> = t.clients.iter().filter(|(id, _)| **id != client).map(|(id, c)| (c.used_tick, *id)).collect();
        by_age.sort_unstable();
        for (_, id) in by_age {
            if t.entries <= keep {
                break;
            }
            if let Some(gone) = t.clients.remove(&id) {
                t.entries -= gone.by_channel.len();
            }
        }
    }

    /// Entries held (for tests and metrics).
    pub fn len(&self) -> usize {
        self.table.lock().entries
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fskv_types::InodeId;

    fn applied(version: u64) -> Applied {
        Applied { version, len_bytes: 10, crc: 7, duplicate: false }
    }

    fn ch(id: u32, seq: u64) -> WriteChannel {
        WriteChannel { id, seq }
    }

    const CHUNK: ChunkId = ChunkId { inode: InodeId(3), index: 0 };

    #[test]
    fn a_retry_is_a_duplicate_and_an_older_write_is_superseded() {
        let t = ChannelTable::new();
        assert_eq!(t.check(1, ch(0, 5), CHUNK), Seen::New);
        t.record(1, ch(0, 5), CHUNK, applied(9));
        assert_eq!(t.check(1, ch(0, 5), CHUNK), Seen::Duplicate(Applied { duplicate: true, ..applied(9) }));
        assert_eq!(t.check(1, ch(0, 4), CHUNK), Seen::Superseded { latest: 5 });
        assert_eq!(t.check(1, ch(0, 6), CHUNK), Seen::New);
        // Other channels and clients are their own.
        assert_eq!(t.check(1, ch(1, 4), CHUNK), Seen::New);
        assert_eq!(t.check(2, ch(0, 4), CHUNK), Seen::New);
        // The same seq for another chunk is not this write.
        assert_eq!(t.check(1, ch(0, 5), ChunkId::new(InodeId(3), 1)), Seen::New);
        // An older record never replaces a newer one.
        t.record(1, ch(0, 3), CHUNK, applied(2));
        assert_eq!(t.check(1, ch(0, 5), CHUNK), Seen::Duplicate(Applied { duplicate: true, ..applied(9) }));
        t.record(1, ch(0, 6), CHUNK, applied(12));
        assert_eq!(t.check(1, ch(0, 5), CHUNK), Seen::Superseded { latest: 6 });
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn when_full_the_least_recently_used_client_goes() {
        let t = ChannelTable::with_max_entries(4);
        t.record(1, ch(0, 1), CHUNK, applied(1));
        t.record(1, ch(1, 2), CHUNK, applied(2));
        t.record(2, ch(0, 1), CHUNK, applied(3));
        t.record(1, ch(2, 3), CHUNK, applied(4));
        assert_eq!(t.len(), 4);
        // Client 2 was used least recently: it goes, client 1 stays whole.
        t.record(3, ch(0, 1), CHUNK, applied(5));
        assert_eq!(t.len(), 4);
        assert_eq!(t.check(2, ch(0, 1), CHUNK), Seen::New);
        assert!(matches!(t.check(1, ch(1, 2), CHUNK), Seen::Duplicate(_)));
        assert!(matches!(t.check(3, ch(0, 1), CHUNK), Seen::Duplicate(_)));
    }

    #[test]
    fn channels_out_of_range_are_not_recorded() {
        let t = ChannelTable::new();
        t.record(1, ch(MAX_WRITE_CHANNELS, 1), CHUNK, applied(1));
        assert!(t.is_empty());
    }
}
