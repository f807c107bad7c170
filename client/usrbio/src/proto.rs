//! What programs and the FUSE daemon agree on: the virtual directory, the
//! names of its entries, the layout of a ring in shared memory, the doorbell
//! and the `ioctl` that registers a file.
//!
//! # The virtual directory
//!
//! | path (under the mount) | what |
//! |---|---|
//! | `3fs-virt/` | not listed by `readdir` of the root; lookups only |
//! | `3fs-virt/iovs/` | mode 01777; a `symlink` here registers, an `unlink` deregisters |
//! | `3fs-virt/iovs/<id>[.b<block>]` | an iov: a symlink to its `/dev/shm` file |
//! | `3fs-virt/iovs/<id>[.b<block>].r<depth>\|.w<depth>[.ph\|.pl][.t<ms>][.f<binary>]` | a ring (its memory is an iov) |
//! | `3fs-virt/iovs/submit-ios` | symlink to the doorbell's `/dev/shm` file (made by the daemon) |
//!
//! `<id>` is the iov's 16-byte id as 32 hex digits (dashes as in a printed
//! UUID are accepted). `.r` / `.w` mark a ring for reads / writes with its
//! `io_depth` (negative depths as `.r-4`); `.ph` / `.pl` high / low priority
//! (default normal); `.t` the batch timeout in ms; `.f` the flags, written in
//! binary as 3FS does (`.f10` = [`FLAG_FORBID_READ_HOLES`]).
//!
//! # A ring in shared memory
//!
//! ```text
//! offset 0            RingHeader (RING_HEADER_BYTES)
//! RING_HEADER_BYTES   args: [SqeArgs; entries]   (one per slot)
//!  + 64 * entries     sq:   [u32; entries]       (slot numbers, in submission order)
//!  + 4 * entries      cq:   [Cqe; entries]       (layout of `struct hf3fs_cqe`)
//! ```
//!
//! Counters are free-running `u32`s (position = counter % entries):
//!
//! | counter | written by | meaning |
//! |---|---|---|
//! | `sq_head` | program | submission entries published |
//! | `sq_tail` | daemon | submission entries the daemon has taken |
//! | `cq_head` | daemon | completions published |
//! | `cq_tail` | program | completions consumed |
//! | `cq_seq` | daemon | futex word, bumped after publishing completions |
//! | `cq_waiters` | program | threads sleeping on `cq_seq` (the daemon wakes only if > 0) |
//! | `state` | daemon | [`RING_LIVE`] or [`RING_CLOSED`] (deregistered, unmounted or broken) |
//!
//! A slot (an index into `args`, reported back as `Cqe::index`) is taken by
//! `prep` and given back when its completion is consumed, so at most
//! `entries` requests are between prep and consumption: neither queue can
//! overflow. The daemon does not trust this: it takes entries only while the
//! completions it owes fit the completion queue, and stops serving a ring
//! whose counters are impossible.

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// Statfs-style magic of a 3FS mount, returned by [`IOC_REG_FD`] (and what
/// `hf3fs_is_hf3fs` compares with).
pub const HF3FS_SUPER_MAGIC: u32 = 0x8f3f_5fff;
/// Ring flag: reads may return data not yet committed on every replica.
pub const FLAG_ALLOW_READ_UNCOMMITTED: u64 = 1;
/// Ring flag: a read that meets a hole fails with `-ENODATA` instead of
/// reading zeros.
pub const FLAG_FORBID_READ_HOLES: u64 = 2;
/// Flags a ring may carry.
pub const KNOWN_FLAGS: u64 = FLAG_ALLOW_READ_UNCOMMITTED | FLAG_FORBID_READ_HOLES;

/// The virtual directory at the root of the mount.
pub const VIRT_DIR: &str = "3fs-virt";
/// Its subdirectory of registrations.
pub const IOVS_DIR: &str = "iovs";
/// The doorbell's symlink in [`IOVS_DIR`].
pub const SUBMIT_LINK: &str = "submit-ios";
/// Where iov and ring files must live.
pub const SHM_DIR: &str = "/dev/shm";
/// Prefix of the `/dev/shm` files this library creates: the daemon removes
/// a dead process's files of this prefix (`<prefix><pid>.<id>`).
pub const LIB_SHM_PREFIX: &str = "fskv-usrbio.";

/// `ioctl` on a file of the mount: registers it for USRBIO with the daemon
/// (for the calling process) and returns a [`RegFdReply`].
/// `_IOR('f', 0x3f, struct RegFdReply)`.
pub const IOC_REG_FD: u32 = ioc_read(b'f', 0x3f, std::mem::size_of::<RegFdReply>() as u32);
/// `ioctl`: forgets the registration of the file for the calling process.
/// `_IOR('f', 0x3e, u32)` (the reply is the magic).
pub const IOC_DEREG_FD: u32 = ioc_read(b'f', 0x3e, 4);

