//! The `s3s::S3` trait: each operation hands its input to the
//! [`Gateway`] method that implements it (in `ops/`).

use crate::error;
use crate::objmeta;
use crate::ops::object::{user_meta, PutArgs};
use crate::ops::Gateway;
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, S3};

fn ok<T>(v: T) -> S3Result<S3Response<T>> {
    Ok(S3Response::new(v))
}

/// The payload SHA-256 the gateway must check itself (`server::PreVerified`).
fn pre_verified_sha256<T>(req: &S3Request<T>) -> Option<[u8; 32]> {
    req.extensions.get::<crate::server::PreVerified>().map(|p| p.payload_sha256)
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn get_bucket_acl(&self, req: S3Request<GetBucketAclInput>) -> S3Result<S3Response<GetBucketAclOutput>> {
        let this = self.for_request(&req)?;
        ok(this.get_bucket_acl(&req.input.bucket).await?)
    }

    async fn put_bucket_acl(&self, req: S3Request<PutBucketAclInput>) -> S3Result<S3Response<PutBucketAclOutput>> {
        let this = self.for_request(&req)?;
        this.put_bucket_acl(&req.input).await?;
        ok(PutBucketAclOutput::default())
    }

    async fn get_object_acl(&self, req: S3Request<GetObjectAclInput>) -> S3Result<S3Response<GetObjectAclOutput>> {
        let this = self.for_request(&req)?;
        ok(this.get_object_acl(&req.input).await?)
    }

    async fn put_object_acl(&self, req: S3Request<PutObjectAclInput>) -> S3Result<S3Response<PutObjectAclOutput>> {
        let this = self.for_request(&req)?;
        this.put_object_acl(&req.input).await?;
        ok(PutObjectAclOutput::default())
    }

    async fn get_bucket_policy(&self, req: S3Request<GetBucketPolicyInput>) -> S3Result<S3Response<GetBucketPolicyOutput>> {
        let this = self.for_request(&req)?;
        ok(this.get_policy(&req.input.bucket).await?)
    }

    async fn put_bucket_policy(&self, req: S3Request<PutBucketPolicyInput>) -> S3Result<S3Response<PutBucketPolicyOutput>> {
        let this = self.for_request(&req)?;
        this.put_policy(&req.input).await?;
        ok(PutBucketPolicyOutput::default())
    }

    async fn delete_bucket_policy(&self, req: S3Request<DeleteBucketPolicyInput>) -> S3Result<S3Response<DeleteBucketPolicyOutput>> {
        let this = self.for_request(&req)?;
        this.delete_policy(&req.input.bucket).await?;
        ok(DeleteBucketPolicyOutput::default())
    }

    async fn get_bucket_ownership_controls(
        &self,
        req: S3Request<GetBucketOwnershipControlsInput>,
    ) -> S3Result<S3Response<GetBucketOwnershipControlsOutput>> {
        let this = self.for_request(&req)?;
        ok(this.get_ownership(&req.input.bucket).await?)
    }

    async fn put_bucket_ownership_controls(
        &self,
        req: S3Request<PutBucketOwnershipControlsInput>,
    ) -> S3Result<S3Response<PutBucketOwnershipControlsOutput>> {
        let this = self.for_request(&req)?;
        this.put_ownership(&req.input).await?;
        ok(PutBucketOwnershipControlsOutput::default())
    }

    async fn delete_bucket_ownership_controls(
        &self,
        req: S3Request<DeleteBucketOwnershipControlsInput>,
    ) -> S3Result<S3Response<DeleteBucketOwnershipControlsOutput>> {
        let this = self.for_request(&req)?;
        this.delete_ownership(&req.input.bucket).await?;
        ok(DeleteBucketOwnershipControlsOutput::default())
    }

    async fn get_bucket_cors(&self, req: S3Request<GetBucketCorsInput>) -> S3Result<S3Response<GetBucketCorsOutput>> {
        let this = self.for_request(&req)?;
        ok(this.get_cors(&req.input.bucket).await?)
    }

    async fn put_bucket_cors(&self, req: S3Request<PutBucketCorsInput>) -> S3Result<S3Response<PutBucketCorsOutput>> {
        let this = self.for_request(&req)?;
        this.put_cors(&req.input).await?;
        ok(PutBucketCorsOutput::default())
    }

    async fn delete_bucket_cors(&self, req: S3Request<DeleteBucketCorsInput>) -> S3Result<S3Response<DeleteBucketCorsOutput>> {
        let this = self.for_request(&req)?;
        this.delete_cors(&req.input.bucket).await?;
        ok(DeleteBucketCorsOutput::default())
    }

    async fn put_bucket_lifecycle_configuration(
        &self,
        req: S3Request<PutBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<PutBucketLifecycleConfigurationOutput>> {
        let this = self.for_request(&req)?;
        this.put_lifecycle(&req.input).await?;
        ok(PutBucketLifecycleConfigurationOutput::default())
    }

    async fn get_bucket_lifecycle_configuration(
        &self,
        req: S3Request<GetBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<GetBucketLifecycleConfigurationOutput>> {
        let this = self.for_request(&req)?;
        ok(this.get_lifecycle(&req.input.bucket).await?)
    }

    async fn delete_bucket_lifecycle(
        &self,
        req: S3Request<DeleteBucketLifecycleInput>,
    ) -> S3Result<S3Response<DeleteBucketLifecycleOutput>> {
        let this = self.for_request(&req)?;
        this.delete_lifecycle(&req.input.bucket).await?;
        ok(DeleteBucketLifecycleOutput::default())
    }

    async fn list_buckets(&self, req: S3Request<ListBucketsInput>) -> S3Result<S3Response<ListBucketsOutput>> {
        let this = self.for_request(&req)?;
        ok(Gateway::list_buckets(&this).await?)
    }

    async fn create_bucket(&self, req: S3Request<CreateBucketInput>) -> S3Result<S3Response<CreateBucketOutput>> {
        let this = self.for_request(&req)?;
        let access = Gateway::bucket_access_input(req.input.acl.as_ref(), req.input.object_ownership.as_ref())?;
        let layout = match req.headers.get(crate::paths::LAYOUT_HEADER) {
            None => crate::paths::Layout::Tree,
            Some(v) => v
                .to_str()
                .ok()
                .and_then(crate::paths::Layout::parse)
                .ok_or_else(|| crate::error::invalid_argument(format!("{}: 'tree' or 'flat'", crate::paths::LAYOUT_HEADER)))?,
        };
        Gateway::create_bucket_with(&this, &req.input.bucket, layout).await?;
        this.init_bucket_access(&req.input.bucket, access).await?;
        ok(CreateBucketOutput { location: Some(format!("/{}", req.input.bucket)) })
    }

    async fn delete_bucket(&self, req: S3Request<DeleteBucketInput>) -> S3Result<S3Response<DeleteBucketOutput>> {
        let this = self.for_request(&req)?;
        Gateway::delete_bucket(&this, &req.input.bucket).await?;
        ok(DeleteBucketOutput::default())
    }

    async fn head_bucket(&self, req: S3Request<HeadBucketInput>) -> S3Result<S3Response<HeadBucketOutput>> {
        let this = self.for_request(&req)?;
        Gateway::head_bucket(&this, &req.input.bucket).await?;
        ok(HeadBucketOutput { bucket_region: Some(this.cfg.region.clone()), ..HeadBucketOutput::default() })
    }

    async fn get_bucket_location(&self, req: S3Request<GetBucketLocationInput>) -> S3Result<S3Response<GetBucketLocationOutput>> {
        let this = self.for_request(&req)?;
        ok(this.bucket_location(&req.input.bucket).await?)
    }

    async fn put_object(&self, req: S3Request<PutObjectInput>) -> S3Result<S3Response<PutObjectOutput>> {
        let this = self.for_request(&req)?;
        let payload_sha256 = pre_verified_sha256(&req);
        let S3Request { input, headers, trailing_headers, .. } = req;
        let tags = match &input.tagging {
            Some(t) => Some(objmeta::parse_tagging_header(t).map_err(error::invalid_argument)?),
            None => None,
        };
        let args = PutArgs {
            bucket: &input.bucket,
            key: &input.key,
            headers: crate::input_headers!(input),
            user: user_meta(input.metadata.clone())?,
            tags,
            if_match: input.if_match.as_ref(),
            if_none_match: input.if_none_match.as_ref(),
            acl: crate::ops::acl::object_acl_input(input.acl.as_ref())?,
        };
        let published = this.put(args, input.body, &headers, trailing_headers.as_ref(), payload_sha256).await?;
        let meta = &published.meta;
        let mut out = PutObjectOutput {
            e_tag: Some(ETag::Strong(meta.etag.clone())),
            version_id: published.version_id.clone(),
            ..PutObjectOutput::default()
        };
        crate::set_checksums!(out, &meta.checksums);
        ok(out)
    }

    async fn get_object(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let this = self.for_request(&req)?;
        ok(this.get(&req.input).await?)
    }

    async fn head_object(&self, req: S3Request<HeadObjectInput>) -> S3Result<S3Response<HeadObjectOutput>> {
        let this = self.for_request(&req)?;
        ok(this.head(&req.input).await?)
    }

    async fn delete_object(&self, req: S3Request<DeleteObjectInput>) -> S3Result<S3Response<DeleteObjectOutput>> {
        let this = self.for_request(&req)?;
        let d = this.delete_object(&req.input.bucket, &req.input.key, req.input.version_id.as_deref()).await?;
        ok(DeleteObjectOutput { version_id: d.version_id, delete_marker: d.delete_marker.then_some(true), ..DeleteObjectOutput::default() })
    }

    async fn delete_objects(&self, req: S3Request<DeleteObjectsInput>) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let this = self.for_request(&req)?;
        let objects = &req.input.delete.objects;
        if objects.len() > this.cfg.limits.max_delete_keys {
            return Err(error::invalid_argument(format!(
                "{} keys in one DeleteObjects (at most {})",
                objects.len(),
                this.cfg.limits.max_delete_keys
            )));
        }
        this.store.bucket(&req.input.bucket).await?;
        let quiet = req.input.delete.quiet.unwrap_or(false);
        let mut deleted = Vec::new();
        let mut errors = Vec::new();
        let per_key = req.extensions.get::<crate::auth::PerKeyAccess>();
        for o in objects {
            if per_key.is_some_and(|a| !a.allows_delete(&req.input.bucket, &o.key, o.version_id.as_deref())) {
                errors.push(Error {
                    key: Some(o.key.clone()),
                    code: Some(s3s::S3ErrorCode::AccessDenied.as_str().to_string()),
                    message: Some("Access Denied".to_string()),
                    version_id: o.version_id.clone(),
                });
                continue;
            }
            match this.delete_object(&req.input.bucket, &o.key, o.version_id.as_deref()).await {
                Ok(d) if !quiet => {
                    let marker_made = d.delete_marker && o.version_id.is_none();
                    deleted.push(DeletedObject {
                        key: Some(o.key.clone()),
                        version_id: o.version_id.clone(),
                        delete_marker: d.delete_marker.then_some(true),
                        delete_marker_version_id: marker_made.then(|| d.version_id.clone()).flatten(),
                    })
                }
                Ok(_) => {}
                Err(e) => errors.push(Error {
                    key: Some(o.key.clone()),
                    code: Some(e.code().as_str().to_string()),
                    message: e.message().map(str::to_string),
                    version_id: o.version_id.clone(),
                }),
            }
        }
        ok(DeleteObjectsOutput { deleted: Some(deleted), errors: Some(errors), ..DeleteObjectsOutput::default() })
    }

    async fn copy_object(&self, req: S3Request<CopyObjectInput>) -> S3Result<S3Response<CopyObjectOutput>> {
        let this = self.for_request(&req)?;
        ok(this.copy(&req.input).await?)
    }

    async fn list_objects(&self, req: S3Request<ListObjectsInput>) -> S3Result<S3Response<ListObjectsOutput>> {
        let this = self.for_request(&req)?;
        ok(this.list_v1(&req.input).await?)
    }

    async fn list_objects_v2(&self, req: S3Request<ListObjectsV2Input>) -> S3Result<S3Response<ListObjectsV2Output>> {
        let this = self.for_request(&req)?;
        ok(this.list_v2(&req.input).await?)
    }

    async fn get_bucket_versioning(&self, req: S3Request<GetBucketVersioningInput>) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        let this = self.for_request(&req)?;
        ok(this.get_bucket_versioning(&req.input.bucket).await?)
    }

    async fn put_bucket_versioning(&self, req: S3Request<PutBucketVersioningInput>) -> S3Result<S3Response<PutBucketVersioningOutput>> {
        let this = self.for_request(&req)?;
        this.put_bucket_versioning(&req.input).await?;
        ok(PutBucketVersioningOutput::default())
    }

    async fn list_object_versions(&self, req: S3Request<ListObjectVersionsInput>) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        let this = self.for_request(&req)?;
        let (out, order) = this.list_versions(&req.input).await?;
        let mut resp = S3Response::new(out);
        resp.extensions.insert(order);
        Ok(resp)
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let this = self.for_request(&req)?;
        ok(this.create_upload(&req.input).await?)
    }

    async fn upload_part(&self, req: S3Request<UploadPartInput>) -> S3Result<S3Response<UploadPartOutput>> {
        let this = self.for_request(&req)?;
        let payload_sha256 = pre_verified_sha256(&req);
        let S3Request { input, headers, trailing_headers, .. } = req;
        ok(Gateway::upload_part(&this, input, &headers, trailing_headers.as_ref(), payload_sha256).await?)
    }

    async fn upload_part_copy(&self, req: S3Request<UploadPartCopyInput>) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let this = self.for_request(&req)?;
        ok(Gateway::upload_part_copy(&this, &req.input).await?)
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let this = self.for_request(&req)?;
        ok(this.complete_upload(&req.input).await?)
    }

    async fn abort_multipart_upload(&self, req: S3Request<AbortMultipartUploadInput>) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let this = self.for_request(&req)?;
        this.abort_upload(&req.input).await?;
        ok(AbortMultipartUploadOutput::default())
    }

    async fn list_parts(&self, req: S3Request<ListPartsInput>) -> S3Result<S3Response<ListPartsOutput>> {
        let this = self.for_request(&req)?;
        ok(Gateway::list_parts(&this, &req.input).await?)
    }

    async fn list_multipart_uploads(&self, req: S3Request<ListMultipartUploadsInput>) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let this = self.for_request(&req)?;
        ok(this.list_uploads(&req.input).await?)
    }

    async fn get_object_attributes(&self, req: S3Request<GetObjectAttributesInput>) -> S3Result<S3Response<GetObjectAttributesOutput>> {
        let this = self.for_request(&req)?;
        ok(this.object_attributes(&req.input).await?)
    }

    async fn get_object_tagging(&self, req: S3Request<GetObjectTaggingInput>) -> S3Result<S3Response<GetObjectTaggingOutput>> {
        let this = self.for_request(&req)?;
        ok(this.get_tagging(&req.input).await?)
    }

    async fn put_object_tagging(&self, req: S3Request<PutObjectTaggingInput>) -> S3Result<S3Response<PutObjectTaggingOutput>> {
        let this = self.for_request(&req)?;
        let version_id = this.put_tagging(&req.input).await?;
        ok(PutObjectTaggingOutput { version_id })
    }

    async fn delete_object_tagging(&self, req: S3Request<DeleteObjectTaggingInput>) -> S3Result<S3Response<DeleteObjectTaggingOutput>> {
        let this = self.for_request(&req)?;
        let version_id = this.delete_tagging(&req.input).await?;
        ok(DeleteObjectTaggingOutput { version_id })
    }
}
