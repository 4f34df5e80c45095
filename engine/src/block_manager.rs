//! KV block ownership: the free pool, reference counts, and the prefix cache.
//!
//! A block is in exactly one of three states:
//! - **in use**: reference count ≥ 1 (one per sequence whose block table holds it);
//! - **cached**: count 0 but its contents are a known full block of tokens (it has a hash), kept
//!   for reuse and evicted least recently used when a free block is needed;
//! - **free**: count 0 and no contents worth keeping.
//!
//! A full block is named by the hash of (its parent block's hash, its token ids), so equal
//! hashes mean equal whole prefixes, not just equal blocks. `models::KvStore` holds the data;
//! this type only decides who owns which block.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

/// Identifies the contents of a full block and every block before it.
pub type BlockHash = u64;

/// The hash of a full block given its parent's hash (`None` for the first block).
pub fn block_hash(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    // SipHash with fixed keys: stable within and across processes of one build.
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// The hashes of every full block of `tokens`, in order.
pub fn prefix_hashes(tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
    let mut out = Vec::with_capacity(tokens.len() / block_size);
    let mut parent = None;
    for chunk in tokens.chunks_exact(block_size) {
        let h = block_hash(parent, chunk);
        out.push(h);
        parent = Some(h);
    }
    out
}

#[derive(Debug)]
pub struct BlockManager {
    refs: Vec<u32>,
    /// The content hash of blocks that hold a registered full block.
    hash_of: Vec<Option<BlockHash>>,
    /// Registered full blocks by content.
    by_hash: HashMap<BlockHash, u32>,
    /// Blocks with no contents, taken first.
    free: Vec<u32>,
    /// Cached blocks with count 0, by last use (a logical clock): the first is evicted first.
    evictable: BTreeMap<u64, u32>,
    /// Each evictable block's key in `evictable`.
    evictable_at: HashMap<u32, u64>,
    clock: u64,
    caching: bool,
}

impl BlockManager {
    pub fn new(num_blocks: usize, caching: bool) -> Self {
        Self {
            refs: vec![0; num_blocks],
            hash_of: vec![None; num_blocks],
            by_hash: HashMap::new(),
            // Popped from the end: block 0 first.
            free: (0..num_blocks as u32).rev().collect(),
            evictable: BTreeMap::new(),
            evictable_at: HashMap::new(),
            clock: 0,
            caching,
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.refs.len()
    }

    /// Blocks that can be handed out now: free plus cached-but-unused.
    pub fn num_available(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Blocks some sequence holds.
    pub fn num_in_use(&self) -> usize {
        self.num_blocks() - self.num_available()
    }

    /// Registered full blocks (in use or not).
    pub fn num_cached(&self) -> usize {
        self.by_hash.len()
    }

    /// Takes one block: a free one, else the least recently used cached one (forgetting its
    /// contents). `None` when every block is in use.
    pub fn allocate(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.evictable.pop_first()?;
                self.evictable_at.remove(&b);
                if let Some(h) = self.hash_of[b as usize].take() {
                    self.by_hash.remove(&h);
                }
                b
            }
        };
        debug_assert_eq!(self.refs[b as usize], 0);
        self.refs[b as usize] = 1;
        Some(b)
    }

    /// The longest run of cached blocks matching `hashes` from the start, each now held once
    /// more by the caller.
    pub fn acquire_prefix(&mut self, hashes: &[BlockHash]) -> Vec<u32> {
        if !self.caching {
            return Vec::new();
        }
        let mut out = Vec::new();
        for h in hashes {
            let Some(&b) = self.by_hash.get(h) else { break };
            if self.refs[b as usize] == 0 {
                let at = self
                    .evictable_at
                    .remove(&b)
                    .expect("unused cached block is evictable");
                self.evictable.remove(&at);
            }
            self.refs[b as usize] += 1;
            out.push(b);
        }
        out
    }

    /// Holds an in-use block once more (another sequence's table now has it too).
    pub fn share(&mut self, b: u32) {
        assert!(self.refs[b as usize] > 0, "sharing an unowned block {b}");
        self.refs[b as usize] += 1;
    }

    /// Records that in-use block `b` now holds the full block named `h`. If another block
    /// already holds those contents, `b` stays anonymous (it is freed, not cached, later).
    pub fn register(&mut self, b: u32, h: BlockHash) {
        if !self.caching || self.hash_of[b as usize].is_some() {
            return;
        }
        if let std::collections::hash_map::Entry::Vacant(e) = self.by_hash.entry(h) {
            e.insert(b);
            self.hash_of[b as usize] = Some(h);
        }
    }

    /// Drops one hold on each block, last block first, so that a sequence's tail is evicted
    /// before its head (the head is the part other prompts are likeliest to share).
    pub fn release(&mut self, blocks: &[u32]) {
        for &b in blocks.iter().rev() {
            let r = &mut self.refs[b as usize];
            assert!(*r > 0, "releasing unowned block {b}");
            *r -= 1;
            if *r == 0 {
                if self.hash_of[b as usize].is_some() {
                    self.clock += 1;
                    self.evictable.insert(self.clock, b);
                    self.evictable_at.insert(b, self.clock);
                } else {
                    self.free.push(b);
                }
            }
        }
    }

    /// How many of `hashes` (from the start) are cached now, without taking them.
    pub fn cached_prefix_len(&self, hashes: &[BlockHash]) -> usize {
        if !self.caching {
            return 0;
        }
        hashes
            .iter()
            .take_while(|h| self.by_hash.contains_key(h))
            .count()
    }

    /// Of the first `n` cached blocks matching `hashes`, how many are unused (acquiring them
    /// takes them out of the available pool).
    pub fn unused_in_prefix(&self, hashes: &[BlockHash], n: usize) -> usize {
        hashes[..n]
            .iter()
            .filter(|h| self.refs[self.by_hash[h] as usize] == 0)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_until_empty_then_release_returns_blocks() {
        let mut bm = BlockManager::new(3, true);
        let got: Vec<u32> = (0..3).map(|_| bm.allocate().unwrap()).collect();
        assert_eq!(got, [0, 1, 2]);
        assert_eq!(bm.allocate(), None);
        assert_eq!(bm.num_in_use(), 3);
        bm.release(&got);
        assert_eq!(bm.num_available(), 3);
    }

    #[test]
    fn cached_blocks_are_reused_by_prefix_and_evicted_lru() {
        let mut bm = BlockManager::new(4, true);
        let hashes = prefix_hashes(&[1, 2, 3, 4, 5, 6, 7], 2); // three full blocks
        assert_eq!(hashes.len(), 3);
        let owned: Vec<u32> = (0..3).map(|_| bm.allocate().unwrap()).collect();
        for (b, h) in owned.iter().zip(&hashes) {
            bm.register(*b, *h);
        }
        bm.release(&owned);
        assert_eq!(bm.num_available(), 4);
        assert_eq!(bm.num_cached(), 3);

        // A prompt sharing the first two blocks gets them back.
        let other = prefix_hashes(&[1, 2, 3, 4, 9, 9], 2);
        assert_eq!(bm.cached_prefix_len(&other), 2);
        assert_eq!(bm.unused_in_prefix(&other, 2), 2);
        let hit = bm.acquire_prefix(&other);
        assert_eq!(hit, owned[..2]);
        assert_eq!(bm.num_in_use(), 2);

        // The free block goes first, then the least recently released cached one: the third
        // (released first, since release walks the tail first).
        assert_eq!(bm.allocate(), Some(3));
        assert_eq!(bm.allocate(), Some(owned[2]));
        assert_eq!(bm.num_cached(), 2);
        assert_eq!(bm.allocate(), None);
    }

    #[test]
    fn a_duplicate_block_stays_anonymous() {
        let mut bm = BlockManager::new(2, true);
        let h = block_hash(None, &[7, 7]);
        let (a, b) = (bm.allocate().unwrap(), bm.allocate().unwrap());
        bm.register(a, h);
        bm.register(b, h);
        bm.release(&[a, b]);
        assert_eq!(bm.num_cached(), 1);
        // b went to the free list, a to the evictable set.
        assert_eq!(bm.allocate(), Some(b));
    }

    #[test]
    fn hashes_name_whole_prefixes() {
        assert_ne!(
            prefix_hashes(&[1, 2, 3, 4], 2)[1],
            prefix_hashes(&[9, 9, 3, 4], 2)[1]
        );
        assert_eq!(prefix_hashes(&[1, 2, 3], 2), prefix_hashes(&[1, 2, 4], 2));
    }

    #[test]
    fn caching_off_never_hits() {
        let mut bm = BlockManager::new(2, false);
        let h = prefix_hashes(&[1, 2], 2);
        let a = bm.allocate().unwrap();
        bm.register(a, h[0]);
        bm.release(&[a]);
        assert_eq!(bm.acquire_prefix(&h), Vec::<u32>::new());
        assert_eq!(bm.num_cached(), 0);
    }

    #[test]
    fn shared_blocks_survive_until_the_last_release() {
        let mut bm = BlockManager::new(1, true);
        let a = bm.allocate().unwrap();
        bm.share(a);
        bm.release(&[a]);
        assert_eq!(bm.num_in_use(), 1);
        bm.release(&[a]);
        assert_eq!(bm.num_in_use(), 0);
    }
}
