//! [`StorageBackend`] over the real storage service, through the native
//! client's [`StorageClient`] (routing from mgmtd, or a fixed table in tests).
//!
//! * exact length: `last_chunk` asks the chain's head for the highest-index
//!   chunk of the file on that chain;
//! * GC and truncate: chunks are removed per chain of the file's layout with
//!   `RemoveChunks(from_index)`; a truncate inside a chunk shortens that chunk.

use crate::storage::{LastChunk, StorageBackend, StorageError};
use async_trait::async_trait;
use fskv_client::storage::{StorageClient, StorageClientError};
use fskv_proto::meta::{chain_for_chunk, FileLayout};
use fskv_types::{ChainId, ChunkId, ErrorCode, InodeId};

pub struct ChainStorage {
    client: StorageClient,
}

impl ChainStorage {
    pub fn new(client: StorageClient) -> Self {
        ChainStorage { client }
    }
}

fn err(what: &str, e: StorageClientError) -> StorageError {
    StorageError::new(e.code(), format!("{what}: {e}"))
}

/// The distinct chains of a layout, in layout order.
fn chains_of(layout: &FileLayout) -> Vec<ChainId> {
    let mut out: Vec<ChainId> = Vec::with_capacity(layout.chains.len());
    for c in &layout.chains {
        if !out.contains(c) {
            out.push(*c);
        }
    }
    out
}

#[async_trait]
impl StorageBackend for ChainStorage {
    fn knows_lengths(&self) -> bool {
        true
    }

    async fn last_chunk(&self, inode: InodeId, chain: ChainId) -> Result<Option<LastChunk>, StorageError> {
        let last = self.client.query_last_chunk(chain, inode).await.map_err(|e| err(&format!("last chunk of {inode} on {chain}"), e))?;
        Ok(last.map(|(id, meta)| LastChunk { index: id.index, len_bytes: meta.len_bytes }))
    }

    async fn remove_chunks(&self, inode: InodeId, layout: &FileLayout) -> Result<u64, StorageError> {
        let mut removed = 0;
        for chain in chains_of(layout) {
            removed +=
                self.client.remove_chunks(chain, inode, 0).await.map_err(|e| err(&format!("remove chunks of {inode} on {chain}"), e))?;
        }
        Ok(removed)
    }

    async fn truncate_chunks(&self, inode: InodeId, layout: &FileLayout, length_bytes: u64) -> Result<(), StorageError> {
        let chunk_bytes = u64::from(layout.chunk_size_bytes.max(1));
        let kept_chunks = length_bytes.div_ceil(chunk_bytes);
        for chain in chains_of(layout) {
            self.client.remove_chunks(chain, inode, kept_chunks).await.map_err(|e| err(&format!("truncate {inode} on {chain}"), e))?;
        }
        let tail = length_bytes % chunk_bytes;
        if tail == 0 {
            return Ok(());
        }
        let index = length_bytes / chunk_bytes;
        let Some(chain) = chain_for_chunk(layout, index) else { return Ok(()) };
        match self.client.truncate(chain, ChunkId::new(inode, index), tail).await {
            Ok(_) => Ok(()),
            // A hole: nothing stored there, nothing to shorten.
            Err(e) if e.code() == ErrorCode::NotFound => Ok(()),
            Err(e) => Err(err(&format!("truncate chunk {index} of {inode}"), e)),
        }
    }

    async fn capacity_bytes(&self) -> (u64, u64) {
        let routing = self.client.routing().current();
        let (mut capacity, mut used) = (0u64, 0u64);
        for node in &routing.nodes {
            match self.client.space_info(&node.address).await {
                Ok(space) => {
                    for t in space.targets {
                        capacity += t.capacity_bytes;
                        used += t.used_bytes;
                    }
                }
                Err(e) => tracing::warn!(node = %node.node_id, error = %e, "space info unavailable; statfs undercounts"),
            }
        }
        (capacity, used)
    }
}
