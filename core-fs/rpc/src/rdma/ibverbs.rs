//! [`Verbs`] over a real RDMA device (cargo feature `rdma`).
//!
//! **Compiled in CI, never run**: no machine of this project has an RDMA
//! device. It uses `ibverbs-sys`, the FFI crate of the `ibverbs` project:
//! `ibverbs`' safe API posts only two-sided SEND/RECV and hides the QP
//! handle and the lkey that one-sided READ/WRITE work requests need.
//!
//! One device context, one protection domain, one completion queue shared
//! by every queue pair (reliable connected, port 1, GID index 0 so RoCE
//! works). Queue pairs go INIT at creation and RTR → RTS when the peer's
//! endpoint arrives. Work requests are signaled one-sided READ / WRITE with
//! one scatter-gather entry.

use super::engine::{OpKind, WcStatus};
use super::verbs::{Completion, QpEndpoint, Region, Verbs, WorkRequest};
use ibverbs_sys as ffi;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::ffi::CStr;
use std::io;
use std::ptr;

const PORT: u8 = 1;
const GID_INDEX: u8 = 0;
const CQ_ENTRIES: i32 = 4096;
const MAX_SEND_WR: u32 = 256;

/// A raw pointer owned by this module (the device objects are thread-safe
/// per the verbs API; calls on one QP are serialized by the caller's lock).
struct Raw<T>(*mut T);
// SAFETY: verbs objects may be used from any thread (libibverbs is thread-safe).
unsafe impl<T> Send for Raw<T> {}
unsafe impl<T> Sync for Raw<T> {}

/// An opened RDMA device.
pub struct IbVerbs {
    name: String,
    ctx: Raw<ffi::ibv_context>,
    pd: Raw<ffi::ibv_pd>,
    cq: Raw<ffi::ibv_cq>,
    lid: u16,
    gid: [u8; 16],
    qps: Mutex<BTreeMap<u64, Raw<ffi::ibv_qp>>>,
    psn_seed: u32,
}

fn last_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn errno(rc: i32, what: &str) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::new(io::Error::from_raw_os_error(rc).kind(), format!("{what}: {}", io::Error::from_raw_os_error(rc))))
    }
}

impl IbVerbs {
    /// Opens the device named `name` (the first one when `None`).
    /// `Err(NotFound)` when the machine has no RDMA device.
    pub fn open(name: Option<&str>) -> io::Result<IbVerbs> {
        let mut n = 0i32;
        // SAFETY: ibv_get_device_list writes the count and returns a
        // NULL-terminated array freed below with ibv_free_device_list.
        let list = unsafe { ffi::ibv_get_device_list(&mut n as *mut i32) };
        if list.is_null() {
            return Err(last_err("ibv_get_device_list"));
        }
        let mut chosen = None;
        for i in 0..n.max(0) as usize {
            // SAFETY: i < n entries in the array.
            let dev = unsafe { *list.add(i) };
            // SAFETY: dev is a device of the list; the name is a C string owned by it.
            let dev_name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(dev)) }.to_string_lossy().into_owned();
            if name.map_or(true, |want| want == dev_name) {
                chosen = Some((dev, dev_name));
                break;
            }
        }
        let result = match chosen {
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                match name {
                    Some(want) => format!("no RDMA device named {want} ({n} devices)"),
                    None => "no RDMA device on this machine".to_string(),
                },
            )),
            Some((dev, dev_name)) => Self::open_device(dev, dev_name),
        };
        // SAFETY: the list came from ibv_get_device_list; opened contexts stay valid.
        unsafe { ffi::ibv_free_device_list(list) };
        result
    }

    fn open_device(dev: *mut ffi::ibv_device, name: String) -> io::Result<IbVerbs> {
        // SAFETY: dev is a valid device pointer from the device list.
        let ctx = unsafe { ffi::ibv_open_device(dev) };
        if ctx.is_null() {
            return Err(last_err("ibv_open_device"));
        }
        let cleanup_ctx = |e: io::Error| {
            // SAFETY: ctx was opened above and nothing else uses it.
            unsafe { ffi::ibv_close_device(ctx) };
            e
        };
        let mut port = ffi::ibv_port_attr::default();
        // SAFETY: ctx is open; port is a valid out-pointer.
        errno(unsafe { ffi::ibv_query_port(ctx, PORT, &mut port as *mut ffi::ibv_port_attr as *mut _) }, "ibv_query_port")
            .map_err(cleanup_ctx)?;
        let mut gid = ffi::ibv_gid::default();
        // SAFETY: as above.
        errno(unsafe { ffi::ibv_query_gid(ctx, PORT, i32::from(GID_INDEX), &mut gid) }, "ibv_query_gid").map_err(cleanup_ctx)?;
        // SAFETY: ctx is open.
        let pd = unsafe { ffi::ibv_alloc_pd(ctx) };
        if pd.is_null() {
            return Err(cleanup_ctx(last_err("ibv_alloc_pd")));
        }
        // SAFETY: ctx is open; no completion channel, vector 0.
        let cq = unsafe { ffi::ibv_create_cq(ctx, CQ_ENTRIES, ptr::null_mut(), ptr::null_mut(), 0) };
        if cq.is_null() {
            // SAFETY: pd was allocated above.
            unsafe { ffi::ibv_dealloc_pd(pd) };
            return Err(cleanup_ctx(last_err("ibv_create_cq")));
        }
        // SAFETY: reading the raw bytes of the union returned by ibv_query_gid.
        let raw = unsafe { gid.raw };
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(7);
        Ok(IbVerbs {
            name,
            ctx: Raw(ctx),
            pd: Raw(pd),
            cq: Raw(cq),
            lid: port.lid,
            gid: raw,
            qps: Mutex::new(BTreeMap::new()),
            psn_seed: seed,
        })
    }

    fn qp(&self, qp: u64) -> io::Result<*mut ffi::ibv_qp> {
        self.qps.lock().get(&qp).map(|r| r.0).ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no queue pair {qp}")))
    }
}

