//! Get/Put/DeleteObjectTagging.
//!
//! Tags are the xattr `user.s3.tags` of the version's own inode, so they
//! move with it into the version store and back (`ops/versioning.rs`).
//!
//! | request | answer |
//! |---|---|
//! | no `versionId` | the current version; 404 `NoSuchKey` when there is none (a delete marker's headers when it is the latest) |
//! | `versionId` of a version | that version, current or not; its id in `x-amz-version-id` |
//! | `versionId` of a delete marker | 405 `MethodNotAllowed` |
//! | `versionId` the key does not have / malformed | 404 `NoSuchVersion` / 400 `InvalidArgument` |

use super::Gateway;
use crate::error;
use crate::objmeta::{self, TagList, XATTR_TAGS};
use fskv_proto::meta::XattrFlag;
use fskv_types::ErrorCode;
use s3s::dto::*;
use s3s::S3Error;

impl Gateway {
    /// The inode of the version a tagging request names (see the module
    /// table) and its `x-amz-version-id`.
    async fn tagged_version(
        &self,
        bucket: &str,
        key: &str,
        version: Option<&str>,
    ) -> Result<(fskv_types::InodeId, Option<String>), S3Error> {
        let (dir, _, obj) = self.locate_for_read(bucket, key, version).await?;
        let version_id = self.version_header(dir.id, &obj.meta).await?;
        Ok((obj.inode.id, version_id))
    }

    pub async fn get_tagging(&self, input: &GetObjectTaggingInput) -> Result<GetObjectTaggingOutput, S3Error> {
        let (inode, version_id) = self.tagged_version(&input.bucket, &input.key, input.version_id.as_deref()).await?;
        let tags = self.tags_of(inode).await?.unwrap_or_default();
        Ok(GetObjectTaggingOutput { tag_set: tags.into_iter().map(|(k, v)| Tag { key: Some(k), value: Some(v) }).collect(), version_id })
    }

    /// Returns the `x-amz-version-id` of the version tagged.
    pub async fn put_tagging(&self, input: &PutObjectTaggingInput) -> Result<Option<String>, S3Error> {
        let tags: TagList =
            input.tagging.tag_set.iter().map(|t| (t.key.clone().unwrap_or_default(), t.value.clone().unwrap_or_default())).collect();
        objmeta::check_tags(&tags).map_err(error::invalid_argument)?;
        let (inode, version_id) = self.tagged_version(&input.bucket, &input.key, input.version_id.as_deref()).await?;
        self.store
            .fs
            .meta()
            .set_xattr(inode, XATTR_TAGS, &objmeta::encode_tags(&tags), XattrFlag::Any)
            .await
            .map_err(|e| error::from_meta(e, &input.key))?;
        Ok(version_id)
    }

    /// Returns the `x-amz-version-id` of the version untagged.
    pub async fn delete_tagging(&self, input: &DeleteObjectTaggingInput) -> Result<Option<String>, S3Error> {
        let (inode, version_id) = self.tagged_version(&input.bucket, &input.key, input.version_id.as_deref()).await?;
        match self.store.fs.meta().remove_xattr(inode, XATTR_TAGS).await {
            Ok(()) => Ok(version_id),
            Err(e) if e.code() == ErrorCode::NotFound => Ok(version_id),
            Err(e) => Err(error::from_meta(e, &input.key)),
        }
    }
}
