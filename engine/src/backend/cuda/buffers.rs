//! Device buffers reused across ops, layers and batches, so that a steady stream of batches of
//! one shape allocates nothing.
//!
//! - [`Pool`]: activations. An op takes a buffer ([`Lease`]); dropping the activation hands it
//!   back. Every layer runs the same ops on the same shapes, so from the second layer on every
//!   take is served from the pool. Reuse is safe without synchronisation: the backend has one
//!   stream, so a later kernel writing a returned buffer is ordered after every earlier reader.
//! - [`Grow`]: one scratch buffer per purpose (q8_1 inputs, router outputs, expert
//!   intermediates), reallocated only when a batch needs more than it holds.
//!
//! Both count their allocations ([`AllocCounter`]): the tests check that a repeated batch
//! makes none.

use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use brink_kernels::cuda::{Gpu, GpuError};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DeviceRepr};

/// Device allocations made by the backend's buffers since it was created, and how many times
/// buffers were given back to the driver: a captured graph holds the addresses of the buffers
/// it was captured with, so it is replayed only while no buffer has been freed since.
#[derive(Clone, Debug, Default)]
pub(crate) struct AllocCounter {
    allocs: Arc<AtomicU64>,
    frees: Arc<AtomicU64>,
}

impl AllocCounter {
    pub(crate) fn get(&self) -> u64 {
        self.allocs.load(Ordering::Relaxed)
    }

    /// Times buffers were freed (a scratch buffer replaced by a larger one, the pool trimmed,
    /// the KV cache replaced).
    pub(crate) fn frees(&self) -> u64 {
        self.frees.load(Ordering::Relaxed)
    }

    pub(crate) fn freed(&self) {
        self.frees.fetch_add(1, Ordering::Relaxed);
    }

    fn alloc<T: DeviceRepr>(&self, gpu: &Gpu, len: usize) -> Result<CudaSlice<T>, GpuError> {
        self.allocs.fetch_add(1, Ordering::Relaxed);
        gpu.alloc(len)
    }
}

/// Index of the smallest capacity that holds `len` elements (best fit keeps the large buffers
/// for the large requests).
pub(crate) fn best_fit(capacities: impl IntoIterator<Item = usize>, len: usize) -> Option<usize> {
    capacities.into_iter().enumerate().filter(|&(_, cap)| cap >= len).min_by_key(|&(_, cap)| cap).map(|(i, _)| i)
}

type FreeList<T> = Arc<Mutex<Vec<CudaSlice<T>>>>;

fn lock<T>(free: &Mutex<Vec<T>>) -> std::sync::MutexGuard<'_, Vec<T>> {
    // A panic while the list was held leaves it valid (a push or a remove): keep using it.
    free.lock().unwrap_or_else(|p| p.into_inner())
}

/// Buffers handed out as [`Lease`]s and returned when the lease drops.
pub(crate) struct Pool<T: DeviceRepr> {
    free: FreeList<T>,
    allocs: AllocCounter,
}

impl<T: DeviceRepr> Pool<T> {
    pub(crate) fn new(allocs: AllocCounter) -> Self {
        Pool { free: Arc::new(Mutex::new(Vec::new())), allocs }
    }

    /// A buffer of at least `len` elements (uninitialised: the op writes it).
    pub(crate) fn take(&self, gpu: &Gpu, len: usize) -> Result<Lease<T>, GpuError> {
        let len = len.max(1);
        let reused = {
            let mut free = lock(&self.free);
            best_fit(free.iter().map(|b| b.len()), len).map(|i| free.swap_remove(i))
        };
        let buf = match reused {
            Some(b) => b,
            None => self.allocs.alloc(gpu, len)?,
        };
        Ok(Lease { buf: ManuallyDrop::new(buf), home: self.free.clone() })
    }

    /// Frees the buffers not in use: a larger batch needs larger ones, and keeping the small
    /// ones would hold memory no later request of that size asks for.
    pub(crate) fn trim(&self) {
        let mut free = lock(&self.free);
        if !free.is_empty() {
            free.clear();
            self.allocs.freed();
        }
    }
}

/// A pooled buffer; it goes back to its pool when dropped.
pub(crate) struct Lease<T: DeviceRepr> {
    buf: ManuallyDrop<CudaSlice<T>>,
    home: FreeList<T>,
}