/// `ioctl`: the mount's magic ([`HF3FS_SUPER_MAGIC`]) — how `hf3fs_is_hf3fs`
/// tells a file of the mount. `_IOR('f', 0x3d, u32)`.
pub const IOC_GET_MAGIC: u32 = ioc_read(b'f', 0x3d, 4);

const fn ioc_read(ty: u8, nr: u8, size: u32) -> u32 {
    // _IOC(_IOC_READ = 2, type, nr, size) on x86_64 / aarch64.
    (2u32 << 30) | (size << 16) | ((ty as u32) << 8) | nr as u32
}

/// The reply of [`IOC_REG_FD`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegFdReply {
    /// [`HF3FS_SUPER_MAGIC`].
    pub magic: u32,
    /// Reserved, 0.
    pub flags: u32,
    /// The file's inode id.
    pub inode: u64,
    /// The token submission entries name the file by (the daemon's handle
    /// of the open file; valid only in rings of the process that registered).
    pub file: u64,
}

/// Magic at offset 0 of a ring.
pub const RING_MAGIC: u64 = u64::from_le_bytes(*b"FSKVRNG1");
/// Layout version of a ring.
pub const RING_VERSION: u32 = 1;
/// `RingHeader::state`: served.
pub const RING_LIVE: u32 = 0;
/// `RingHeader::state`: the daemon no longer serves the ring.
pub const RING_CLOSED: u32 = 1;
/// Bytes of the ring header (the sections start here).
pub const RING_HEADER_BYTES: usize = 512;
/// Most entries of one ring.
pub const MAX_RING_ENTRIES: u32 = 1 << 20;

/// The header of a ring; each counter on its own cache line.
#[repr(C, align(64))]
pub struct RingHeader {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub entries: AtomicU32,
    _pad0: [u8; 48],
    pub sq_head: AtomicU32,
    _pad1: [u8; 60],
    pub sq_tail: AtomicU32,
    _pad2: [u8; 60],
    pub cq_head: AtomicU32,
    pub cq_seq: AtomicU32,
    pub state: AtomicU32,
    _pad3: [u8; 52],
    pub cq_tail: AtomicU32,
    pub cq_waiters: AtomicU32,
    _pad4: [u8; 56],
}

/// The arguments of one request (one per slot).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SqeArgs {
    /// The iov the buffer lies in.
    pub iov_id: [u8; 16],
    /// Offset of the buffer in the iov.
    pub iov_offset: u64,
    /// The file's token ([`RegFdReply::file`]).
    pub file: u64,
    pub file_offset: u64,
    pub len: u64,
    /// Echoed in the completion.
    pub userdata: u64,
    pub reserved: u64,
}

/// A completion; the layout of `struct hf3fs_cqe`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cqe {
    /// The request's slot (what `hf3fs_prep_io` returned).
    pub index: i32,
    pub reserved: i32,
    /// Bytes transferred, or a negative errno.
    pub result: i64,
    pub userdata: u64,
}

const _: () = assert!(std::mem::size_of::<RingHeader>() <= RING_HEADER_BYTES);
const _: () = assert!(std::mem::size_of::<SqeArgs>() == 64);
const _: () = assert!(std::mem::size_of::<Cqe>() == 24);

/// Offsets of the sections of a ring of `entries`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    pub entries: u32,
    pub args_offset: usize,
    pub sq_offset: usize,
    pub cq_offset: usize,
    /// Bytes the ring needs (a multiple of 4096).
    pub bytes: usize,
}

impl RingLayout {
    /// The layout of a ring of `entries` (1..=[`MAX_RING_ENTRIES`]).
    pub fn new(entries: u32) -> Option<RingLayout> {
        if entries == 0 || entries > MAX_RING_ENTRIES {
            return None;
        }
        let n = entries as usize;
        let args_offset = RING_HEADER_BYTES;
        let sq_offset = args_offset + n * std::mem::size_of::<SqeArgs>();
        // Keep the completions 8-aligned.
        let cq_offset = (sq_offset + n * 4).div_ceil(8) * 8;
        let end = cq_offset + n * std::mem::size_of::<Cqe>();
        Some(RingLayout { entries, args_offset, sq_offset, cq_offset, bytes: end.div_ceil(4096) * 4096 })
    }

