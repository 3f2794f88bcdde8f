//! The KV cache as fixed-size blocks: per-sequence block tables, refcounts and prefix reuse.
//!
//! A block holds `block_size` consecutive positions of one sequence. A *full* block whose KV
//! has been computed is registered under a key chained over (the previous block's key, the
//! block's token ids), so the key names the whole prefix up to the block's end. A new
//! sequence whose prompt starts with registered blocks takes them (refcount + 1) instead of
//! recomputing them. Only full, already computed blocks are ever shared and a sequence only
//! writes positions past its shared prefix, so a shared block is immutable: no copy-on-write.
//!
//! Every block is in exactly one state: *used* (refcount > 0), *cached* (refcount 0 but
//! registered: reusable until evicted, oldest release first) or *free*. Hence
//! free + cached + used = total at all times.
//!
//! Prefix reuse is a constructor option ([`KvBlocks::with_prefix_reuse`]): off, no block is
//! registered, so none is ever cached or shared (`cached_tokens` is always 0). It must be off
//! when the engine's sliding-window layers keep a ring per sequence (the window-only layout):
//! a ring cannot be shared, so a shared prefix's windowed-layer KV would be missing.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

use super::SeqId;

/// Why the block manager refused an operation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    #[error("the KV cache needs {needed} more blocks, {available} are free or evictable")]
    NoSpace { needed: usize, available: usize },
    #[error("sequence {0} already holds KV blocks")]
    Duplicate(SeqId),
    #[error("sequence {0} holds no KV blocks")]
    UnknownSeq(SeqId),
    #[error("sequence {seq}: {what}")]
    Invalid { seq: SeqId, what: String },
    #[error("KV block manager: {0}")]
    Config(String),
}

/// What `allocate` gave a sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alloc {
    /// Leading prompt tokens whose KV is already in the shared blocks: prefill starts here.
    pub cached_tokens: usize,
    /// The sequence's block table (shared prefix blocks first).
    pub blocks: Vec<u32>,
}

/// Block counts by state; `free + cached + used == total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvStats {
    pub total: usize,
    pub free: usize,
    pub cached: usize,
    pub used: usize,
    pub block_size: usize,
}

/// A full block registered for reuse: its key, its parent's key and its tokens, kept so a
/// 64-bit key collision can never hand a sequence another prefix's KV.
#[derive(Clone, Debug)]
struct Registered {
    key: u64,
    parent: u64,
    tokens: Box<[u32]>,
}

#[derive(Clone, Debug, Default)]
struct Block {
    refs: u32,
    reg: Option<Registered>,
    /// Release tick while cached (refcount 0 and registered): its key in the LRU.
    lru_tick: Option<u64>,
}

#[derive(Clone, Debug, Default)]
struct SeqBlocks {
    table: Vec<u32>,
    /// Every token of the sequence known so far (prompt, then generated ones).
    tokens: Vec<u32>,
    /// Leading blocks already registered or taken from the cache (never re-registered).
    registered: usize,
}

/// The key of the empty prefix: the chain starts here.
const ROOT_KEY: u64 = 0x6272_696e_6b5f_6b76; // "brink_kv"

