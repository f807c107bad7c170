//! Get/Put/DeleteObjectTagging.

use super::object::find_object;
use super::Gateway;
use crate::error;
use crate::objmeta::{self, TagList, XATTR_TAGS};
use fskv_proto::meta::XattrFlag;
use fskv_types::ErrorCode;
use s3s::dto::*;
use s3s::S3Error;

impl Gateway {
    async fn tagged_inode(&self, bucket: &str, key: &str) -> Result<fskv_types::InodeId, S3Error> {
        let (b_dir, path) = self.store.locate(bucket, key).await?;
        let b = b_dir.id;
        let obj = find_object(&self.store, b, &path, key).await?.ok_or_else(|| error::no_such_key(key))?;
        Ok(obj.inode.id)
    }

    pub async fn get_tagging(&self, input: &GetObjectTaggingInput) -> Result<GetObjectTaggingOutput, S3Error> {
        let inode = self.tagged_inode(&input.bucket, &input.key).await?;
        let tags = self.tags_of(inode).await?.unwrap_or_default();
        Ok(GetObjectTaggingOutput {
            tag_set: tags.into_iter().map(|(k, v)| Tag { key: Some(k), value: Some(v) }).collect(),
            version_id: None,
        })
    }

    pub async fn put_tagging(&self, input: &PutObjectTaggingInput) -> Result<(), S3Error> {
        let tags: TagList =
            input.tagging.tag_set.iter().map(|t| (t.key.clone().unwrap_or_default(), t.value.clone().unwrap_or_default())).collect();
        objmeta::check_tags(&tags).map_err(error::invalid_argument)?;
        let inode = self.tagged_inode(&input.bucket, &input.key).await?;
        self.store
            .fs
            .meta()
            .set_xattr(inode, XATTR_TAGS, &objmeta::encode_tags(&tags), XattrFlag::Any)
            .await
            .map_err(|e| error::from_meta(e, &input.key))
    }

    pub async fn delete_tagging(&self, input: &DeleteObjectTaggingInput) -> Result<(), S3Error> {
        let inode = self.tagged_inode(&input.bucket, &input.key).await?;
        match self.store.fs.meta().remove_xattr(inode, XATTR_TAGS).await {
            Ok(()) => Ok(()),
            Err(e) if e.code() == ErrorCode::NotFound => Ok(()),
            Err(e) => Err(error::from_meta(e, &input.key)),
        }
    }
}
