//! Eviction policies as pure code: S3-FIFO (the default), LRU and FIFO.
//!
//! A policy orders the cache's slots (numbered `0..slots`) and, when every
//! slot is in use, names the one to reuse. It knows nothing of data, locks
//! or I/O, so the live cache (`cache::engine`) and the trace simulator
//! (`sim::policy`, test support) run the very same code.
//!
//! # Why S3-FIFO
//!
//! S3-FIFO (Yang et al., SOSP 2023) keeps three FIFO queues:
//!
//! ```text
//!   new key ──► S (small, 10% of slots) ──evict, freq 0──► G (ghost: keys only)
//!                  │ freq ≥ 1 when it reaches the tail                │
//!                  ▼                                                  │
//!   key in G ──► M (main, the rest) ◄── reinserted while freq > 0 ────┘
//!                  │ (freq decremented)
//!                  └── freq 0 at the tail: evicted
//! ```
//!
//! - It is scan resistant: a block read once passes through the small queue
//!   and leaves without disturbing the main queue, where LRU would let a
//!   scan flush the whole working set.
//! - A hit only bumps a 2-bit counter (an atomic in [`HitMarks`]), so the
//!   cache's hit path takes no policy lock at all. LRU must move the entry
//!   to the head of a list on every hit, which needs a lock.
//! - The measured comparison (zipf working set twice the cache, with scans
//!   mixed in) is in `sim::policy` and bench/cache-policies.md.
//!
//! # Invariants
//!
//! - A slot is in at most one queue; `insert` puts it in one, `remove` and
//!   `evict` (when it returns the slot) take it out.
//! - Queues hold `(slot, generation)` pairs and removal is lazy: an entry
//!   whose generation no longer matches the slot's is stale and skipped.
//! - `evict` visits a bounded number of entries and never returns a slot
//!   the caller's `can_evict` refused; a refused slot goes back to the head
//!   of its queue (a second chance) so the next call tries others first.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU8, Ordering};

/// Which eviction policy a cache uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// S3-FIFO: scan resistant, lock-free hits (the default).
    S3Fifo,
    /// Least recently used: the classic; a lock on every hit.
    Lru,
    /// First in, first out: hits change nothing.
    Fifo,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 3] = [PolicyKind::S3Fifo, PolicyKind::Lru, PolicyKind::Fifo];

    /// The name used in configs and reports.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::S3Fifo => "s3fifo",
            PolicyKind::Lru => "lru",
            PolicyKind::Fifo => "fifo",
        }
    }

    /// True when a hit needs the policy lock (`Policy::touch`).
    pub fn hit_needs_lock(self) -> bool {
        self == PolicyKind::Lru
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A policy name that is none of s3fifo, lru, fifo.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown eviction policy '{0}': use s3fifo (default), lru or fifo")]
pub struct UnknownPolicy(pub String);

impl std::str::FromStr for PolicyKind {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, UnknownPolicy> {
        match s.to_ascii_lowercase().as_str() {
            "s3fifo" | "s3-fifo" => Ok(PolicyKind::S3Fifo),
            "lru" => Ok(PolicyKind::Lru),
            "fifo" => Ok(PolicyKind::Fifo),
            _ => Err(UnknownPolicy(s.to_owned())),
        }
    }
}

/// Largest value of a slot's access counter (2 bits, as in the paper).
const FREQ_MAX: u8 = 3;
/// Share of the slots the small queue aims for, in percent.
const SMALL_PERCENT: usize = 10;

/// Per-slot access counters, bumped on hits without any lock.
pub struct HitMarks {
    /// One saturating counter per slot (0..=3).
    freq: Box<[AtomicU8]>,
}

impl HitMarks {
    pub fn new(slots: usize) -> Self {
        HitMarks {
            freq: (0..slots).map(|_| AtomicU8::new(0)).collect(),
        }
    }

    /// Records a hit on `slot` (saturating). A plain load-then-store: a
    /// lost increment under a race only makes the counter a little low,
    /// which costs nothing in correctness and keeps the hit path to one
    /// uncontended store at most.
    #[inline]
    pub fn bump(&self, slot: u32) {
        let f = &self.freq[slot as usize];
        let v = f.load(Ordering::Relaxed);
        if v < FREQ_MAX {
            f.store(v + 1, Ordering::Relaxed);
        }
    }

    fn get(&self, slot: u32) -> u8 {
        self.freq[slot as usize].load(Ordering::Relaxed)
    }

    fn set(&self, slot: u32, v: u8) {
        self.freq[slot as usize].store(v, Ordering::Relaxed)
    }
}

/// Which queue a slot is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Where {
    None,
    Small,
    Main,
}

