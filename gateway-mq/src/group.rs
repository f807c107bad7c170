//! Consumer groups: membership, generations, partition assignment and
//! committed offsets. Pure state machine (the caller passes the time and
//! the topics' partition counts); the state lives in one file per group
//! (`groups/<name>`) replaced with compare-and-swap, so any gateway serves
//! any member (no sticky consumer instances): each call reads the file,
//! applies one transition and writes it back, retrying on a conflict.
//!
//! | event | rule |
//! |---|---|
//! | any call | members whose last call is older than their session timeout are removed first |
//! | join (new member, or one whose subscription changed) | member added; generation + 1; partitions reassigned |
//! | join (known member, same subscription) | nothing changes; the current generation and assignment are returned |
//! | heartbeat | the member's last-seen time moves; answers the current generation and its assignment (a changed generation tells it to switch) |
//! | leave, or a member timed out | removed; generation + 1; reassigned |
//! | commit with (member, generation) | member must exist (`UnknownMemberId`) and generation be current (`IllegalGeneration`): a consumer of an old generation cannot commit |
//! | commit without a member | only while the group has no members (a standalone consumer, as Kafka's generation -1) |
//!
//! Ownership: a group belongs to the tenant whose join or commit created it
//! ([`GroupState::tenant`], in the same file and CAS as the group itself);
//! every call of another tenant (join, heartbeat, leave, commit, describe —
//! which is how offsets are fetched —, delete) gets 403 `AccessDenied` and
//! changes nothing; ListGroups lists the caller's groups only. Group names
//! stay global, as topic names.
//!
//! Assignment: per topic, the members subscribed to it in member-id order
//! get contiguous ranges of its partitions, the first `n % m` one more
//! (Kafka's range assignor).

use crate::error::MqError;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Bounds on a group.
#[derive(Clone, Copy, Debug)]
pub struct GroupLimits {
    pub max_members: usize,
    pub min_session_timeout_ms: u64,
    pub max_session_timeout_ms: u64,
    pub max_committed_partitions: usize,
    pub max_metadata_bytes: usize,
}

