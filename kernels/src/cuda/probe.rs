//! What the driver says about one device, for discovery (`brink-agent device`) and the
//! qualification fingerprint. Unlike [`super::Gpu::open`] it loads no module and needs no NVRTC:
//! a machine whose NVRTC is missing still reports its GPU (and the missing library).

use cudarc::driver::CudaContext;
use cudarc::driver::sys::CUdevice_attribute as Attr;

use super::{GpuError, driver_err, driver_present, error_name};

/// The driver's answers for one device, unformatted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub ordinal: usize,
    pub name: String,
    /// `GPU-…` as NVML prints it.
    pub uuid: String,
    pub compute_capability: (u32, u32),
    pub sm_count: u32,
    pub total_mem_bytes: u64,
    /// `cuMemGetInfo`'s free memory. On an integrated GPU it leaves out page cache the kernel
    /// would reclaim, so callers there read the OS's view as well.
    pub free_mem_bytes: u64,
    pub max_grid_dim: [u32; 3],
    /// `CU_DEVICE_ATTRIBUTE_INTEGRATED`: the GPU shares host memory (GB10).
    pub integrated: bool,
    /// `cuDriverGetVersion`: `major * 1000 + minor * 10`.
    pub cuda_driver_version: i32,
    /// NVRTC's version, or why it could not be read.
    pub nvrtc_version: Result<(i32, i32), String>,
}

/// Probes device `ordinal` (retains its primary context to read free memory).
pub fn probe(ordinal: usize) -> Result<Probe, GpuError> {
    if !driver_present() {
        return Err(GpuError::NoDriver);
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| GpuError::NoDevice(error_name(&e)))?;
    let attr = |a: Attr| ctx.attribute(a).map_err(|e| driver_err(&format!("cuDeviceGetAttribute({a:?})"), e));
    let count = |a: Attr| attr(a).map(|v| u32::try_from(v).unwrap_or(0));
    let (major, minor) = ctx.compute_capability().map_err(|e| driver_err("cuDeviceComputeCapability", e))?;
    let uuid = ctx.uuid().map_err(|e| driver_err("cuDeviceGetUuid", e))?;
    let mut driver_version = 0;
    // SAFETY: valid out-pointer; the driver library is present (checked above).
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) }.result().map_err(|e| driver_err("cuDriverGetVersion", e))?;
    let (free, total) = ctx.mem_get_info().map_err(|e| driver_err("cuMemGetInfo", e))?;
    Ok(Probe {
        ordinal,
        name: ctx.name().map_err(|e| driver_err("cuDeviceGetName", e))?,
        uuid: format_uuid(uuid_bytes(&uuid)),
        compute_capability: (u32::try_from(major).unwrap_or(0), u32::try_from(minor).unwrap_or(0)),
        sm_count: count(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        total_mem_bytes: total as u64,
        free_mem_bytes: free as u64,
        max_grid_dim: [
            count(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
            count(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
            count(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
        ],
        integrated: attr(Attr::CU_DEVICE_ATTRIBUTE_INTEGRATED)? != 0,
        cuda_driver_version: driver_version,
        nvrtc_version: super::compile::nvrtc_version().map_err(|e| e.to_string()),
    })
}

// `c_char` is i8 on x86_64 and u8 on aarch64: the cast is a no-op on one of them.
#[allow(clippy::unnecessary_cast)]
fn uuid_bytes(u: &cudarc::driver::sys::CUuuid) -> [u8; 16] {
    u.bytes.map(|b| b as u8)
}

/// `GPU-` and the 16 bytes as 8-4-4-4-12 lower-case hex: the spelling of NVML and `nvidia-smi -L`.
pub fn format_uuid(b: [u8; 16]) -> String {
    let hex = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!("GPU-{}-{}-{}-{}-{}", hex(0..4), hex(4..6), hex(6..8), hex(8..10), hex(10..16))
}

/// `cuDriverGetVersion`'s integer as `major.minor` (13000 → `13.0`, 12080 → `12.8`).
pub fn format_cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, v % 1000 / 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_is_spelt_like_nvml() {
        let b = [0x6b, 0x2d, 0x37, 0x1a, 0x0e, 0x4f, 0x99, 0x10, 0xab, 0xcd, 0x00, 0x01, 0x02, 0x03, 0xfe, 0xff];
        assert_eq!(format_uuid(b), "GPU-6b2d371a-0e4f-9910-abcd-00010203feff");
    }

    #[test]
    fn cuda_versions() {
        assert_eq!(format_cuda_version(13000), "13.0");
        assert_eq!(format_cuda_version(12080), "12.8");
        assert_eq!(format_cuda_version(13010), "13.1");
    }
}
