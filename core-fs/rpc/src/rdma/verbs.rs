//! What the RDMA layer needs from a device: register memory once, create
//! and connect reliable-connected queue pairs, post one-sided READ / WRITE
//! work requests, poll completions. Implemented over `ibverbs-sys`
//! (`ibverbs.rs`, feature `rdma`) and by an in-process fabric
//! (`loopback.rs`) that tests the layer above without hardware.

use super::engine::{OpKind, WcStatus};
use crate::transport::RemoteBuf;

/// A memory region registered with a device (deregistered and freed on drop).
pub trait Region: Send + Sync {
    /// Virtual address of the first byte (what peers name in a `RemoteBuf`).
    fn addr(&self) -> u64;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn lkey(&self) -> u32;
    fn rkey(&self) -> u32;
    /// The first byte; valid for `len()` bytes while the region lives.
    fn ptr(&self) -> *mut u8;
}

/// One side of a reliable connection, exchanged at connect time: enough for
/// the peer to move its queue pair to ready-to-receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpEndpoint {
    pub lid: u16,
    pub gid: [u8; 16],
    pub qpn: u32,
    pub psn: u32,
}

impl QpEndpoint {
    /// `3FSQ`, version, then lid, gid, qpn, psn (little-endian): 31 bytes.
    pub const ENCODED_BYTES: usize = 31;
    const MAGIC: &'static [u8; 4] = b"3FSQ";
    const VERSION: u8 = 1;

    pub fn encode(&self) -> [u8; Self::ENCODED_BYTES] {
        let mut out = [0u8; Self::ENCODED_BYTES];
        out[..4].copy_from_slice(Self::MAGIC);
        out[4] = Self::VERSION;
        out[5..7].copy_from_slice(&self.lid.to_le_bytes());
        out[7..23].copy_from_slice(&self.gid);
        out[23..27].copy_from_slice(&self.qpn.to_le_bytes());
        out[27..31].copy_from_slice(&self.psn.to_le_bytes());
        out
    }

    pub fn decode(raw: &[u8]) -> Result<QpEndpoint, String> {
        if raw.len() != Self::ENCODED_BYTES {
            return Err(format!("queue pair endpoint of {} bytes, expected {}", raw.len(), Self::ENCODED_BYTES));
        }
        if &raw[..4] != Self::MAGIC {
            return Err("not an RDMA handshake (bad magic): is the peer using the TCP transport?".into());
        }
        if raw[4] != Self::VERSION {
            return Err(format!("RDMA handshake version {} (expected {})", raw[4], Self::VERSION));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&raw[7..23]);
        let u32_at = |i: usize| u32::from_le_bytes([raw[i], raw[i + 1], raw[i + 2], raw[i + 3]]);
        Ok(QpEndpoint { lid: u16::from_le_bytes([raw[5], raw[6]]), gid, qpn: u32_at(23), psn: u32_at(27) & 0x00ff_ffff })
    }
}

/// A one-sided transfer between a local registered range and peer memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkRequest {
    pub wr_id: u64,
    pub op: OpKind,
    pub local_addr: u64,
    pub local_lkey: u32,
    pub len: u32,
    pub remote: RemoteBuf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub byte_len: u32,
}

/// A device (one protection domain, one completion queue).
pub trait Verbs: Send + Sync + 'static {
    fn name(&self) -> String;
    /// Registers `len` bytes (allocated and owned by the region).
    fn register(&self, len: usize) -> std::io::Result<Box<dyn Region>>;
    /// A new reliable-connected queue pair, in the INIT state; its endpoint.
    fn create_qp(&self) -> std::io::Result<(u64, QpEndpoint)>;
    /// Moves queue pair `qp` to ready-to-send, connected to `remote`.
    fn connect_qp(&self, qp: u64, remote: &QpEndpoint) -> std::io::Result<()>;
    fn destroy_qp(&self, qp: u64);
    /// Posts a signaled READ or WRITE on `qp`.
    fn post(&self, qp: u64, wr: &WorkRequest) -> std::io::Result<()>;
    /// Appends up to `max` completions (never blocks).
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> std::io::Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_round_trip_and_bad_handshakes_are_refused() {
        let ep = QpEndpoint { lid: 7, gid: [9; 16], qpn: 0x12_3456, psn: 0xab_cdef };
        assert_eq!(QpEndpoint::decode(&ep.encode()).unwrap(), ep);
        let mut bad = ep.encode();
        bad[0] = b'X';
        assert!(QpEndpoint::decode(&bad).unwrap_err().contains("magic"));
        let mut v2 = ep.encode();
        v2[4] = 2;
        assert!(QpEndpoint::decode(&v2).unwrap_err().contains("version"));
        assert!(QpEndpoint::decode(&ep.encode()[..30]).is_err());
    }
}
