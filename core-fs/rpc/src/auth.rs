//! Service identity: the mutual challenge/response every RPC connection
//! starts with when a cluster key is configured.
//!
//! # Protocol (version 1)
//!
//! Both ends hold the same [`ClusterKey`] `K` (32 random bytes, hex in a file
//! only trusted users can read). `cn` and `sn` are 32-byte nonces drawn from
//! the OS by each side, `name` the principal the client claims, `MAC` is
//! HMAC-SHA256.
//!
//! | step | direction | bytes |
//! |---|---|---|
//! | hello | client → server | magic `3FSA`, version `u8` = 1, `name_len u8` (1..=64), `name`, `cn` (32) |
//! | challenge | server → client | `0x00`, `sn` (32), `MAC(K, "fskv-rpc-auth-v1 server" · cn · sn · name)` (32) |
//! | refusal instead of a challenge | server → client | reason `u8` ≠ 0 (table below), then close |
//! | proof | client → server | `MAC(K, "fskv-rpc-auth-v1 client" · sn · cn · name)` (32) |
//! | verdict | server → client | `0x00` accepted, or a reason `u8` and close |
//!
//! Then RPC frames ([`crate::frame`]) flow as without authentication. The
//! client checks the server's MAC before it proves anything, so a server
//! without the key learns nothing usable; the server checks the client's
//! proof before it reads a single frame, so no handler ever runs for a peer
//! without the key. Both MACs cover both nonces and the claimed name: a
//! recorded handshake cannot be replayed (fresh nonce of the other side) nor
//! its name changed. Compares are constant-time ([`subtle`]). A failed
//! handshake closes the connection and counts in
//! `fskv_rpc_auth_failures_total{reason}` on the server.
//!
//! | reason byte | name | when |
//! |---|---|---|
//! | 1 | `bad_magic` | the first bytes are neither a hello nor `GET ` (e.g. a client without the key sending frames) |
//! | 2 | `bad_version` | a hello of another protocol version |
//! | 3 | `bad_name` | a name that is empty, longer than 64 bytes or not printable ASCII |
//! | 4 | `bad_proof` | the client's MAC does not verify (it does not hold the key) |
//! | 5 | `timeout` | the handshake did not finish within `handshake_timeout_ms` (server only counts; nothing is sent) |
//! | 6 | `closed` | the peer closed or failed mid-handshake (e.g. a client that rejected our MAC) |
//!
//! Every message has a fixed size or a size bounded by
//! [`MAX_PRINCIPAL_BYTES`]; nothing a peer sends makes either side allocate
//! more than 136 bytes.
//!
//! # User principals
//!
//! A name `user:<uid>:<gid>[:<g1>,<g2>…]` ([`UserPrincipal`]) is proven with
//! its own key, `K_user = HMAC-SHA256(K, "fskv-user-key-v1" · name)`
//! ([`ClusterKey::derive_user_key`]), instead of `K`: the server (holding
//! `K`) derives it from the hello's name, the client holds only `K_user`
//! (a key file of `fskv admin user-key`, [`KeyFile`]). The bytes on the wire
//! are the same. So the holder of a user key proves that one name and no
//! other (`client`, a service, another uid, another group list: its MACs do
//! not verify), and learns neither `K` nor another user's key.
//!
//! | claimed name | key both MACs use |
//! |---|---|
//! | `user:…` (well-formed) | `K_user` of that exact name |
//! | `user:…` (malformed) | none: refused at the hello (`bad_name`) |
//! | anything else | `K` |
//!
//! # Why an HMAC handshake and not mTLS
//!
//! * No per-frame cost: after the handshake frames travel exactly as before
//!   (no record layer, no encryption of 64 MiB chunk payloads); the
//!   handshake is two round trips and four HMACs per connection, and
//!   connections are pooled for the life of a process.
//! * No certificate management: one 32-byte key per cluster, created by
//!   `fskv up` (or the deploy scripts) with mode 0600, instead of a CA,
//!   per-process certificates, expiry and rotation.
//! * One trust domain: every process that holds the key is a trusted part of
//!   the cluster (services, FUSE daemon, gateways, root's `fskv` commands).
//!
//! # What it does NOT protect against
//!
//! * An on-path attacker who can read and rewrite TCP after the handshake
//!   (frames are neither encrypted nor MACed): it can read data and inject
//!   requests into an authenticated connection. The threat model is
//!   loopback or a private cluster network where other hosts' users cannot
//!   touch the wire; across an untrusted network use a VPN / IPsec / WireGuard
//!   underneath (or mTLS as future work).
//! * A holder of the key claiming another principal's name: with one cluster
//!   key every holder can claim any name (one trust domain). Names are used
//!   to refuse mistakes and forged heartbeats from processes that claim to
//!   be a client; per-node keys (the name bound to a key) are the next step.
//!
//! The module is a pure state machine (no I/O, no clock; nonces are passed
//! in): [`ClientHandshake`] and [`ServerHandshake`]. The async shells live in
//! the client's connect and the server's accept.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use subtle::ConstantTimeEq;

