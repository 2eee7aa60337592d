//! The device type of [`CudaGraphRuntime`](super::CudaGraphRuntime).
//!
//! CubeCL keys its per-device worker threads and servers by `DeviceId`. This device uses
//! its own `type_id`, so a process can hold stock cubecl-cuda and this runtime on the same
//! GPU without the two sharing one server (ARCHITECTURE.md, hazards).

use cubecl_common::device::{Device, DeviceId};

/// `DeviceId::type_id` of [`CudaGraphDevice`]. Stock cubecl-cuda uses 0; this value is
/// arbitrary but fixed ("CG" in ASCII).
pub const CUDA_GRAPH_DEVICE_TYPE_ID: u16 = 0x4347;

/// An NVIDIA GPU driven by [`CudaGraphRuntime`](super::CudaGraphRuntime), by CUDA ordinal.
#[derive(Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct CudaGraphDevice {
    /// The CUDA device ordinal (as in `cuDeviceGet`).
    pub index: usize,
}

impl CudaGraphDevice {
    /// The device with CUDA ordinal `index`.
    pub const fn new(index: usize) -> Self {
        Self { index }
    }
}

impl core::fmt::Debug for CudaGraphDevice {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "CudaGraph({})", self.index)
    }
}

impl Device for CudaGraphDevice {
    fn from_id(device_id: DeviceId) -> Self {
        Self {
            index: device_id.index_id as usize,
        }
    }

    fn to_id(&self) -> DeviceId {
        DeviceId {
            type_id: CUDA_GRAPH_DEVICE_TYPE_ID,
            index_id: self.index as u16,
        }
    }
}

// Lets burn-cubecl treat this runtime as a `CubeRuntime` (it requires `DeviceOps`).
impl burn::tensor::backend::DeviceOps for CudaGraphDevice {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_id_round_trips_and_is_not_stock_cuda() {
        let device = CudaGraphDevice::new(3);
        let id = device.to_id();
        assert_eq!(id.type_id, CUDA_GRAPH_DEVICE_TYPE_ID);
        assert_ne!(id.type_id, 0, "type id 0 belongs to stock cubecl-cuda");
        assert_eq!(CudaGraphDevice::from_id(id), device);
    }
}
