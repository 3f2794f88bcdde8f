//! Launch plans: the pure part of every kernel launch.
//!
//! A plan is a function `(problem shape, device limits) -> Result<Launch, PlanError>`. It is
//! built through [`Launch::checked`], which rejects any grid, block or shared-memory size the
//! device cannot take *before* anything reaches the driver, and it records how work items map
//! onto the grid ([`Cover`]) so that tests can prove every item is covered exactly once.
//!
//! The geometry rule the plans follow: an index that grows with tokens (tokens x top_k, padded
//! rows, quantize rows) goes on `grid.x` (limit 2^31-1) or into a grid-stride loop; `grid.y` and
//! `grid.z` carry only bounded quantities (column tiles, groups, heads).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::limits::DeviceLimits;

/// How the work items of one dimension of a problem are spread over the grid.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Cover {
    /// `items` cut into tiles of `per_block`; block `b` on `axis` owns items
    /// `[b * per_block, (b + 1) * per_block)`. Exactly once iff `grid[axis] == ceil(items / per_block)`.
    Tiles { axis: usize, items: u64, per_block: u64 },
    /// Every worker (a thread or a warp; `per_block` of them per block) walks
    /// `i = worker; i < items; i += workers` over the whole grid. Exactly once for any grid;
    /// the plan caps the grid so no block is idle.
    GridStride { items: u64, per_block: u64 },
    /// One block loops over all items (small problems: offsets of a few hundred experts).
    SingleBlock { items: u64 },
}

impl Cover {
    pub fn items(&self) -> u64 {
        match *self {
            Cover::Tiles { items, .. } | Cover::GridStride { items, .. } | Cover::SingleBlock { items } => items,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    pub kernel: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub shared_mem: u32,
    /// The problem shape, for error messages ("tokens=8192 top_k=8 n=768 k=2048").
    pub shape: String,
    pub cover: Vec<Cover>,
}

#[derive(thiserror::Error, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PlanError {
    #[error("{kernel}: grid.{axis} = {value} exceeds the device limit {limit} [{shape}]")]
    GridDim { kernel: String, axis: char, value: u64, limit: u32, shape: String },
    #[error("{kernel}: block {block:?} exceeds the device's block limits {limit:?} / {max_threads} threads [{shape}]")]
    BlockDim { kernel: String, block: [u32; 3], limit: [u32; 3], max_threads: u32, shape: String },
    #[error("{kernel}: needs {needed} B of shared memory per block, the device allows {limit} B [{shape}]")]
    SharedMem { kernel: String, needed: u64, limit: u32, shape: String },
    #[error("{kernel}: unsupported shape: {what} [{shape}]")]
    Unsupported { kernel: String, what: String, shape: String },
}

const AXES: [char; 3] = ['x', 'y', 'z'];

impl Launch {
    /// Builds a launch, checking it against the device's limits. Grid extents are taken as
    /// `u64` so that an overflowing product is caught here rather than wrapped.
    pub fn checked(
        kernel: &str,
        shape: impl fmt::Display,
        grid: [u64; 3],
        block: [u32; 3],
        shared_mem: u64,
        cover: Vec<Cover>,
        limits: &DeviceLimits,
    ) -> Result<Launch, PlanError> {
        let shape = shape.to_string();
        for (axis, (&value, &limit)) in grid.iter().zip(&limits.max_grid_dim).enumerate() {
            if value == 0 || value > limit as u64 {
                return Err(PlanError::GridDim { kernel: kernel.into(), axis: AXES[axis], value, limit, shape });
            }
        }
        let threads: u64 = block.iter().map(|&b| b as u64).product();
        if block.iter().zip(&limits.max_block_dim).any(|(&b, &l)| b == 0 || b > l) || threads > limits.max_threads_per_block as u64 {
            return Err(PlanError::BlockDim {
                kernel: kernel.into(),
                block,
                limit: limits.max_block_dim,
                max_threads: limits.max_threads_per_block,
                shape,
            });
        }
        if shared_mem > limits.max_shared_mem_per_block_optin as u64 {
            return Err(PlanError::SharedMem {
                kernel: kernel.into(),
                needed: shared_mem,
                limit: limits.max_shared_mem_per_block_optin,
                shape,
            });
        }
        Ok(Launch { kernel: kernel.into(), grid: grid.map(|g| g as u32), block, shared_mem: shared_mem as u32, shape, cover })
    }

    pub fn threads_per_block(&self) -> u64 {
        self.block.iter().map(|&b| b as u64).product()
    }

    pub fn blocks(&self) -> u64 {
        self.grid.iter().map(|&g| g as u64).product()
    }

    /// Checks that the recorded covers are consistent with the grid: every item of every
    /// covered dimension is owned exactly once and no block is idle.
    pub fn check_cover(&self) -> Result<(), String> {
        for c in &self.cover {
            match *c {
                Cover::Tiles { axis, items, per_block } => {
                    let want = items.div_ceil(per_block);
                    if self.grid[axis] as u64 != want {
                        return Err(format!(
                            "{}: grid.{} = {} but {} items in tiles of {} need {}",
                            self.kernel, AXES[axis], self.grid[axis], items, per_block, want
                        ));
                    }
                }
                Cover::GridStride { items, per_block } => {
                    // Exactly once by construction; an idle block would mean the cap is wrong.
                    if self.blocks() > items.div_ceil(per_block).max(1) {
                        return Err(format!(
                            "{}: {} blocks for {} items ({} workers per block) leaves blocks idle",
                            self.kernel,
                            self.blocks(),
                            items,
                            per_block
                        ));
                    }
                }
                Cover::SingleBlock { .. } => {
                    if self.blocks() != 1 {
                        return Err(format!("{}: single-block kernel launched with {} blocks", self.kernel, self.blocks()));
                    }
                }
            }
        }
        Ok(())
    }