impl Drop for IbVerbs {
    fn drop(&mut self) {
        for (_, qp) in std::mem::take(&mut *self.qps.lock()) {
            // SAFETY: each QP was created by this device and is destroyed once.
            unsafe { ffi::ibv_destroy_qp(qp.0) };
        }
        // SAFETY: created in open_device, destroyed once, after their QPs.
        unsafe {
            ffi::ibv_destroy_cq(self.cq.0);
            ffi::ibv_dealloc_pd(self.pd.0);
            ffi::ibv_close_device(self.ctx.0);
        }
    }
}

struct IbRegion {
    mr: Raw<ffi::ibv_mr>,
    mem: Box<[u8]>,
    ptr: *mut u8,
}

// SAFETY: the region owns its memory; the device accesses it by DMA.
unsafe impl Send for IbRegion {}
unsafe impl Sync for IbRegion {}

impl Region for IbRegion {
    fn addr(&self) -> u64 {
        self.ptr as u64
    }
    fn len(&self) -> usize {
        self.mem.len()
    }
    fn lkey(&self) -> u32 {
        // SAFETY: mr is a registration that lives as long as self.
        unsafe { (*self.mr.0).lkey }
    }
    fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr.0).rkey }
    }
    fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for IbRegion {
    fn drop(&mut self) {
        // SAFETY: registered once in `register`; the memory is freed after this.
        let rc = unsafe { ffi::ibv_dereg_mr(self.mr.0) };
        if rc != 0 {
            tracing::error!(error = %io::Error::from_raw_os_error(rc), "ibv_dereg_mr failed");
        }
    }
}

fn status_of(s: ffi::ibv_wc_status::Type) -> WcStatus {
    use ffi::ibv_wc_status as st;
    match s {
        st::IBV_WC_SUCCESS => WcStatus::Success,
        st::IBV_WC_REM_ACCESS_ERR | st::IBV_WC_REM_INV_REQ_ERR | st::IBV_WC_REM_OP_ERR => WcStatus::RemoteAccess,
        st::IBV_WC_LOC_PROT_ERR | st::IBV_WC_LOC_LEN_ERR | st::IBV_WC_LOC_ACCESS_ERR => WcStatus::LocalProtection,
        st::IBV_WC_RETRY_EXC_ERR | st::IBV_WC_RNR_RETRY_EXC_ERR | st::IBV_WC_RESP_TIMEOUT_ERR => WcStatus::Transport,
        st::IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
        other => WcStatus::Other(other),
    }
}

impl Verbs for IbVerbs {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn register(&self, len: usize) -> io::Result<Box<dyn Region>> {
        let mut mem = vec![0u8; len].into_boxed_slice();
        let ptr = mem.as_mut_ptr();
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        // SAFETY: pd is live; mem outlives the registration (IbRegion drops the MR first).
        let mr = unsafe { ffi::ibv_reg_mr(self.pd.0, ptr.cast(), len, access.0 as i32) };
        if mr.is_null() {
            return Err(last_err("ibv_reg_mr"));
        }
        Ok(Box::new(IbRegion { mr: Raw(mr), mem, ptr }))
    }

