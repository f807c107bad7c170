//! Namespaces: list, create / set settings, settings + stats, delete.
//!
//! | request | answer |
//! |---|---|
//! | `GET /v1/ns` | `{"namespaces": [..]}` |
//! | `PUT /v1/ns/{ns}` with a JSON [`NamespaceConfig`] (or an empty body: the defaults for a new namespace, unchanged for an existing one) | 201 created / 200 updated, the settings |
//! | `GET /v1/ns/{ns}` | `{"namespace", "config", "stats": {keys, bytes, hits, misses, evictions, expirations, as_of_ms, source}}` — stats from the writer's index (`source: "writer"`), on a reader the last ones the writer published (`"published"`, at most `stats_interval_ms` old; `null` before the first) |
//! | `DELETE /v1/ns/{ns}` | 204; the namespace and every key in it are gone at once (one metadata transaction), the data reclaimed in the background |

use super::{collect, json, respond, Kv};
use crate::body::KvBody;
use crate::config::NamespaceConfig;
use crate::error::{KvError, Result};
use fskv_gateway::RequestBody;
use http::{Response, StatusCode};

/// Stats of a namespace, as served and as the writer publishes them.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NsStats {
    pub keys: u64,
    pub bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub expirations: u64,
    pub as_of_ms: u64,
}

/// Largest stats file read.
const STATS_MAX_BYTES: u64 = 64 << 10;

impl Kv {
    /// The namespaces of `owner`'s tenant.
    pub async fn list_namespaces(&self, owner: fskv_gateway::TenantIds) -> Result<Response<KvBody>> {
        let names = self.store.list_namespaces(Some(owner.uid)).await?;
        Ok(json(StatusCode::OK, &serde_json::json!({ "namespaces": names })))
    }

    pub async fn put_namespace(&self, name: &str, body: RequestBody, owner: fskv_gateway::TenantIds) -> Result<Response<KvBody>> {
        if !crate::consul::native_may_use(&self.cfg.consul_namespace, name, owner.uid) {
            return Err(KvError::AccessDenied(format!("namespace {name:?} is reserved for another tenant's Consul API")));
        }
        let bytes = collect(body).await?;
        let existing = match self.store.namespace(name).await {
            Ok(ns) if ns.owner_uid != owner.uid => {
                return Err(KvError::AccessDenied(format!("namespace {name:?} belongs to another tenant")));
            }
            Ok(ns) => Some(ns),
            Err(KvError::NoSuchNamespace(_)) => None,
            Err(e) => return Err(e),
        };
        let config: NamespaceConfig = if bytes.iter().all(u8::is_ascii_whitespace) {
            existing.as_ref().map(|n| n.config.clone()).unwrap_or_default()
        } else {
            serde_json::from_slice(&bytes).map_err(|e| KvError::InvalidArgument(format!("namespace settings: {e}")))?
        };
        config.validate(&self.cfg.limits).map_err(KvError::InvalidArgument)?;
        let (ns, created) = self.store.put_namespace(name, &config, owner).await?;
        if let Some(m) = &self.maint {
            m.namespace_changed(&ns, created);
        }
        let status = if created { StatusCode::CREATED } else { StatusCode::OK };
        Ok(json(status, &serde_json::json!({ "namespace": ns.name, "config": ns.config })))
    }

    /// The namespace's stats: exact on the writer, last published on a reader.
    pub async fn namespace_stats(&self, name: &str) -> Result<(Option<NsStats>, &'static str)> {
        if let Some(m) = &self.maint {
            if let Some(s) = m.stats(name) {
                return Ok((Some(s), "writer"));
            }
        }
        let published = self.store.read_file(self.store.system.stats, name, STATS_MAX_BYTES).await?;
        Ok((published.and_then(|b| serde_json::from_slice(&b).ok()), "published"))
    }

    pub async fn get_namespace(&self, name: &str) -> Result<Response<KvBody>> {
        self.store.forget_namespace(name);
        let ns = self.store.namespace(name).await?;
        let (stats, source) = self.namespace_stats(name).await?;
        let mut stats = serde_json::to_value(stats).unwrap_or(serde_json::Value::Null);
        if let Some(o) = stats.as_object_mut() {
            o.insert("source".into(), source.into());
        }
        Ok(json(StatusCode::OK, &serde_json::json!({ "namespace": ns.name, "config": ns.config, "stats": stats })))
    }

    pub async fn delete_namespace(&self, name: &str) -> Result<Response<KvBody>> {
        self.store.delete_namespace(name).await?;
        if let Some(m) = &self.maint {
            m.namespace_deleted(name);
        }
        self.notify_change();
        Ok(respond(StatusCode::NO_CONTENT, vec![], KvBody::empty()))
    }
}
