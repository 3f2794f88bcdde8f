//! Device progress for the watchdog. Kernel launches return before the device runs them, so the
//! host's stage says only how far the *queue* got. After each layer's kernels the backend queues
//! a host callback (`cuLaunchHostFunc`) that records the layer on the progress board when the
//! device reaches it: after a hang, the board names the last layer the device finished, the one
//! after it being where it is stuck.
//!
//! Only a supervised engine (a shared board) queues them: each costs a few microseconds of
//! stream time per layer.

use std::ffi::c_void;
use std::sync::Arc;

use brink_kernels::cuda::{Gpu, error_name};
use cudarc::driver::result::stream::launch_host_function;

use super::fail;
use crate::model::BackendError;
use crate::monitor::Monitor;

struct LayerDone {
    monitor: Arc<Monitor>,
    layer: u32,
}

/// Runs on the driver's callback thread once the stream reaches it; must not call CUDA.
unsafe extern "C" fn on_layer_done(arg: *mut c_void) {
    // SAFETY: `arg` is the Box leaked by `queue_layer_done`, handed over exactly once.
    let done = unsafe { Box::from_raw(arg.cast::<LayerDone>()) };
    done.monitor.board().device_done(done.layer);
}

/// Queues the record "the device finished `layer`" behind the work queued so far.
pub(crate) fn queue_layer_done(gpu: &Gpu, monitor: &Arc<Monitor>, layer: u32) -> Result<(), BackendError> {
    let arg = Box::into_raw(Box::new(LayerDone { monitor: monitor.clone(), layer })).cast::<c_void>();
    // SAFETY: the stream is the backend's live stream; the callback takes ownership of `arg`.
    match unsafe { launch_host_function(gpu.stream().cu_stream(), on_layer_done, arg) } {
        Ok(()) => Ok(()),
        Err(e) => {
            // Not queued: the callback will never run, so the box is still ours to free.
            drop(unsafe { Box::from_raw(arg.cast::<LayerDone>()) });
            Err(fail(format!("queueing the progress callback after layer {layer}: {}", error_name(&e))))
        }
    }
}
