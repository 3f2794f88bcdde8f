//! The I/O side of the kernels: the device, its modules, and the checked launch.
//!
//! Everything here goes through cudarc with dynamic loading, so building needs no CUDA. A
//! missing `libcuda`/`libnvrtc` is detected before the first call (cudarc would panic).

pub mod compile;
pub mod graph;
pub mod probe;

pub use graph::{KernelOverlap, StepGraph};

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::sys::{CUstreamCaptureMode, CUstreamCaptureStatus};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, DriverError, LaunchArgs, LaunchConfig};
use serde::{Deserialize, Serialize};

use crate::launch::Launch;
use crate::limits::DeviceLimits;
use crate::sources::KernelSource;

pub use compile::CompileError;

#[derive(thiserror::Error, Debug)]
pub enum GpuError {
    #[error("no CUDA driver (libcuda.so) on this machine")]
    NoDriver,
    #[error("CUDA driver present but no usable GPU: {0}")]
    NoDevice(String),
    #[error("CUDA call {call} failed: {error}")]
    Driver { call: String, error: String },
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error(transparent)]
    Launch(#[from] Box<LaunchError>),
    #[error(transparent)]
    Plan(#[from] crate::launch::PlanError),
}

/// A kernel launch the driver rejected, or a fault found by the synchronise that follows it in
/// diagnostic mode. Names the kernel, its geometry and the problem shape, so the error is
/// attributed to the launch that caused it, not to whatever CUDA call runs next.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[error("kernel {kernel} grid=({},{},{}) block=({},{},{}) smem={shared_mem} [{shape}]: {phase} failed: {error}", grid[0], grid[1], grid[2], block[0], block[1], block[2])]
pub struct LaunchError {
    pub kernel: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    pub shape: String,
    /// `launch` (rejected by the driver) or `execution` (found by the diagnostic synchronise).
    pub phase: String,
    /// The driver's error name, e.g. `CUDA_ERROR_INVALID_VALUE`.
    pub error: String,
    /// True when the error leaves the context unusable (illegal address, ...): the process
    /// must exit and a fresh one take over.
    pub sticky: bool,
}

fn driver_err(call: &str, e: DriverError) -> GpuError {
    GpuError::Driver { call: call.into(), error: error_name(&e) }
}

pub fn error_name(e: &DriverError) -> String {
    // The enum's name (CUDA_ERROR_INVALID_VALUE): needs no driver call, unlike cuGetErrorName.
    format!("{:?}", e.0)
}

/// Errors after which the CUDA context cannot be used again.
fn is_sticky(e: &DriverError) -> bool {
    use cudarc::driver::sys::CUresult::*;
    matches!(
        e.0,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_LAUNCH_TIMEOUT
    )
}

/// What the agent reports about the device beside its limits.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub ordinal: usize,
    /// `major * 1000 + minor * 10`, as `cuDriverGetVersion` returns it.
    pub driver_cuda_version: i32,
    pub nvrtc_version: (i32, i32),
    pub free_mem_bytes: u64,
}

pub fn driver_present() -> bool {
    // SAFETY: only probes whether the shared library can be opened.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// One GPU: context, one stream, the device's own limits, and the modules loaded so far.
///
/// The stream is a real one (not the legacy NULL stream, which cannot be captured into a CUDA
/// graph), and cudarc's per-buffer event tracking is off: everything runs on this one stream,
/// in order, so the events it would record around every launch argument order nothing.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    limits: DeviceLimits,
    info: DeviceInfo,
    cache_dir: Option<PathBuf>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    /// Functions looked up so far, by (source file, name): a step launches ~1,350 kernels, and
    /// `cuModuleGetFunction` on each was host time the device waited for.
    functions: Mutex<HashMap<&'static str, HashMap<String, CudaFunction>>>,
    /// Synchronise after every launch so that asynchronous faults name their kernel.
    diagnostic: bool,
    /// How the kernels of a captured graph follow one another (`BRINK_GRAPH_OVERLAP`).
    overlap: KernelOverlap,
}