/// First bytes of a hello.
pub const AUTH_MAGIC: [u8; 4] = *b"3FSA";
/// The protocol version this build speaks.
pub const AUTH_VERSION: u8 = 1;
/// Longest principal name.
pub const MAX_PRINCIPAL_BYTES: usize = 64;
/// Size of a nonce and of a MAC.
pub const NONCE_BYTES: usize = 32;
pub const MAC_BYTES: usize = 32;
/// Bytes of a hello before the name: magic, version, name length.
pub const HELLO_HEAD_BYTES: usize = 6;
/// Bytes of a challenge: status, server nonce, server MAC.
pub const CHALLENGE_BYTES: usize = 1 + NONCE_BYTES + MAC_BYTES;
/// Bytes of the client's proof.
pub const PROOF_BYTES: usize = MAC_BYTES;
/// Size of the key in bytes.
pub const KEY_BYTES: usize = 32;

const SERVER_LABEL: &[u8] = b"fskv-rpc-auth-v1 server";
const CLIENT_LABEL: &[u8] = b"fskv-rpc-auth-v1 client";
/// `K_user = HMAC-SHA256(K, USER_KEY_LABEL · name)`.
pub const USER_KEY_LABEL: &[u8] = b"fskv-user-key-v1";
/// `K_cap = HMAC-SHA256(K, CAP_KEY_LABEL)`: the key of chunk capabilities.
pub const CAP_KEY_LABEL: &[u8] = b"fskv-chunk-cap-key-v1";
/// Label of a capability's MAC input.
const CAP_MAC_LABEL: &[u8] = b"fskv-chunk-cap-v1";
/// Prefix of user principal names.
pub const USER_PREFIX: &str = "user:";

/// Why a handshake failed (the reason byte table in the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AuthFailure {
    BadMagic,
    BadVersion,
    BadName,
    BadProof,
    Timeout,
    Closed,
}

impl AuthFailure {
    pub fn byte(self) -> u8 {
        match self {
            AuthFailure::BadMagic => 1,
            AuthFailure::BadVersion => 2,
            AuthFailure::BadName => 3,
            AuthFailure::BadProof => 4,
            AuthFailure::Timeout => 5,
            AuthFailure::Closed => 6,
        }
    }

    pub fn from_byte(b: u8) -> Option<AuthFailure> {
        Some(match b {
            1 => AuthFailure::BadMagic,
            2 => AuthFailure::BadVersion,
            3 => AuthFailure::BadName,
            4 => AuthFailure::BadProof,
            5 => AuthFailure::Timeout,
            6 => AuthFailure::Closed,
            _ => return None,
        })
    }

    /// The `reason` label of `fskv_rpc_auth_failures_total`.
    pub fn name(self) -> &'static str {
        match self {
            AuthFailure::BadMagic => "bad_magic",
            AuthFailure::BadVersion => "bad_version",
            AuthFailure::BadName => "bad_name",
            AuthFailure::BadProof => "bad_proof",
            AuthFailure::Timeout => "timeout",
            AuthFailure::Closed => "closed",
        }
    }
}

impl fmt::Display for AuthFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            AuthFailure::BadMagic => "the peer did not start with an authentication hello",
            AuthFailure::BadVersion => "unsupported authentication protocol version",
            AuthFailure::BadName => "invalid principal name",
            AuthFailure::BadProof => "the peer does not hold the cluster key",
            AuthFailure::Timeout => "authentication timed out",
            AuthFailure::Closed => "the connection closed during authentication",
        };
        f.write_str(text)
    }
}

/// What the client side concluded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClientAuthError {
    /// The server answered our hello or proof with a refusal.
    #[error("the server refused the connection: {0}")]
    Refused(AuthFailure),
    /// The server's MAC does not verify: it does not hold our key (a wrong
    /// key on either side, or not the server we meant to reach).
    #[error("the server could not prove it holds the cluster key (the keys differ)")]
    ServerNotAuthenticated,
    /// The server sent bytes that are not part of the protocol (e.g. a
    /// server without authentication, or another service on that port).
    #[error("the server does not speak the authentication protocol ({0})")]
    Protocol(String),
    /// Our own principal name is not valid (a configuration error).
    #[error("invalid principal name {0:?}")]
    BadName(String),
}

/// The cluster secret: 32 random bytes. Debug output never shows it.
#[derive(Clone)]
pub struct ClusterKey([u8; KEY_BYTES]);

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey(<redacted>)")
    }
}

impl ClusterKey {
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> ClusterKey {
        ClusterKey(bytes)
    }