/// An eviction policy over slots `0..slots`.
pub struct Policy {
    kind: PolicyKind,
    inner: Inner,
}

enum Inner {
    S3Fifo(S3Fifo),
    Lru(Lru),
    Fifo(Fifo),
}

impl Policy {
    pub fn new(kind: PolicyKind, slots: usize) -> Self {
        assert!(slots > 0 && slots < u32::MAX as usize, "slot count {slots}");
        let inner = match kind {
            PolicyKind::S3Fifo => Inner::S3Fifo(S3Fifo::new(slots)),
            PolicyKind::Lru => Inner::Lru(Lru::new(slots)),
            PolicyKind::Fifo => Inner::Fifo(Fifo::new(slots)),
        };
        Policy { kind, inner }
    }

    pub fn kind(&self) -> PolicyKind {
        self.kind
    }

    /// A hit on a resident slot, for policies that need the lock for it
    /// (LRU). S3-FIFO records hits in [`HitMarks`] instead.
    pub fn touch(&mut self, slot: u32) {
        if let Inner::Lru(l) = &mut self.inner {
            l.touch(slot);
        }
    }

    /// `slot` now holds block `key` (it was free or just evicted).
    pub fn insert(&mut self, key: u64, slot: u32, marks: &HitMarks) {
        marks.set(slot, 0);
        match &mut self.inner {
            Inner::S3Fifo(s) => s.insert(key, slot),
            Inner::Lru(l) => l.insert(slot),
            Inner::Fifo(f) => f.insert(slot),
        }
    }

    /// `slot` was emptied by its owner (invalidated): forget it.
    pub fn remove(&mut self, slot: u32) {
        match &mut self.inner {
            Inner::S3Fifo(s) => s.remove(slot),
            Inner::Lru(l) => l.remove(slot),
            Inner::Fifo(f) => f.remove(slot),
        }
    }

    /// Picks a resident slot to reuse, skipping those `can_evict` refuses
    /// (dirty or busy). None when no slot could be chosen within the bound.
    pub fn evict(
        &mut self,
        marks: &HitMarks,
        can_evict: &mut dyn FnMut(u32) -> bool,
    ) -> Option<u32> {
        match &mut self.inner {
            Inner::S3Fifo(s) => s.evict(marks, can_evict),
            Inner::Lru(l) => l.evict(can_evict),
            Inner::Fifo(f) => f.evict(can_evict),
        }
    }

