//! The MQ gateway: durable partitioned logs, consumer groups and queues
//! over the 3FS-KV filesystem, with an SQS-compatible facade. See
//! docs/mq.md for the design, formats, API and the durability argument.
//!
//! | module | what |
//! |---|---|
//! | [`record`] | binary formats: produce request, stored batch, fetch response (pure) |
//! | [`index`] | sparse offset/time index of a segment (pure) |
//! | [`state`] | the partition state file and the lease rules (pure) |
//! | [`producer`] | idempotent producers and the FIFO dedup window (pure) |
//! | [`group`] | consumer groups: membership, generations, assignment, offsets (pure) |
//! | [`queue`] | queue semantics over a log: visibility, acks, delivery counts, dead letters, FIFO groups (pure) |
//! | [`store`] | where everything lives in the filesystem; CAS files |
//! | [`log`] | reading a partition: manifest, fetch, offsets by time |
//! | [`partition`] | the writer: one actor per owned partition (leases, group commit, recovery, roll, retention) |
//! | [`watch`] | long polling on readers |
//! | [`route`] | the pure request classifier the front shares |
//! | [`api`] | the native HTTP API |
//! | [`sqs`] | the SQS facade (AWS JSON 1.0) |
//! | [`server`] | the protocol on the shared gateway layer |

pub mod api;
pub mod config;
pub mod error;
pub mod group;
pub mod index;
pub mod log;
pub mod partition;
pub mod producer;
pub mod queue;
pub mod record;
pub mod route;
pub mod server;
pub mod sqs;
pub mod state;
pub mod store;
pub mod watch;

pub use config::{MqConfig, MqLimits};
pub use error::MqError;
pub use fskv_gateway::{AccessKey, KeyStore, Role};
pub use partition::WriterConfig;
pub use route::classify;
pub use server::{start, MqHandle};
