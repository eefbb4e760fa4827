"""The kernel catalogue: names (short, demangled, mangled), launch call, mean duration and launch shape of
each kernel the synthetic training step runs, and the order a layer runs them in.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kernel:
    short: str
    demangled: str
    mangled: str
    api: str  # CUDA call that launches it, as nsys names it
    mean_ns: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    registers: int = 32
    static_shared_bytes: int = 0
    dynamic_shared_bytes: int = 0


def _plain(name: str, api: str, mean_ns: int, grid: tuple[int, int, int], block: tuple[int, int, int],
           registers: int, dynamic_shared_bytes: int = 0) -> Kernel:
    """A kernel whose three names are the same string (cuBLAS, nvjet, Triton)."""
    return Kernel(name, name, name, api, mean_ns, grid, block, registers, 0, dynamic_shared_bytes)


_LAUNCH = "cudaLaunchKernel_v7000"
_LAUNCH_EX = "cuLaunchKernelEx"
_LAUNCH_DRIVER = "cuLaunchKernel"
_VEC = "void at::native::vectorized_elementwise_kernel"
KERNELS: dict[str, Kernel] = {
    "layer_norm": Kernel(
        "vectorized_layer_norm_kernel",
        "void at::native::<unnamed>::vectorized_layer_norm_kernel<float, float, (bool)0>(int, T2, "
        "const T1 *, const T1 *, const T1 *, T2 *, T2 *, T1 *)",
        "_ZN2at6native53_GLOBAL__N__21739cd4_20_layer_norm_kernel_cu_9c5ada8a28vectorized_layer_norm_kernel"
        "IffLb0EEEviT0_PKT_S6_S6_PS3_S7_PS4_",
        _LAUNCH, 45_000, (16_384, 1, 1), (32, 4, 1), 39),
    "gemm_qkv": _plain(
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off"
        "_kernel__5x_cublas", _LAUNCH_EX, 260_000, (132, 1, 1), (384, 1, 1), 168, 213_248),
    "flash_fwd": Kernel(
        "flash_fwd_kernel",
        "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<(int)128, (int)128, (int)64, (int)4, (bool)0, "
        "(bool)0, cutlass::bfloat16_t, Flash_kernel_traits<(int)128, (int)128, (int)64, (int)4, "
        "cutlass::bfloat16_t>>, (bool)0, (bool)0, (bool)0, (bool)0, (bool)0, (bool)1, (bool)0, (bool)0>"
        "(flash::Flash_fwd_params)",
        "_ZN5flash16flash_fwd_kernelI23Flash_fwd_kernel_traitsILi128ELi128ELi64ELi4ELb0ELb0EN7cutlass10bfloat"
        "16_tE19Flash_kernel_traitsILi128ELi128ELi64ELi4ES3_EELb0ELb0ELb0ELb0ELb0ELb1ELb0ELb0EEEvNS_16Flash_fwd"
        "_paramsE",
        _LAUNCH, 420_000, (16, 32, 4), (128, 1, 1), 255, 0, 49_152),
    "gemm_out": _plain("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", _LAUNCH_EX, 130_000,
                       (2, 66, 1), (384, 1, 1), 168, 200_704),
    "residual_add_triton": _plain("triton_poi_fused_add_0", _LAUNCH_DRIVER, 26_000,
                                  (4_096, 1, 1), (128, 1, 1), 24),
    "gemm_mlp_up": _plain("nvjet_tst_192x208_64x4_1x1_h_bz_coopB_bias_TNT", _LAUNCH_EX, 340_000,
                          (1, 132, 1), (384, 1, 1), 168, 213_248),
    "gelu": Kernel(
        "vectorized_elementwise_kernel",
        f"{_VEC}<(int)8, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase &, at::native::GeluType)::"
        "[lambda() (instance 1)]::operator ()() const::[lambda() (instance 4)]::operator ()() const::"
        "[lambda(c10::BFloat16) (instance 1)], std::array<char *, (unsigned long)2>>(int, T2, T3)",
        "_ZN2at6native29vectorized_elementwise_kernelILi8EZZZNS0_18GeluCUDAKernelImplERNS_18TensorIteratorBase"
        "ENS0_8GeluTypeEENKUlvE_clEvENKUlvE2_clEvEUlN3c108BFloat16EE_St5arrayIPcLm2EEEEviT0_T1_",
        _LAUNCH, 62_000, (8_192, 1, 1), (128, 1, 1), 22),
    "gemm_mlp_down": _plain(
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
        "_kernel__5x_cublas", _LAUNCH_EX, 330_000, (132, 1, 1), (256, 1, 1), 168, 164_864),
    "residual_add": Kernel(
        "vectorized_elementwise_kernel",
        f"{_VEC}<(int)8, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char *, (unsigned long)3>>"
        "(int, T2, T3)",
        "_ZN2at6native29vectorized_elementwise_kernelILi8ENS0_15CUDAFunctor_addIN3c108BFloat16EEESt5arrayIPcLm"
        "3EEEEviT0_T1_",
        _LAUNCH, 31_000, (8_192, 1, 1), (128, 1, 1), 24),
    "log_softmax_triton": _plain("triton_red_fused__log_softmax_1", _LAUNCH_DRIVER, 110_000,
                                 (8_192, 1, 1), (256, 1, 1), 40),
    "mean_reduce": Kernel(
        "reduce_kernel",
        "void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::MeanOps<"
        "float, float, float, float>, unsigned int, float, (int)4, (int)4>>(T3)",
        "_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIfNS0_7MeanOpsIffffEEjfLi4ELi4EEEEEvT1_",
        _LAUNCH, 18_000, (32, 1, 1), (32, 16, 1), 32, 16),
    "gemm_dgrad": _plain(
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off"
        "_kernel__5x_cublas", _LAUNCH_EX, 300_000, (132, 1, 1), (384, 1, 1), 168, 213_248),
    "gemm_wgrad": _plain("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_NTN", _LAUNCH_EX, 310_000,
                         (2, 66, 1), (384, 1, 1), 168, 213_248),
    "gelu_backward": _plain("triton_poi_fused_gelu_gelu_backward_2", _LAUNCH_DRIVER, 70_000,
                            (8_192, 1, 1), (128, 1, 1), 28),
    "layer_norm_backward": Kernel(
        "layer_norm_grad_input_kernel_vectorized",
        "void at::native::<unnamed>::layer_norm_grad_input_kernel_vectorized<float, float>(const T1 *, "
        "const T1 *, const T2 *, const T2 *, const T1 *, T1 *, int)",
        "_ZN2at6native53_GLOBAL__N__21739cd4_20_layer_norm_kernel_cu_9c5ada8a39layer_norm_grad_input_kernel"
        "_vectorizedIffEEvPKT_S5_PKT0_S8_S5_PS3_i",
        _LAUNCH, 72_000, (16_384, 1, 1), (128, 1, 1), 40),
    "gamma_beta_backward": Kernel(
        "GammaBetaBackwardCUDAKernelTemplate",
        "void at::native::<unnamed>::GammaBetaBackwardCUDAKernelTemplate<float, float, (unsigned int)32, "
        "(unsigned int)32, (unsigned int)256, (bool)0, (bool)1>(long, long, const T1 *, const T1 *, "
        "const T2 *, const T2 *, T1 *, T1 *)",
        "_ZN2at6native53_GLOBAL__N__21739cd4_20_layer_norm_kernel_cu_9c5ada8a35GammaBetaBackwardCUDAKernel"
        "TemplateIffLj32ELj32ELj256ELb0ELb1EEEvllPKT_S5_PKT0_S8_PS3_S9_",
        _LAUNCH, 41_000, (128, 1, 1), (32, 32, 1), 64, 8_448),
    "flash_bwd": Kernel(
        "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel",
        "void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<(int)128, "
        "(int)64, (int)128, (int)8, (int)2, (int)4, (int)2, (bool)0, (bool)0, cutlass::bfloat16_t, "
        "Flash_kernel_traits<(int)128, (int)64, (int)128, (int)8, cutlass::bfloat16_t>>, (bool)1, (bool)0, "
        "(bool)0, (bool)0, (bool)0, (bool)0>(flash::Flash_bwd_params)",
        "_ZN5flash44flash_bwd_dq_dk_dv_loop_seqk_parallel_kernelI23Flash_bwd_kernel_traitsILi128ELi64ELi128ELi"
        "8ELi2ELi4ELi2ELb0ELb0EN7cutlass10bfloat16_tE19Flash_kernel_traitsILi128ELi64ELi128ELi8ES3_EELb1ELb0E"
        "Lb0ELb0ELb0ELb0EEEvNS_16Flash_bwd_paramsE",
        _LAUNCH, 950_000, (32, 32, 4), (256, 1, 1), 255, 0, 147_456),
    "fused_adam": Kernel(
        "multi_tensor_apply_kernel",
        "void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::FusedOptimizer"
        "TensorListMetadata<(int)4>, at::native::<unnamed>::FusedAdamMathFunctor<float, (int)4, "
        "(at::native::ADAM_MODE)1, (bool)0>, double *, double, double, double, double, double, bool, "
        "const float *, const float *>(T1, T2, T3...)",
        "_ZN2at6native12_GLOBAL__N_125multi_tensor_apply_kernelINS1_33FusedOptimizerTensorListMetadataILi4EEE"
        "NS1_20FusedAdamMathFunctorIfLi4ELNS0_9ADAM_MODEE1ELb0EEEJPddddddbPKfSA_EEEvT_T0_DpT1_",
        _LAUNCH, 360_000, (1_480, 1, 1), (512, 1, 1), 72, 0),
    "tiny_add": Kernel(
        "vectorized_elementwise_kernel",
        f"{_VEC}<(int)4, at::native::CUDAFunctor_add<float>, std::array<char *, (unsigned long)3>>"
        "(int, T2, T3)",
        "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIfEESt5arrayIPcLm3EEEEviT0_T1_",
        _LAUNCH, 3_000, (1, 1, 1), (128, 1, 1), 32),
    "tiny_mul": Kernel(
        "elementwise_kernel",
        "void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<"
        "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float>>>("
        "at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)",
        "_ZN2at6native18elementwise_kernelILi128ELi2EZNS0_22gpu_kernel_impl_nocastINS0_13BinaryFunctorIfffNS0_"
        "15binary_internal10MulFunctorIfEEEEEEvRNS_18TensorIteratorBaseERKT_EUliE_EEviT1_",
        _LAUNCH, 3_000, (1, 1, 1), (128, 1, 1), 18),
    "tiny_rsqrt": Kernel(
        "vectorized_elementwise_kernel",
        f"{_VEC}<(int)4, at::native::rsqrt_kernel_cuda(at::TensorIteratorBase &)::[lambda() (instance 2)]::"
        "operator ()() const::[lambda() (instance 2)]::operator ()() const::[lambda(float) (instance 1)], "
        "std::array<char *, (unsigned long)2>>(int, T2, T3)",
        "_ZN2at6native29vectorized_elementwise_kernelILi4EZZZNS0_17rsqrt_kernel_cudaERNS_18TensorIteratorBaseE"
        "ENKUlvE0_clEvENKUlvE0_clEvEUlfE_St5arrayIPcLm2EEEEviT0_T1_",
        _LAUNCH, 3_000, (1, 1, 1), (128, 1, 1), 16),
    "nccl_allreduce": Kernel(
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)",
        "_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE",
        _LAUNCH_EX, 0, (32, 1, 1), (640, 1, 1), 96, 0, 0),
}
FORWARD_LAYER = ("layer_norm", "gemm_qkv", "flash_fwd", "gemm_out", "residual_add_triton", "layer_norm",
                  "gemm_mlp_up", "gelu", "gemm_mlp_down", "residual_add")
LOSS = ("log_softmax_triton", "mean_reduce")
BACKWARD_LAYER = ("residual_add_triton", "gemm_dgrad", "gemm_wgrad", "gelu_backward", "gemm_dgrad",
                   "gemm_wgrad", "layer_norm_backward", "gamma_beta_backward", "gemm_dgrad", "gemm_wgrad",
                   "flash_bwd", "gemm_dgrad", "gemm_wgrad", "layer_norm_backward")
FUSED_OPTIMIZER = ("fused_adam", "fused_adam")
TINY = ("tiny_mul", "tiny_add", "tiny_rsqrt")
NCCL_KERNEL = "nccl_allreduce"

