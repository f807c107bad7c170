//! Copying object data between files of the cluster.

use crate::config::Limits;
use crate::error;
use fskv_client::FileHandle;
use s3s::S3Error;

/// Copies `len` bytes of `src` at `src_off` into `dst` at `dst_off`.
pub async fn copy_range(src: &FileHandle, dst: &FileHandle, src_off: u64, dst_off: u64, len: u64, _limits: &Limits) -> Result<(), S3Error> {
    dst.copy_from(src, src_off, dst_off, len).await.map_err(|e| error::from_file(e, "copy"))
}
