//! GetObjectAttributes (`GET /bucket/key?attributes`, the attributes named
//! in `x-amz-object-attributes`).
//!
//! | attribute | answer |
//! |---|---|
//! | `ETag` | the object's ETag, unquoted (as S3 gives it here) |
//! | `Checksum` | the object's stored checksums and their type (`FULL_OBJECT` for a single PUT); absent when it has none |
//! | `ObjectSize` | the size in bytes |
//! | `StorageClass` | `STANDARD` (the only class) |
//! | `ObjectParts`, single-part object | absent (as S3) |
//! | `ObjectParts`, multipart object | `TotalPartsCount`; with the part checksums the upload recorded: the page of parts after `PartNumberMarker` (default 0), at most `MaxParts` (default and cap 1000), each with its number, size and checksums, `IsTruncated`, `NextPartNumberMarker` (the last part of the page), `PartNumberMarker` and `MaxParts` echoed |
//! | `ObjectParts`, multipart object uploaded without checksums | `TotalPartsCount` only: S3 lists no `Part` elements for an object without additional checksums |
//! | an unknown attribute name | 400 `InvalidArgument` |
//! | `MaxParts` or `PartNumberMarker` negative | 400 `InvalidArgument` |
//! | `versionId` | that version (`ops/versioning.rs`): 404 `NoSuchVersion`, 405 for a delete marker, 400 for a malformed id |
//!
//! `Last-Modified` is always sent. The page is computed by [`parts_page`]
//! (pure).

use super::object::timestamp;
use super::Gateway;
use crate::error;
use crate::objmeta::{Checksums, ObjectMeta};
use s3s::dto::*;
use s3s::S3Error;

/// Parts listed by one GetObjectAttributes when `MaxParts` is not given,
/// and the most it may ask for (S3's).
pub const MAX_PARTS_PER_PAGE: i32 = 1000;

const ATTRIBUTES: [&str; 5] = [
    ObjectAttributes::ETAG,
    ObjectAttributes::CHECKSUM,
    ObjectAttributes::OBJECT_PARTS,
    ObjectAttributes::STORAGE_CLASS,
    ObjectAttributes::OBJECT_SIZE,
];

/// The `ObjectParts` element of a multipart object (see the module table).
pub fn parts_page(meta: &ObjectMeta, marker: i32, max_parts: i32) -> Option<GetObjectAttributesParts> {
    if meta.part_sizes.is_empty() {
        return None;
    }
    let total = meta.part_sizes.len();
    if meta.part_checksums.len() != total {
        return Some(GetObjectAttributesParts { total_parts_count: Some(total as i32), ..GetObjectAttributesParts::default() });
    }
    let first = usize::try_from(marker).unwrap_or(0).min(total);
    let take = usize::try_from(max_parts).unwrap_or(0);
    let end = first.saturating_add(take).min(total);
    let parts: Vec<ObjectPart> = (first..end)
        .map(|i| {
            let mut p = ObjectPart { part_number: Some(i as i32 + 1), size: Some(meta.part_sizes[i] as i64), ..ObjectPart::default() };
            crate::set_checksums!(p, &meta.part_checksums[i]);
            p
        })
        .collect();
    let next = parts.last().and_then(|p| p.part_number);
    Some(GetObjectAttributesParts {
        is_truncated: Some(end < total),
        max_parts: Some(max_parts),
        next_part_number_marker: next,
        part_number_marker: Some(marker),
        parts: Some(parts),
        total_parts_count: Some(total as i32),
    })
}

/// The `Checksum` element: the stored checksums, or none.
fn checksum_of(sums: &Checksums) -> Option<Checksum> {
    if sums.is_empty() {
        return None;
    }
    let kind = sums.kind.clone().unwrap_or_else(|| ChecksumType::FULL_OBJECT.to_string());
    let mut c = Checksum { checksum_type: Some(ChecksumType::from(kind)), ..Checksum::default() };
    crate::set_checksums!(c, sums);
    Some(c)
}