fn block_key(parent: u64, tokens: &[u32]) -> u64 {
    // DefaultHasher::new() has fixed keys (unlike RandomState), so equal prefixes get equal keys
    // across sequences. A crafted collision costs only a cache miss: hits are checked against
    // the stored tokens and parent key.
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

pub struct KvBlocks {
    block_size: usize,
    blocks: Vec<Block>,
    free: Vec<u32>,
    /// key → block, for every registered block (used or cached).
    index: HashMap<u64, u32>,
    /// release tick → block, for cached blocks: the first entry is evicted first.
    lru: BTreeMap<u64, u32>,
    tick: u64,
    seqs: HashMap<SeqId, SeqBlocks>,
    /// Computed full blocks are registered for reuse by later prompts.
    prefix_reuse: bool,
}

impl KvBlocks {
    /// `num_blocks` blocks of `block_size` positions each, with prefix reuse.
    pub fn new(num_blocks: usize, block_size: usize) -> Result<Self, KvError> {
        Self::with_prefix_reuse(num_blocks, block_size, true)
    }

    /// [`KvBlocks::new`], with prefix reuse on or off.
    pub fn with_prefix_reuse(num_blocks: usize, block_size: usize, prefix_reuse: bool) -> Result<Self, KvError> {
        if block_size == 0 || num_blocks == 0 {
            return Err(KvError::Config(format!("{num_blocks} blocks of {block_size} positions: both must be at least 1")));
        }
        if u32::try_from(num_blocks).is_err() {
            return Err(KvError::Config(format!("{num_blocks} blocks: block ids are u32")));
        }
        Ok(KvBlocks {
            block_size,
            blocks: vec![Block::default(); num_blocks],
            // Popped from the end: block 0 first, which keeps tables readable in tests.
            free: (0..num_blocks as u32).rev().collect(),
            index: HashMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
            seqs: HashMap::new(),
            prefix_reuse,
        })
    }

    /// Whether computed prompt prefixes are shared with later sequences.
    pub fn prefix_reuse(&self) -> bool {
        self.prefix_reuse
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn total_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks that hold `tokens` positions.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    pub fn stats(&self) -> KvStats {
        let used = self.blocks.iter().filter(|b| b.refs > 0).count();
        KvStats { total: self.blocks.len(), free: self.free.len(), cached: self.lru.len(), used, block_size: self.block_size }
    }

    /// The registered blocks a prompt would reuse. The last prompt token is never taken from the
    /// cache: its logits are needed, so at least one position is computed — and it lands in a
    /// block of the sequence's own.
    fn prefix_hits(&self, prompt: &[u32]) -> Vec<u32> {
        let reusable = prompt.len().saturating_sub(1) / self.block_size;
        let mut hits = Vec::new();
        let mut parent = ROOT_KEY;
        for chunk in prompt.chunks_exact(self.block_size).take(reusable) {
            let key = block_key(parent, chunk);
            let Some(&b) = self.index.get(&key) else { break };
            let reg = self.blocks[b as usize].reg.as_ref();
            if !reg.is_some_and(|r| r.parent == parent && *r.tokens == *chunk) {
                break;
            }
            hits.push(b);
            parent = key;
        }
        hits
    }

    /// Prompt tokens a new sequence would find cached (no state change).
    pub fn cached_prefix_tokens(&self, prompt: &[u32]) -> usize {
        self.prefix_hits(prompt).len() * self.block_size
    }

    /// Blocks `allocate(prompt)` would take beyond the cached prefix, and whether they are
    /// available now (free, or cached and not part of the prefix being reused).
    pub fn fits(&self, prompt: &[u32]) -> Result<(), KvError> {
        let hits = self.prefix_hits(prompt);
        let needed = self.blocks_for(prompt.len()) - hits.len();
        let hits_cached = hits.iter().filter(|&&b| self.blocks[b as usize].refs == 0).count();
        let available = self.free.len() + self.lru.len() - hits_cached;
        if needed > available { Err(KvError::NoSpace { needed, available }) } else { Ok(()) }
    }

    /// Gives `seq` blocks for its whole prompt, reusing the cached prefix. All or nothing: on
    /// `NoSpace` nothing changed.
    pub fn allocate(&mut self, seq: SeqId, prompt: &[u32]) -> Result<Alloc, KvError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::Duplicate(seq));
        }
        if prompt.is_empty() {
            return Err(KvError::Invalid { seq, what: "the prompt has no tokens".into() });
        }
        self.fits(prompt)?;
        let hits = self.prefix_hits(prompt);
        for &b in &hits {
            self.take_ref(b);
        }
        let mut table = hits.clone();
        let fresh = self.blocks_for(prompt.len()) - hits.len();
        for _ in 0..fresh {
            // `fits` counted these: the pop cannot fail.
            let b = self.pop_block().ok_or_else(|| KvError::Config("block accounting broken".into()))?;
            table.push(b);
        }
        let alloc = Alloc { cached_tokens: hits.len() * self.block_size, blocks: table.clone() };
        self.seqs.insert(seq, SeqBlocks { table, tokens: prompt.to_vec(), registered: hits.len() });
        Ok(alloc)
    }

    /// Grows `seq`'s table to hold `new_len` positions (no-op when it already does). All or
    /// nothing.
    pub fn extend(&mut self, seq: SeqId, new_len: usize) -> Result<(), KvError> {
        let have = self.seqs.get(&seq).ok_or(KvError::UnknownSeq(seq))?.table.len();
        let want = self.blocks_for(new_len);
        if want <= have {
            return Ok(());
        }
        let available = self.free.len() + self.lru.len();
        if want - have > available {
            return Err(KvError::NoSpace { needed: want - have, available });
        }
        let mut fresh = Vec::with_capacity(want - have);
        for _ in have..want {
            fresh.push(self.pop_block().ok_or_else(|| KvError::Config("block accounting broken".into()))?);
        }
        self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?.table.extend(fresh);
        Ok(())
    }

    /// Appends generated tokens to `seq`'s known tokens (so their blocks can be registered
    /// once computed) and grows its table to hold them.
    pub fn push_tokens(&mut self, seq: SeqId, tokens: &[u32]) -> Result<(), KvError> {
        let len = self.seqs.get(&seq).ok_or(KvError::UnknownSeq(seq))?.tokens.len() + tokens.len();
        self.extend(seq, len)?;
        self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// Records that the KV of `seq`'s first `computed` tokens is written: full blocks among them
    /// become reusable by later sequences (and stay cached after `release`).
    pub fn mark_computed(&mut self, seq: SeqId, computed: usize) -> Result<(), KvError> {
        let bs = self.block_size;
        let s = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
        if computed > s.tokens.len() {
            return Err(KvError::Invalid { seq, what: format!("{computed} tokens computed but only {} known", s.tokens.len()) });
        }
        let full = computed / bs;
        if full <= s.registered || !self.prefix_reuse {
            return Ok(());
        }
        let mut parent = if s.registered == 0 { ROOT_KEY } else { block_key_of(&s.tokens, s.registered, bs) };
        for i in s.registered..full {
            let toks = &s.tokens[i * bs..(i + 1) * bs];
            let key = block_key(parent, toks);
            let b = s.table[i];
            // The same prefix computed twice (two sequences prefilling it at once): the first
            // registration wins and this block stays private, freed on release.
            if let std::collections::hash_map::Entry::Vacant(slot) = self.index.entry(key) {
                slot.insert(b);
                self.blocks[b as usize].reg = Some(Registered { key, parent, tokens: toks.into() });
            }
            parent = key;
        }
        s.registered = s.registered.max(full);
        Ok(())
    }

    /// Drops `seq`: its blocks lose a reference; registered ones stay cached, the rest are free.
    pub fn release(&mut self, seq: SeqId) -> Result<(), KvError> {
        let s = self.seqs.remove(&seq).ok_or(KvError::UnknownSeq(seq))?;
        // Last block first: under eviction a prefix's tail goes before its head, which later
        // prompts need to reach the tail at all.
        for &b in s.table.iter().rev() {
            let blk = &mut self.blocks[b as usize];
            blk.refs -= 1;
            if blk.refs == 0 {
                if blk.reg.is_some() {
                    self.tick += 1;
                    blk.lru_tick = Some(self.tick);
                    self.lru.insert(self.tick, b);
                } else {
                    self.free.push(b);
                }
            }
        }
        Ok(())
    }

    pub fn block_table(&self, seq: SeqId) -> Option<&[u32]> {
        self.seqs.get(&seq).map(|s| s.table.as_slice())
    }

    pub fn holds(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    fn take_ref(&mut self, b: u32) {
        let blk = &mut self.blocks[b as usize];
        if blk.refs == 0
            && let Some(t) = blk.lru_tick.take()
        {
            self.lru.remove(&t);
        }
        blk.refs += 1;
    }

    /// A block for new KV: a free one, else the least recently released cached one.
    fn pop_block(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.lru.pop_first()?;
                let blk = &mut self.blocks[b as usize];
                blk.lru_tick = None;
                if let Some(r) = blk.reg.take() {
                    self.index.remove(&r.key);
                }
                b
            }
        };
        self.blocks[b as usize].refs = 1;
        Some(b)
    }
}

