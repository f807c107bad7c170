//! Reads: `BatchRead` (strict or relaxed reads of several chunks, each
//! routed to a serving target) and `QueryLastChunk`. Admission is
//! [`chain::check_read`] (chain version first, then serving only); the
//! engine work runs off the async threads, except for small batches
//! (`StorageConfig::max_inline_read_bytes`), which run in place on their
//! worker (`block_in_place`) to save two thread hand-offs per read.

use super::repair::RepairCause;
use super::{StorageService, Target};
use crate::chain;
use crate::error::{Result, StorageError};
use crate::sync;
use bytes::{Bytes, BytesMut};
use fskv_chunk_engine::ReadMode;
use fskv_proto::storage::{BatchReadReq, BatchReadResp, QueryLastChunkReq, QueryLastChunkResp, ReadIo, ReadOk};
use fskv_types::{ErrorCode, Status};
use std::sync::Arc;

/// Each read of a batch with its target, or why it was refused.
type ReadJobs = Vec<(ReadIo, std::result::Result<Arc<Target>, Status>)>;

impl StorageService {
    pub(super) async fn handle_batch_read(&self, req: BatchReadReq) -> Result<(BatchReadResp, Bytes)> {
        let _slot = self.inner.read_slots.acquire().await.map_err(|_| StorageError::Internal("read slots closed".into()))?;
        let total: u64 = req.ios.iter().map(|io| u64::from(io.len_bytes)).sum();
        if total > self.inner.config.max_read_batch_bytes {
            return Err(StorageError::Invalid(format!(
                "batch of {total} bytes exceeds max_read_batch_bytes {}",
                self.inner.config.max_read_batch_bytes
            )));
        }
        let routing = self.inner.routing.current();
        let mut jobs = Vec::with_capacity(req.ios.len());
        for io in &req.ios {
            let checked = self.target(io.target).and_then(|t| {
                let chain = Self::chain_of(&routing, io.chain_id)?;
                chain::check_read(chain, io.target, io.chain_ver).map_err(|reject| StorageError::Route {
                    chain: io.chain_id,
                    target: io.target,
                    reject,
                })?;
                Ok(t)
            });
            jobs.push((io.clone(), checked.map_err(Status::from)));
        }
        // Shared, not cloned: the batch is read a second time only after a repair.
        let jobs = Arc::new(jobs);
        let (resp, payload) = self.read_jobs(jobs.clone(), total).await?;
        // Bit rot caught by a page checksum: repair each such chunk from
        // another replica, then read the batch again (once). A chunk that
        // cannot be repaired keeps its ChecksumMismatch: never a wrong byte.
        let corrupt: Vec<_> = resp
            .results
            .iter()
            .zip(jobs.iter())
            .filter(|(r, _)| matches!(r, Err(s) if s.code == ErrorCode::ChecksumMismatch))
            .filter_map(|(_, (io, t))| t.as_ref().ok().map(|t| (t.clone(), io.chain_id, io.chunk)))
            .collect();
        if corrupt.is_empty() {
            return Ok((resp, payload));
        }
        for (target, chain, chunk) in corrupt {
            self.repair_chunk(&target, chain, chunk, RepairCause::Read).await;
        }
        self.read_jobs(jobs, total).await
    }

    async fn read_jobs(&self, jobs: Arc<ReadJobs>, total: u64) -> Result<(BatchReadResp, Bytes)> {
        let this = self.clone();
        self.blocking_read(total, move || {
            let mut payload = BytesMut::with_capacity(total as usize);
            let mut results = Vec::with_capacity(jobs.len());
            for (io, target) in jobs.iter() {
                let mode = if io.relaxed { ReadMode::Relaxed } else { ReadMode::Strict };
                let r = target.clone().and_then(|t| {
                    t.engine
                        .read(io.chunk, io.offset_bytes, u64::from(io.len_bytes), mode)
                        .map_err(|e| Status::from(Self::engine_error(&t, e.into())))
                });
                results.push(r.map(|read| {
                    this.inner.metrics.read(io.target, read.data.len());
                    payload.extend_from_slice(&read.data);
                    ReadOk {
                        len_bytes: read.data.len() as u32,
                        crc: crc32c::crc32c(&read.data),
                        version: read.version,
                        chunk_len_bytes: read.chunk_len_bytes,
                        uncommitted: read.uncommitted,
                    }
                }));
            }
            Ok((BatchReadResp { results }, payload.freeze()))
        })
        .await
    }

    pub(super) async fn handle_query_last(&self, req: QueryLastChunkReq) -> Result<QueryLastChunkResp> {
        let target = self.target(req.target)?;
        let routing = self.inner.routing.current();
        let chain = Self::chain_of(&routing, req.chain_id)?;
        chain::check_read(chain, req.target, req.chain_ver).map_err(|reject| StorageError::Route {
            chain: req.chain_id,
            target: req.target,
            reject,
        })?;
        let engine = target.engine.clone();
        let last = self.blocking(move || Ok(engine.last_chunk(req.inode)?)).await?;
        Ok(QueryLastChunkResp { last: last.map(|(id, m)| (id, sync::remote_meta(&m))) })
    }
}
