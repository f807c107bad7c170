//! A [`Transport`] over turmoil's simulated network (feature `sim`).
//!
//! Only usable inside a `turmoil::Sim` host or client: addresses are
//! `host:port` with turmoil host names (resolved by the simulation's DNS),
//! and a listener binds `0.0.0.0:port` of the current host. Partitions,
//! held links, latency and crashes are the simulation's; nothing here
//! touches the real network or the real clock.

use crate::transport::{Connection, Listener, Transport};
use async_trait::async_trait;

/// The simulated transport (stateless: turmoil keeps the network).
#[derive(Clone, Copy, Debug, Default)]
pub struct SimTransport;

impl SimTransport {
    pub fn new() -> Self {
        SimTransport
    }
}

fn split(stream: turmoil::net::TcpStream, peer: String) -> Connection {
    let (read, write) = stream.into_split();
    Connection { read: Box::new(read), write: Box::new(write), peer }
}

struct SimListener {
    inner: turmoil::net::TcpListener,
}

#[async_trait]
impl Listener for SimListener {
    async fn accept(&mut self) -> std::io::Result<Connection> {
        let (stream, peer) = self.inner.accept().await?;
        Ok(split(stream, peer.to_string()))
    }

    fn local_addr(&self) -> std::io::Result<String> {
        Ok(self.inner.local_addr()?.to_string())
    }
}

#[async_trait]
impl Transport for SimTransport {
    fn name(&self) -> &'static str {
        "sim"
    }

    async fn connect(&self, addr: &str) -> std::io::Result<Connection> {
        let stream = turmoil::net::TcpStream::connect(addr).await?;
        Ok(split(stream, addr.to_string()))
    }

    /// Binds `addr`'s port on every address of the current host (turmoil
    /// only binds unspecified or loopback addresses, so a host name in
    /// `addr` is replaced by `0.0.0.0`).
    async fn bind(&self, addr: &str) -> std::io::Result<Box<dyn Listener>> {
        let port = addr
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("no port in {addr}")))?;
        let inner = turmoil::net::TcpListener::bind(("0.0.0.0", port)).await?;
        Ok(Box::new(SimListener { inner }))
    }
}