impl Gpu {
    /// Opens device `ordinal`. Diagnostic mode is on when `BRINK_SYNC_LAUNCHES=1`.
    pub fn open(ordinal: usize) -> Result<Gpu, GpuError> {
        if !driver_present() {
            return Err(GpuError::NoDriver);
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| GpuError::NoDevice(error_name(&e)))?;
        // SAFETY: before any buffer exists; all work goes to the one stream below, so no buffer
        // is ever used by two streams (the condition event tracking guards).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| driver_err("cuStreamCreate", e))?;
        let attr = |a: Attr| ctx.attribute(a).map(|v| v as u32).map_err(|e| driver_err(&format!("cuDeviceGetAttribute({a:?})"), e));
        let (major, minor) = ctx.compute_capability().map_err(|e| driver_err("cuDeviceComputeCapability", e))?;
        let name = ctx.name().map_err(|e| driver_err("cuDeviceGetName", e))?;
        let limits = DeviceLimits {
            name: name.clone(),
            compute_capability: (major as u32, minor as u32),
            sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            warp_size: attr(Attr::CU_DEVICE_ATTRIBUTE_WARP_SIZE)?,
            max_threads_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            max_block_dim: [
                attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)?,
                attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)?,
                attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)?,
            ],
            max_grid_dim: [
                attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
                attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
                attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
            ],
            max_shared_mem_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?,
            max_shared_mem_per_block_optin: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
            max_threads_per_sm: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?,
            total_mem_bytes: ctx.total_mem().map_err(|e| driver_err("cuDeviceTotalMem", e))? as u64,
        };
        let mut driver_version = 0;
        // SAFETY: valid out-pointer; the driver library is present (checked above).
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(|e| driver_err("cuDriverGetVersion", e))?;
        let (free, _) = ctx.mem_get_info().map_err(|e| driver_err("cuMemGetInfo", e))?;
        let info = DeviceInfo {
            name,
            ordinal,
            driver_cuda_version: driver_version,
            nvrtc_version: compile::nvrtc_version()?,
            free_mem_bytes: free as u64,
        };
        let diagnostic = std::env::var("BRINK_SYNC_LAUNCHES").is_ok_and(|v| v == "1");
        let overlap = KernelOverlap::choose(std::env::var("BRINK_GRAPH_OVERLAP").ok().as_deref(), limits.compute_capability)
            .map_err(|e| GpuError::Driver { call: "Gpu::open".into(), error: e })?;
        Ok(Gpu {
            ctx,
            stream,
            limits,
            info,
            cache_dir: compile::default_cache_dir(),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            diagnostic,
            overlap,
        })
    }

    pub fn limits(&self) -> &DeviceLimits {
        &self.limits
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn set_diagnostic(&mut self, on: bool) {
        self.diagnostic = on;
    }

    /// Whether every launch is followed by a synchronise (`BRINK_SYNC_LAUNCHES=1`): no graphs then.
    pub fn diagnostic(&self) -> bool {
        self.diagnostic
    }

    /// Starts recording the stream's work into a graph instead of running it. Relaxed mode:
    /// the host may still call the driver (function attributes, lookups) meanwhile; the
    /// caller keeps device allocations, copies from the host and synchronisation out of it.
    pub fn begin_capture(&self) -> Result<(), GpuError> {
        if self.diagnostic {
            return Err(GpuError::Driver {
                call: "cuStreamBeginCapture".into(),
                error: "refused in diagnostic mode (BRINK_SYNC_LAUNCHES=1)".into(),
            });
        }
        self.stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).map_err(|e| driver_err("cuStreamBeginCapture", e))
    }

    /// Whether the stream is recording a graph now.
    pub fn capturing(&self) -> bool {
        matches!(self.stream.capture_status(), Ok(CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE))
    }

    /// Ends the recording started by [`Gpu::begin_capture`] and instantiates it, its
    /// kernel-to-kernel edges made programmatic unless `BRINK_GRAPH_OVERLAP=off` ([`graph`]).
    /// The recorded work has not run: launch the graph for that.
    pub fn end_capture(&self) -> Result<StepGraph, GpuError> {
        // No instantiate flags: a captured step allocates nothing (the backend checks).
        match StepGraph::end_capture(&self.stream, self.overlap) {
            Ok(Some(g)) => Ok(g),
            Ok(None) => Err(GpuError::Driver { call: "cuStreamEndCapture".into(), error: "empty graph".into() }),
            Err((call, e)) => Err(driver_err(call, e)),
        }
    }

    /// How captured kernels follow one another on this GPU.
    pub fn overlap(&self) -> KernelOverlap {
        self.overlap
    }

    /// Runs a graph made by [`Gpu::end_capture`] on the stream (asynchronously, like a launch).
    pub fn replay(&self, graph: &StepGraph) -> Result<(), GpuError> {
        graph.launch().map_err(|e| driver_err("cuGraphLaunch", e))?;
        if self.diagnostic {
            self.synchronize()?;
        }
        Ok(())
    }

    /// Free device memory now (for GB10 the agent combines this with the OS's view).
    pub fn free_mem(&self) -> Result<u64, GpuError> {
        self.ctx.mem_get_info().map(|(f, _)| f as u64).map_err(|e| driver_err("cuMemGetInfo", e))
    }

    /// Loads (compiling or taking from the cache) the module of `source`.
    pub fn module(&self, source: &KernelSource) -> Result<Arc<CudaModule>, GpuError> {
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = modules.get(source.file) {
            return Ok(m.clone());
        }
        let cubin = compile::compile(source, &self.limits.arch(), self.cache_dir.as_deref())?;
        let module = self.load_cubin(source, cubin.bytes)?;
        modules.insert(source.file, module.clone());
        Ok(module)
    }

    /// Loads the modules of `sources` not loaded yet, compiling the missing ones in parallel
    /// first ([`compile::compile_all`]; [`Gpu::module`] compiles under its lock, one at a time).
    pub fn load_modules(&self, sources: &[KernelSource]) -> Result<(), GpuError> {
        let missing: Vec<KernelSource> = {
            let modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
            sources.iter().filter(|s| !modules.contains_key(s.file)).copied().collect()
        };
        let cubins = compile::compile_all(&missing, &self.limits.arch(), self.cache_dir.as_deref());
        for (source, cubin) in missing.iter().zip(cubins) {
            let module = self.load_cubin(source, cubin?.bytes)?;
            self.modules.lock().unwrap_or_else(|p| p.into_inner()).entry(source.file).or_insert(module);
        }
        Ok(())
    }

    fn load_cubin(&self, source: &KernelSource, bytes: Vec<u8>) -> Result<Arc<CudaModule>, GpuError> {
        self.ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(bytes))
            .map_err(|e| driver_err(&format!("cuModuleLoadData({})", source.file), e))
    }

    /// The function `name` of `source`'s module, looked up once and then taken from the cache.
    pub fn function(&self, source: &KernelSource, name: &str) -> Result<CudaFunction, GpuError> {
        if let Some(f) = self.functions.lock().unwrap_or_else(|p| p.into_inner()).get(source.file).and_then(|m| m.get(name)) {
            return Ok(f.clone());
        }
        let f = self
            .module(source)?
            .load_function(name)
            .map_err(|e| driver_err(&format!("cuModuleGetFunction({}::{name})", source.file), e))?;
        let mut functions = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        functions.entry(source.file).or_default().insert(name.to_string(), f.clone());
        Ok(f)
    }

    /// Launches `func` with the geometry of `plan`, arguments pushed by `args`. The launch's
    /// own return code is checked; in diagnostic mode the stream is synchronised as well, so
    /// an execution fault is attributed to this launch.
    pub fn launch<'a>(
        &'a self,
        plan: &Launch,
        func: &'a CudaFunction,
        args: impl FnOnce(&mut LaunchArgs<'a>),
    ) -> Result<(), Box<LaunchError>> {
        let fail = |phase: &str, e: DriverError| {
            Box::new(LaunchError {
                kernel: plan.kernel.clone(),
                grid: plan.grid,
                block: plan.block,
                shared_mem: plan.shared_mem,
                shape: plan.shape.clone(),
                phase: phase.into(),
                error: error_name(&e),
                sticky: is_sticky(&e),
            })
        };
        if plan.shared_mem > self.limits.max_shared_mem_per_block {
            func.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                plan.shared_mem as i32,
            )
            .map_err(|e| fail("set max dynamic shared memory", e))?;
        }
        let mut builder = self.stream.launch_builder(func);
        args(&mut builder);
        let cfg = LaunchConfig {
            grid_dim: (plan.grid[0], plan.grid[1], plan.grid[2]),
            block_dim: (plan.block[0], plan.block[1], plan.block[2]),
            shared_mem_bytes: plan.shared_mem,
        };
        // SAFETY: every kernel's arguments are pushed by its own typed wrapper in `ops::*`,
        // which matches the kernel's C signature; the plan has been checked against the limits.
        unsafe { builder.launch(cfg) }.map_err(|e| fail("launch", e))?;
        if self.diagnostic {
            self.stream.synchronize().map_err(|e| fail("execution", e))?;
        }
        Ok(())
    }

    /// An allocation or a host copy inside a capture would become part of the graph (or fail
    /// the capture): refused with an error naming the call, so the caller runs the step eagerly.
    fn refuse_while_capturing(&self, call: &str) -> Result<(), GpuError> {
        if self.capturing() {
            return Err(GpuError::Driver { call: call.into(), error: "refused while a graph is being captured".into() });
        }
        Ok(())
    }

    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.stream.synchronize().map_err(|e| driver_err("cuStreamSynchronize", e))
    }

    /// Uninitialised device buffer of `n` elements (callers poison or fill it).
    pub fn alloc<T: DeviceRepr>(&self, n: usize) -> Result<CudaSlice<T>, GpuError> {
        self.refuse_while_capturing("cuMemAlloc")?;
        // SAFETY: the buffer is written (fill/poison kernels) before any read.
        unsafe { self.stream.alloc::<T>(n.max(1)) }.map_err(|e| driver_err(&format!("cuMemAlloc({} x {})", n, std::mem::size_of::<T>()), e))
    }

    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>, GpuError> {
        self.refuse_while_capturing("cuMemcpyHtoD")?;
        self.stream.clone_htod(host).map_err(|e| driver_err(&format!("cuMemcpyHtoD({} x {})", host.len(), std::mem::size_of::<T>()), e))
    }

    /// Copies `host` into the start of `dst` (which keeps its address: a captured graph may
    /// read it). Refused while capturing, like [`Gpu::upload`].
    pub fn write<T: DeviceRepr>(&self, host: &[T], dst: &mut CudaSlice<T>) -> Result<(), GpuError> {
        self.refuse_while_capturing("cuMemcpyHtoD")?;
        let dst_len = dst.len();
        let what = || format!("cuMemcpyHtoD({} x {} into {dst_len})", host.len(), std::mem::size_of::<T>());
        if host.len() > dst.len() {
            return Err(GpuError::Driver { call: what(), error: "destination too small".into() });
        }
        if host.is_empty() {
            return Ok(());
        }
        let mut view = dst.slice_mut(0..host.len());
        self.stream.memcpy_htod(host, &mut view).map_err(|e| driver_err(&what(), e))
    }

    pub fn download<T: DeviceRepr + Default + Clone>(&self, dev: &CudaSlice<T>) -> Result<Vec<T>, GpuError> {
        self.stream.clone_dtoh(dev).map_err(|e| driver_err("cuMemcpyDtoH", e))
    }

    /// Copies elements `[start, start + len)` of `dev` to the host.
    pub fn download_range<T: DeviceRepr + Default + Clone>(
        &self,
        dev: &CudaSlice<T>,
        start: usize,
        len: usize,
    ) -> Result<Vec<T>, GpuError> {
        let view = dev
            .try_slice(start..start + len)
            .ok_or_else(|| GpuError::Driver { call: "download_range".into(), error: format!("range {start}+{len} past {}", dev.len()) })?;
        self.stream.clone_dtoh(&view).map_err(|e| driver_err("cuMemcpyDtoH", e))
    }
}