impl Default for GroupLimits {
    fn default() -> Self {
        GroupLimits {
            max_members: 1000,
            min_session_timeout_ms: 1000,
            max_session_timeout_ms: 30 * 60 * 1000,
            max_committed_partitions: 100_000,
            max_metadata_bytes: 1024,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub client_id: String,
    pub topics: BTreeSet<String>,
    pub session_timeout_ms: u64,
    pub last_seen_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Committed {
    pub offset: u64,
    #[serde(default)]
    pub metadata: String,
    pub committed_ms: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupState {
    pub generation: u64,
    pub members: BTreeMap<String, Member>,
    /// Member id → its (topic, partition)s in the current generation.
    pub assignment: BTreeMap<String, Vec<(String, u32)>>,
    /// "topic/partition" → committed offset.
    pub offsets: BTreeMap<String, Committed>,
    /// The tenant owning the group: written with the group's file when the
    /// first join or commit creates it (one CAS with `Expected::Absent`);
    /// empty for groups made before tenants (`default`'s).
    #[serde(default)]
    pub tenant: String,
}

/// What a member learns from join or heartbeat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemberView {
    pub member_id: String,
    pub generation: u64,
    pub assignment: Vec<(String, u32)>,
    pub members: usize,
}

pub fn offset_key(topic: &str, partition: u32) -> String {
    format!("{topic}/{partition}")
}

impl GroupState {
    /// The owning tenant (`default` for a group made before tenants).
    pub fn owner(&self) -> &str {
        if self.tenant.is_empty() {
            "default"
        } else {
            &self.tenant
        }
    }

    /// `Ok` when `tenant` owns the group, else 403 `AccessDenied`.
    pub fn check_owner(&self, tenant: &str, name: &str) -> Result<(), MqError> {
        if self.owner() == tenant {
            Ok(())
        } else {
            Err(MqError::AccessDenied(format!("group {name:?} belongs to another tenant")))
        }
    }

    /// Removes members whose session timed out; true if any was.
    pub fn expire(&mut self, now_ms: u64) -> bool {
        let before = self.members.len();
        self.members.retain(|_, m| m.last_seen_ms.saturating_add(m.session_timeout_ms) > now_ms);
        before != self.members.len()
    }

    /// Topics any member subscribes to.
    pub fn subscribed_topics(&self) -> BTreeSet<String> {
        self.members.values().flat_map(|m| m.topics.iter().cloned()).collect()
    }

    fn view(&self, member_id: &str) -> MemberView {
        MemberView {
            member_id: member_id.to_string(),
            generation: self.generation,
            assignment: self.assignment.get(member_id).cloned().unwrap_or_default(),
            members: self.members.len(),
        }
    }

    /// Range assignment over the current members; bumps the generation.
    pub fn rebalance(&mut self, partitions: &dyn Fn(&str) -> u32) {
        self.generation += 1;
        let mut assignment: BTreeMap<String, Vec<(String, u32)>> = self.members.keys().map(|m| (m.clone(), Vec::new())).collect();
        for topic in self.subscribed_topics() {
            let subs: Vec<&String> = self.members.iter().filter(|(_, m)| m.topics.contains(&topic)).map(|(id, _)| id).collect();
            let n = partitions(&topic);
            let m = subs.len() as u32;
            if m == 0 {
                continue;
            }
            let (per, extra) = (n / m, n % m);
            let mut next = 0u32;
            for (i, id) in subs.iter().enumerate() {
                let take = per + u32::from((i as u32) < extra);
                if let Some(list) = assignment.get_mut(*id) {
                    list.extend((next..next + take).map(|p| (topic.clone(), p)));
                }
                next += take;
            }
        }
        self.assignment = assignment;
    }

    /// Joins (or re-joins) a member; `member_id` is the caller's (a new one
    /// when it had none). `topics` must be non-empty.
    #[allow(clippy::too_many_arguments)]
    pub fn join(
        &mut self,
        member_id: &str,
        client_id: &str,
        topics: BTreeSet<String>,
        session_timeout_ms: u64,
        now_ms: u64,
        partitions: &dyn Fn(&str) -> u32,
        limits: &GroupLimits,
    ) -> Result<MemberView, MqError> {
        if !(limits.min_session_timeout_ms..=limits.max_session_timeout_ms).contains(&session_timeout_ms) {
            return Err(MqError::InvalidRequest(format!(
                "session_timeout_ms {session_timeout_ms} must be in [{}, {}]",
                limits.min_session_timeout_ms, limits.max_session_timeout_ms
            )));
        }
        if topics.is_empty() {
            return Err(MqError::InvalidRequest("a member must subscribe to at least one topic".into()));
        }
        let mut changed = self.expire(now_ms);
        match self.members.get_mut(member_id) {
            Some(m) => {
                m.last_seen_ms = now_ms;
                m.session_timeout_ms = session_timeout_ms;
                m.client_id = client_id.to_string();
                if m.topics != topics {
                    m.topics = topics;
                    changed = true;
                }
            }
            None => {
                if self.members.len() >= limits.max_members {
                    return Err(MqError::LimitExceeded(format!(
                        "the group has {} members; at most {}",
                        self.members.len(),
                        limits.max_members
                    )));
                }
                self.members.insert(
                    member_id.to_string(),
                    Member { client_id: client_id.to_string(), topics, session_timeout_ms, last_seen_ms: now_ms },
                );
                changed = true;
            }
        }
        if changed {
            self.rebalance(partitions);
        }
        Ok(self.view(member_id))
    }

    pub fn heartbeat(&mut self, member_id: &str, now_ms: u64, partitions: &dyn Fn(&str) -> u32) -> Result<MemberView, MqError> {
        if self.expire(now_ms) {
            self.rebalance(partitions);
        }
        let m = self.members.get_mut(member_id).ok_or_else(|| MqError::UnknownMember(member_id.to_string()))?;
        m.last_seen_ms = now_ms;
        Ok(self.view(member_id))
    }

    pub fn leave(&mut self, member_id: &str, now_ms: u64, partitions: &dyn Fn(&str) -> u32) -> Result<(), MqError> {
        let expired = self.expire(now_ms);
        let removed = self.members.remove(member_id).is_some();
        if expired || removed {
            self.rebalance(partitions);
        }
        if removed {
            Ok(())
        } else {
            Err(MqError::UnknownMember(member_id.to_string()))
        }
    }

    /// Commits offsets, fenced by generation (see the module table).
    pub fn commit(
        &mut self,
        member: Option<(&str, u64)>,
        offsets: &[(String, u32, u64, String)],
        now_ms: u64,
        partitions: &dyn Fn(&str) -> u32,
        limits: &GroupLimits,
    ) -> Result<(), MqError> {
        if self.expire(now_ms) {
            self.rebalance(partitions);
        }
        match member {
            Some((id, generation)) => {
                let m = self.members.get_mut(id).ok_or_else(|| MqError::UnknownMember(id.to_string()))?;
                if generation != self.generation {
                    return Err(MqError::IllegalGeneration { got: generation, current: self.generation });
                }
                m.last_seen_ms = now_ms;
            }
            None if !self.members.is_empty() => {
                return Err(MqError::IllegalGeneration { got: 0, current: self.generation });
            }
            None => {}
        }
        for (topic, partition, offset, metadata) in offsets {
            if metadata.len() > limits.max_metadata_bytes {
                return Err(MqError::LimitExceeded(format!(
                    "commit metadata of {} bytes; at most {}",
                    metadata.len(),
                    limits.max_metadata_bytes
                )));
            }
            let key = offset_key(topic, *partition);
            if !self.offsets.contains_key(&key) && self.offsets.len() >= limits.max_committed_partitions {
                return Err(MqError::LimitExceeded(format!("at most {} committed partitions per group", limits.max_committed_partitions)));
            }
            self.offsets.insert(key, Committed { offset: *offset, metadata: metadata.clone(), committed_ms: now_ms });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics(t: &[&str]) -> BTreeSet<String> {
        t.iter().map(|s| s.to_string()).collect()
    }

    fn parts(t: &str) -> u32 {
        match t {
            "a" => 5,
            "b" => 2,
            _ => 0,
        }
    }

    #[test]
    fn join_rebalance_timeout_and_fencing() {
        let l = GroupLimits { min_session_timeout_ms: 10, ..GroupLimits::default() };
        let mut g = GroupState::default();
        let v1 = g.join("m1", "c", topics(&["a"]), 100, 0, &parts, &l).unwrap();
        assert_eq!(v1.generation, 1);
        assert_eq!(v1.assignment.len(), 5);
        // The same join again changes nothing.
        assert_eq!(g.join("m1", "c", topics(&["a"]), 100, 10, &parts, &l).unwrap().generation, 1);
        let v2 = g.join("m2", "c", topics(&["a", "b"]), 100, 20, &parts, &l).unwrap();
        assert_eq!(v2.generation, 2);
        let h1 = g.heartbeat("m1", 30, &parts).unwrap();
        assert_eq!(h1.assignment, vec![("a".to_string(), 0), ("a".to_string(), 1), ("a".to_string(), 2)]);
        assert_eq!(v2.assignment, vec![("a".to_string(), 3), ("a".to_string(), 4), ("b".to_string(), 0), ("b".to_string(), 1)]);
        // m1 still at generation 1 cannot commit; at 2 it can.
        let off = vec![("a".to_string(), 0, 42, String::new())];
        assert!(matches!(g.commit(Some(("m1", 1)), &off, 40, &parts, &l), Err(MqError::IllegalGeneration { got: 1, current: 2 })));
        g.commit(Some(("m1", 2)), &off, 40, &parts, &l).unwrap();
        assert_eq!(g.offsets["a/0"].offset, 42);
        // Standalone commits are refused while members exist.
        assert!(g.commit(None, &off, 40, &parts, &l).is_err());
        // m2 stops heartbeating: at 125 it is gone (last seen 20 + 100).
        let h = g.heartbeat("m1", 125, &parts).unwrap();
        assert_eq!(h.generation, 3);
        assert_eq!(h.assignment.len(), 5);
        assert!(matches!(g.heartbeat("m2", 126, &parts), Err(MqError::UnknownMember(_))));
        assert!(matches!(g.commit(Some(("m2", 3)), &off, 127, &parts, &l), Err(MqError::UnknownMember(_))));
        g.leave("m1", 130, &parts).unwrap();
        assert!(g.members.is_empty());
        assert_eq!(g.generation, 4);
        g.commit(None, &off, 140, &parts, &l).unwrap();
        assert!(g.join("m3", "c", topics(&[]), 100, 0, &parts, &l).is_err());
        assert!(g.join("m3", "c", topics(&["a"]), 1, 0, &parts, &l).is_err());
    }

    #[test]
    fn every_partition_assigned_once() {
        let l = GroupLimits { min_session_timeout_ms: 10, ..GroupLimits::default() };
        for members in 1..8 {
            let mut g = GroupState::default();
            for m in 0..members {
                g.join(&format!("m{m}"), "c", topics(&["a", "b"]), 1000, 0, &parts, &l).unwrap();
            }
            let mut all: Vec<(String, u32)> = g.assignment.values().flatten().cloned().collect();
            all.sort();
            assert_eq!(all.len(), 7, "{members}");
            all.dedup();
            assert_eq!(all.len(), 7);
        }
    }
}