    /// A fresh key from the operating system's random source.
    pub fn generate() -> ClusterKey {
        let mut bytes = [0u8; KEY_BYTES];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut bytes);
        ClusterKey(bytes)
    }

    /// Parses the file format: 64 hex digits, surrounding whitespace allowed.
    pub fn from_hex(text: &str) -> Result<ClusterKey, String> {
        let text = text.trim();
        let raw = hex::decode(text).map_err(|e| format!("not hex: {e}"))?;
        let bytes: [u8; KEY_BYTES] =
            raw.try_into().map_err(|raw: Vec<u8>| format!("{} bytes, expected {KEY_BYTES} (64 hex digits)", raw.len()))?;
        Ok(ClusterKey(bytes))
    }

    /// The file format: 64 lowercase hex digits and a newline.
    pub fn to_hex(&self) -> String {
        format!("{}\n", hex::encode(self.0))
    }

    /// Reads a cluster key file; the error says which file and why
    /// (permission denied is the usual one for an untrusted user; a user
    /// key file is refused: services need the cluster key itself).
    pub fn load(path: &Path) -> Result<ClusterKey, String> {
        match KeyFile::load(path)? {
            KeyFile::Cluster(key) => Ok(key),
            KeyFile::User { principal, .. } => Err(format!(
                "{} is a user key (for {principal}), not the cluster key: services, the FUSE mount and gateways need the cluster key",
                path.display()
            )),
        }
    }

    /// The key of the user principal `name`:
    /// `HMAC-SHA256(K, "fskv-user-key-v1" · name)`. Whoever holds the
    /// cluster key can derive it; a user key reveals neither the cluster key
    /// nor another user's key.
    pub fn derive_user_key(&self, name: &str) -> ClusterKey {
        ClusterKey(self.hmac(&[USER_KEY_LABEL, name.as_bytes()]))
    }

    /// The key chunk capabilities are MACed with (meta issues, storage verifies).
    pub fn cap_key(&self) -> CapKey {
        CapKey(self.hmac(&[CAP_KEY_LABEL]))
    }

    fn hmac(&self, parts: &[&[u8]]) -> [u8; MAC_BYTES] {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        for p in parts {
            mac.update(p);
        }
        let mut out = [0u8; MAC_BYTES];
        out.copy_from_slice(&mac.finalize().into_bytes());
        out
    }

    fn mac(&self, label: &[u8], first: &[u8; NONCE_BYTES], second: &[u8; NONCE_BYTES], name: &[u8]) -> [u8; MAC_BYTES] {
        // A key of any length is valid for HMAC; 32 bytes always is.
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        mac.update(label);
        mac.update(first);
        mac.update(second);
        mac.update(name);
        let mut out = [0u8; MAC_BYTES];
        out.copy_from_slice(&mac.finalize().into_bytes());
        out
    }
}

/// The key of chunk capabilities (`K_cap`, derived from the cluster key).
/// Debug output never shows it.
#[derive(Clone)]
pub struct CapKey([u8; KEY_BYTES]);

impl fmt::Debug for CapKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CapKey(<redacted>)")
    }
}

impl CapKey {
    /// `HMAC-SHA256(K_cap, "fskv-chunk-cap-v1" · len(principal) u8 · principal · inode u64 BE · rights u8 · expires_at_ms u64 BE)`.
    pub fn mac(&self, principal: &str, inode: u64, rights: u8, expires_at_ms: u64) -> [u8; MAC_BYTES] {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        mac.update(CAP_MAC_LABEL);
        // Names are at most 64 bytes (valid_principal_name); the length
        // prefix keeps the encoding unambiguous.
        mac.update(&[principal.len().min(255) as u8]);
        mac.update(principal.as_bytes());
        mac.update(&inode.to_be_bytes());
        mac.update(&[rights]);
        mac.update(&expires_at_ms.to_be_bytes());
        let mut out = [0u8; MAC_BYTES];
        out.copy_from_slice(&mac.finalize().into_bytes());
        out
    }

    /// Whether `mac` is the MAC of these fields (constant-time compare).
    pub fn verify(&self, principal: &str, inode: u64, rights: u8, expires_at_ms: u64, mac: &[u8]) -> bool {
        let expected = self.mac(principal, inode, rights, expires_at_ms);
        mac.len() == MAC_BYTES && bool::from(expected.ct_eq(mac))
    }
}

/// Whether `name` is a user principal (`user:…`).
pub fn is_user_principal(name: &str) -> bool {
    name.starts_with(USER_PREFIX)
}

/// A user principal: `user:<uid>:<gid>` or `user:<uid>:<gid>:<g1>,<g2>,…`
/// (decimal, no sign or leading zeros; at most [`MAX_PRINCIPAL_BYTES`] in all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserPrincipal {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl UserPrincipal {
    /// Parses a name; `None` for anything not exactly of the form above.
    pub fn parse(name: &str) -> Option<UserPrincipal> {
        fn num(s: &str) -> Option<u32> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0')) {
                return None;
            }
            s.parse().ok()
        }
        if name.len() > MAX_PRINCIPAL_BYTES {
            return None;
        }
        let rest = name.strip_prefix(USER_PREFIX)?;
        let mut parts = rest.split(':');
        let uid = num(parts.next()?)?;
        let gid = num(parts.next()?)?;
        let groups = match parts.next() {
            None => Vec::new(),
            Some(list) => list.split(',').map(num).collect::<Option<Vec<u32>>>()?,
        };
        if parts.next().is_some() {
            return None;
        }
        Some(UserPrincipal { uid, gid, groups })
    }

    /// The principal name; an error when it would exceed [`MAX_PRINCIPAL_BYTES`].
    pub fn name(&self) -> Result<String, String> {
        let mut name = format!("{USER_PREFIX}{}:{}", self.uid, self.gid);
        if !self.groups.is_empty() {
            let list: Vec<String> = self.groups.iter().map(u32::to_string).collect();
            name.push(':');
            name.push_str(&list.join(","));
        }
        if name.len() > MAX_PRINCIPAL_BYTES {
            return Err(format!(
                "the principal name {name:?} is {} bytes, more than {MAX_PRINCIPAL_BYTES}: give fewer supplementary groups",
                name.len()
            ));
        }
        Ok(name)
    }
}