    /// Counts how many times each item of cover `idx` is visited by simulating the mapping
    /// block by block (for small sizes: the property tests use it to show "exactly once").
    pub fn simulate_cover(&self, idx: usize) -> Vec<u32> {
        let c = &self.cover[idx];
        let items = c.items() as usize;
        let mut hits = vec![0u32; items];
        match *c {
            Cover::Tiles { axis, per_block, .. } => {
                for b in 0..self.grid[axis] as u64 {
                    for l in 0..per_block {
                        let i = b * per_block + l;
                        if (i as usize) < items {
                            hits[i as usize] += 1;
                        }
                    }
                }
            }
            Cover::GridStride { per_block, .. } => {
                let workers = self.blocks() * per_block;
                for w in 0..workers {
                    let mut i = w;
                    while (i as usize) < items {
                        hits[i as usize] += 1;
                        i += workers;
                    }
                }
            }
            Cover::SingleBlock { .. } => hits.iter_mut().for_each(|h| *h += 1),
        }
        hits
    }
}

impl fmt::Display for Launch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} grid=({},{},{}) block=({},{},{}) smem={} [{}]",
            self.kernel, self.grid[0], self.grid[1], self.grid[2], self.block[0], self.block[1], self.block[2], self.shared_mem, self.shape
        )
    }
}

/// Bytes of `len` elements of `elem` bytes, for [`require_bytes`].
pub fn bytes_of(len: usize, elem: usize) -> u64 {
    len as u64 * elem as u64
}

/// Refuses a launch whose buffers are smaller than it reads or writes: `(name, have, need)` in
/// bytes. A launch never goes out of bounds of what the caller handed in.
pub fn require_bytes(p: &Launch, needs: &[(&str, u64, u64)]) -> Result<(), PlanError> {
    match needs.iter().find(|(_, have, need)| have < need) {
        Some((name, have, need)) => Err(PlanError::Unsupported {
            kernel: p.kernel.clone(),
            what: format!("buffer {name} holds {have} B, the launch needs {need} B"),
            shape: p.shape.clone(),
        }),
        None => Ok(()),
    }
}

/// Blocks for a grid-stride loop over `items` with `per_block` workers per block: enough to
/// fill the device a few times over, never more than the items need, never past `grid.x`.
pub fn grid_stride_blocks(items: u64, per_block: u64, limits: &DeviceLimits) -> u64 {
    let threads_per_block = per_block.max(1);
    let fill = (limits.resident_threads() / threads_per_block.max(1)).max(1) * 4;
    items.div_ceil(per_block).clamp(1, fill.min(limits.max_grid_dim[0] as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_grid_z_past_limit() {
        let l = DeviceLimits::h200();
        let e = Launch::checked("k", "t", [1, 1, 65_536], [32, 1, 1], 0, vec![], &l).unwrap_err();
        assert!(matches!(e, PlanError::GridDim { axis: 'z', value: 65_536, .. }), "{e}");
        assert!(Launch::checked("k", "t", [1, 1, 65_535], [32, 1, 1], 0, vec![], &l).is_ok());
    }

    #[test]
    fn rejects_shared_memory_past_gb10_optin() {
        let need = 120 * 1024;
        assert!(Launch::checked("k", "t", [1, 1, 1], [128, 1, 1], need, vec![], &DeviceLimits::h200()).is_ok());
        let e = Launch::checked("k", "t", [1, 1, 1], [128, 1, 1], need, vec![], &DeviceLimits::gb10()).unwrap_err();
        assert!(matches!(e, PlanError::SharedMem { .. }));
    }

    #[test]
    fn rejects_oversized_block_and_empty_grid() {
        let l = DeviceLimits::gb10();
        assert!(matches!(Launch::checked("k", "t", [1, 1, 1], [1024, 2, 1], 0, vec![], &l), Err(PlanError::BlockDim { .. })));
        assert!(matches!(Launch::checked("k", "t", [0, 1, 1], [32, 1, 1], 0, vec![], &l), Err(PlanError::GridDim { .. })));
    }

    #[test]
    fn cover_simulation_counts_each_item_once() {
        let l = DeviceLimits::h200();
        let items = 1000;
        let launch = Launch::checked(
            "k",
            "t",
            [grid_stride_blocks(items, 8, &l), 1, 1],
            [256, 1, 1],
            0,
            vec![Cover::GridStride { items, per_block: 8 }],
            &l,
        )
        .unwrap();
        launch.check_cover().unwrap();
        assert!(launch.simulate_cover(0).iter().all(|&h| h == 1));
        let tiles =
            Launch::checked("k", "t", [16, 1, 1], [64, 1, 1], 0, vec![Cover::Tiles { axis: 0, items: 1000, per_block: 64 }], &l).unwrap();
        tiles.check_cover().unwrap();
        assert!(tiles.simulate_cover(0).iter().all(|&h| h == 1));
        let wrong =
            Launch::checked("k", "t", [17, 1, 1], [64, 1, 1], 0, vec![Cover::Tiles { axis: 0, items: 1000, per_block: 64 }], &l).unwrap();
        assert!(wrong.check_cover().is_err());
    }
}