impl<T: DeviceRepr> Deref for Lease<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.buf
    }
}

impl<T: DeviceRepr> DerefMut for Lease<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.buf
    }
}

impl<T: DeviceRepr> Drop for Lease<T> {
    fn drop(&mut self) {
        // SAFETY: `buf` is taken exactly once, here, and the lease is not used afterwards.
        let buf = unsafe { ManuallyDrop::take(&mut self.buf) };
        lock(&self.home).push(buf);
    }
}

/// A scratch buffer that grows to the largest request it has seen.
///
/// A q8_1 scratch also records which activation rows it currently holds the quantization of
/// ([`ActRows`], set by whoever writes it: `dense::quantize_rows` or the norm that emits q8_1),
/// so a projection of the same rows reuses it instead of quantizing again (`dense::ensure_q8_1`).
/// The record is dropped when the buffer is reallocated, and the backend drops it at the entry
/// of every op other than those that read it (the rule is in `cuda/mod.rs`, `CudaBackend::stale_q8_1`).
pub(crate) struct Grow<T: DeviceRepr> {
    buf: CudaSlice<T>,
    allocs: AllocCounter,
    holds: Option<ActRows>,
}

/// Rows of an activation as a q8_1 scratch records them: the activation's id (unique for the
/// backend's lifetime: a pooled buffer handed out again is a new activation), rows and width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ActRows {
    pub id: u64,
    pub rows: usize,
    pub width: usize,
}

impl ActRows {
    /// The first `rows` rows of width `width` of `x`.
    pub(crate) fn of(x: &CudaAct, rows: usize, width: usize) -> Self {
        ActRows { id: x.id, rows, width }
    }
}

impl<T: DeviceRepr> Grow<T> {
    pub(crate) fn new(gpu: &Gpu, allocs: &AllocCounter) -> Result<Self, GpuError> {
        Ok(Grow { buf: allocs.alloc(gpu, 1)?, allocs: allocs.clone(), holds: None })
    }

    /// Makes room for `len` elements (reallocating drops the contents and their record).
    pub(crate) fn ensure(&mut self, gpu: &Gpu, len: usize) -> Result<(), GpuError> {
        if self.buf.len() < len {
            self.holds = None;
            self.buf = self.allocs.alloc(gpu, len)?;
            self.allocs.freed();
        }
        Ok(())
    }

    /// Records that the buffer now holds the quantization of `rows` (`None`: of nothing known).
    pub(crate) fn set_holds(&mut self, rows: Option<ActRows>) {
        self.holds = rows;
    }

    /// Whether the buffer holds the quantization of exactly `rows`.
    pub(crate) fn holds(&self, rows: &ActRows) -> bool {
        self.holds.as_ref() == Some(rows)
    }
}

impl<T: DeviceRepr> Deref for Grow<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.buf
    }
}

impl<T: DeviceRepr> DerefMut for Grow<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.buf
    }
}

/// Activations: `[rows, width]` f32 in a pooled buffer (which may be longer).
pub struct CudaAct {
    pub(crate) buf: Lease<f32>,
    rows: usize,
    width: usize,
    /// Names this activation in a q8_1 scratch's record ([`ActRows`]).
    id: u64,
}

/// Ids of activations, never reused.
static NEXT_ACT_ID: AtomicU64 = AtomicU64::new(1);

impl CudaAct {
    pub(crate) fn new(buf: Lease<f32>, rows: usize, width: usize) -> Self {
        debug_assert!(buf.len() >= rows * width);
        CudaAct { buf, rows, width, id: NEXT_ACT_ID.fetch_add(1, Ordering::Relaxed) }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn len(&self) -> usize {
        self.rows * self.width
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn view(&self) -> CudaView<'_, f32> {
        self.buf.slice(0..self.len())
    }

    pub(crate) fn view_mut(&mut self) -> CudaViewMut<'_, f32> {
        let len = self.len();
        self.buf.slice_mut(0..len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_takes_the_smallest_buffer_that_holds_the_request() {
        assert_eq!(best_fit([100, 10, 40, 40], 30), Some(2));
        assert_eq!(best_fit([100, 10, 40], 10), Some(1));
        assert_eq!(best_fit([100, 10, 40], 100), Some(0));
        assert_eq!(best_fit([100, 10, 40], 101), None);
        assert_eq!(best_fit([], 1), None);
    }
}