/// What a key file holds.
///
/// | format | content |
/// |---|---|
/// | cluster key | one line: 64 hex digits |
/// | user key (`fskv admin user-key`) | line 1: the principal name (`user:<uid>:<gid>[:<groups>]`), line 2: 64 hex digits of its derived key |
///
/// Blank lines and surrounding whitespace are ignored.
#[derive(Debug)]
pub enum KeyFile {
    Cluster(ClusterKey),
    User { principal: String, key: ClusterKey },
}

impl KeyFile {
    pub fn parse(text: &str) -> Result<KeyFile, String> {
        let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        match lines.as_slice() {
            [hex] => Ok(KeyFile::Cluster(ClusterKey::from_hex(hex)?)),
            [name, hex] => {
                if UserPrincipal::parse(name).is_none() {
                    return Err(format!("first line {name:?} is not a user principal (user:<uid>:<gid>[:<g1>,<g2>…])"));
                }
                Ok(KeyFile::User { principal: name.to_string(), key: ClusterKey::from_hex(hex)? })
            }
            _ => Err(format!("{} non-empty lines; expected 1 (cluster key) or 2 (user principal, user key)", lines.len())),
        }
    }

    /// The user key file text: the name, then the key.
    pub fn user_text(principal: &str, key: &ClusterKey) -> String {
        format!("{principal}\n{}", key.to_hex())
    }

    /// Reads and parses a key file; errors name the file and say why.
    pub fn load(path: &Path) -> Result<KeyFile, String> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            let why = match e.kind() {
                std::io::ErrorKind::PermissionDenied => "permission denied — only trusted users may talk to the cluster".to_string(),
                _ => e.to_string(),
            };
            format!("cannot read the cluster key at {}: {why}", path.display())
        })?;
        KeyFile::parse(&text).map_err(|e| format!("the cluster key at {} is invalid: {e}", path.display()))
    }
}

/// Whether `name` may be claimed: 1..=64 bytes of printable ASCII, no space.
pub fn valid_principal_name(name: &[u8]) -> bool {
    !name.is_empty() && name.len() <= MAX_PRINCIPAL_BYTES && name.iter().all(|b| b.is_ascii_graphic())
}

/// The authenticated identity of a connection's peer, as claimed in its
/// hello and proven with the cluster key.
///
/// Names in use: `node:<id>` (a storage process of the layout), `meta:<id>`,
/// `mgmtd`, `fuse`, `gateway`, `client` (the `fskv` commands, benches),
/// `user:<uid>:<gid>[:groups]` (a local user with a user key).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Principal(Arc<str>);

impl Principal {
    /// A principal from a name that passed [`valid_principal_name`].
    pub fn new(name: &str) -> Option<Principal> {
        valid_principal_name(name.as_bytes()).then(|| Principal(name.into()))
    }

    pub fn name(&self) -> &str {
        &self.0
    }

    /// The node id of a `node:<id>` principal.
    pub fn node_id(&self) -> Option<u32> {
        self.0.strip_prefix("node:").and_then(|id| id.parse().ok())
    }

