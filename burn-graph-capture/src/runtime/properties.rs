//! Device properties and compiler options, derived from queried driver attributes.
//!
//! The table of "which compute capability enables what" is pure logic: it takes a
//! [`DeviceAttributes`] (filled from `cuDeviceGetAttribute` on the GPU, or by hand in
//! tests) and registers only what this runtime's launch path supports. Tensor-memory
//! accelerator (TMA) maps and thread-block clusters are deliberately *not* registered:
//! this runtime does not encode tensor maps nor launch with cluster attributes.

use cubecl_common::profile::TimingMethod;
use cubecl_core::ir::{
    BarrierLevel, DeviceProperties, ElemType, FloatKind, HardwareProperties,
    MemoryDeviceProperties, OpaqueType, SemanticType, StorageType, Type, VectorSize,
    features::{AtomicUsage, Plane, TypeUsage},
};
use cubecl_cpp::{
    DialectWmmaCompiler,
    cuda::{CudaDialect, arch::CudaArchitecture, mma::CudaWmmaCompiler},
    register_supported_types,
    shared::{
        CompilationOptions, CppSupportedFeatures, register_mma_features,
        register_scaled_mma_features, register_wmma_features,
    },
};

/// Upper bound on buffers bound to one kernel (CUDA has no hard limit this low).
pub const MAX_BINDINGS: u32 = 1024;

/// Row alignment `cuMemAllocPitch` returns; used as the pool alignment.
pub const MEMORY_ALIGNMENT: u64 = 512;

/// The raw facts about a GPU that the property table needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttributes {
    /// Compute capability as `major * 10 + minor` (90 for sm_90).
    pub arch_version: u32,
    /// Threads per warp.
    pub warp_size: u32,
    /// Shared memory a block may opt into, in bytes.
    pub max_shared_memory_per_block_optin: usize,
    /// Most threads in one block.
    pub max_threads_per_block: u32,
    /// Most threads along each block dimension.
    pub max_block_dim: (u32, u32, u32),
    /// Most blocks along each grid dimension.
    pub max_grid_dim: (u32, u32, u32),
    /// Streaming multiprocessors.
    pub multiprocessor_count: u32,
    /// Device memory, in bytes.
    pub total_memory: u64,
}

impl DeviceAttributes {
    /// Major compute capability (9 for sm_90).
    pub fn arch_major(&self) -> u32 {
        self.arch_version / 10
    }
}

/// Tensor cores per SM for the architectures whose count is known.
pub fn tensor_cores_per_sm(arch_version: u32) -> Option<u32> {
    match arch_version {
        70 | 75 => Some(8),
        80 | 86 | 89 | 90 | 91 | 92 | 100 => Some(4),
        _ => None,
    }
}

/// Memory properties of the device pools: one page is at most a quarter of the device.
pub fn memory_properties(attrs: &DeviceAttributes) -> MemoryDeviceProperties {
    MemoryDeviceProperties {
        max_page_size: attrs.total_memory / 4,
        alignment: MEMORY_ALIGNMENT,
    }
}