impl Gateway {
    pub async fn object_attributes(&self, input: &GetObjectAttributesInput) -> Result<GetObjectAttributesOutput, S3Error> {
        // The header is one comma-separated list (s3s gives it as one item).
        let wanted: Vec<&str> =
            input.object_attributes.iter().flat_map(|a| a.as_str().split(',')).map(str::trim).filter(|a| !a.is_empty()).collect();
        if let Some(bad) = wanted.iter().find(|a| !ATTRIBUTES.contains(a)) {
            return Err(error::invalid_argument(format!(
                "invalid attribute name {bad:?} in x-amz-object-attributes (valid: {})",
                ATTRIBUTES.join(", ")
            )));
        }
        if wanted.is_empty() {
            return Err(error::invalid_argument("x-amz-object-attributes names no attribute"));
        }
        let max_parts = input.max_parts.unwrap_or(MAX_PARTS_PER_PAGE);
        let marker = input.part_number_marker.unwrap_or(0);
        if max_parts < 0 || marker < 0 {
            return Err(error::invalid_argument("max-parts and part-number-marker must not be negative"));
        }
        let max_parts = max_parts.min(MAX_PARTS_PER_PAGE);
        let (bucket_dir, _, obj) = self.locate_for_read(&input.bucket, &input.key, input.version_id.as_deref()).await?;
        let bucket = bucket_dir.id;
        let version_id = self.version_header(bucket, &obj.meta).await?;
        let m = &obj.meta;
        let has = |a: &str| wanted.contains(&a);
        Ok(GetObjectAttributesOutput {
            e_tag: has(ObjectAttributes::ETAG).then(|| ETag::Strong(m.etag.clone())),
            checksum: if has(ObjectAttributes::CHECKSUM) { checksum_of(&m.checksums) } else { None },
            object_size: has(ObjectAttributes::OBJECT_SIZE).then_some(m.size as i64),
            storage_class: has(ObjectAttributes::STORAGE_CLASS).then(|| StorageClass::from_static(StorageClass::STANDARD)),
            object_parts: if has(ObjectAttributes::OBJECT_PARTS) { parts_page(m, marker, max_parts) } else { None },
            last_modified: Some(timestamp(m.mtime_ns)),
            version_id,
            ..GetObjectAttributesOutput::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn multipart(n: usize, with_sums: bool) -> ObjectMeta {
        ObjectMeta {
            etag: format!("e-{n}"),
            size: 5 * n as u64,
            part_sizes: vec![5; n],
            part_checksums: if with_sums {
                (0..n).map(|i| Checksums { crc32: Some(format!("c{i}")), ..Checksums::default() }).collect()
            } else {
                Vec::new()
            },
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn single_part_objects_have_no_parts() {
        assert!(parts_page(&ObjectMeta::default(), 0, 1000).is_none());
    }

    #[test]
    fn without_part_checksums_only_the_count_is_given() {
        let p = parts_page(&multipart(3, false), 0, 1000).unwrap();
        assert_eq!(p.total_parts_count, Some(3));
        assert!(p.parts.is_none() && p.is_truncated.is_none() && p.next_part_number_marker.is_none());
    }

    #[test]
    fn pages_walk_every_part_once() {
        let m = multipart(7, true);
        for max in 1..=8 {
            let (mut marker, mut seen) = (0, Vec::new());
            for _ in 0..10 {
                let p = parts_page(&m, marker, max).unwrap();
                assert_eq!(p.total_parts_count, Some(7));
                assert_eq!((p.part_number_marker, p.max_parts), (Some(marker), Some(max)));
                let parts = p.parts.unwrap();
                assert!(parts.len() <= max as usize);
                for part in &parts {
                    let n = part.part_number.unwrap();
                    assert_eq!(part.checksum_crc32.as_deref(), Some(format!("c{}", n - 1).as_str()));
                    assert_eq!(part.size, Some(5));
                    seen.push(n);
                }
                if !p.is_truncated.unwrap() {
                    break;
                }
                marker = p.next_part_number_marker.unwrap();
            }
            assert_eq!(seen, (1..=7).collect::<Vec<_>>(), "max_parts {max}");
        }
    }

    #[test]
    fn markers_past_the_end_and_zero_pages_are_empty() {
        let m = multipart(3, true);
        let p = parts_page(&m, 3, 10).unwrap();
        assert_eq!((p.parts.unwrap().len(), p.is_truncated, p.next_part_number_marker), (0, Some(false), None));
        let p = parts_page(&m, 99, 10).unwrap();
        assert_eq!(p.parts.unwrap().len(), 0);
        let p = parts_page(&m, 0, 0).unwrap();
        assert_eq!((p.parts.unwrap().len(), p.is_truncated), (0, Some(true)));
    }

    #[test]
    fn checksum_type_defaults_to_full_object() {
        assert!(checksum_of(&Checksums::default()).is_none());
        let c = checksum_of(&Checksums { sha256: Some("x".into()), ..Checksums::default() }).unwrap();
        assert_eq!(c.checksum_type.as_ref().map(|t| t.as_str()), Some(ChecksumType::FULL_OBJECT));
        assert_eq!(c.checksum_sha256.as_deref(), Some("x"));
    }
}