    fn create_qp(&self) -> io::Result<(u64, QpEndpoint)> {
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: self.cq.0,
            recv_cq: self.cq.0,
            srq: ptr::null_mut(),
            cap: ffi::ibv_qp_cap { max_send_wr: MAX_SEND_WR, max_recv_wr: 1, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: pd and cq are live; init is a valid attribute block.
        let qp = unsafe { ffi::ibv_create_qp(self.pd.0, &mut init) };
        if qp.is_null() {
            return Err(last_err("ibv_create_qp"));
        }
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: PORT,
            qp_access_flags: (ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
                .0,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ffi::ibv_qp_attr_mask::IBV_QP_PORT
            | ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        // SAFETY: qp was just created.
        if let Err(e) = errno(unsafe { ffi::ibv_modify_qp(qp, &mut attr, mask.0 as i32) }, "ibv_modify_qp INIT") {
            // SAFETY: destroyed once, never registered.
            unsafe { ffi::ibv_destroy_qp(qp) };
            return Err(e);
        }
        // SAFETY: qp is live.
        let qpn = unsafe { (*qp).qp_num };
        let id = u64::from(qpn);
        self.qps.lock().insert(id, Raw(qp));
        let psn = (self.psn_seed ^ qpn.wrapping_mul(2_654_435_761)) & 0x00ff_ffff;
        Ok((id, QpEndpoint { lid: self.lid, gid: self.gid, qpn, psn }))
    }

    fn connect_qp(&self, qp: u64, remote: &QpEndpoint) -> io::Result<()> {
        let qp = self.qp(qp)?;
        let mut rtr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: ffi::IBV_MTU_1024,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
            ..Default::default()
        };
        rtr.ah_attr.dlid = remote.lid;
        rtr.ah_attr.port_num = PORT;
        if remote.gid != [0u8; 16] {
            rtr.ah_attr.is_global = 1;
            rtr.ah_attr.grh.dgid.raw = remote.gid;
            rtr.ah_attr.grh.hop_limit = 0xff;
            rtr.ah_attr.grh.sgid_index = GID_INDEX;
        }
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_AV
            | ffi::ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ffi::ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ffi::ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ffi::ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ffi::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        // SAFETY: qp is live and in INIT.
        errno(unsafe { ffi::ibv_modify_qp(qp, &mut rtr, mask.0 as i32) }, "ibv_modify_qp RTR")?;
        // SAFETY: qp is live.
        let my_psn = (self.psn_seed ^ unsafe { (*qp).qp_num }.wrapping_mul(2_654_435_761)) & 0x00ff_ffff;
        let mut rts = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            sq_psn: my_psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ffi::ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ffi::ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ffi::ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ffi::ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        // SAFETY: qp is live and in RTR.
        errno(unsafe { ffi::ibv_modify_qp(qp, &mut rts, mask.0 as i32) }, "ibv_modify_qp RTS")
    }

    fn destroy_qp(&self, qp: u64) {
        if let Some(raw) = self.qps.lock().remove(&qp) {
            // SAFETY: removed from the table, so destroyed once.
            let rc = unsafe { ffi::ibv_destroy_qp(raw.0) };
            if rc != 0 {
                tracing::warn!(qp, error = %io::Error::from_raw_os_error(rc), "ibv_destroy_qp failed");
            }
        }
    }

    fn post(&self, qp: u64, wr: &WorkRequest) -> io::Result<()> {
        let qp = self.qp(qp)?;
        let mut sge = ffi::ibv_sge { addr: wr.local_addr, length: wr.len, lkey: wr.local_lkey };
        let mut send = ffi::ibv_send_wr {
            wr_id: wr.wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
            opcode: match wr.op {
                OpKind::Read => ffi::ibv_wr_opcode::IBV_WR_RDMA_READ,
                OpKind::Write => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            },
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        send.wr.rdma.remote_addr = wr.remote.addr;
        send.wr.rdma.rkey = wr.remote.rkey;
        let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
        // SAFETY: post_send is the context's function (as ibv_post_send
        // inlines it); wr, sge and bad live across the call; the buffers are
        // registered and stay alive until the completion (the pool owns them).
        let rc = unsafe {
            let ctx = (*qp).context;
            match (*ctx).ops.post_send {
                Some(f) => f(qp, &mut send, &mut bad),
                None => libc_enosys(),
            }
        };
        errno(rc, "ibv_post_send")
    }

    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> io::Result<()> {
        let mut wcs = vec![ffi::ibv_wc::default(); max.clamp(1, 256)];
        // SAFETY: poll_cq is the context's function (ibv_poll_cq inlines it);
        // wcs has room for the count passed.
        let n = unsafe {
            let ctx = (*self.cq.0).context;
            match (*ctx).ops.poll_cq {
                Some(f) => f(self.cq.0, wcs.len() as i32, wcs.as_mut_ptr()),
                None => -1,
            }
        };
        if n < 0 {
            return Err(io::Error::other("ibv_poll_cq failed"));
        }
        for wc in &wcs[..n as usize] {
            let status = match wc.error() {
                None => WcStatus::Success,
                Some((s, _vendor)) => status_of(s),
            };
            out.push(Completion { wr_id: wc.wr_id(), status, byte_len: wc.len() as u32 });
        }
        Ok(())
    }
}

fn libc_enosys() -> i32 {
    38 // ENOSYS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs only where an RDMA device exists; says so otherwise.
    #[test]
    fn opens_a_device_if_there_is_one() {
        match IbVerbs::open(None) {
            Ok(dev) => {
                let r = dev.register(1 << 20).expect("register 1 MiB");
                assert_eq!(r.len(), 1 << 20);
                let (qp, ep) = dev.create_qp().expect("create a queue pair");
                assert_eq!(u64::from(ep.qpn), qp);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => println!("SKIPPED opens_a_device_if_there_is_one: {e}"),
            Err(e) => println!("SKIPPED opens_a_device_if_there_is_one: cannot list RDMA devices ({e})"),
        }
    }
}
