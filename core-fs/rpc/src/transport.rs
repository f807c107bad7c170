//! The transport seam: how bytes move between two endpoints.
//!
//! RPC code (client, server) only sees [`Transport`], [`Listener`] and the
//! boxed halves of a [`Connection`], so a TCP stream, an RDMA queue pair (its
//! send/recv channel) or a simulated socket (e.g. `turmoil`) all fit. Time in
//! this crate comes from `tokio::time`, which a simulator controls.
//!
//! # Remote memory (RDMA) hook
//!
//! Over RDMA, bulk data should not be copied through the message stream: the
//! owner registers a buffer and sends a [`RemoteBuf`] descriptor (address,
//! length, rkey) in the frame payload with
//! [`FLAG_PAYLOAD_REMOTE`](crate::frame::FLAG_PAYLOAD_REMOTE) set; the peer
//! then pulls it ([`RemoteMemory::read_remote`], e.g. a storage successor
//! reading its predecessor's buffer) or pushes into it
//! ([`RemoteMemory::write_remote`], e.g. a storage target serving a read into
//! client memory). A transport exposes this via [`Transport::remote_memory`];
//! TCP returns `None` and callers fall back to carrying the bytes inline.

use crate::error::{Result, RpcError};
use async_trait::async_trait;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};

/// Read half of a connection.
pub type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
/// Write half of a connection.
pub type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// An established, ordered, reliable byte stream split into halves.
pub struct Connection {
    pub read: BoxRead,
    pub write: BoxWrite,
    /// Peer address, for logs and contexts.
    pub peer: String,
}

/// Accepts inbound connections.
#[async_trait]
pub trait Listener: Send {
    async fn accept(&mut self) -> std::io::Result<Connection>;
    /// The bound address (useful after binding port 0).
    fn local_addr(&self) -> std::io::Result<String>;
}

/// A way to reach peers by address.
#[async_trait]
pub trait Transport: Send + Sync + 'static {
    /// A short name for logs ("tcp", "rdma", "sim").
    fn name(&self) -> &'static str;
    async fn connect(&self, addr: &str) -> std::io::Result<Connection>;
    async fn bind(&self, addr: &str) -> std::io::Result<Box<dyn Listener>>;
    /// The remote-memory capability of this transport, if it has one.
    fn remote_memory(&self) -> Option<&dyn RemoteMemory> {
        None
    }
}

/// Describes a registered memory region of one peer that another peer may
/// read or write directly (RDMA). Encoded as 16 little-endian bytes:
/// `addr u64, len u32, rkey u32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct RemoteBuf {
    pub addr: u64,
    pub len: u32,
    pub rkey: u32,
}

impl RemoteBuf {
    pub const ENCODED_BYTES: usize = 16;

    pub fn encode(&self, out: &mut impl BufMut) {
        out.put_u64_le(self.addr);
        out.put_u32_le(self.len);
        out.put_u32_le(self.rkey);
    }

    /// Decodes a payload made of descriptors; `None` if the length is not a
    /// multiple of [`Self::ENCODED_BYTES`].
    pub fn decode_list(raw: &[u8]) -> Option<Vec<RemoteBuf>> {
        let chunks = raw.chunks_exact(Self::ENCODED_BYTES);
        if !chunks.remainder().is_empty() {
            return None;
        }
        let decode = |mut c: &[u8]| RemoteBuf { addr: c.get_u64_le(), len: c.get_u32_le(), rkey: c.get_u32_le() };
        Some(chunks.map(decode).collect())
    }

    pub fn encode_list(bufs: &[RemoteBuf]) -> Bytes {
        let mut out = BytesMut::with_capacity(bufs.len() * Self::ENCODED_BYTES);
        for b in bufs {
            b.encode(&mut out);
        }
        out.freeze()
    }
}

/// A local buffer registered with the transport's device, exposed to peers
/// through its [`RemoteBuf`] descriptor. Deregistered when dropped (the
/// implementation decides how).
pub trait RegisteredBuf: Send + Sync {
    fn descriptor(&self) -> RemoteBuf;
    fn as_slice(&self) -> &[u8];
    fn as_mut_slice(&mut self) -> &mut [u8];
}