    /// Slots currently resident (in a queue).
    pub fn len(&self) -> usize {
        match &self.inner {
            Inner::S3Fifo(s) => s.small_len + s.main_len,
            Inner::Lru(l) => l.len,
            Inner::Fifo(f) => f.len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A FIFO of slots with lazy deletion.
#[derive(Default)]
struct LazyQueue {
    /// (slot, generation) from oldest (front) to newest (back).
    q: VecDeque<(u32, u32)>,
}

impl LazyQueue {
    fn push_newest(&mut self, slot: u32, gen: u32) {
        self.q.push_back((slot, gen));
    }

    /// Oldest live entry, removed from the queue.
    fn pop_oldest(&mut self, gens: &[u32]) -> Option<u32> {
        while let Some((s, g)) = self.q.pop_front() {
            if gens[s as usize] == g {
                return Some(s);
            }
        }
        None
    }

    /// Drops stale entries when they outnumber live ones, so a cache that
    /// invalidates a lot (write-around) cannot grow the queue without bound.
    fn compact(&mut self, live: usize, gens: &[u32]) {
        if self.q.len() > 2 * live + 64 {
            self.q.retain(|&(s, g)| gens[s as usize] == g);
        }
    }
}

/// S3-FIFO over slots; see the module docs.
struct S3Fifo {
    slots: usize,
    /// The small queue's target length.
    small_target: usize,
    small: LazyQueue,
    main: LazyQueue,
    small_len: usize,
    main_len: usize,
    /// Per slot: which queue, generation (for lazy deletion), key.
    place: Vec<Where>,
    gens: Vec<u32>,
    keys: Vec<u64>,
    /// Keys recently evicted from the small queue, oldest first, with the
    /// sequence number that makes a stale queue entry recognisable.
    ghost_fifo: VecDeque<(u64, u64)>,
    ghost: HashMap<u64, u64>,
    ghost_seq: u64,
}

impl S3Fifo {
    fn new(slots: usize) -> Self {
        S3Fifo {
            slots,
            small_target: (slots * SMALL_PERCENT / 100).max(1),
            small: LazyQueue::default(),
            main: LazyQueue::default(),
            small_len: 0,
            main_len: 0,
            place: vec![Where::None; slots],
            gens: vec![0; slots],
            keys: vec![0; slots],
            ghost_fifo: VecDeque::new(),
            ghost: HashMap::new(),
            ghost_seq: 0,
        }
    }

    fn insert(&mut self, key: u64, slot: u32) {
        let s = slot as usize;
        debug_assert_eq!(self.place[s], Where::None, "slot {slot} inserted twice");
        self.gens[s] = self.gens[s].wrapping_add(1);
        self.keys[s] = key;
        if self.ghost.remove(&key).is_some() {
            self.place[s] = Where::Main;
            self.main_len += 1;
            self.main.push_newest(slot, self.gens[s]);
        } else {
            self.place[s] = Where::Small;
            self.small_len += 1;
            self.small.push_newest(slot, self.gens[s]);
        }
    }

    fn remove(&mut self, slot: u32) {
        let s = slot as usize;
        match self.place[s] {
            Where::Small => self.small_len -= 1,
            Where::Main => self.main_len -= 1,
            Where::None => return,
        }
        self.place[s] = Where::None;
        self.gens[s] = self.gens[s].wrapping_add(1);
        self.small.compact(self.small_len, &self.gens);
        self.main.compact(self.main_len, &self.gens);
    }

    fn remember_ghost(&mut self, key: u64) {
        self.ghost_seq += 1;
        self.ghost.insert(key, self.ghost_seq);
        self.ghost_fifo.push_back((key, self.ghost_seq));
        // The ghost queue remembers about as many keys as the main queue holds.
        while self.ghost.len() > self.slots {
            let Some((k, seq)) = self.ghost_fifo.pop_front() else {
                break;
            };
            if self.ghost.get(&k) == Some(&seq) {
                self.ghost.remove(&k);
            }
        }
        if self.ghost_fifo.len() > 2 * self.slots + 64 {
            let ghost = &self.ghost;
            self.ghost_fifo
                .retain(|(k, seq)| ghost.get(k).is_some_and(|s| s == seq));
        }
    }

    fn evict(&mut self, marks: &HitMarks, can_evict: &mut dyn FnMut(u32) -> bool) -> Option<u32> {
        // Each entry is visited at most FREQ_MAX + 2 times (promotion, freq
        // decrements, one refusal), so this bound is never the reason to fail
        // while an evictable slot exists.
        let mut budget = (self.small_len + self.main_len) * (FREQ_MAX as usize + 3) + 8;
        while budget > 0 {
            budget -= 1;
            let from_small =
                self.small_len > 0 && (self.small_len >= self.small_target || self.main_len == 0);
            if from_small {
                let slot = self.small.pop_oldest(&self.gens)?;
                let s = slot as usize;
                if marks.get(slot) >= 1 {
                    // Used while in the small queue: promote to main.
                    marks.set(slot, 0);
                    self.small_len -= 1;
                    self.main_len += 1;
                    self.place[s] = Where::Main;
                    self.main.push_newest(slot, self.gens[s]);
                    continue;
                }
                if !can_evict(slot) {
                    // Busy or dirty: give it another round in main, where it
                    // does not block the small queue.
                    self.small_len -= 1;
                    self.main_len += 1;
                    self.place[s] = Where::Main;
                    self.main.push_newest(slot, self.gens[s]);
                    continue;
                }
                self.small_len -= 1;
                self.place[s] = Where::None;
                self.gens[s] = self.gens[s].wrapping_add(1);
                let key = self.keys[s];
                self.remember_ghost(key);
                return Some(slot);
            }
            let slot = self.main.pop_oldest(&self.gens)?;
            let s = slot as usize;
            let f = marks.get(slot);
            if f > 0 {
                marks.set(slot, f - 1);
                self.main.push_newest(slot, self.gens[s]);
                continue;
            }
            if !can_evict(slot) {
                self.main.push_newest(slot, self.gens[s]);
                continue;
            }
            self.main_len -= 1;
            self.place[s] = Where::None;
            self.gens[s] = self.gens[s].wrapping_add(1);
            return Some(slot);
        }
        None
    }
}

/// LRU as an intrusive doubly linked list over slot numbers.
struct Lru {
    prev: Vec<u32>,
    next: Vec<u32>,
    linked: Vec<bool>,
    /// Most recently used.
    head: u32,
    /// Least recently used.
    tail: u32,
    len: usize,
}

const NIL: u32 = u32::MAX;

impl Lru {
    fn new(slots: usize) -> Self {
        Lru {
            prev: vec![NIL; slots],
            next: vec![NIL; slots],
            linked: vec![false; slots],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    fn unlink(&mut self, s: u32) {
        let (p, n) = (self.prev[s as usize], self.next[s as usize]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.linked[s as usize] = false;
        self.len -= 1;
    }

    fn push_head(&mut self, s: u32) {
        self.prev[s as usize] = NIL;
        self.next[s as usize] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = s;
        }
        self.head = s;
        if self.tail == NIL {
            self.tail = s;
        }
        self.linked[s as usize] = true;
        self.len += 1;
    }

    fn insert(&mut self, s: u32) {
        debug_assert!(!self.linked[s as usize]);
        self.push_head(s);
    }

    fn touch(&mut self, s: u32) {
        if self.linked[s as usize] && self.head != s {
            self.unlink(s);
            self.push_head(s);
        }
    }

    fn remove(&mut self, s: u32) {
        if self.linked[s as usize] {
            self.unlink(s);
        }
    }

    fn evict(&mut self, can_evict: &mut dyn FnMut(u32) -> bool) -> Option<u32> {
        for _ in 0..self.len {
            let s = self.tail;
            if s == NIL {
                return None;
            }
            self.unlink(s);
            if can_evict(s) {
                return Some(s);
            }
            self.push_head(s);
        }
        None
    }
}

/// FIFO: insertion order only.
struct Fifo {
    q: LazyQueue,
    gens: Vec<u32>,
    queued: Vec<bool>,
    len: usize,
}

impl Fifo {
    fn new(slots: usize) -> Self {
        Fifo {
            q: LazyQueue::default(),
            gens: vec![0; slots],
            queued: vec![false; slots],
            len: 0,
        }
    }

    fn insert(&mut self, s: u32) {
        debug_assert!(!self.queued[s as usize]);
        self.gens[s as usize] = self.gens[s as usize].wrapping_add(1);
        self.queued[s as usize] = true;
        self.len += 1;
        self.q.push_newest(s, self.gens[s as usize]);
    }

    fn remove(&mut self, s: u32) {
        if self.queued[s as usize] {
            self.queued[s as usize] = false;
            self.gens[s as usize] = self.gens[s as usize].wrapping_add(1);
            self.len -= 1;
            self.q.compact(self.len, &self.gens);
        }
    }

    fn evict(&mut self, can_evict: &mut dyn FnMut(u32) -> bool) -> Option<u32> {
        for _ in 0..self.len {
            let s = self.q.pop_oldest(&self.gens)?;
            if can_evict(s) {
                self.queued[s as usize] = false;
                self.gens[s as usize] = self.gens[s as usize].wrapping_add(1);
                self.len -= 1;
                return Some(s);
            }
            self.q.push_newest(s, self.gens[s as usize]);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives a policy like a cache: key -> slot map, free slots first.
    struct Harness {
        policy: Policy,
        marks: HitMarks,
        slot_of: HashMap<u64, u32>,
        key_of: Vec<Option<u64>>,
        free: Vec<u32>,
    }

    impl Harness {
        fn new(kind: PolicyKind, slots: usize) -> Self {
            Harness {
                policy: Policy::new(kind, slots),
                marks: HitMarks::new(slots),
                slot_of: HashMap::new(),
                key_of: vec![None; slots],
                free: (0..slots as u32).rev().collect(),
            }
        }

        /// Returns true on a hit.
        fn access(&mut self, key: u64) -> bool {
            if let Some(&s) = self.slot_of.get(&key) {
                self.marks.bump(s);
                self.policy.touch(s);
                return true;
            }
            let s = match self.free.pop() {
                Some(s) => s,
                None => {
                    let s = self.policy.evict(&self.marks, &mut |_| true).unwrap();
                    let old = self.key_of[s as usize].take().unwrap();
                    self.slot_of.remove(&old);
                    s
                }
            };
            self.slot_of.insert(key, s);
            self.key_of[s as usize] = Some(key);
            self.policy.insert(key, s, &self.marks);
            false
        }
    }

    #[test]
    fn every_policy_keeps_a_consistent_population() {
        for kind in PolicyKind::ALL {
            let mut h = Harness::new(kind, 16);
            for i in 0..1000u64 {
                h.access((i * 7919) % 40);
                assert!(h.policy.len() <= 16);
            }
            assert_eq!(h.policy.len(), 16, "{kind}");
            assert_eq!(h.slot_of.len(), 16);
        }
    }

    #[test]
    fn lru_evicts_least_recent() {
        let mut h = Harness::new(PolicyKind::Lru, 3);
        for k in [1, 2, 3, 1, 4] {
            h.access(k);
        }
        // 2 was least recently used.
        assert!(!h.slot_of.contains_key(&2));
        assert!(h.slot_of.contains_key(&1));
    }

    #[test]
    fn fifo_evicts_oldest_even_if_hit() {
        let mut h = Harness::new(PolicyKind::Fifo, 3);
        for k in [1, 2, 3, 1, 4] {
            h.access(k);
        }
        assert!(!h.slot_of.contains_key(&1));
    }

    #[test]
    fn s3fifo_survives_a_scan() {
        // A hot set of 50 keys in a 100-slot cache, then a scan of 10_000
        // cold keys: S3-FIFO keeps the hot set, LRU loses it.
        let run = |kind| {
            let mut h = Harness::new(kind, 100);
            for _ in 0..5 {
                for k in 0..50 {
                    h.access(k);
                }
            }
            for k in 1000..11_000 {
                h.access(k);
            }
            (0..50).filter(|k| h.slot_of.contains_key(k)).count()
        };
        assert_eq!(run(PolicyKind::S3Fifo), 50);
        assert_eq!(run(PolicyKind::Lru), 0);
    }

    #[test]
    fn refused_slots_are_skipped_and_none_when_all_refused() {
        for kind in PolicyKind::ALL {
            let mut h = Harness::new(kind, 4);
            for k in 0..4 {
                h.access(k);
            }
            let pinned = h.slot_of[&0];
            let v = h
                .policy
                .evict(&h.marks, &mut |s| s != pinned)
                .expect("an evictable slot");
            assert_ne!(v, pinned, "{kind}");
            h.policy.insert(99, v, &h.marks);
            assert_eq!(h.policy.evict(&h.marks, &mut |_| false), None, "{kind}");
            // Nothing was lost by the refusals.
            assert_eq!(h.policy.len(), 4, "{kind}");
        }
    }

    #[test]
    fn removed_slots_are_never_returned() {
        for kind in PolicyKind::ALL {
            let mut h = Harness::new(kind, 8);
            for k in 0..8 {
                h.access(k);
            }
            let gone = h.slot_of[&3];
            h.policy.remove(gone);
            for _ in 0..7 {
                let s = h.policy.evict(&h.marks, &mut |_| true).unwrap();
                assert_ne!(s, gone, "{kind}");
            }
            assert!(h.policy.is_empty(), "{kind}");
            assert_eq!(h.policy.evict(&h.marks, &mut |_| true), None);
        }
    }

    #[test]
    fn ghost_hits_go_to_main() {
        let mut h = Harness::new(PolicyKind::S3Fifo, 10);
        // Fill, then push key 0 out through the small queue into the ghost.
        for k in 0..13 {
            h.access(k);
        }
        assert!(!h.slot_of.contains_key(&0));
        h.access(0);
        let Inner::S3Fifo(s) = &h.policy.inner else {
            unreachable!()
        };
        assert_eq!(s.place[h.slot_of[&0] as usize], Where::Main);
    }

    #[test]
    fn kind_parses() {
        assert_eq!("S3-FIFO".parse::<PolicyKind>(), Ok(PolicyKind::S3Fifo));
        assert_eq!("lru".parse::<PolicyKind>(), Ok(PolicyKind::Lru));
        assert!("arc"
            .parse::<PolicyKind>()
            .unwrap_err()
            .to_string()
            .contains("s3fifo"));
    }
}