/// The key of the prefix ending at block `n` (n ≥ 1) of `tokens`.
fn block_key_of(tokens: &[u32], n: usize, bs: usize) -> u64 {
    tokens[..n * bs].chunks_exact(bs).fold(ROOT_KEY, block_key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn check(kv: &KvBlocks) {
        let s = kv.stats();
        assert_eq!(s.free + s.cached + s.used, s.total, "{s:?}");
        // Refcounts equal the number of tables holding each block.
        let mut refs = vec![0u32; kv.blocks.len()];
        for sb in kv.seqs.values() {
            for &b in &sb.table {
                refs[b as usize] += 1;
            }
        }
        for (i, b) in kv.blocks.iter().enumerate() {
            assert_eq!(b.refs, refs[i], "block {i}");
            assert_eq!(b.lru_tick.is_some(), b.refs == 0 && b.reg.is_some(), "block {i}");
        }
        assert_eq!(kv.index.len(), kv.blocks.iter().filter(|b| b.reg.is_some()).count());
    }

    fn prompt(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i.wrapping_mul(31).wrapping_add(salt)).collect()
    }

    #[test]
    fn second_sequence_reuses_a_computed_prefix() {
        let mut kv = KvBlocks::new(16, 4).unwrap();
        let p = prompt(10, 7); // 2 full blocks + 2 tokens
        let a = kv.allocate(1, &p).unwrap();
        assert_eq!(a.cached_tokens, 0);
        assert_eq!(a.blocks.len(), 3);
        // Not computed yet: nothing to reuse.
        assert_eq!(kv.cached_prefix_tokens(&p), 0);
        kv.mark_computed(1, 10).unwrap();
        let mut q = p.clone();
        q.extend([99, 98, 97]);
        let b = kv.allocate(2, &q).unwrap();
        assert_eq!(b.cached_tokens, 8);
        assert_eq!(b.blocks[..2], a.blocks[..2]);
        assert_ne!(b.blocks[2], a.blocks[2]);
        assert_eq!(kv.stats().used, 3 + 2);
        check(&kv);
        // A different first block shares nothing, even with the same second block.
        let mut r = p.clone();
        r[0] ^= 1;
        assert_eq!(kv.cached_prefix_tokens(&r), 0);
    }

    #[test]
    fn without_prefix_reuse_nothing_is_shared_or_cached() {
        let mut kv = KvBlocks::with_prefix_reuse(16, 4, false).unwrap();
        assert!(!kv.prefix_reuse() && KvBlocks::new(16, 4).unwrap().prefix_reuse());
        let p = prompt(10, 7);
        let a = kv.allocate(1, &p).unwrap();
        kv.mark_computed(1, 10).unwrap();
        let b = kv.allocate(2, &p).unwrap();
        assert_eq!((a.cached_tokens, b.cached_tokens, kv.cached_prefix_tokens(&p)), (0, 0, 0));
        assert!(a.blocks.iter().all(|x| !b.blocks.contains(x)), "no block is shared");
        check(&kv);
        kv.release(1).unwrap();
        kv.release(2).unwrap();
        assert_eq!((kv.stats().free, kv.stats().cached), (16, 0), "released blocks are free, none cached");
        check(&kv);
    }

    #[test]
    fn the_last_prompt_token_is_always_computed() {
        let mut kv = KvBlocks::new(8, 4).unwrap();
        let p = prompt(8, 1); // exactly 2 blocks
        kv.allocate(1, &p).unwrap();
        kv.mark_computed(1, 8).unwrap();
        let b = kv.allocate(2, &p).unwrap();
        // Only the first block: the second holds the last token, which must be recomputed.
        assert_eq!(b.cached_tokens, 4);
        check(&kv);
    }

    #[test]
    fn released_prefix_stays_cached_until_space_is_needed() {
        let mut kv = KvBlocks::new(4, 4).unwrap();
        let p = prompt(9, 3);
        kv.allocate(1, &p).unwrap();
        kv.mark_computed(1, 9).unwrap();
        kv.release(1).unwrap();
        assert_eq!(kv.stats(), KvStats { total: 4, free: 2, cached: 2, used: 0, block_size: 4 });
        assert_eq!(kv.cached_prefix_tokens(&p), 8);
        // 12 tokens of something else need 3 blocks: 2 free + 1 evicted (the tail goes first).
        kv.allocate(2, &prompt(12, 500)).unwrap();
        assert_eq!(kv.stats(), KvStats { total: 4, free: 0, cached: 1, used: 3, block_size: 4 });
        assert_eq!(kv.cached_prefix_tokens(&p), 4);
        assert_eq!(kv.allocate(3, &prompt(12, 900)), Err(KvError::NoSpace { needed: 3, available: 1 }));
        check(&kv);
    }

    #[test]
    fn no_space_changes_nothing() {
        let mut kv = KvBlocks::new(3, 4).unwrap();
        kv.allocate(1, &prompt(8, 0)).unwrap();
        let before = kv.stats();
        assert_eq!(kv.allocate(2, &prompt(8, 50)), Err(KvError::NoSpace { needed: 2, available: 1 }));
        assert_eq!(kv.extend(1, 20), Err(KvError::NoSpace { needed: 3, available: 1 }));
        assert_eq!(kv.stats(), before);
        assert_eq!(kv.block_table(1).unwrap().len(), 2);
        assert!(kv.block_table(2).is_none());
        assert_eq!(kv.allocate(1, &prompt(1, 0)), Err(KvError::Duplicate(1)));
        assert!(matches!(kv.allocate(5, &[]), Err(KvError::Invalid { .. })));
        assert_eq!(kv.release(9), Err(KvError::UnknownSeq(9)));
        check(&kv);
    }

    #[test]
    fn generated_tokens_become_reusable_once_computed() {
        let mut kv = KvBlocks::new(8, 4).unwrap();
        let p = prompt(6, 2);
        kv.allocate(1, &p).unwrap();
        kv.mark_computed(1, 6).unwrap();
        kv.push_tokens(1, &[40, 41, 42]).unwrap();
        kv.mark_computed(1, 8).unwrap();
        assert_eq!(kv.block_table(1).unwrap().len(), 3);
        // The next turn of an agent: the previous prompt and answer, then more.
        let mut next = p.clone();
        next.extend([40, 41, 42, 43, 44]);
        assert_eq!(kv.cached_prefix_tokens(&next), 8);
        check(&kv);
    }

    /// Random operations with a fixed seed: the accounting holds after every one, and a reused
    /// prefix is always the same tokens.
    #[test]
    fn accounting_holds_under_random_operations() {
        let mut rng = StdRng::seed_from_u64(0x5eed);
        let mut kv = KvBlocks::new(40, 4).unwrap();
        let bases: Vec<Vec<u32>> = (0..4).map(|s| prompt(24, s * 1000)).collect();
        let mut live: Vec<(SeqId, Vec<u32>, usize)> = Vec::new();
        let (mut hits, mut no_space) = (0usize, 0usize);
        for id in 0..3000u64 {
            match rng.random_range(0..10) {
                0..=3 => {
                    let base = &bases[rng.random_range(0..bases.len())];
                    let mut p = base[..rng.random_range(1..=base.len())].to_vec();
                    p.extend((0..rng.random_range(0..10)).map(|_| rng.random_range(0..50u32)));
                    match kv.allocate(id, &p) {
                        Ok(a) => {
                            assert!(a.cached_tokens < p.len());
                            assert_eq!(a.blocks.len(), p.len().div_ceil(4));
                            hits += (a.cached_tokens > 0) as usize;
                            live.push((id, p, a.cached_tokens));
                        }
                        Err(KvError::NoSpace { .. }) => no_space += 1,
                        Err(e) => panic!("{e}"),
                    }
                }
                4..=5 if !live.is_empty() => {
                    let i = rng.random_range(0..live.len());
                    let (seq, toks, computed) = &mut live[i];
                    *computed = rng.random_range(*computed..=toks.len());
                    kv.mark_computed(*seq, *computed).unwrap();
                }
                6 if !live.is_empty() => {
                    let i = rng.random_range(0..live.len());
                    let (seq, toks, computed) = &mut live[i];
                    let t = rng.random_range(0..50u32);
                    if kv.push_tokens(*seq, &[t]).is_ok() {
                        toks.push(t);
                        *computed = toks.len();
                        kv.mark_computed(*seq, *computed).unwrap();
                    }
                }
                _ if !live.is_empty() => {
                    let (seq, ..) = live.swap_remove(rng.random_range(0..live.len()));
                    kv.release(seq).unwrap();
                }
                _ => {}
            }
            check(&kv);
            // Every registered block holds the tokens its key names.
            for (seq, toks, _) in &live {
                let table = kv.block_table(*seq).unwrap();
                assert!(table.len() * 4 >= toks.len());
                for (i, &b) in table.iter().enumerate() {
                    if let Some(r) = &kv.blocks[b as usize].reg {
                        assert_eq!(*r.tokens, toks[i * 4..(i + 1) * 4], "seq {seq} block {i}");
                    }
                }
            }
        }
        assert!(hits > 100 && no_space > 10, "the loop must exercise reuse ({hits}) and a full cache ({no_space})");
        for (seq, ..) in live {
            kv.release(seq).unwrap();
        }
        assert_eq!(kv.stats().used, 0);
        check(&kv);
    }
}