/// One-sided remote memory access, implemented by the RDMA transport
/// (`ibverbs`, behind a cargo feature; not in this crate yet).
#[async_trait]
pub trait RemoteMemory: Send + Sync {
    /// Registers `len_bytes` of local memory for remote access.
    fn register(&self, len_bytes: usize) -> Result<Box<dyn RegisteredBuf>>;
    /// Copies `src` (peer memory) into `dst` (local registered memory).
    async fn read_remote(&self, peer: &str, src: RemoteBuf, dst: &mut dyn RegisteredBuf) -> Result<()>;
    /// Copies `src` (local registered memory) into `dst` (peer memory).
    async fn write_remote(&self, peer: &str, src: &dyn RegisteredBuf, dst: RemoteBuf) -> Result<()>;
}

/// TCP over tokio, with `TCP_NODELAY` on every socket.
#[derive(Clone, Debug, Default)]
pub struct TcpTransport {
    /// Socket send/receive buffer size to request; `None` keeps the OS default.
    pub socket_buffer_bytes: Option<usize>,
}

impl TcpTransport {
    pub fn new() -> Self {
        TcpTransport::default()
    }

    fn split(&self, stream: tokio::net::TcpStream, peer: String) -> std::io::Result<Connection> {
        stream.set_nodelay(true)?;
        let (read, write) = stream.into_split();
        Ok(Connection { read: Box::new(read), write: Box::new(write), peer })
    }

    fn tune(&self, sock: &tokio::net::TcpSocket) -> std::io::Result<()> {
        if let Some(bytes) = self.socket_buffer_bytes {
            let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
            sock.set_send_buffer_size(bytes)?;
            sock.set_recv_buffer_size(bytes)?;
        }
        Ok(())
    }
}

struct TcpListenerBox {
    inner: tokio::net::TcpListener,
    transport: TcpTransport,
}

#[async_trait]
impl Listener for TcpListenerBox {
    async fn accept(&mut self) -> std::io::Result<Connection> {
        let (stream, peer) = self.inner.accept().await?;
        self.transport.split(stream, peer.to_string())
    }

    fn local_addr(&self) -> std::io::Result<String> {
        Ok(self.inner.local_addr()?.to_string())
    }
}

async fn resolve(addr: &str) -> std::io::Result<std::net::SocketAddr> {
    tokio::net::lookup_host(addr)
        .await?
        .next()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, format!("no address for {addr}")))
}

#[async_trait]
impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    async fn connect(&self, addr: &str) -> std::io::Result<Connection> {
        let sa = resolve(addr).await?;
        let sock = if sa.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        self.tune(&sock)?;
        let stream = sock.connect(sa).await?;
        self.split(stream, sa.to_string())
    }

    async fn bind(&self, addr: &str) -> std::io::Result<Box<dyn Listener>> {
        let sa = resolve(addr).await?;
        let sock = if sa.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        // Lets a restarted server rebind its port while old sockets linger.
        sock.set_reuseaddr(true)?;
        self.tune(&sock)?;
        sock.bind(sa)?;
        let inner = sock.listen(1024)?;
        Ok(Box::new(TcpListenerBox { inner, transport: self.clone() }))
    }
}

/// Connects with a bound on the time spent, mapping failures to
/// [`RpcError::ConnectionFailed`].
pub(crate) async fn connect_with_timeout(transport: &dyn Transport, addr: &str, connect_timeout_ms: u64) -> Result<Connection> {
    match tokio::time::timeout(Duration::from_millis(connect_timeout_ms), transport.connect(addr)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(RpcError::connection(addr, e)),
        Err(_) => Err(RpcError::connection(addr, format!("connect timed out after {connect_timeout_ms} ms"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_buf_list_round_trip() {
        let bufs = [RemoteBuf { addr: 1 << 40, len: 4096, rkey: 7 }, RemoteBuf { addr: 3, len: 0, rkey: u32::MAX }];
        let raw = RemoteBuf::encode_list(&bufs);
        assert_eq!(raw.len(), 32);
        assert_eq!(RemoteBuf::decode_list(&raw).unwrap(), bufs);
        assert_eq!(RemoteBuf::decode_list(&raw[..31]), None);
    }

    #[test]
    fn tcp_has_no_remote_memory() {
        assert!(TcpTransport::new().remote_memory().is_none());
    }
}
