//! The RDMA layer through the transport seam, on the in-process fabric
//! (`fskv_rpc::rdma::loopback`): real RPC connections over TCP loopback with
//! the queue-pair handshake, the successor pulling a predecessor's
//! registered buffer by RDMA READ (3FS's write path), a target writing into
//! client memory, and the failures — lost and failed completions, refused
//! keys, exhausted pool, a peer that does not speak the handshake.
//!
//! No RDMA device is involved (there is none on these machines): this tests
//! the state machines above the device, not a NIC.

use bytes::Bytes;
use fskv_rpc::rdma::loopback::{Fault, LoopbackFabric, LoopbackVerbs};
use fskv_rpc::rdma::{RdmaConfig, RdmaMemory, RdmaTransport, WcStatus};
use fskv_rpc::transport::{RegisteredBuf, RemoteMemory};
use fskv_rpc::{CallOptions, ClientConfig, ErrorCode, RemoteBuf, Router, RpcClient, RpcError, Server, ServerConfig, Status};
use std::sync::Arc;
use std::time::Duration;

fskv_rpc::rpc_method!(
    /// The successor side of a forward: pull the payload the descriptor names.
    "rdmatest", Pull = 1, u32 => u32
);
fskv_rpc::rpc_method!(
    /// A read served into client memory: write `len` bytes of pattern `seed`.
    "rdmatest", Push = 2, (u8, u32) => ()
);

fn cfg() -> RdmaConfig {
    RdmaConfig { pool_slots: 4, slot_bytes: 64 << 10, op_timeout_ms: 300, ..RdmaConfig::default() }
}

fn crc(data: &[u8]) -> u32 {
    data.iter().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193))
}

/// A "storage target": pulls what a Pull names into its own registered slot
/// and answers the checksum of what it got; writes a pattern for a Push.
async fn target(fabric: &LoopbackFabric) -> (Server, Arc<RdmaTransport<LoopbackVerbs>>) {
    let transport = Arc::new(RdmaTransport::new(Arc::new(fabric.device()), cfg()).expect("rdma transport"));
    let mem = transport.memory().clone();
    let mem2 = mem.clone();
    let router = Router::new()
        .route::<Pull, _, _>(move |ctx, len, payload| {
            let mem = mem.clone();
            async move {
                let descs = RemoteBuf::decode_list(&payload).ok_or_else(|| Status::new(ErrorCode::MalformedMessage, "bad descriptor"))?;
                let src = *descs.first().ok_or_else(|| Status::new(ErrorCode::MalformedMessage, "no descriptor"))?;
                let mut dst = mem.register(len as usize).map_err(|e| e.to_status())?;
                mem.read_remote(&ctx.peer, src, &mut *dst).await.map_err(|e| e.to_status())?;
                Ok((crc(dst.as_slice()), Bytes::new()))
            }
        })
        .route::<Push, _, _>(move |ctx, (seed, len), payload| {
            let mem = mem2.clone();
            async move {
                let dst = RemoteBuf::decode_list(&payload)
                    .and_then(|d| d.first().copied())
                    .ok_or_else(|| Status::new(ErrorCode::MalformedMessage, "no descriptor"))?;
                let mut src = mem.register(len as usize).map_err(|e| e.to_status())?;
                for (i, b) in src.as_mut_slice().iter_mut().enumerate() {
                    *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
                }
                mem.write_remote(&ctx.peer, &*src, dst).await.map_err(|e| e.to_status())?;
                Ok(((), Bytes::new()))
            }
        });
    let server = Server::bind(transport.clone(), "127.0.0.1:0", router, ServerConfig::default()).await.expect("bind");
    (server, transport)
}

fn client(fabric: &LoopbackFabric) -> (RpcClient, Arc<RdmaMemory<LoopbackVerbs>>) {
    let transport = Arc::new(RdmaTransport::new(Arc::new(fabric.device()), cfg()).expect("rdma transport"));
    let mem = transport.memory().clone();
    (RpcClient::new(transport, ClientConfig { connections_per_addr: 1, ..ClientConfig::default() }), mem)
}