    /// Entries of a ring that fits in `bytes` (what `hf3fs_io_entries` reports
    /// for a ring of that size), 0 if none.
    pub fn entries_for_bytes(bytes: usize) -> u32 {
        let per = std::mem::size_of::<SqeArgs>() + 4 + std::mem::size_of::<Cqe>();
        let n = bytes.saturating_sub(RING_HEADER_BYTES + 8) / per;
        let mut n = n.min(MAX_RING_ENTRIES as usize) as u32;
        while n > 0 && RingLayout::new(n).is_none_or(|l| l.bytes > bytes) {
            n -= 1;
        }
        n
    }
}

/// Ring priority (the daemon serves higher first when it has to choose).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    High = 0,
    #[default]
    Normal = 1,
    Low = 2,
}

impl Priority {
    /// The C API's convention: < 0 high, 0 normal, > 0 low.
    pub fn from_c(p: i32) -> Priority {
        match p {
            p if p < 0 => Priority::High,
            0 => Priority::Normal,
            _ => Priority::Low,
        }
    }
}

/// What a ring's name says besides its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingKey {
    pub for_read: bool,
    pub io_depth: i32,
    pub priority: Priority,
    pub timeout_ms: u32,
    pub flags: u64,
}

/// A parsed registration name: `<id>[.b<block>]` (an iov) plus ring fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IovKey {
    pub id: [u8; 16],
    pub block_size: u64,
    pub ring: Option<RingKey>,
}

/// Why a registration name is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the id {0:?} is not 32 hex digits")]
    BadId(String),
    #[error("field {0:?} is not valid")]
    BadField(String),
    #[error("field {0:?} repeats")]
    Repeated(char),
    #[error("ring fields (.p, .t, .f) on an iov that is not a ring")]
    RingFieldsWithoutRing,
    #[error("unknown flags {0:#b}")]
    UnknownFlags(u64),
}