    /// A `user:` principal (proven with its own derived key, not the cluster key).
    pub fn is_user(&self) -> bool {
        is_user_principal(&self.0)
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The client's side. Create with [`ClientHandshake::start`], send the
/// hello, feed the server's challenge to [`ClientHandshake::on_challenge`],
/// send the proof, feed the verdict byte to [`ClientHandshake::on_verdict`].
pub struct ClientHandshake {
    key: Arc<ClusterKey>,
    name: Vec<u8>,
    client_nonce: [u8; NONCE_BYTES],
    server_nonce: Option<[u8; NONCE_BYTES]>,
}

impl ClientHandshake {
    /// Returns the state and the hello to send.
    pub fn start(key: Arc<ClusterKey>, name: &str, client_nonce: [u8; NONCE_BYTES]) -> Result<(ClientHandshake, Vec<u8>), ClientAuthError> {
        if !valid_principal_name(name.as_bytes()) {
            return Err(ClientAuthError::BadName(name.to_string()));
        }
        let mut hello = Vec::with_capacity(HELLO_HEAD_BYTES + name.len() + NONCE_BYTES);
        hello.extend_from_slice(&AUTH_MAGIC);
        hello.push(AUTH_VERSION);
        // Fits: valid_principal_name bounds it by 64.
        hello.push(name.len() as u8);
        hello.extend_from_slice(name.as_bytes());
        hello.extend_from_slice(&client_nonce);
        Ok((ClientHandshake { key, name: name.as_bytes().to_vec(), client_nonce, server_nonce: None }, hello))
    }

    /// Bytes the server's first answer has, given its first byte: a whole
    /// challenge after `0x00`, nothing more after a refusal.
    pub fn challenge_len(first: u8) -> usize {
        if first == 0 {
            CHALLENGE_BYTES
        } else {
            1
        }
    }

    /// Checks the server's challenge (or refusal) and returns the proof to send.
    pub fn on_challenge(&mut self, msg: &[u8]) -> Result<[u8; PROOF_BYTES], ClientAuthError> {
        let Some((&status, rest)) = msg.split_first() else {
            return Err(ClientAuthError::Protocol("empty challenge".into()));
        };
        if status != 0 {
            return Err(match AuthFailure::from_byte(status) {
                Some(reason) => ClientAuthError::Refused(reason),
                None => ClientAuthError::Protocol(format!("unknown refusal byte {status:#04x}")),
            });
        }
        if rest.len() != NONCE_BYTES + MAC_BYTES {
            return Err(ClientAuthError::Protocol(format!("challenge of {} bytes, expected {CHALLENGE_BYTES}", msg.len())));
        }
        let (sn, server_mac) = rest.split_at(NONCE_BYTES);
        let mut server_nonce = [0u8; NONCE_BYTES];
        server_nonce.copy_from_slice(sn);
        let expected = self.key.mac(SERVER_LABEL, &self.client_nonce, &server_nonce, &self.name);
        if !bool::from(expected.ct_eq(server_mac)) {
            return Err(ClientAuthError::ServerNotAuthenticated);
        }
        self.server_nonce = Some(server_nonce);
        Ok(self.key.mac(CLIENT_LABEL, &server_nonce, &self.client_nonce, &self.name))
    }

    /// The server's verdict on our proof.
    pub fn on_verdict(&self, verdict: u8) -> Result<(), ClientAuthError> {
        if self.server_nonce.is_none() {
            return Err(ClientAuthError::Protocol("verdict before a verified challenge".into()));
        }
        match verdict {
            0 => Ok(()),
            b => Err(match AuthFailure::from_byte(b) {
                Some(reason) => ClientAuthError::Refused(reason),
                None => ClientAuthError::Protocol(format!("unknown verdict byte {b:#04x}")),
            }),
        }
    }
}

/// A refusal: the bytes to send the peer (possibly none) before closing,
/// and the reason to count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reason: AuthFailure,
    pub reply: Vec<u8>,
}

impl Refusal {
    fn new(reason: AuthFailure) -> Refusal {
        Refusal { reason, reply: vec![reason.byte()] }
    }
}

/// The server's side: [`ServerHandshake::hello_len`] on the first six bytes,
/// [`ServerHandshake::on_hello`] on the whole hello (answer the challenge),
/// [`ServerHandshake::on_proof`] on the client's proof (answer the verdict).
pub struct ServerHandshake {
    key: Arc<ClusterKey>,
    server_nonce: [u8; NONCE_BYTES],
    /// The client's nonce, the claimed principal and the key its MACs use
    /// (the cluster key, or the user key derived for a `user:` name).
    hello: Option<([u8; NONCE_BYTES], Principal, ClusterKey)>,
}

impl ServerHandshake {
    pub fn new(key: Arc<ClusterKey>, server_nonce: [u8; NONCE_BYTES]) -> ServerHandshake {
        ServerHandshake { key, server_nonce, hello: None }
    }

    /// The whole hello's length from its first [`HELLO_HEAD_BYTES`] bytes
    /// (at most 6 + 64 + 32), or the refusal to send.
    pub fn hello_len(head: &[u8; HELLO_HEAD_BYTES]) -> Result<usize, Refusal> {
        if head[..4] != AUTH_MAGIC {
            return Err(Refusal::new(AuthFailure::BadMagic));
        }
        if head[4] != AUTH_VERSION {
            return Err(Refusal::new(AuthFailure::BadVersion));
        }
        let name_len = usize::from(head[5]);
        if name_len == 0 || name_len > MAX_PRINCIPAL_BYTES {
            return Err(Refusal::new(AuthFailure::BadName));
        }
        Ok(HELLO_HEAD_BYTES + name_len + NONCE_BYTES)
    }

    /// Checks the whole hello; returns the challenge to send.
    pub fn on_hello(&mut self, hello: &[u8]) -> Result<[u8; CHALLENGE_BYTES], Refusal> {
        let head: &[u8; HELLO_HEAD_BYTES] =
            hello.get(..HELLO_HEAD_BYTES).and_then(|h| h.try_into().ok()).ok_or_else(|| Refusal::new(AuthFailure::BadMagic))?;
        let len = Self::hello_len(head)?;
        if hello.len() != len {
            return Err(Refusal::new(AuthFailure::BadName));
        }
        let name = &hello[HELLO_HEAD_BYTES..len - NONCE_BYTES];
        let principal = std::str::from_utf8(name).ok().and_then(Principal::new).ok_or_else(|| Refusal::new(AuthFailure::BadName))?;
        // A `user:` name is proven with its derived key (only its holder and
        // the cluster key's holders know it); every other name with the
        // cluster key. A malformed user name is refused here.
        let key = if is_user_principal(principal.name()) {
            if UserPrincipal::parse(principal.name()).is_none() {
                return Err(Refusal::new(AuthFailure::BadName));
            }
            self.key.derive_user_key(principal.name())
        } else {
            (*self.key).clone()
        };
        let mut client_nonce = [0u8; NONCE_BYTES];
        client_nonce.copy_from_slice(&hello[len - NONCE_BYTES..]);
        let mac = key.mac(SERVER_LABEL, &client_nonce, &self.server_nonce, principal.name().as_bytes());
        let mut challenge = [0u8; CHALLENGE_BYTES];
        challenge[1..1 + NONCE_BYTES].copy_from_slice(&self.server_nonce);
        challenge[1 + NONCE_BYTES..].copy_from_slice(&mac);
        self.hello = Some((client_nonce, principal, key));
        Ok(challenge)
    }

