//! A batch of token rows from one or more sequences, as every backend receives it.
//!
//! Rows are grouped in chunks: a chunk is a run of consecutive positions of one sequence (a
//! whole prompt, a slice of a long prompt under chunked prefill, or the one token a decode
//! step adds). A chunk's tokens attend to every earlier position of their sequence already in
//! the KV cache and to the chunk's earlier rows.
//!
//! The KV cache is paged: a sequence's positions live in fixed-size blocks listed by its block
//! table (position p in row `p % block_size` of block `table[p / block_size]`), so sequences that
//! share a prompt prefix can share its blocks. Each chunk carries its sequence's table, copied
//! into the batch's flat [`Batch::block_tables`].
//!
//! With the window-only layout (a batch made by [`Batch::with_ring`]) the sliding-window layers
//! keep a ring of `ring_blocks` (R) blocks per sequence instead: each chunk also carries a window
//! table, entry for entry beside its table in [`Batch::window_tables`], entry i = ring · R +
//! i mod R, so the windowed layers address position p through `window_table[p / block_size]` as
//! the others do through theirs.

use crate::model::ModelError;

/// One run of consecutive positions of one sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Where the sequence's block table starts in [`Batch::block_tables`].
    pub table: u32,
    /// Entries of the block table (they cover at least [`Chunk::end_pos`] positions).
    pub table_len: u32,
    /// Position of the chunk's first token in its sequence.
    pub start_pos: u32,
    pub len: u32,
    /// Index of the chunk's first row in the batch.
    pub first_row: u32,
}

impl Chunk {
    /// One past the last position this chunk writes.
    pub fn end_pos(&self) -> u64 {
        self.start_pos as u64 + self.len as u64
    }
}

/// Which rows of a chunk the caller wants logits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    All,
}

/// An empty batch is `Batch::new(block_size)`; `Default` gives one without a block size, which
/// refuses every chunk (backends keep one as "no batch yet").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// Positions per KV block: a power of two.
    pub block_size: u32,
    pub tokens: Vec<u32>,
    /// Position of each row in its sequence.
    pub positions: Vec<u32>,
    /// Every chunk's block table, one after another.
    pub block_tables: Vec<u32>,
    pub chunks: Vec<Chunk>,
    /// Rows whose logits are computed, in order; the logits come back in this order.
    pub logit_rows: Vec<u32>,
    /// Blocks of each sequence's ring in the windowed layers' cache; 0: no window-only layout.
    pub ring_blocks: u32,
    /// With a ring: every chunk's window table, entry for entry beside [`Batch::block_tables`]
    /// (same offsets and lengths); empty without.
    pub window_tables: Vec<u32>,
}

impl Batch {
    /// An empty batch over a KV cache of blocks of `block_size` positions (a power of two).
    pub fn new(block_size: u32) -> Result<Batch, ModelError> {
        if !block_size.is_power_of_two() {
            return Err(ModelError::Request(format!("KV block size {block_size} is not a power of two")));
        }
        Ok(Batch { block_size, ..Batch::default() })
    }

    /// An empty batch whose windowed layers keep rings of `ring_blocks` blocks per sequence
    /// (chunks are added with [`Batch::push_in_ring`]).
    pub fn with_ring(block_size: u32, ring_blocks: u32) -> Result<Batch, ModelError> {
        if ring_blocks == 0 {
            return Err(ModelError::Request("a ring of 0 KV blocks".into()));
        }
        Ok(Batch { ring_blocks, ..Batch::new(block_size)? })
    }

    /// Adds `tokens` of the sequence whose block table is `blocks`, starting at position
    /// `start_pos`. The table must cover the chunk's last position.
    pub fn push(&mut self, blocks: &[u32], start_pos: u32, tokens: &[u32], logits: Logits) -> Result<(), ModelError> {
        if self.ring_blocks != 0 {
            return Err(ModelError::Request("the batch has window-only layers: a chunk needs its ring (push_in_ring)".into()));
        }
        self.push_chunk(blocks, None, start_pos, tokens, logits)
    }

    /// [`Batch::push`] for a batch made by [`Batch::with_ring`]: the sequence's windowed layers
    /// use ring `ring` (blocks `ring · R .. (ring + 1) · R` of their cache).
    pub fn push_in_ring(&mut self, blocks: &[u32], ring: u32, start_pos: u32, tokens: &[u32], logits: Logits) -> Result<(), ModelError> {
        if self.ring_blocks == 0 {
            return Err(ModelError::Request("the batch has no window-only layers (make it with Batch::with_ring)".into()));
        }
        self.push_chunk(blocks, Some(ring), start_pos, tokens, logits)
    }