/// Hex of an id (32 lowercase digits).
pub fn id_hex(id: &[u8; 16]) -> String {
    let mut s = String::with_capacity(32);
    for b in id {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Parses an id: 32 hex digits, dashes ignored.
pub fn parse_id(text: &str) -> Option<[u8; 16]> {
    let digits: Vec<u8> = text.bytes().filter(|&b| b != b'-').collect();
    if digits.len() != 32 || text.len() > 36 {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, pair) in digits.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        id[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(id)
}

impl IovKey {
    /// Parses a name of the virtual directory.
    pub fn parse(name: &str) -> Result<IovKey, KeyError> {
        let mut parts = name.split('.');
        let id_text = parts.next().unwrap_or("");
        let id = parse_id(id_text).ok_or_else(|| KeyError::BadId(id_text.to_string()))?;
        let mut key = IovKey { id, block_size: 0, ring: None };
        let mut seen = Vec::new();
        let (mut priority, mut timeout_ms, mut flags) = (None, None, None);
        for field in parts {
            let bad = || KeyError::BadField(field.to_string());
            let tag = field.chars().next().ok_or_else(bad)?;
            if seen.contains(&tag) || (matches!(tag, 'r' | 'w') && (seen.contains(&'r') || seen.contains(&'w'))) {
                return Err(KeyError::Repeated(tag));
            }
            seen.push(tag);
            // The tag may be any character (a name comes from any local process).
            let rest = &field[tag.len_utf8()..];
            match tag {
                'b' => key.block_size = rest.parse::<u64>().ok().filter(|&b| b > 0).ok_or_else(bad)?,
                'r' | 'w' => {
                    let io_depth = rest.parse::<i32>().map_err(|_| bad())?;
                    key.ring = Some(RingKey { for_read: tag == 'r', io_depth, priority: Priority::Normal, timeout_ms: 0, flags: 0 });
                }
                'p' => {
                    priority = Some(match rest {
                        "h" => Priority::High,
                        "" | "n" => Priority::Normal,
                        "l" => Priority::Low,
                        _ => return Err(bad()),
                    })
                }
                't' => timeout_ms = Some(rest.parse::<u32>().map_err(|_| bad())?),
                'f' => flags = Some(u64::from_str_radix(rest, 2).map_err(|_| bad())?),
                _ => return Err(bad()),
            }
        }
        match key.ring.as_mut() {
            Some(ring) => {
                ring.priority = priority.unwrap_or_default();
                ring.timeout_ms = timeout_ms.unwrap_or(0);
                ring.flags = flags.unwrap_or(0);
                if ring.flags & !KNOWN_FLAGS != 0 {
                    return Err(KeyError::UnknownFlags(ring.flags));
                }
            }
            None if priority.is_some() || timeout_ms.is_some() || flags.is_some() => return Err(KeyError::RingFieldsWithoutRing),
            None => {}
        }
        Ok(key)
    }
}

impl fmt::Display for IovKey {
    /// The name the C library gives the registration (what [`IovKey::parse`] reads).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&id_hex(&self.id))?;
        if self.block_size != 0 {
            write!(f, ".b{}", self.block_size)?;
        }
        if let Some(r) = &self.ring {
            write!(f, ".{}{}", if r.for_read { 'r' } else { 'w' }, r.io_depth)?;
            match r.priority {
                Priority::High => f.write_str(".ph")?,
                Priority::Low => f.write_str(".pl")?,
                Priority::Normal => {}
            }
            write!(f, ".t{}", r.timeout_ms)?;
            if r.flags != 0 {
                write!(f, ".f{:b}", r.flags)?;
            }
        }
        Ok(())
    }
}

/// The doorbell: one per mount, in a `/dev/shm` file the daemon creates
/// (named by [`SUBMIT_LINK`]). A program bumps `seq` after publishing
/// submissions and wakes the daemon (futex on `seq`) only if `waiters` > 0.
#[repr(C, align(64))]
pub struct Doorbell {
    pub magic: AtomicU64,
    pub seq: AtomicU32,
    pub waiters: AtomicU32,
    _pad: [u8; 48],
}

/// Magic at offset 0 of the doorbell.
pub const DOORBELL_MAGIC: u64 = u64::from_le_bytes(*b"FSKVBEL1");
/// Bytes of the doorbell file.
pub const DOORBELL_BYTES: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_reject_bad_names() {
        let id = [0xabu8; 16];
        let iov = IovKey { id, block_size: 0, ring: None };
        assert_eq!(iov.to_string(), "abababababababababababababababab");
        assert_eq!(IovKey::parse(&iov.to_string()), Ok(iov));
        let ring = IovKey {
            id,
            block_size: 4096,
            ring: Some(RingKey { for_read: false, io_depth: -8, priority: Priority::High, timeout_ms: 5, flags: FLAG_FORBID_READ_HOLES }),
        };
        assert_eq!(ring.to_string(), "abababababababababababababababab.b4096.w-8.ph.t5.f10");
        assert_eq!(IovKey::parse(&ring.to_string()), Ok(ring));
        // 3FS's own names: a UUID with dashes (Python's make_iovec), a ring without priority.
        let k = IovKey::parse("1b4e28ba-2fa1-11d2-883f-0016d3cca427").expect("uuid with dashes");
        assert_eq!(k.id[0], 0x1b);
        assert_eq!(k.id[15], 0x27);
        let k = IovKey::parse("00000000000000000000000000000001.r32.t0").expect("ring");
        assert_eq!(k.ring.map(|r| (r.for_read, r.io_depth, r.priority)), Some((true, 32, Priority::Normal)));
        for bad in [
            "",
            "xyz",
            "0000000000000000000000000000000",
            "00000000000000000000000000000000.b0",
            "00000000000000000000000000000000.q1",
            "00000000000000000000000000000000.t5",
            "00000000000000000000000000000000.r1.w2",
            "00000000000000000000000000000000.r1.f100",
            "00000000000000000000000000000000.r1.px",
            "00000000000000000000000000000000.r1.b4.b4",
            "00000000000000000000000000000000.",
            "submit-ios",
            // Found by the fuzz target usrbio_names: a field starting with a
            // multi-byte character panicked the daemon (a slice inside it).
            "00000000000000000000000000000000.\u{4d2}1",
            "00000000000000000000000000000000.r1.é",
        ] {
            assert!(IovKey::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn ring_layout_fits_and_inverts() {
        assert!(RingLayout::new(0).is_none());
        assert!(RingLayout::new(MAX_RING_ENTRIES + 1).is_none());
        for n in [1u32, 2, 7, 64, 1000, 4096, 100_000] {
            let l = RingLayout::new(n).expect("layout");
            assert_eq!(l.bytes % 4096, 0);
            assert_eq!(l.cq_offset % 8, 0);
            assert!(l.cq_offset + n as usize * 24 <= l.bytes);
            let back = RingLayout::entries_for_bytes(l.bytes);
            assert!(back >= n, "{n} entries -> {} bytes -> {back}", l.bytes);
            assert!(RingLayout::new(back).expect("layout").bytes <= l.bytes);
        }
        assert_eq!(RingLayout::entries_for_bytes(100), 0);
    }

    #[test]
    fn ioctl_numbers_encode_the_reply_size() {
        assert_eq!(IOC_REG_FD >> 30, 2, "_IOC_READ");
        assert_eq!((IOC_REG_FD >> 16) & 0x3fff, 24);
        assert_eq!(IOC_REG_FD & 0xff, 0x3f);
        assert_eq!((IOC_DEREG_FD >> 16) & 0x3fff, 4);
    }
}
