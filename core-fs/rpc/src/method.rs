//! Typed methods and the body codec.

use crate::error::{Result, RpcError};
use bincode::Options;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// One RPC method. Services declare each method as a unit struct:
///
/// ```
/// # use fskv_rpc::Method;
/// pub struct Ping;
/// impl Method for Ping {
///     const ID: u16 = 1;
///     const NAME: &'static str = "test.Ping";
///     type Req = u64;
///     type Resp = u64;
/// }
/// ```
///
/// `ID` must be unique within one server's [`Router`](crate::Router) and must
/// never be reused for a different message shape.
pub trait Method: Send + Sync + 'static {
    const ID: u16;
    const NAME: &'static str;
    type Req: Serialize + DeserializeOwned + Send + Sync + 'static;
    type Resp: Serialize + DeserializeOwned + Send + Sync + 'static;
}

/// Declares a method as a unit struct implementing [`Method`], named
/// `"<service>.<Name>"`:
///
/// ```
/// fskv_rpc::rpc_method!(
///     /// Echoes a number.
///     "test", Ping = 1, u64 => u64
/// );
/// assert_eq!(<Ping as fskv_rpc::Method>::NAME, "test.Ping");
/// ```
#[macro_export]
macro_rules! rpc_method {
    ($(#[$doc:meta])* $service:literal, $name:ident = $id:literal, $req:ty => $resp:ty) => {
        $(#[$doc])*
        pub struct $name;
        impl $crate::Method for $name {
            const ID: u16 = $id;
            const NAME: &'static str = concat!($service, ".", stringify!($name));
            type Req = $req;
            type Resp = $resp;
        }
    };
}

/// Bodies are bincode with fixed-width little-endian integers; decoding is
/// bounded by the body length and rejects trailing bytes.
fn options(limit_bytes: u64) -> impl Options {
    bincode::DefaultOptions::new().with_fixint_encoding().with_little_endian().with_limit(limit_bytes)
}

pub fn encode_body<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    options(u64::MAX).serialize(value).map_err(|e| RpcError::Malformed(format!("encode: {e}")))
}

pub fn decode_body<T: DeserializeOwned>(raw: &[u8]) -> Result<T> {
    options(raw.len() as u64).deserialize(raw).map_err(|e| RpcError::Malformed(format!("decode: {e}")))
}