fn desc(buf: &dyn RegisteredBuf) -> Bytes {
    RemoteBuf::encode_list(&[buf.descriptor()])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_successor_pulls_the_payload_and_a_target_writes_into_client_memory() {
    let fabric = LoopbackFabric::new();
    let (server, _t) = target(&fabric).await;
    let (rpc, mem) = client(&fabric);
    let addr = server.local_addr().to_string();
    for round in 0..20u32 {
        let len = 1 + round * 3000;
        let mut buf = mem.register(len as usize).expect("slot");
        for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
            *b = (i as u32 ^ round) as u8;
        }
        let want = crc(buf.as_slice());
        let (got, _) = rpc.call::<Pull>(&addr, &len, desc(&*buf), CallOptions::default()).await.expect("pull");
        assert_eq!(got, want, "round {round}: the target pulled other bytes");
    }
    // Into client memory.
    let mut buf = mem.register(5000).expect("slot");
    rpc.call::<Push>(&addr, &(9, 5000), desc(&*buf), CallOptions::default()).await.expect("push");
    assert!(buf.as_mut_slice().iter().enumerate().all(|(i, b)| *b == (i as u8).wrapping_mul(31).wrapping_add(9)));
    drop(buf);
    assert_eq!(mem.free_slots(), 4, "every slot given back");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_mapped_and_a_new_connection_recovers() {
    let fabric = LoopbackFabric::new();
    let (server, target_t) = target(&fabric).await;
    let (rpc, mem) = client(&fabric);
    let addr = server.local_addr().to_string();
    let buf = mem.register(100).expect("slot");

    // A completion that never comes: the deadline ends the transfer, and the
    // queue pair is failed (the next transfer on it is refused at once).
    fabric.inject(Fault::LoseCompletion);
    let e = rpc.call::<Pull>(&addr, &100, desc(&*buf), CallOptions::default()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::DeadlineExceeded, "{e}");
    let e = rpc.call::<Pull>(&addr, &100, desc(&*buf), CallOptions::default()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::ConnectionFailed, "{e}");
    assert!(e.is_retryable());

    // The dead queue pair ends its connection (both sides): the client's
    // next call reconnects, and the new connection's handshake makes a new
    // queue pair.
    let mut recovered = false;
    for _ in 0..50 {
        match rpc.call::<Pull>(&addr, &100, desc(&*buf), CallOptions::default()).await {
            Ok(_) => {
                recovered = true;
                break;
            }
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(recovered, "no transfer got through after the queue pair failed");
    let (rpc2, mem2) = client(&fabric);
    let buf2 = mem2.register(100).expect("slot");
    rpc2.call::<Pull>(&addr, &100, desc(&*buf2), CallOptions::default()).await.expect("a new queue pair works");

    // A transport error completion: retryable, and flushes the queue pair.
    fabric.inject(Fault::Fail(WcStatus::Transport));
    let e = rpc2.call::<Pull>(&addr, &100, desc(&*buf2), CallOptions::default()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::ConnectionFailed, "{e}");

    // A refused key (a forged descriptor): not retryable.
    let (rpc3, mem3) = client(&fabric);
    let buf3 = mem3.register(100).expect("slot");
    let mut forged = buf3.descriptor();
    forged.rkey ^= 0xdead;
    let e = rpc3.call::<Pull>(&addr, &100, RemoteBuf::encode_list(&[forged]), CallOptions::default()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::MalformedMessage, "{e}");
    assert!(!e.is_retryable());
    // Out of bounds of the registered slot: refused before posting.
    let (rpc4, mem4) = client(&fabric);
    let buf4 = mem4.register(100).expect("slot");
    let e = rpc4.call::<Pull>(&addr, &50, desc(&*buf4), CallOptions::default()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::MalformedMessage, "a 100-byte source into a 50-byte slot: {e}");
    rpc4.call::<Pull>(&addr, &100, desc(&*buf4), CallOptions::default()).await.expect("the queue pair is still fine");

    // Late completions after a timeout are counted, not delivered.
    assert_eq!(target_t.memory().stray_completions(), 0);
    drop((buf, buf2, buf3, buf4));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_is_registered_once_and_bounded() {
    let fabric = LoopbackFabric::new();
    let mem = RdmaMemory::new(Arc::new(fabric.device()), cfg()).expect("memory");
    let bufs: Vec<_> = (0..4).map(|_| mem.register(64 << 10).expect("slot")).collect();
    let e = mem.register(1).err().expect("a fifth slot");
    assert_eq!(e.code(), ErrorCode::Overloaded);
    assert!(e.is_retryable());
    let e = mem.register((64 << 10) + 1).err().expect("larger than a slot");
    assert_eq!(e.code(), ErrorCode::MalformedMessage);
    // Slots are disjoint ranges of one registration.
    let d: Vec<RemoteBuf> = bufs.iter().map(|b| b.descriptor()).collect();
    assert!(d.iter().all(|x| x.rkey == d[0].rkey), "one memory registration");
    for w in d.windows(2) {
        assert!(w[0].addr + u64::from(w[0].len) <= w[1].addr);
    }
    drop(bufs);
    assert_eq!(mem.free_slots(), 4);
    // A transfer to a peer never connected is refused.
    let mut b = mem.register(8).expect("slot");
    let e = mem.read_remote("127.0.0.1:1", RemoteBuf { addr: 0, len: 8, rkey: 1 }, &mut *b).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::ConnectionFailed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_without_the_handshake_is_dropped_and_the_listener_goes_on() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fabric = LoopbackFabric::new();
    let (server, _t) = target(&fabric).await;
    let addr = server.local_addr().to_string();
    // A TCP client sending an RPC frame where the handshake is expected.
    let mut s = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    s.write_all(&[0x33u8; 31]).await.expect("write");
    let mut one = [0u8; 1];
    let r = tokio::time::timeout(Duration::from_secs(5), s.read(&mut one)).await.expect("the server closes it");
    assert!(matches!(r, Ok(0) | Err(_)), "connection closed without an answer");
    // An RDMA client still gets through.
    let (rpc, mem) = client(&fabric);
    let buf = mem.register(10).expect("slot");
    rpc.call::<Pull>(&addr, &10, desc(&*buf), CallOptions::default()).await.expect("pull after a bad peer");
    // A TCP transport dialing an RDMA server fails its calls cleanly.
    let tcp = RpcClient::new(Arc::new(fskv_rpc::TcpTransport::new()), ClientConfig { connections_per_addr: 1, ..ClientConfig::default() });
    let e = tcp.call::<Pull>(&addr, &10, desc(&*buf), CallOptions { timeout_ms: 2_000 }).await.unwrap_err();
    assert!(matches!(e, RpcError::ConnectionFailed { .. } | RpcError::DeadlineExceeded { .. }), "{e}");
    server.shutdown().await;
}