    fn push_chunk(&mut self, blocks: &[u32], ring: Option<u32>, start_pos: u32, tokens: &[u32], logits: Logits) -> Result<(), ModelError> {
        if self.block_size == 0 {
            return Err(ModelError::Request("the batch has no KV block size (make it with Batch::new)".into()));
        }
        if tokens.is_empty() {
            return Err(ModelError::Request("a chunk needs at least one token".into()));
        }
        let first_row = u32::try_from(self.tokens.len()).map_err(|_| ModelError::Request("batch too large".into()))?;
        let len = u32::try_from(tokens.len()).map_err(|_| ModelError::Request("chunk too large".into()))?;
        let end = start_pos.checked_add(len).ok_or_else(|| ModelError::Request(format!("positions {start_pos}+{len} overflow")))?;
        let covered = blocks.len() as u64 * self.block_size as u64;
        if covered < end as u64 {
            return Err(ModelError::Request(format!(
                "a block table of {} blocks of {} positions covers {covered} positions, the chunk ends at position {end}",
                blocks.len(),
                self.block_size
            )));
        }
        let table = u32::try_from(self.block_tables.len()).map_err(|_| ModelError::Request("batch block tables too large".into()))?;
        let table_len = u32::try_from(blocks.len()).map_err(|_| ModelError::Request("block table too large".into()))?;
        if table.checked_add(table_len).is_none() {
            return Err(ModelError::Request("batch block tables too large".into()));
        }
        if let Some(ring) = ring {
            let r = self.ring_blocks as u64;
            let last = (ring as u64 + 1) * r - 1;
            if last > u32::MAX as u64 {
                return Err(ModelError::Request(format!("ring {ring} of {r} blocks: block ids past u32")));
            }
            self.window_tables.extend((0..blocks.len() as u64).map(|i| (ring as u64 * r + i % r) as u32));
        }
        self.block_tables.extend_from_slice(blocks);
        self.chunks.push(Chunk { table, table_len, start_pos, len, first_row });
        self.tokens.extend_from_slice(tokens);
        self.positions.extend(start_pos..end);
        let rows = first_row..first_row + len;
        match logits {
            Logits::None => {}
            Logits::Last => self.logit_rows.push(rows.end - 1),
            Logits::All => self.logit_rows.extend(rows),
        }
        Ok(())
    }

    /// Chunk `c`'s block table (empty if `c` does not index this batch's tables).
    pub fn table(&self, c: &Chunk) -> &[u32] {
        let start = c.table as usize;
        self.block_tables.get(start..start + c.table_len as usize).unwrap_or(&[])
    }

    /// Chunk `c`'s window table (empty without a ring, or if `c` does not index this batch's
    /// tables).
    pub fn window_table(&self, c: &Chunk) -> &[u32] {
        let start = c.table as usize;
        self.window_tables.get(start..start + c.table_len as usize).unwrap_or(&[])
    }

    /// Chunk `c`'s table for a layer: its window table for a windowed layer (`ring`), else its
    /// block table.
    pub fn layer_table(&self, c: &Chunk, ring: bool) -> &[u32] {
        if ring { self.window_table(c) } else { self.table(c) }
    }

    /// [`Batch::window_rows`] for a windowed layer (`ring`), else [`Batch::physical_rows`].
    pub fn layer_rows(&self, ring: bool) -> Vec<Option<u64>> {
        if ring { self.window_rows() } else { self.physical_rows() }
    }

    /// The KV cache row of each row of the batch: `block · block_size + pos % block_size`, its
    /// block from its chunk's table; `None` where the table does not reach (not for a batch
    /// built by [`Batch::push`]).
    pub fn physical_rows(&self) -> Vec<Option<u64>> {
        self.rows_through(Batch::table)
    }

    /// [`Batch::physical_rows`] in the windowed layers' cache, through the window tables (all
    /// `None` without a ring).
    pub fn window_rows(&self) -> Vec<Option<u64>> {
        self.rows_through(Batch::window_table)
    }