/// Builds the CubeCL device properties and the C++ compiler options for a device.
///
/// `cuda_version` is the toolkit version the bindings were built for (e.g. 13000); it gates
/// features that need a recent NVRTC.
pub fn device_properties(
    attrs: &DeviceAttributes,
    cuda_version: u32,
) -> (DeviceProperties, CompilationOptions) {
    let arch = CudaArchitecture {
        version: attrs.arch_version,
    };
    type Wmma = CudaWmmaCompiler;
    type D = CudaDialect<CudaWmmaCompiler>;
    let wmma = <Wmma as DialectWmmaCompiler<D>>::supported_wmma_combinations(&arch);
    let mma = <Wmma as DialectWmmaCompiler<D>>::supported_mma_combinations(&arch);
    let scaled_mma = <Wmma as DialectWmmaCompiler<D>>::supported_scaled_mma_combinations(&arch);

    let mut options = CompilationOptions {
        warp_size: attrs.warp_size,
        supports_features: CppSupportedFeatures {
            fast_math: true,
            ..Default::default()
        },
    };

    let hardware = HardwareProperties {
        load_width: 128,
        plane_size_min: attrs.warp_size,
        plane_size_max: attrs.warp_size,
        max_bindings: MAX_BINDINGS,
        max_shared_memory_size: attrs.max_shared_memory_per_block_optin,
        max_cube_count: attrs.max_grid_dim,
        max_units_per_cube: attrs.max_threads_per_block,
        max_cube_dim: attrs.max_block_dim,
        num_streaming_multiprocessors: Some(attrs.multiprocessor_count),
        num_tensor_cores: tensor_cores_per_sm(attrs.arch_version),
        min_tensor_cores_dim: if wmma.is_empty() { None } else { Some(8) },
        num_cpu_cores: None,
        max_vector_size: VectorSize::MAX,
    };

    let mut props = DeviceProperties::new(
        Default::default(),
        memory_properties(attrs),
        hardware,
        TimingMethod::System,
    );
    register_supported_types(&mut props);
    props.register_type_usage(ElemType::Float(FloatKind::TF32), TypeUsage::Conversion);

    let v = attrs.arch_version;
    if v >= 60 {
        props.register_atomic_type_usage(
            Type::new(StorageType::Atomic(ElemType::Float(FloatKind::F64))),
            AtomicUsage::Add | AtomicUsage::LoadStore,
        );
    }
    if v >= 70 {
        let f16_atomic = Type::new(StorageType::Atomic(ElemType::Float(FloatKind::F16)));
        props.register_atomic_type_usage(f16_atomic, AtomicUsage::Add | AtomicUsage::LoadStore);
        props.register_atomic_type_usage(
            f16_atomic.with_vector_size(2),
            AtomicUsage::Add | AtomicUsage::LoadStore,
        );
        props.register_semantic_type(SemanticType::Pipeline);
        props.register_type_usage(OpaqueType::Barrier(BarrierLevel::Unit), TypeUsage::Buffer);
        props.register_type_usage(OpaqueType::Barrier(BarrierLevel::Cube), TypeUsage::Buffer);
        props.features.plane.insert(Plane::Sync);
        // Static metadata and scalars go by value as a `__grid_constant__` struct.
        options.supports_features.grid_constants = true;
    }
    if v >= 75 {
        for kind in [FloatKind::F16, FloatKind::BF16] {
            props
                .features
                .matmul
                .ldmatrix
                .insert(ElemType::Float(kind).into());
        }
        options.supports_features.fast_tanh = cuda_version >= 12080;
    }
    if v >= 80 {
        props.features.copy_async = true;
    }
    if v >= 89 {
        for kind in [FloatKind::E4M3, FloatKind::E5M2] {
            props.register_type_usage(
                ElemType::Float(kind),
                TypeUsage::Conversion | TypeUsage::Buffer,
            );
        }
    }
    if v >= 90 {
        // No TMA (`Tma::Base`, `SemanticType::TensorMap`) and no clusters: not supported by
        // this runtime's launch path.
        options.supports_features.elect_sync = true;
        for kind in [FloatKind::F16, FloatKind::BF16] {
            props
                .features
                .matmul
                .stmatrix
                .insert(ElemType::Float(kind).into());
        }
        let f32_atomic = Type::new(StorageType::Atomic(ElemType::Float(FloatKind::F32)));
        for width in [2, 4] {
            props.register_atomic_type_usage(
                f32_atomic.with_vector_size(width),
                AtomicUsage::LoadStore | AtomicUsage::Add,
            );
        }
    }
    if matches!(attrs.arch_major(), 10..=12) {
        props.register_type_usage(ElemType::Float(FloatKind::E2M1), TypeUsage::Conversion);
        props.register_type_usage(
            StorageType::Packed(ElemType::Float(FloatKind::E2M1), 2),
            TypeUsage::Conversion | TypeUsage::Buffer,
        );
        for kind in [FloatKind::E2M3, FloatKind::E3M2, FloatKind::UE8M0] {
            props.register_type_usage(
                ElemType::Float(kind),
                TypeUsage::Conversion | TypeUsage::Buffer,
            );
        }
    }

    props.features.memory_reinterpret = true;
    props.features.alignment = true;
    props.features.plane.insert(Plane::Ops);
    props.features.plane.insert(Plane::NonUniformControlFlow);

    register_wmma_features(wmma, &mut props);
    register_mma_features(mma, &mut props);
    register_scaled_mma_features(scaled_mma, &mut props);

    (props, options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200() -> DeviceAttributes {
        DeviceAttributes {
            arch_version: 90,
            warp_size: 32,
            max_shared_memory_per_block_optin: 232_448,
            max_threads_per_block: 1024,
            max_block_dim: (1024, 1024, 64),
            max_grid_dim: (2_147_483_647, 65_535, 65_535),
            multiprocessor_count: 132,
            total_memory: 150_000_000_000,
        }
    }

    #[test]
    fn hopper_gets_grid_constants_but_no_tma_or_clusters() {
        let (props, options) = device_properties(&h200(), 13000);
        assert!(options.supports_features.grid_constants);
        assert!(options.supports_features.elect_sync);
        assert!(options.supports_features.fast_tanh);
        assert!(!options.supports_features.clusters);
        assert!(props.features.tma.is_empty());
        assert!(!props.features.cube_cluster);
        assert!(props.features.copy_async);
        assert_eq!(options.warp_size, 32);
        assert_eq!(props.hardware.max_shared_memory_size, 232_448);
        assert_eq!(props.hardware.num_streaming_multiprocessors, Some(132));
        assert_eq!(props.hardware.num_tensor_cores, Some(4));
        assert!(!props.features.matmul.cmma.is_empty());
    }

    #[test]
    fn old_toolkit_disables_fast_tanh() {
        let (_, options) = device_properties(&h200(), 12040);
        assert!(!options.supports_features.fast_tanh);
    }

    #[test]
    fn pascal_has_no_grid_constants() {
        let attrs = DeviceAttributes {
            arch_version: 61,
            ..h200()
        };
        let (props, options) = device_properties(&attrs, 13000);
        assert!(!options.supports_features.grid_constants);
        assert!(!props.features.copy_async);
        assert_eq!(props.hardware.num_tensor_cores, None);
    }

    #[test]
    fn pages_are_a_quarter_of_device_memory() {
        let mem = memory_properties(&h200());
        assert_eq!(mem.max_page_size, 37_500_000_000);
        assert_eq!(mem.alignment, 512);
    }

    #[test]
    fn tensor_core_table() {
        assert_eq!(tensor_cores_per_sm(75), Some(8));
        assert_eq!(tensor_cores_per_sm(90), Some(4));
        assert_eq!(tensor_cores_per_sm(120), None);
    }
}
