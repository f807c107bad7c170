//! Chain table generation (docs/mgmtd.md, "Chain table generation"): N nodes × T targets per node ×
//! replication factor R → N·T/R chains of R targets on R distinct nodes.
//!
//! Goal: when any one node fails, the read load of its chains moves to the
//! other members of those chains; it should spread over as many survivors as
//! possible, ideally 1/(N−1) of the failed node's load each. With
//! `pairs(f, s)` = chains holding both node f and node s, survivor s takes
//! `pairs(f, s) / (T·(R−1))` of f's load, so the ideal table has every pair of
//! nodes sharing the same number of chains — a balanced incomplete block design.
//!
//! Construction (deterministic; documented in docs/mgmtd.md):
//! 1. **Greedy.** Chains are built one at a time. A node whose remaining
//!    target count equals the number of chains still to build must be in the
//!    next chain (this keeps the construction always feasible); the other
//!    members are the nodes with the smallest sum of pair counts with the
//!    members chosen so far (ties: more remaining targets, then lower node).
//! 2. **Local search**, bounded by `max_search_steps`: swap the nodes of two
//!    chain slots when both chains stay on distinct nodes and the objective
//!    (largest pair count, then sum of squared pair counts) improves. Steps are
//!    drawn from a SplitMix64 sequence seeded by the inputs, so the same inputs
//!    always give the same table.
//! 3. **Heads.** Each chain's head is its member that heads the fewest chains
//!    so far, so write load is balanced too.
//!
//! An integer program (e.g. `good_lp`) could prove optimality on small cases;
//! the construction reaches the ideal wherever a BIBD exists in the sizes we
//! tested (see tests) and is bounded in time on all sizes.

use serde::Serialize;
use std::fmt;

/// Largest cluster the generator accepts (bounds time and memory).
pub const MAX_NODES: usize = 1024;
pub const MAX_TARGETS_PER_NODE: usize = 256;
pub const MAX_REPLICAS: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainTableError {
    #[error("{0}")]
    Invalid(String),
}

/// The request.
#[derive(Clone, Copy, Debug)]
pub struct ChainTableSpec {
    pub nodes: usize,
    pub targets_per_node: usize,
    pub replicas: usize,
    /// Bound on local-search steps (each O(N) at most).
    pub max_search_steps: usize,
}

impl ChainTableSpec {
    pub fn new(nodes: usize, targets_per_node: usize, replicas: usize) -> Self {
        ChainTableSpec { nodes, targets_per_node, replicas, max_search_steps: 200_000 }
    }
}

/// One chain: member nodes (0-based), head first, and for each member the
/// index of the target on that node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlannedChain {
    pub nodes: Vec<usize>,
    pub target_index: Vec<usize>,
}

