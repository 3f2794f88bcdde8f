//! A batch of token rows from one or more sequences, as every backend receives it.
//!
//! Rows are grouped in chunks: a chunk is a run of consecutive positions of one sequence (a
//! whole prompt, a slice of a long prompt under chunked prefill, or the one token a decode
//! step adds). A chunk's tokens attend to every earlier position of their sequence already in
//! the KV cache and to the chunk's earlier rows.

use crate::model::ModelError;

/// One run of consecutive positions of one sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// The sequence's KV-cache slot.
    pub slot: u32,
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

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    pub tokens: Vec<u32>,
    /// Position of each row in its sequence.
    pub positions: Vec<u32>,
    /// KV slot of each row.
    pub slots: Vec<u32>,
    pub chunks: Vec<Chunk>,
    /// Rows whose logits are computed, in order; the logits come back in this order.
    pub logit_rows: Vec<u32>,
}

impl Batch {
    /// Adds `tokens` of the sequence in `slot`, starting at position `start_pos`.
    pub fn push(&mut self, slot: u32, start_pos: u32, tokens: &[u32], logits: Logits) -> Result<(), ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::Request("a chunk needs at least one token".into()));
        }
        let first_row = u32::try_from(self.tokens.len()).map_err(|_| ModelError::Request("batch too large".into()))?;
        let len = u32::try_from(tokens.len()).map_err(|_| ModelError::Request("chunk too large".into()))?;
        if start_pos.checked_add(len).is_none() {
            return Err(ModelError::Request(format!("positions {start_pos}+{len} overflow")));
        }
        self.chunks.push(Chunk { slot, start_pos, len, first_row });
        for (i, &t) in tokens.iter().enumerate() {
            self.tokens.push(t);
            self.positions.push(start_pos + i as u32);
            self.slots.push(slot);
        }
        let rows = first_row..first_row + len;
        match logits {
            Logits::None => {}
            Logits::Last => self.logit_rows.push(rows.end - 1),
            Logits::All => self.logit_rows.extend(rows),
        }
        Ok(())
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
    fn chunks_record_rows_positions_and_logit_rows() {
        let mut b = Batch::default();
        b.push(0, 0, &[5, 6, 7], Logits::Last).unwrap();
        b.push(3, 10, &[8], Logits::All).unwrap();
        b.push(1, 4, &[9, 9], Logits::None).unwrap();
        assert_eq!(b.positions, vec![0, 1, 2, 10, 4, 5]);
        assert_eq!(b.slots, vec![0, 0, 0, 3, 1, 1]);
        assert_eq!(b.chunks[1], Chunk { slot: 3, start_pos: 10, len: 1, first_row: 3 });
        assert_eq!(b.logit_rows, vec![2, 3]);
        assert!(b.push(0, 0, &[], Logits::Last).is_err());
        assert!(b.push(0, u32::MAX, &[1, 2], Logits::Last).is_err());
    }
}
