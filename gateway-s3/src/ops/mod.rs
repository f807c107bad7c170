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

/// The one owner of every bucket, object and upload: the gateway keeps no
/// ACLs; signed requests by any configured key have full control. Listings
/// (ListObjects v1, v2 with `fetch-owner=true`, ListObjectVersions,
/// ListBuckets, ListMultipartUploads, ListParts) and ACLs name it.
pub fn owner() -> s3s::dto::Owner {
    s3s::dto::Owner { display_name: Some(OWNER_ID.into()), id: Some(OWNER_ID.into()) }
}

/// The owner's canonical id and display name.
pub const OWNER_ID: &str = "fskv";

/// The initiator of every multipart upload (the owner).
pub fn initiator() -> s3s::dto::Initiator {
    s3s::dto::Initiator { display_name: Some(OWNER_ID.into()), id: Some(OWNER_ID.into()) }
}

/// Everything a request handler needs; cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    pub store: Store,
    pub cfg: Arc<GatewayConfig>,
}