    /// Checks the client's proof: the authenticated principal and the
    /// verdict byte `0x00` to send, or the refusal.
    pub fn on_proof(&self, proof: &[u8]) -> Result<(Principal, u8), Refusal> {
        let Some((client_nonce, principal, key)) = &self.hello else {
            return Err(Refusal::new(AuthFailure::BadMagic));
        };
        let expected = key.mac(CLIENT_LABEL, &self.server_nonce, client_nonce, principal.name().as_bytes());
        if proof.len() != PROOF_BYTES || !bool::from(expected.ct_eq(proof)) {
            return Err(Refusal::new(AuthFailure::BadProof));
        }
        Ok((principal.clone(), 0))
    }
}

/// The identity the process's RPC clients and servers use by default
/// ([`crate::ClientConfig::default`], [`crate::ServerConfig::default`]).
#[derive(Clone, Debug)]
pub struct ProcessIdentity {
    /// `None`: no authentication (tests, simulation, `--insecure-no-auth`).
    pub key: Option<Arc<ClusterKey>>,
    /// The name this process's clients claim in their hello.
    pub principal: Arc<str>,
}

static IDENTITY: OnceLock<ProcessIdentity> = OnceLock::new();

/// Installs the process's identity; only the first call counts (`false`
/// for a later one).
pub fn install(identity: ProcessIdentity) -> bool {
    IDENTITY.set(identity).is_ok()
}

/// The installed identity: no key and the name `client` when none was installed.
pub fn current() -> ProcessIdentity {
    IDENTITY.get().cloned().unwrap_or_else(|| ProcessIdentity { key: None, principal: "client".into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> Arc<ClusterKey> {
        Arc::new(ClusterKey::from_bytes([b; KEY_BYTES]))
    }

    /// Runs the whole exchange between two state machines in memory.
    fn run(
        client_key: Arc<ClusterKey>,
        server_key: Arc<ClusterKey>,
        name: &str,
    ) -> (Result<(), ClientAuthError>, Result<Principal, AuthFailure>) {
        let (mut client, hello) = ClientHandshake::start(client_key, name, [1; NONCE_BYTES]).unwrap();
        let mut server = ServerHandshake::new(server_key, [2; NONCE_BYTES]);
        let head: [u8; HELLO_HEAD_BYTES] = hello[..HELLO_HEAD_BYTES].try_into().unwrap();
        assert_eq!(ServerHandshake::hello_len(&head).unwrap(), hello.len());
        let challenge = match server.on_hello(&hello) {
            Ok(c) => c,
            Err(r) => return (Err(ClientAuthError::Refused(r.reason)), Err(r.reason)),
        };
        assert_eq!(ClientHandshake::challenge_len(challenge[0]), challenge.len());
        let proof = match client.on_challenge(&challenge) {
            Ok(p) => p,
            // The client closes: the server sees the connection end.
            Err(e) => return (Err(e), Err(AuthFailure::Closed)),
        };
        match server.on_proof(&proof) {
            Ok((principal, verdict)) => (client.on_verdict(verdict), Ok(principal)),
            Err(r) => (client.on_verdict(r.reply[0]), Err(r.reason)),
        }
    }

    #[test]
    fn same_key_authenticates_both_sides_and_the_name() {
        let (client, server) = run(key(7), key(7), "node:3");
        assert_eq!(client, Ok(()));
        let principal = server.unwrap();
        assert_eq!(principal.name(), "node:3");
        assert_eq!(principal.node_id(), Some(3));
        assert_eq!(Principal::new("client").unwrap().node_id(), None);
    }

    #[test]
    fn a_different_key_fails_on_the_client_first() {
        // The client finds out the server does not hold its key and proves
        // nothing; the server counts the close.
        let (client, server) = run(key(7), key(8), "client");
        assert_eq!(client, Err(ClientAuthError::ServerNotAuthenticated));
        assert_eq!(server, Err(AuthFailure::Closed));
    }

    #[test]
    fn a_forged_proof_is_refused() {
        let (mut client, hello) = ClientHandshake::start(key(7), "client", [1; NONCE_BYTES]).unwrap();
        let mut server = ServerHandshake::new(key(7), [2; NONCE_BYTES]);
        let challenge = server.on_hello(&hello).unwrap();
        let mut proof = client.on_challenge(&challenge).unwrap();
        proof[0] ^= 1;
        let refusal = server.on_proof(&proof).unwrap_err();
        assert_eq!(refusal.reason, AuthFailure::BadProof);
        assert_eq!(client.on_verdict(refusal.reply[0]), Err(ClientAuthError::Refused(AuthFailure::BadProof)));
        // A short proof too.
        assert_eq!(server.on_proof(&proof[..31]).unwrap_err().reason, AuthFailure::BadProof);
    }

    #[test]
    fn a_replayed_proof_fails_against_a_fresh_server_nonce() {
        let (mut client, hello) = ClientHandshake::start(key(7), "node:1", [1; NONCE_BYTES]).unwrap();
        let mut first = ServerHandshake::new(key(7), [2; NONCE_BYTES]);
        let proof = client.on_challenge(&first.on_hello(&hello).unwrap()).unwrap();
        assert!(first.on_proof(&proof).is_ok());
        // The attacker replays the recorded hello and proof to a new connection.
        let mut second = ServerHandshake::new(key(7), [3; NONCE_BYTES]);
        second.on_hello(&hello).unwrap();
        assert_eq!(second.on_proof(&proof).unwrap_err().reason, AuthFailure::BadProof);
    }

    #[test]
    fn the_name_is_bound_by_both_macs() {
        // Rewrite the name in the hello on the way (same length): the
        // server's MAC no longer verifies at the client.
        let (mut client, mut hello) = ClientHandshake::start(key(7), "node:5", [1; NONCE_BYTES]).unwrap();
        let at = HELLO_HEAD_BYTES + "node:".len();
        hello[at] = b'6';
        let mut server = ServerHandshake::new(key(7), [2; NONCE_BYTES]);
        let challenge = server.on_hello(&hello).unwrap();
        assert_eq!(client.on_challenge(&challenge), Err(ClientAuthError::ServerNotAuthenticated));
    }

    #[test]
    fn malformed_hellos_are_refused_with_a_reason() {
        let mut server = ServerHandshake::new(key(7), [2; NONCE_BYTES]);
        let frame_head = *b"3FSR\x01\x00";
        assert_eq!(ServerHandshake::hello_len(&frame_head).unwrap_err().reason, AuthFailure::BadMagic);
        assert_eq!(ServerHandshake::hello_len(b"3FSA\x02\x05").unwrap_err().reason, AuthFailure::BadVersion);
        assert_eq!(ServerHandshake::hello_len(b"3FSA\x01\x00").unwrap_err().reason, AuthFailure::BadName);
        assert_eq!(ServerHandshake::hello_len(b"3FSA\x01\x41").unwrap_err().reason, AuthFailure::BadName);
        assert_eq!(ServerHandshake::hello_len(b"3FSA\x01\x40").unwrap(), 6 + 64 + 32);
        // A name with a control byte or a space.
        let mut hello = b"3FSA\x01\x03a b".to_vec();
        hello.extend_from_slice(&[0; NONCE_BYTES]);
        assert_eq!(server.on_hello(&hello).unwrap_err().reason, AuthFailure::BadName);
        // A length that disagrees with the bytes.
        assert_eq!(server.on_hello(&hello[..20]).unwrap_err(), Refusal::new(AuthFailure::BadName));
        assert_eq!(server.on_hello(b"3F").unwrap_err().reason, AuthFailure::BadMagic);
        // A proof before any hello.
        assert_eq!(server.on_proof(&[0; PROOF_BYTES]).unwrap_err().reason, AuthFailure::BadMagic);
        // The refusal byte reaches the client as a reason.
        let (mut client, _) = ClientHandshake::start(key(7), "client", [1; NONCE_BYTES]).unwrap();
        assert_eq!(client.on_challenge(&[3]), Err(ClientAuthError::Refused(AuthFailure::BadName)));
        assert!(matches!(client.on_challenge(&[0x7f]), Err(ClientAuthError::Protocol(_))));
        assert!(matches!(client.on_challenge(&[0, 1, 2]), Err(ClientAuthError::Protocol(_))));
        assert!(matches!(client.on_verdict(0), Err(ClientAuthError::Protocol(_))));
    }

    #[test]
    fn client_refuses_to_claim_an_invalid_name() {
        for bad in ["", "has space", "x".repeat(65).as_str(), "tab\t"] {
            assert!(matches!(ClientHandshake::start(key(1), bad, [0; NONCE_BYTES]), Err(ClientAuthError::BadName(_))), "{bad:?}");
        }
        assert!(ClientHandshake::start(key(1), &"x".repeat(64), [0; NONCE_BYTES]).is_ok());
    }

    #[test]
    fn key_file_format_round_trips_and_errors_are_clear() {
        let k = ClusterKey::generate();
        let text = k.to_hex();
        assert_eq!(text.len(), 65);
        assert_eq!(ClusterKey::from_hex(&text).unwrap().0, k.0);
        assert!(ClusterKey::from_hex("abcd").unwrap_err().contains("expected 32"));
        assert!(ClusterKey::from_hex(&"zz".repeat(32)).unwrap_err().contains("not hex"));
        assert_eq!(format!("{k:?}"), "ClusterKey(<redacted>)");
        let err = ClusterKey::load(Path::new("/nonexistent/cluster.key")).unwrap_err();
        assert!(err.starts_with("cannot read the cluster key at /nonexistent/cluster.key"), "{err}");
        // Two generated keys differ (the OS random source works).
        assert_ne!(ClusterKey::generate().0, k.0);
    }

    #[test]
    fn a_user_key_proves_its_own_name_only() {
        let cluster = key(7);
        let name = "user:1000:1000:27,100";
        let user_key = Arc::new(cluster.derive_user_key(name));
        // The user key's holder proves its name to a server holding the cluster key.
        let (client, server) = run(user_key.clone(), cluster.clone(), name);
        assert_eq!(client, Ok(()));
        let p = server.unwrap();
        assert!(p.is_user());
        assert_eq!(p.name(), name);
        // It cannot claim `client`, another uid, or another group list.
        for other in ["client", "node:1", "user:1001:1000", "user:1000:1000", "user:1000:1000:27,100,0", "user:0:0"] {
            let (client, server) = run(user_key.clone(), cluster.clone(), other);
            assert_eq!(client, Err(ClientAuthError::ServerNotAuthenticated), "{other}");
            assert_eq!(server, Err(AuthFailure::Closed), "{other}");
        }
        // The cluster key's holder cannot claim a user name without deriving
        // its key (it can derive it: one trust domain).
        let (client, _) = run(cluster.clone(), cluster.clone(), name);
        assert_eq!(client, Err(ClientAuthError::ServerNotAuthenticated));
        // A malformed user name is refused at the hello.
        let (_, server) = run(key(1), cluster.clone(), "user:abc");
        assert_eq!(server, Err(AuthFailure::BadName));
        // Keys differ per name and from the cluster key.
        assert_ne!(cluster.derive_user_key("user:1:1").0, cluster.derive_user_key("user:2:1").0);
        assert_ne!(cluster.derive_user_key("user:1:1").0, cluster.0);
    }

    #[test]
    fn user_principal_names_parse_strictly() {
        let p = UserPrincipal::parse("user:1000:100:27,4").unwrap();
        assert_eq!(p, UserPrincipal { uid: 1000, gid: 100, groups: vec![27, 4] });
        assert_eq!(p.name().unwrap(), "user:1000:100:27,4");
        assert_eq!(UserPrincipal::parse("user:0:0").unwrap().name().unwrap(), "user:0:0");
        for bad in [
            "user:",
            "user:1",
            "user:1:",
            "user:1:2:",
            "user:1:2:3,",
            "user:01:2",
            "user:+1:2",
            "user:1:2:3:4",
            "user:x:1",
            "node:1",
            "user:4294967296:1",
        ] {
            assert_eq!(UserPrincipal::parse(bad), None, "{bad}");
        }
        let many = UserPrincipal { uid: 1, gid: 1, groups: (1_000_000..1_000_010).collect() };
        assert!(many.name().unwrap_err().contains("more than 64"));
    }

    #[test]
    fn key_files_name_their_principal() {
        let k = ClusterKey::generate();
        assert!(matches!(KeyFile::parse(&k.to_hex()).unwrap(), KeyFile::Cluster(_)));
        let text = KeyFile::user_text("user:5:6", &k.derive_user_key("user:5:6"));
        match KeyFile::parse(&text).unwrap() {
            KeyFile::User { principal, key } => {
                assert_eq!(principal, "user:5:6");
                assert_eq!(key.0, k.derive_user_key("user:5:6").0);
            }
            other => panic!("{other:?}"),
        }
        assert!(KeyFile::parse(&format!("client\n{}", k.to_hex())).unwrap_err().contains("not a user principal"));
        assert!(KeyFile::parse("a\nb\nc").unwrap_err().contains("3 non-empty lines"));
        let dir = std::env::temp_dir().join(format!("fskv-auth-test-{}", std::process::id()));
        std::fs::write(&dir, text).unwrap();
        let err = ClusterKey::load(&dir).unwrap_err();
        std::fs::remove_file(&dir).unwrap();
        assert!(err.contains("is a user key (for user:5:6)"), "{err}");
    }

    #[test]
    fn capability_macs_bind_every_field() {
        let cap = key(7).cap_key();
        let mac = cap.mac("user:1:1", 42, 1, 1000);
        assert!(cap.verify("user:1:1", 42, 1, 1000, &mac));
        assert!(!cap.verify("user:2:1", 42, 1, 1000, &mac));
        assert!(!cap.verify("user:1:1", 43, 1, 1000, &mac));
        assert!(!cap.verify("user:1:1", 42, 3, 1000, &mac));
        assert!(!cap.verify("user:1:1", 42, 1, 1001, &mac));
        assert!(!cap.verify("user:1:1", 42, 1, 1000, &mac[..31]));
        assert!(!key(8).cap_key().verify("user:1:1", 42, 1, 1000, &mac));
        assert_eq!(format!("{cap:?}"), "CapKey(<redacted>)");
    }

    #[test]
    fn reason_bytes_round_trip() {
        for r in [
            AuthFailure::BadMagic,
            AuthFailure::BadVersion,
            AuthFailure::BadName,
            AuthFailure::BadProof,
            AuthFailure::Timeout,
            AuthFailure::Closed,
        ] {
            assert_eq!(AuthFailure::from_byte(r.byte()), Some(r));
            assert_ne!(r.byte(), 0);
        }
        assert_eq!(AuthFailure::from_byte(0), None);
    }
}