    fn rows_through(&self, table_of: impl for<'b> Fn(&'b Batch, &Chunk) -> &'b [u32]) -> Vec<Option<u64>> {
        let bs = self.block_size.max(1) as u64;
        let mut rows = vec![None; self.tokens.len()];
        for c in &self.chunks {
            let table = table_of(self, c);
            for i in 0..c.len as usize {
                let pos = c.start_pos as u64 + i as u64;
                if let (Some(&block), Some(r)) = (table.get((pos / bs) as usize), rows.get_mut(c.first_row as usize + i)) {
                    *r = Some(block as u64 * bs + pos % bs);
                }
            }
        }
        rows
    }

    pub fn rows(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_record_rows_positions_tables_and_logit_rows() {
        let mut b = Batch::new(4).unwrap();
        b.push(&[7], 0, &[5, 6, 7], Logits::Last).unwrap();
        b.push(&[3, 0, 9], 10, &[8], Logits::All).unwrap();
        b.push(&[2, 1], 4, &[9, 9], Logits::None).unwrap();
        assert_eq!(b.positions, vec![0, 1, 2, 10, 4, 5]);
        assert_eq!(b.block_tables, vec![7, 3, 0, 9, 2, 1]);
        assert_eq!(b.chunks[1], Chunk { table: 1, table_len: 3, start_pos: 10, len: 1, first_row: 3 });
        assert_eq!(b.table(&b.chunks[2]), &[2, 1]);
        assert_eq!(b.logit_rows, vec![2, 3]);
        // Position 10 is row 2 of block 9; positions 4 and 5 rows 0 and 1 of block 1.
        assert_eq!(b.physical_rows(), vec![Some(28), Some(29), Some(30), Some(38), Some(4), Some(5)]);
        assert!(b.push(&[0], 0, &[], Logits::Last).is_err());
        assert!(b.push(&[0], u32::MAX, &[1, 2], Logits::Last).is_err());
    }

    #[test]
    fn a_table_must_cover_the_chunks_end() {
        let mut b = Batch::new(4).unwrap();
        // 2 blocks of 4 cover positions 0..8: a chunk ending at 8 fits, one ending at 9 does not.
        b.push(&[0, 1], 5, &[1, 2, 3], Logits::Last).unwrap();
        let e = b.push(&[0, 1], 5, &[1, 2, 3, 4], Logits::Last).unwrap_err().to_string();
        assert!(e.contains("2 blocks of 4 positions covers 8 positions, the chunk ends at position 9"), "{e}");
        assert_eq!(b.rows(), 3, "a refused chunk adds nothing");
        assert!(Batch::new(12).is_err() && Batch::new(0).is_err());
        assert!(Batch::default().push(&[0], 0, &[1], Logits::Last).is_err());
    }

    #[test]
    fn window_tables_map_each_entry_into_the_sequences_ring() {
        // Rings of 3 blocks of 4 positions; sequence A in ring 2 (blocks 6, 7, 8), B in ring 0.
        let mut b = Batch::with_ring(4, 3).unwrap();
        let a: Vec<u32> = (10..17).collect(); // 7 blocks: positions 0..28
        b.push_in_ring(&a, 2, 9, &[1, 2, 3, 4, 5], Logits::Last).unwrap(); // positions 9..14
        b.push_in_ring(&[40, 41], 0, 7, &[1], Logits::Last).unwrap(); // decode at 7
        b.push_in_ring(&a, 2, 25, &[1, 2, 3], Logits::None).unwrap(); // positions 25..28
        assert_eq!(b.window_tables.len(), b.block_tables.len());
        assert_eq!(b.window_table(&b.chunks[0]), &[6, 7, 8, 6, 7, 8, 6]);
        assert_eq!(b.window_table(&b.chunks[1]), &[0, 1]);
        assert_eq!(b.window_table(&b.chunks[2]), b.window_table(&b.chunks[0]), "same ring, same table");
        assert_eq!(b.table(&b.chunks[1]), &[40, 41]);
        // Position 9: logical block 2, ring slot 2 (block 8), row 1; 12: block 3 -> slot 0 (6).
        // Position 25: block 6 -> slot 0 (block 6), row 1.
        let want = [33, 34, 35, 24, 25, 7, 25, 26, 27];
        assert_eq!(b.window_rows(), want.map(Some).to_vec());
        assert_eq!(b.physical_rows()[..2], [Some(12 * 4 + 1), Some(12 * 4 + 2)]);
        // Chunks need their ring in a ring batch, and only there.
        assert!(b.push(&a, 0, &[1], Logits::Last).unwrap_err().to_string().contains("push_in_ring"));
        assert!(Batch::new(4).unwrap().push_in_ring(&a, 0, 0, &[1], Logits::Last).is_err());
        assert!(Batch::with_ring(4, 0).is_err() && Batch::with_ring(3, 2).is_err());
        assert!(Batch::with_ring(4, 1 << 16).unwrap().push_in_ring(&a, 1 << 16, 0, &[1], Logits::Last).is_err(), "ids past u32");
        let plain = Batch::new(4).unwrap();
        assert!(plain.window_rows().is_empty() && plain.window_tables.is_empty());
    }
}
