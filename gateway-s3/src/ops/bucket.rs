//! ListBuckets, CreateBucket, DeleteBucket, HeadBucket, GetBucketLocation.

use super::object::timestamp;
use super::Gateway;
use crate::error;
use crate::paths::{self, Layout, XATTR_LAYOUT};
use crate::store::{DIR_MODE, UPLOADS_DIR};
use fskv_types::ErrorCode;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode};

impl Gateway {
    pub async fn list_buckets(&self) -> Result<ListBucketsOutput, S3Error> {
        let buckets = self.store.list_buckets().await?;
        Ok(ListBucketsOutput {
            buckets: Some(
                buckets
                    .into_iter()
                    .map(|(name, ns)| Bucket { name: Some(name), creation_date: Some(timestamp(ns)), ..Bucket::default() })
                    .collect(),
            ),
            owner: Some(super::owner()),
            ..ListBucketsOutput::default()
        })
    }

    /// Creates a tree bucket (keys are paths).
    pub async fn create_bucket(&self, name: &str) -> Result<(), S3Error> {
        self.create_bucket_with(name, Layout::Tree).await
    }

    /// Creates a bucket of `layout`; a flat bucket's directory is made
    /// with its layout xattr in the same meta transaction.
    pub async fn create_bucket_with(&self, name: &str, layout: Layout) -> Result<(), S3Error> {
        if !paths::is_bucket_name(name) {
            return Err(S3Error::with_message(
                S3ErrorCode::InvalidBucketName,
                format!("{name:?}: bucket names are 3-63 lowercase letters, digits, '-' and '.'"),
            ));
        }
        let meta = self.store.fs.meta();
        // The store of a request creates as its tenant: the directory is
        // the tenant's uid/gid from the transaction that makes it.
        let xattrs = match layout {
            Layout::Tree => Vec::new(),
            Layout::Flat => vec![(XATTR_LAYOUT.to_string(), layout.as_str().as_bytes().to_vec())],
        };
        match meta.mkdir_with_xattrs(self.store.root, name, DIR_MODE, xattrs).await {
            Ok(_) => Ok(()),
            Err(e) if e.code() == ErrorCode::AlreadyExists => match meta.lookup(self.store.root, name).await {
                Ok(dir) if self.store.owns(&dir) => {
                    Err(S3Error::with_message(S3ErrorCode::BucketAlreadyOwnedByYou, format!("bucket {name:?} exists and is yours")))
                }
                Ok(_) => Err(S3Error::with_message(S3ErrorCode::BucketAlreadyExists, format!("bucket {name:?} belongs to another tenant"))),
                Err(e) => Err(error::from_meta(e, name)),
            },
            Err(e) => Err(error::from_meta(e, name)),
        }
    }

    /// Deletes an empty bucket and whatever multipart uploads it had.
    pub async fn delete_bucket(&self, name: &str) -> Result<(), S3Error> {
        let bucket = self.store.bucket(name).await?;
        let (entries, _) = self.store.fs.meta().readdir(bucket.id, "", 1, false).await.map_err(|e| error::from_meta(e, name))?;
        if !entries.is_empty() {
            return Err(S3Error::with_message(S3ErrorCode::BucketNotEmpty, format!("bucket {name:?} is not empty")));
        }
        if self.versions_left(name).await? {
            return Err(S3Error::with_message(
                S3ErrorCode::BucketNotEmpty,
                format!("bucket {name:?} has noncurrent versions or delete markers; delete them by version id first"),
            ));
        }
        match self.store.fs.meta().rmdir(self.store.root, name).await {
            Ok(()) => {}
            Err(e) if e.code() == ErrorCode::NotEmpty => {
                return Err(S3Error::with_message(S3ErrorCode::BucketNotEmpty, format!("bucket {name:?} is not empty")))
            }
            Err(e) if e.code() == ErrorCode::NotFound => return Err(error::no_such_bucket(name)),
            Err(e) => return Err(error::from_meta(e, name)),
        }
        if let Ok(uploads) = self.store.fs.meta().lookup(self.store.root, UPLOADS_DIR).await {
            match self.store.fs.meta().remove_tree(uploads.id, name).await {
                Ok(()) => {}
                Err(e) if e.code() == ErrorCode::NotFound => {}
                Err(e) => tracing::warn!(bucket = name, error = %e, "could not remove the bucket's multipart staging"),
            }
        }
        self.remove_version_store(name).await;
        Ok(())
    }

    pub async fn head_bucket(&self, name: &str) -> Result<(), S3Error> {
        self.store.bucket(name).await.map(|_| ())
    }

    pub async fn bucket_location(&self, name: &str) -> Result<GetBucketLocationOutput, S3Error> {
        self.store.bucket(name).await?;
        let region = &self.cfg.region;
        // us-east-1 is reported as an empty constraint, as S3 does.
        let constraint = (region != "us-east-1").then(|| BucketLocationConstraint::from(region.clone()));
        Ok(GetBucketLocationOutput { location_constraint: constraint })
    }
}
