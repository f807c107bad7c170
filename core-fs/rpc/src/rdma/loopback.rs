//! An in-process RDMA fabric: [`Verbs`] devices whose one-sided READ and
//! WRITE copy between registered regions of devices on the same fabric,
//! checking keys and bounds as a NIC does (a bad rkey, address or length
//! completes with a remote access error and breaks the queue pair). Faults
//! can be injected: a completion that never comes, a failed transfer.
//!
//! It exists to test the layers above the device (the work-request state
//! machine, the registered pool, the handshake and [`RemoteMemory`]) on
//! machines without an RDMA device; it says nothing about a real NIC.
//!
//! [`RemoteMemory`]: crate::transport::RemoteMemory

use super::engine::{OpKind, WcStatus};
use super::verbs::{Completion, QpEndpoint, Region, Verbs, WorkRequest};
use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Faults the next posted work requests get (consumed in order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Never complete (the caller's deadline must end it).
    LoseCompletion,
    /// Complete with this status, transferring nothing.
    Fail(WcStatus),
}

struct RegionRec {
    device: u32,
    addr: u64,
    len: usize,
}

struct QpRec {
    device: u32,
    peer_qpn: Option<u32>,
}

#[derive(Default)]
struct FabricState {
    regions: BTreeMap<u32, RegionRec>,
    qps: BTreeMap<u32, QpRec>,
    completions: BTreeMap<u32, VecDeque<Completion>>,
    faults: VecDeque<Fault>,
}

/// The fabric every [`LoopbackVerbs`] device of a test is attached to.
#[derive(Clone, Default)]
pub struct LoopbackFabric {
    state: Arc<Mutex<FabricState>>,
    next_id: Arc<AtomicU32>,
}

impl LoopbackFabric {
    pub fn new() -> Self {
        LoopbackFabric { state: Arc::default(), next_id: Arc::new(AtomicU32::new(1)) }
    }

    /// A new device on this fabric.
    pub fn device(&self) -> LoopbackVerbs {
        LoopbackVerbs { fabric: self.clone(), id: self.next_id.fetch_add(1, Ordering::Relaxed) }
    }

    /// Queues a fault for the next posted work request.
    pub fn inject(&self, fault: Fault) {
        self.state.lock().faults.push_back(fault);
    }
}

/// One device on a [`LoopbackFabric`].
pub struct LoopbackVerbs {
    fabric: LoopbackFabric,
    id: u32,
}

struct LoopbackRegion {
    fabric: LoopbackFabric,
    key: u32,
    mem: Box<[u8]>,
    ptr: *mut u8,
}

// SAFETY: the region owns its memory; the raw pointer is only used for the
// copies a (simulated) device makes, as a NIC's DMA would.
unsafe impl Send for LoopbackRegion {}
unsafe impl Sync for LoopbackRegion {}

impl Region for LoopbackRegion {
    fn addr(&self) -> u64 {
        self.ptr as u64
    }
    fn len(&self) -> usize {
        self.mem.len()
    }
    fn lkey(&self) -> u32 {
        self.key
    }
    fn rkey(&self) -> u32 {
        self.key
    }
    fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for LoopbackRegion {
    fn drop(&mut self) {
        self.fabric.state.lock().regions.remove(&self.key);
    }
}

fn in_region(r: &RegionRec, addr: u64, len: u32) -> bool {
    addr >= r.addr && addr.saturating_add(u64::from(len)) <= r.addr + r.len as u64
}

impl Verbs for LoopbackVerbs {
    fn name(&self) -> String {
        format!("loopback{}", self.id)
    }

    fn register(&self, len: usize) -> std::io::Result<Box<dyn Region>> {
        let mut mem = vec![0u8; len].into_boxed_slice();
        let ptr = mem.as_mut_ptr();
        let key = self.fabric.next_id.fetch_add(1, Ordering::Relaxed);
        self.fabric.state.lock().regions.insert(key, RegionRec { device: self.id, addr: ptr as u64, len });
        Ok(Box::new(LoopbackRegion { fabric: self.fabric.clone(), key, mem, ptr }))
    }

    fn create_qp(&self) -> std::io::Result<(u64, QpEndpoint)> {
        let qpn = self.fabric.next_id.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
        self.fabric.state.lock().qps.insert(qpn, QpRec { device: self.id, peer_qpn: None });
        Ok((u64::from(qpn), QpEndpoint { lid: self.id as u16, gid: [0; 16], qpn, psn: qpn }))
    }

    fn connect_qp(&self, qp: u64, remote: &QpEndpoint) -> std::io::Result<()> {
        let mut s = self.fabric.state.lock();
        if !s.qps.contains_key(&remote.qpn) {
            return Err(std::io::Error::new(std::io::ErrorKind::NotFound, format!("no queue pair {} on the fabric", remote.qpn)));
        }
        let rec =
            s.qps.get_mut(&(qp as u32)).ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such local queue pair"))?;
        rec.peer_qpn = Some(remote.qpn);
        Ok(())
    }

    fn destroy_qp(&self, qp: u64) {
        self.fabric.state.lock().qps.remove(&(qp as u32));
    }

    fn post(&self, qp: u64, wr: &WorkRequest) -> std::io::Result<()> {
        let mut s = self.fabric.state.lock();
        let rec = s.qps.get(&(qp as u32)).ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such queue pair"))?;
        let peer_device = rec.peer_qpn.and_then(|p| s.qps.get(&p)).map(|p| p.device);
        let fault = s.faults.pop_front();
        let status = match (fault, peer_device) {
            (Some(Fault::LoseCompletion), _) => return Ok(()),
            (Some(Fault::Fail(status)), _) => status,
            (None, None) => WcStatus::Transport,
            (None, Some(peer)) => {
                let local = s.regions.get(&wr.local_lkey).filter(|r| r.device == self.id && in_region(r, wr.local_addr, wr.len));
                let remote = s.regions.get(&wr.remote.rkey).filter(|r| r.device == peer && in_region(r, wr.remote.addr, wr.len));
                match (local, remote) {
                    (None, _) => WcStatus::LocalProtection,
                    (_, None) => WcStatus::RemoteAccess,
                    (Some(_), Some(_)) => {
                        let (src, dst) = match wr.op {
                            OpKind::Read => (wr.remote.addr, wr.local_addr),
                            OpKind::Write => (wr.local_addr, wr.remote.addr),
                        };
                        // SAFETY: both ranges were checked to lie inside live
                        // registered regions (held in the fabric's table under
                        // its lock; a region leaves the table before its memory
                        // is freed); `copy` allows overlap.
                        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, wr.len as usize) };
                        WcStatus::Success
                    }
                }
            }
        };
        let byte_len = if status == WcStatus::Success { wr.len } else { 0 };
        s.completions.entry(self.id).or_default().push_back(Completion { wr_id: wr.wr_id, status, byte_len });
        Ok(())
    }

    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> std::io::Result<()> {
        let mut s = self.fabric.state.lock();
        if let Some(q) = s.completions.get_mut(&self.id) {
            for _ in 0..max {
                match q.pop_front() {
                    Some(c) => out.push(c),
                    None => break,
                }
            }
        }
        Ok(())
    }
}
