//! Host↔device copies of (pitched) row-major tensors.
//!
//! CubeCL describes a copy by shape, strides and element size. Rows may be padded on the
//! device (pitched layout), never on the host, so a rank ≥ 2 copy is one 2D memcpy:
//! width = last dim in bytes, height = product of the other dims, device pitch = the
//! stride of the second-to-last dim. [`plan_copy`] is that arithmetic, unit tested.

use super::error::io_err;
use cubecl_common::backtrace::BackTrace;
use cubecl_core::{
    server::IoError,
    zspace::{Shape, Strides, striding::has_pitched_row_major_strides},
};
use cudarc::driver::{
    result,
    sys::{self, CUDA_MEMCPY2D, CUdeviceptr, CUmemorytype, CUstream},
};
use std::ffi::c_void;

/// How to move one tensor between host and device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyPlan {
    /// One contiguous run of `bytes`.
    Linear { bytes: usize },
    /// `height` rows of `width` bytes; rows are `device_pitch` bytes apart on the device
    /// and packed on the host.
    Pitched {
        width: usize,
        height: usize,
        device_pitch: usize,
    },
}

impl CopyPlan {
    /// Bytes on the host side.
    pub fn host_bytes(&self) -> usize {
        match *self {
            CopyPlan::Linear { bytes } => bytes,
            CopyPlan::Pitched { width, height, .. } => width * height,
        }
    }
}

/// Plans the copy of a tensor, or refuses layouts that are not pitched row-major.
pub fn plan_copy(shape: &Shape, strides: &Strides, elem_size: usize) -> Result<CopyPlan, IoError> {
    if !has_pitched_row_major_strides(shape, strides) {
        return Err(IoError::UnsupportedStrides {
            backtrace: BackTrace::capture(),
        });
    }
    let rank = shape.len();
    if rank <= 1 {
        let elems: usize = shape.iter().product();
        return Ok(CopyPlan::Linear {
            bytes: elems * elem_size,
        });
    }
    let width = shape[rank - 1] * elem_size;
    let height: usize = shape[..rank - 1].iter().product();
    let device_pitch = strides[rank - 2] * elem_size;
    if device_pitch == width || height <= 1 {
        return Ok(CopyPlan::Linear {
            bytes: width * height,
        });
    }
    Ok(CopyPlan::Pitched {
        width,
        height,
        device_pitch,
    })
}

/// Queues a host→device copy on `stream`.
///
/// # Safety
/// `dst` must be a device allocation large enough for `plan`, and `src` must stay alive
/// and unchanged until the stream has executed the copy.
pub unsafe fn copy_to_device(
    plan: CopyPlan,
    src: &[u8],
    dst: CUdeviceptr,
    stream: CUstream,
) -> Result<(), IoError> {
    if src.len() < plan.host_bytes() {
        return Err(IoError::Unknown {
            description: format!(
                "write of {} bytes from a {}-byte host buffer",
                plan.host_bytes(),
                src.len()
            ),
            backtrace: BackTrace::capture(),
        });
    }
    match plan {
        CopyPlan::Linear { bytes: 0 } => Ok(()),
        CopyPlan::Linear { bytes } => {
            // SAFETY: forwarded from the caller.
            unsafe { result::memcpy_htod_async(dst, &src[..bytes], stream) }
                .map_err(|err| io_err("cuMemcpyHtoDAsync", err))
        }
        CopyPlan::Pitched {
            width,
            height,
            device_pitch,
        } => {
            let copy = CUDA_MEMCPY2D {
                srcMemoryType: CUmemorytype::CU_MEMORYTYPE_HOST,
                srcHost: src.as_ptr() as *const c_void,
                srcPitch: width,
                dstMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
                dstDevice: dst,
                dstPitch: device_pitch,
                WidthInBytes: width,
                Height: height,
                ..unused_2d_fields()
            };
            // SAFETY: descriptor fully initialised; pointers valid per the caller.
            unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream) }
                .result()
                .map_err(|err| io_err("cuMemcpy2DAsync", err))
        }
    }
}

/// Queues a device→host copy on `stream`.
///
/// # Safety
/// `src` must be a device allocation covering `plan`; `dst` must stay alive and must not be
/// read until the stream has executed the copy.
pub unsafe fn copy_to_host(
    plan: CopyPlan,
    src: CUdeviceptr,
    dst: &mut [u8],
    stream: CUstream,
) -> Result<(), IoError> {
    if dst.len() < plan.host_bytes() {
        return Err(IoError::Unknown {
            description: format!(
                "read of {} bytes into a {}-byte host buffer",
                plan.host_bytes(),
                dst.len()
            ),
            backtrace: BackTrace::capture(),
        });
    }
    match plan {
        CopyPlan::Linear { bytes: 0 } => Ok(()),
        CopyPlan::Linear { bytes } => {
            // SAFETY: forwarded from the caller.
            unsafe { result::memcpy_dtoh_async(&mut dst[..bytes], src, stream) }
                .map_err(|err| io_err("cuMemcpyDtoHAsync", err))
        }
        CopyPlan::Pitched {
            width,
            height,
            device_pitch,
        } => {
            let copy = CUDA_MEMCPY2D {
                srcMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
                srcDevice: src,
                srcPitch: device_pitch,
                dstMemoryType: CUmemorytype::CU_MEMORYTYPE_HOST,
                dstHost: dst.as_mut_ptr() as *mut c_void,
                dstPitch: width,
                WidthInBytes: width,
                Height: height,
                ..unused_2d_fields()
            };
            // SAFETY: descriptor fully initialised; pointers valid per the caller.
            unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream) }
                .result()
                .map_err(|err| io_err("cuMemcpy2DAsync", err))
        }
    }
}

/// A 2D copy descriptor with every field the plans above do not set at its "unused"
/// value. Built field by field: `std::mem::zeroed` is undefined behaviour here (the memory
/// type enums have no zero variant) and panics at run time.
fn unused_2d_fields() -> CUDA_MEMCPY2D {
    CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: CUmemorytype::CU_MEMORYTYPE_HOST,
        srcHost: std::ptr::null(),
        srcDevice: 0,
        srcArray: std::ptr::null_mut(),
        srcPitch: 0,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: CUmemorytype::CU_MEMORYTYPE_HOST,
        dstHost: std::ptr::null_mut(),
        dstDevice: 0,
        dstArray: std::ptr::null_mut(),
        dstPitch: 0,
        WidthInBytes: 0,
        Height: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(shape: &[usize], strides: &[usize], elem: usize) -> Result<CopyPlan, IoError> {
        plan_copy(&shape.into(), &strides.into(), elem)
    }

    #[test]
    fn vectors_and_contiguous_matrices_are_linear() {
        assert_eq!(
            plan(&[10], &[1], 4).unwrap(),
            CopyPlan::Linear { bytes: 40 }
        );
        assert_eq!(
            plan(&[3, 5], &[5, 1], 4).unwrap(),
            CopyPlan::Linear { bytes: 60 }
        );
    }

    #[test]
    fn padded_rows_give_a_2d_copy() {
        assert_eq!(
            plan(&[2, 3, 5], &[24, 8, 1], 4).unwrap(),
            CopyPlan::Pitched {
                width: 20,
                height: 6,
                device_pitch: 32
            }
        );
    }

    #[test]
    fn unused_descriptor_fields_build_without_zeroing() {
        let desc = unused_2d_fields();
        assert_eq!(desc.Height, 0);
        assert!(desc.srcHost.is_null());
    }

    #[test]
    fn transposed_layouts_are_refused() {
        assert!(plan(&[3, 5], &[1, 3], 4).is_err());
    }
}
