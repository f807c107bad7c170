//! The S3 operations, one file per group, on a [`Gateway`].

pub mod bucket;
pub mod copy;
pub mod list;
pub mod multipart;
pub mod object;
pub mod tagging;
pub mod write;

use crate::config::GatewayConfig;
use crate::store::Store;
use std::sync::Arc;

/// Everything a request handler needs; cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    pub store: Store,
    pub cfg: Arc<GatewayConfig>,
}