/// A generated table and its balance figures.
#[derive(Clone, Debug, Serialize)]
pub struct ChainTable {
    pub nodes: usize,
    pub targets_per_node: usize,
    pub replicas: usize,
    pub chains: Vec<PlannedChain>,
    /// Worst share of a failed node's read load taken by one survivor.
    pub worst_survivor_share: f64,
    /// The ideal share, 1/(N−1).
    pub ideal_share: f64,
    /// Fewest survivors that take part of a failed node's load.
    pub min_survivors_sharing: usize,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

struct Pairs {
    n: usize,
    counts: Vec<u32>,
}

impl Pairs {
    fn new(n: usize) -> Self {
        Pairs { n, counts: vec![0; n * n] }
    }
    fn get(&self, a: usize, b: usize) -> u32 {
        self.counts[a * self.n + b]
    }
    fn add(&mut self, a: usize, b: usize, d: i32) {
        let v = &mut self.counts[a * self.n + b];
        *v = v.wrapping_add_signed(d);
        let w = &mut self.counts[b * self.n + a];
        *w = w.wrapping_add_signed(d);
    }
    fn add_chain(&mut self, chain: &[usize], d: i32) {
        for (i, &a) in chain.iter().enumerate() {
            for &b in &chain[i + 1..] {
                self.add(a, b, d);
            }
        }
    }
    /// (largest pair count, sum of squares) — smaller is better.
    fn objective(&self) -> (u32, u64) {
        let mut max = 0;
        let mut sq = 0u64;
        for a in 0..self.n {
            for b in a + 1..self.n {
                let c = self.get(a, b);
                max = max.max(c);
                sq += (c as u64) * (c as u64);
            }
        }
        (max, sq)
    }
}

fn validate(spec: &ChainTableSpec) -> Result<usize, ChainTableError> {
    let bad = |m: String| Err(ChainTableError::Invalid(m));
    if spec.nodes == 0 || spec.nodes > MAX_NODES {
        return bad(format!("nodes must be 1..={MAX_NODES}, got {}", spec.nodes));
    }
    if spec.targets_per_node == 0 || spec.targets_per_node > MAX_TARGETS_PER_NODE {
        return bad(format!("targets per node must be 1..={MAX_TARGETS_PER_NODE}, got {}", spec.targets_per_node));
    }
    if spec.replicas == 0 || spec.replicas > MAX_REPLICAS || spec.replicas > spec.nodes {
        return bad(format!(
            "replication factor must be 1..={} and at most the number of nodes ({}), got {}",
            MAX_REPLICAS, spec.nodes, spec.replicas
        ));
    }
    let total = spec.nodes * spec.targets_per_node;
    if !total.is_multiple_of(spec.replicas) {
        return bad(format!(
            "{} nodes x {} targets = {} targets do not divide into chains of {}",
            spec.nodes, spec.targets_per_node, total, spec.replicas
        ));
    }
    Ok(total / spec.replicas)
}

/// Generates a balanced chain table. Deterministic for given inputs.
pub fn generate(spec: &ChainTableSpec) -> Result<ChainTable, ChainTableError> {
    let chain_count = validate(spec)?;
    let n = spec.nodes;
    let mut remaining = vec![spec.targets_per_node; n];
    let mut pairs = Pairs::new(n);
    let mut members: Vec<Vec<usize>> = Vec::with_capacity(chain_count);
    for built in 0..chain_count {
        let chains_left = chain_count - built;
        let chain = greedy_chain(spec.replicas, chains_left, &remaining, &pairs)?;
        pairs.add_chain(&chain, 1);
        for &m in &chain {
            remaining[m] -= 1;
        }
        members.push(chain);
    }
    debug_assert!(remaining.iter().all(|&r| r == 0));
    local_search(spec, &mut members, &mut pairs);
    let chains = assign_heads_and_targets(n, members);
    Ok(measure(spec, chains, &pairs))
}

fn greedy_chain(replicas: usize, chains_left: usize, remaining: &[usize], pairs: &Pairs) -> Result<Vec<usize>, ChainTableError> {
    let mut chain: Vec<usize> = (0..remaining.len()).filter(|&v| remaining[v] == chains_left).collect();
    if chain.len() > replicas {
        return Err(ChainTableError::Invalid("internal: infeasible chain table construction".into()));
    }
    while chain.len() < replicas {
        let best = (0..remaining.len())
            .filter(|v| remaining[*v] > 0 && !chain.contains(v))
            .min_by_key(|&v| {
                let load: u32 = chain.iter().map(|&m| pairs.get(v, m)).sum();
                (load, std::cmp::Reverse(remaining[v]), v)
            })
            .ok_or_else(|| ChainTableError::Invalid("internal: no node left for a chain".into()))?;
        chain.push(best);
    }
    Ok(chain)
}

fn local_search(spec: &ChainTableSpec, members: &mut [Vec<usize>], pairs: &mut Pairs) {
    if members.len() < 2 || spec.replicas < 2 {
        return;
    }
    let mut rng = Rng((spec.nodes as u64) << 40 ^ (spec.targets_per_node as u64) << 20 ^ spec.replicas as u64);
    let mut best = pairs.objective();
    let floor = ideal_objective(spec);
    for _ in 0..spec.max_search_steps {
        if best <= floor {
            break;
        }
        let (c1, c2) = (rng.below(members.len()), rng.below(members.len()));
        let (s1, s2) = (rng.below(spec.replicas), rng.below(spec.replicas));
        let (a, b) = (members[c1][s1], members[c2][s2]);
        if c1 == c2 || a == b || members[c1].contains(&b) || members[c2].contains(&a) {
            continue;
        }
        pairs.add_chain(&members[c1], -1);
        pairs.add_chain(&members[c2], -1);
        members[c1][s1] = b;
        members[c2][s2] = a;
        pairs.add_chain(&members[c1], 1);
        pairs.add_chain(&members[c2], 1);
        let now = pairs.objective();
        // Sideways moves (equal objective) walk across plateaus.
        if now <= best {
            best = now;
        } else {
            pairs.add_chain(&members[c1], -1);
            pairs.add_chain(&members[c2], -1);
            members[c1][s1] = a;
            members[c2][s2] = b;
            pairs.add_chain(&members[c1], 1);
            pairs.add_chain(&members[c2], 1);
        }
    }
}

/// The best objective any table could have: pair counts as even as possible.
fn ideal_objective(spec: &ChainTableSpec) -> (u32, u64) {
    let n = spec.nodes as u64;
    let total_pairs = (spec.nodes * spec.targets_per_node * (spec.replicas - 1) / 2) as u64;
    let slots = n * (n - 1) / 2;
    let (q, r) = (total_pairs / slots, total_pairs % slots);
    let max = if r > 0 { q + 1 } else { q };
    (max as u32, (slots - r) * q * q + r * (q + 1) * (q + 1))
}

fn assign_heads_and_targets(n: usize, members: Vec<Vec<usize>>) -> Vec<PlannedChain> {
    let mut heads = vec![0usize; n];
    let mut next_target = vec![0usize; n];
    members
        .into_iter()
        .map(|mut nodes| {
            let head_pos = (0..nodes.len()).min_by_key(|&i| (heads[nodes[i]], nodes[i])).unwrap_or(0);
            nodes.rotate_left(head_pos);
            if let Some(&h) = nodes.first() {
                heads[h] += 1;
            }
            let target_index = nodes
                .iter()
                .map(|&v| {
                    next_target[v] += 1;
                    next_target[v] - 1
                })
                .collect();
            PlannedChain { nodes, target_index }
        })
        .collect()
}

fn measure(spec: &ChainTableSpec, chains: Vec<PlannedChain>, pairs: &Pairs) -> ChainTable {
    let n = spec.nodes;
    let per_failed_node = (spec.targets_per_node * (spec.replicas.saturating_sub(1))) as f64;
    let mut worst = 0.0f64;
    let mut min_sharing = usize::MAX;
    for f in 0..n {
        let mut sharing = 0;
        for s in (0..n).filter(|&s| s != f) {
            let p = pairs.get(f, s);
            if p > 0 {
                sharing += 1;
            }
            if per_failed_node > 0.0 {
                worst = worst.max(p as f64 / per_failed_node);
            }
        }
        min_sharing = min_sharing.min(sharing);
    }
    ChainTable {
        nodes: n,
        targets_per_node: spec.targets_per_node,
        replicas: spec.replicas,
        chains,
        worst_survivor_share: worst,
        ideal_share: if n > 1 { 1.0 / (n - 1) as f64 } else { 0.0 },
        min_survivors_sharing: if n > 1 { min_sharing } else { 0 },
    }
}

impl fmt::Display for ChainTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "chain table: {} nodes x {} targets per node, replication factor {} -> {} chains",
            self.nodes,
            self.targets_per_node,
            self.replicas,
            self.chains.len()
        )?;
        for (i, c) in self.chains.iter().enumerate() {
            let members: Vec<String> = c.nodes.iter().zip(&c.target_index).map(|(n, t)| format!("node{}/t{}", n + 1, t)).collect();
            writeln!(f, "  chain {:>4}: {}", i + 1, members.join(" -> "))?;
        }
        if self.replicas < 2 || self.nodes < 2 {
            return write!(f, "no redundancy: a failed node's chains have no survivor");
        }
        write!(
            f,
            "one node fails: worst survivor takes {:.4} of its read load (ideal 1/(N-1) = {:.4}, ratio {:.2}); \
             at least {} of {} survivors share it",
            self.worst_survivor_share,
            self.ideal_share,
            self.worst_survivor_share / self.ideal_share,
            self.min_survivors_sharing,
            self.nodes - 1
        )?;
        let partners = self.targets_per_node * (self.replicas - 1);
        if partners < self.nodes - 1 {
            write!(
                f,
                "\n(a node shares chains with at most T*(R-1) = {partners} others, so no table does better than 1/{partners} = {:.4})",
                1.0 / partners as f64
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_valid(t: &ChainTable) {
        let mut per_node = vec![0; t.nodes];
        for c in &t.chains {
            assert_eq!(c.nodes.len(), t.replicas);
            let mut sorted = c.nodes.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), t.replicas, "a chain repeats a node: {c:?}");
            for &n in &c.nodes {
                per_node[n] += 1;
            }
        }
        assert!(per_node.iter().all(|&k| k == t.targets_per_node), "targets per node: {per_node:?}");
        // Each target of a node is used by exactly one chain.
        let mut used = std::collections::HashSet::new();
        for c in &t.chains {
            for (n, i) in c.nodes.iter().zip(&c.target_index) {
                assert!(*i < t.targets_per_node);
                assert!(used.insert((*n, *i)), "target used twice");
            }
        }
    }

    #[test]
    fn block_design_sizes_reach_the_ideal() {
        // Sizes where a balanced incomplete block design exists (7x3x3 is the
        // Fano plane): every survivor takes exactly 1/(N-1).
        for (n, k, r) in [(7, 3, 3), (6, 5, 3), (9, 4, 3), (12, 11, 3), (16, 15, 3), (3, 1, 3), (5, 4, 2)] {
            let t = generate(&ChainTableSpec::new(n, k, r)).unwrap();
            check_valid(&t);
            assert!((t.worst_survivor_share - t.ideal_share).abs() < 1e-9, "{n}x{k}x{r}: {t}");
            assert_eq!(t.min_survivors_sharing, n - 1);
        }
    }

    #[test]
    fn common_sizes_spread_over_every_survivor() {
        for (n, k, r) in [(3, 1, 3), (4, 3, 3), (5, 6, 3), (6, 5, 3), (6, 10, 3), (9, 4, 3), (10, 6, 2), (16, 15, 3)] {
            let t = generate(&ChainTableSpec::new(n, k, r)).unwrap();
            check_valid(&t);
            // A node shares chains with at most T·(R−1) others.
            assert_eq!(t.min_survivors_sharing, (n - 1).min(k * (r - 1)), "{n}x{k}x{r}: {t}");
            // Within one chain of the ideal per survivor.
            let slack = 1.0 / (k * (r - 1)) as f64;
            assert!(t.worst_survivor_share <= t.ideal_share + slack + 1e-9, "{n}x{k}x{r}: {}", t.worst_survivor_share);
        }
    }

    #[test]
    fn heads_are_balanced() {
        let t = generate(&ChainTableSpec::new(6, 5, 3)).unwrap();
        let mut heads = vec![0; 6];
        for c in &t.chains {
            heads[c.nodes[0]] += 1;
        }
        let (lo, hi) = (heads.iter().min().unwrap(), heads.iter().max().unwrap());
        assert!(hi - lo <= 1, "{heads:?}");
    }

    #[test]
    fn deterministic() {
        let a = generate(&ChainTableSpec::new(9, 4, 3)).unwrap();
        let b = generate(&ChainTableSpec::new(9, 4, 3)).unwrap();
        assert_eq!(a.chains, b.chains);
    }

    #[test]
    fn bad_inputs_are_clear_errors() {
        for (n, k, r) in [(0, 1, 1), (2, 1, 3), (4, 1, 3), (3, 0, 1), (3, 1, 0)] {
            let e = generate(&ChainTableSpec::new(n, k, r)).unwrap_err();
            assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn single_replica_and_single_node() {
        let t = generate(&ChainTableSpec::new(1, 4, 1)).unwrap();
        check_valid(&t);
        assert_eq!(t.chains.len(), 4);
        let t = generate(&ChainTableSpec::new(3, 2, 1)).unwrap();
        check_valid(&t);
    }
}
