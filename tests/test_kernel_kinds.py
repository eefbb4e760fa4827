"""kernel_kinds: kinds, architectures and display names from real kernel names."""

from __future__ import annotations

import sqlite3
from collections import defaultdict

import pytest
from conftest import FIXTURE_IDS, FIXTURES

from stallhound.analysis import kernel_kinds as kk

VEC = "void at::native::vectorized_elementwise_kernel"
FFMA = ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute"
        "_kernel__5x_cublas")

# (demangled name, short name, kind): names as nsys exported them from real programs (fixtures and our
# own H100 captures of PyTorch, torch.compile, JAX, CuPy and CUDA C programs).
REAL = [
    (FFMA, FFMA, "gemm-fp32"),
    ("void sgemm_largek_lds64<(bool)1, (bool)0, (int)5, (int)5, (int)4, (int)4, (int)4, (int)34>(float *, const "
     "float *, const float *, int, int, int, int, int, int, const float *, const float *, float, float, int, int, "
     "int *, int *)", "sgemm_largek_lds64", "gemm-fp32"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)", "Kernel2", "gemm-fp32"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_256x64_16x4_nt_align4>(T1::Params)", "Kernel2",
     "gemm-tensor"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_"
     "cublas", "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_"
     "kernel__5x_cublas", "gemm-tensor"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__"
     "5x_cublas", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_"
     "k_off_kernel__5x_cublas", "gemm-tensor"),
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN",
     "gemm-tensor"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_relubias_TNT", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_relubias"
     "_TNT", "gemm-tensor"),
    ("gemm_fusion_dot_general_1", "gemm_fusion_dot_general_1", "gemm"),
    ("void cublasLt::splitKreduce_kernel<(int)32, (int)16, int, float, float, float, float, (bool)0, float, float, "
     "float, (bool)1, (bool)0, (bool)0, (bool)0>(cublasLt::cublasSplitKParams<T6>, const T4 *, const T10 *, T9 *, "
     "T5 *, const T6 *, const T6 *, const T11 *, const T4 *, T11 *, void *, long, T6 *, int *, T6 *, T6 *)",
     "splitKreduce_kernel", "gemm"),
    ("void cublasLt::epilogue::impl::globalKernel<(int)8, (int)32, float, float, float, (bool)1, (bool)1, (int)1>("
     "int, int, long, T3 *, cublasLtEpilogue_t, int, T4 *, long, void *, long, long, long, T5 *, long, int *)",
     "globalKernel", "gemm"),
    ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<(int)128, (int)128, (int)64, (int)4, (bool)0, (bool)0, "
     "cutlass::bfloat16_t, Flash_kernel_traits<(int)128, (int)128, (int)64, (int)4, cutlass::bfloat16_t>>, (bool)0, "
     "(bool)0, (bool)0, (bool)0, (bool)0, (bool)1, (bool)0, (bool)0>(flash::Flash_fwd_params)", "flash_fwd_kernel",
     "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0",
     "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0",
     "attention"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)", "ncclDevKernel_SendRecv", "nccl"),
    ("void at::native::<unnamed>::vectorized_layer_norm_kernel<c10::BFloat16, float, (bool)0>(int, T2, const T1 *, "
     "const T1 *, const T1 *, T2 *, T2 *, T1 *)", "vectorized_layer_norm_kernel", "norm"),
    ("void at::native::<unnamed>::GammaBetaBackwardCUDAKernelTemplate<float, float, (unsigned int)32, (unsigned "
     "int)32, (unsigned int)256, (bool)0, (bool)1, (bool)0>(long, long, const T1 *, const T1 *, const T2 *, const "
     "T2 *, T1 *, T1 *)", "GammaBetaBackwardCUDAKernelTemplate", "norm"),
    ("void <unnamed>::softmax_warp_forward<float, float, float, (int)6, (bool)0, (bool)0>(T2 *, const T1 *, int, "
     "int, int, const bool *, int, bool)", "softmax_warp_forward", "norm"),
    ("triton_red_fused_native_layer_norm_native_layer_norm_backward_0",
     "triton_red_fused_native_layer_norm_native_layer_norm_backward_0", "norm"),
    (f"{VEC}<(int)8, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase &)::[lambda(float) (instance 1)], "
     "std::array<char *, (unsigned long)2>>(int, T2, T3)", "vectorized_elementwise_kernel", "copy"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase &)::"
     "[lambda() (instance 3)]::operator ()() const::[lambda() (instance 7)]::operator ()() const::[lambda(float) "
     "(instance 1)], std::array<char *, (unsigned long)2>, (int)4, TrivialOffsetCalculator<(int)1, unsigned int>, "
     "TrivialOffsetCalculator<(int)1, unsigned int>, at::native::memory::LoadWithCast<(int)1>, "
     "at::native::memory::StoreWithCast<(int)1>>(int, T1, T2, T4, T5, T6, T7)", "unrolled_elementwise_kernel",
     "copy"),
    ("void at::native::<unnamed>::CatArrayBatchedCopy_vectorized<at::native::<unnamed>::OpaqueType<(unsigned int)2>, "
     "unsigned int, (int)1, (int)128, (int)1, (int)16, (int)8>(char *, at::native::<unnamed>::CatArrInputTensor"
     "Metadata<T1, T2, T4, T5>, at::native::<unnamed>::TensorSizeStride<T2, (unsigned int)4>, int, T2)",
     "CatArrayBatchedCopy_vectorized", "copy"),
    ("input_concatenate_fusion", "input_concatenate_fusion", "copy"),
    ("void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::MeanOps<float, float, "
     "float, float>, unsigned int, float, (int)4, (int)4>>(T3)", "reduce_kernel", "reduction"),
    ("void at::native::<unnamed>::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(T1 *, T1 *, const T1 *, "
     "const T3 *, const T1 *, bool, long, long, long, long)", "nll_loss_forward_reduce_cuda_kernel_2d", "reduction"),
    ("triton_red_fused_sum_5", "triton_red_fused_sum_5", "reduction"),
    ("<unnamed>::nvfuser_inner_persistent_f1_c1_r0_g2(<unnamed>::Tensor<float, (int)2, (int)2>, <unnamed>::Tensor<"
     "float, (int)2, (int)2>, <unnamed>::Tensor<float, (int)3, (int)3>)", "nvfuser_inner_persistent_f1_c1_r0_g2",
     "reduction"),
    ("input_reduce_fusion_1", "input_reduce_fusion_1", "reduction"),
    (f"{VEC}<(int)4, at::native::CUDAFunctor_add<float>, std::array<char *, (unsigned long)3>>(int, T2, T3)",
     "vectorized_elementwise_kernel", "elementwise"),
    ("void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::TensorListMetadata<(int)2>, "
     "at::native::<unnamed>::UnaryOpFunctor<float, (int)2, (int)1, (int)1>, at::native::Sqrt<float>>(T1, T2, T3...)",
     "multi_tensor_apply_kernel", "elementwise"),
    ("triton_poi_fused_gelu_0", "triton_poi_fused_gelu_0", "elementwise"),
    ("<unnamed>::nvfuser_pointwise_f0_c1_r0_g0(<unnamed>::Tensor<float, (int)2, (int)2>, <unnamed>::Tensor<float, "
     "(int)2, (int)2>)", "nvfuser_pointwise_f0_c1_r0_g0", "elementwise"),
    ("loop_multiply_fusion", "loop_multiply_fusion", "elementwise"),
    ("wrapped_tanh", "wrapped_tanh", "elementwise"),
    ("cupy_multiply__float32_float32_float32", "cupy_multiply__float32_float32_float32", "elementwise"),
    ("void scal_kernel<float, float, (int)1, (bool)1, (int)6, (int)5, (int)5, (int)3>(cublasTransposeParams<T2>, "
     "const T1 *, T1 *, const T2 *)", "scal_kernel", "elementwise"),  # 'Transpose' in the parameters is no copy
    # the programs' own kernels: clue, extrap, pipit, CUDA C, CuPy RawKernel, NVRTC
    ("void kernel_calculate_distanceToHigherTile<TilesConstants>(TilesGPU<T1> *, PointsPtr, float, float, int)",
     "kernel_calculate_distanceToHigherTile", "custom"),
    ("void kernel_compute_histogram<TilesConstants>(TilesGPU<T1> *, PointsPtr, int)", "kernel_compute_histogram",
     "custom"),
    ("kernel_find_clusters(GPU::VecArray<int, (int)100000> *, GPU::VecArray<int, (int)32> *, PointsPtr, float, "
     "float, float, int)", "kernel_find_clusters", "custom"),
    ("test2(double *, unsigned long long, unsigned long long)", "test2", "custom"),
    ("saxpy(double *, double *, double *, double, int)", "saxpy", "custom"),
    ("stencil(int, const float *, float *)", "stencil", "custom"),
    ("smooth", "smooth", "custom"),
    ("k", "k", "custom"),
    # NVHPC offload programs (corpus: dtuhpc_omp_matmult_mnk, openaccpol_fill_allocloop): the runtime's fill kernels
    # are runtime helpers; the compiler's kernels are the program's own, whatever words of its source they carry
    ("__pgi_uacc_cuda_fill_42_gpu", "__pgi_uacc_cuda_fill_42_gpu", "runtime"),
    ("_21______src_cuda_fill_c___pgi_uacc_cuda_fill_44_gpu", "_21______src_cuda_fill_c___pgi_uacc_cuda_fill_44_gpu",
     "runtime"),
    ("nvkernel_matmult_mnk_offload_F1L115_7", "nvkernel_matmult_mnk_offload_F1L115_7", "custom"),
    ("main_53_gpu__red", "main_53_gpu__red", "custom"),
]


@pytest.mark.parametrize("name, short, kind", REAL, ids=[f"{k}-{s[:40]}" for _, s, k in REAL])
def test_kernel_kinds_of_real_names(name, short, kind):
    assert kk.kind_of(name, short) == kind


def test_kernel_kinds_every_kind_is_documented_and_reached():
    assert {k for _, _, k in REAL} == set(kk.KINDS) - {"conv"}  # no fixture has a convolution
    assert [kk.kind_of(n) for n in ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128",
                                    "void cudnn::detail::implicit_convolve_sgemm<float, float, (int)1024>(int)",
                                    "loop_convert_fusion")] == ["conv", "conv", "copy"]


# cuDNN's convolutions of a V100 run (corpus hta_ddp_resnet_v100_ws1) and FP16 tensor-core ones: (name, FP32 math)
CUDNN_CONVS = [
    ("cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1", True),  # implicit-GEMM, s: single precision
    ("cudnn_train_volta_scudnn_128x128_stridedB_splitK_medium_nn_v1", True),
    ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*, int)", True),
    ("void wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, false, 512>(int, int, int, float const*, int, float*)", True),
    ("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(cudnn::winograd_nonfused::"
     "WinogradDataParams<float, float>)", True),
    ("volta_fp16_s884cudnn_fp16_256x128_ldg8_relu_f2f_exp_small_nhwc2nchw_tn_v1", False),  # tensor cores
    ("volta_h884cudnn_256x64_ldg8_relu_exp_medium_nhwc_tn_v1", False),
    ("cask_cudnn_train::computeWgradSplitKOffsetsKernel(cask_cudnn_train::ComputeSplitKOffsetsParams)", False),
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128", False),  # TF32
]


@pytest.mark.parametrize("name, fp32", CUDNN_CONVS, ids=[n[:40] for n, _ in CUDNN_CONVS])
def test_kernel_kinds_cudnn_convolutions_and_their_fp32_math(name, fp32):
    assert (kk.kind_of(name), kk.fp32_conv(name)) == ("conv", fp32)


def test_kernel_kinds_without_names_is_custom():
    assert (kk.kind_of(None), kk.kind_of(None, "nvjet_tst_96x64_64x10_1x2_h_bz_bias_TNN")) == ("custom", "gemm-tensor")


@pytest.mark.parametrize("name, arch", [
    (FFMA, 80),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT", 90),
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", 90),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)", 80),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0", 90),
    ("ampere_sgemm_128x64_nn", 80),
    ("volta_sgemm_128x64_nn", 70),
    # CUB lists every architecture it was compiled for: not the one it runs on
    ("void cub::CUB_300102_SM_750_800_860_890_900_1000_1200::detail::reduce::DeviceReduceKernel<int>(int)", None),
    ("saxpy(double *, double *, double *, double, int)", None),
    (None, None),
])
def test_kernel_kinds_min_arch(name, arch):
    assert kk.min_arch_of(name) == arch


# --- parsing and display names ---------------------------------------------------------------------
@pytest.mark.parametrize("name, expected", [
    (f"{VEC}<(int)4, at::native::FillFunctor<float>, std::array<char *, (unsigned long)1>>(int, T2, T3)",
     kk.Signature("at::native::vectorized_elementwise_kernel",
                  ("(int)4", "at::native::FillFunctor<float>", "std::array<char *, (unsigned long)1>"), "int, T2, T3")),
    ("<unnamed>::nvfuser_pointwise_f0_c1_r0_g0(<unnamed>::Tensor<float, (int)2, (int)2>)",
     kk.Signature("nvfuser_pointwise_f0_c1_r0_g0", (), "Tensor<float, (int)2, (int)2>")),
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNN", kk.Signature("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNN", (), None)),
    ("void broken<int(float)", kk.Signature("broken<int(float)", (), None)),  # unbalanced: kept whole
    ("void f<a->b>(int)", kk.Signature("f", ("a->b",), "int")),  # an arrow is no bracket
])
def test_kernel_kinds_parse(name, expected):
    assert kk.parse(name) == expected


def test_kernel_kinds_simplify_lambdas_casts_namespaces():
    arg = ("void at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase &)::"
           "[lambda() (instance 3)]::operator ()() const::[lambda() (instance 7)]::operator ()() const::"
           "[lambda(c10::BFloat16) (instance 1)]>(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]")
    assert kk.simplify(arg) == "gpu_kernel_impl_nocast<direct_copy_kernel_cuda::lambda(BFloat16)>::lambda(int)"
    assert kk.simplify(arg, detailed=True) == ("gpu_kernel_impl_nocast<direct_copy_kernel_cuda::lambda()#3::lambda()#7"
                                               "::lambda(BFloat16)#1>::lambda(int)#1")
    assert kk.simplify("std::array<char *, (unsigned long)3>") == "array<char *, 3>"
    assert kk.simplify("(bool)0, (bool)1, (at::native::ADAM_MODE)1") == "false, true, 1"


H100_VEC = [  # vectorized_elementwise_kernel names of nsysai_h100_2gpu_1s
    f"{VEC}<(int)4, at::native::CUDAFunctor_add<float>, std::array<char *, (unsigned long)3>>(int, T2, T3)",
    f"{VEC}<(int)2, at::native::CUDAFunctor_add<long>, std::array<char *, (unsigned long)3>>(int, T2, T3)",
    f"{VEC}<(int)4, at::native::FillFunctor<float>, std::array<char *, (unsigned long)1>>(int, T2, T3)",
    f"{VEC}<(int)4, void at::native::<unnamed>::pow_tensor_scalar_kernel_impl<float, float>(at::TensorIteratorBase &"
    ", T2)::[lambda(float) (instance 1)], std::array<char *, (unsigned long)2>>(int, T2, T3)",
    f"{VEC}<(int)4, void at::native::<unnamed>::pow_tensor_scalar_kernel_impl<float, float>(at::TensorIteratorBase &"
    ", T2)::[lambda(float) (instance 2)], std::array<char *, (unsigned long)2>>(int, T2, T3)",
]


def test_kernel_kinds_display_names_tell_instantiations_apart():
    short = "vectorized_elementwise_kernel"
    assert kk.display_names(short, H100_VEC) == {
        H100_VEC[0]: "vectorized_elementwise_kernel<CUDAFunctor_add<float>>",
        H100_VEC[1]: "vectorized_elementwise_kernel<CUDAFunctor_add<long>>",
        H100_VEC[2]: "vectorized_elementwise_kernel<FillFunctor<float>>",
        # only the lambda's instance number differs
        H100_VEC[3]: "vectorized_elementwise_kernel<pow_tensor_scalar_kernel_impl<float, float>::lambda(float)#1>",
        H100_VEC[4]: "vectorized_elementwise_kernel<pow_tensor_scalar_kernel_impl<float, float>::lambda(float)#2>",
    }
    assert kk.display_names(short, H100_VEC[:1]) == {H100_VEC[0]: short}


@pytest.mark.parametrize("names, expected", [
    # the vector width and the functor both tell them apart: the type says more
    ([f"{VEC}<(int)4, at::native::FillFunctor<float>, std::array<char *, (unsigned long)1>>(int, T2, T3)",
      f"{VEC}<(int)2, at::native::FillFunctor<long>, std::array<char *, (unsigned long)1>>(int, T2, T3)"],
     ["k<FillFunctor<float>>", "k<FillFunctor<long>>"]),
    (["scale(int, float *, float)", "scale(int, double *, double)"],  # overloads: the parameters decide
     ["k(int, double *, double)", "k(int, float *, float)"]),
    (["a::k<int>(int)", "b::k<int>(int)"], ["a::k<int>(int)", "b::k<int>(int)"]),  # namespaces only: full names
    (["k<(int)1>(int)", "k<(int)2>(int)", "k<(int)2>(float)"], ["k<1>", "k<2>(float)", "k<2>(int)"]),
])
def test_kernel_kinds_display_name_fallbacks(names, expected):
    assert sorted(kk.display_names("k", names).values()) == expected


def test_kernel_kinds_display_names_are_bounded():
    long_arg = ", ".join(f"Functor{i}<float>" for i in range(40))
    names = [f"k<{long_arg}, (int){i}>(int)" for i in range(2)]
    labels = kk.display_names("k", names)
    assert all(len(v) <= kk.DISPLAY_CHARS for v in labels.values())
    assert labels[names[0]] == "k<0>"


# --- golden: every kernel name of every fixture ----------------------------------------------------
def fixture_names(stem: str) -> list[tuple[str, str, int]]:
    """(demangled, short, total ns) per demangled name, from the raw export."""
    con = sqlite3.connect(f"file:{FIXTURES / f'{stem}.sqlite'}?mode=ro", uri=True)
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    if not con.execute("SELECT 1 FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_KERNEL'").fetchone():
        return []
    return con.execute("""SELECT d.value, s.value, sum(k."end" - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN StringIds d ON d.id = k.demangledName JOIN StringIds s ON s.id = k.shortName GROUP BY 1, 2""").fetchall()


@pytest.mark.parametrize("stem", FIXTURE_IDS)
def test_kernel_kinds_display_names_unique_on_fixtures(stem):
    groups = defaultdict(set)
    for name, short, _ in fixture_names(stem):
        groups[short].add(name)
    for short, names in groups.items():
        labels = kk.display_names(short, names)
        assert sorted(labels) == sorted(names)
        assert len(set(labels.values())) == len(names), short
        assert all(label.startswith(short) for label in labels.values())


@pytest.mark.parametrize("stem, kinds", [
    ("clue_t4_report4", {"custom"}),
    ("extrap_windows_con_kernel", {"custom"}),
    ("pipit_saxpy_mpi_a100", {"custom"}),
    ("nsysai_mock", {"reduction", "elementwise"}),
    ("nsysai_mfu_2gpu_before", {"attention", "gemm-tensor", "nccl", "copy", "elementwise", "norm", "reduction"}),
    ("fuser_h200_crossentropy", {"gemm-tensor", "reduction", "elementwise", "copy"}),
])
def test_kernel_kinds_on_fixtures(stem, kinds):
    assert {kk.kind_of(name, short) for name, short, _ in fixture_names(stem)} == kinds


def test_kernel_kinds_fp32_gemms_of_h100_fixture_are_its_ffma_kernels():
    names = fixture_names("nsysai_h100_2gpu_1s")
    fp32 = {n for n, s, _ in names if kk.kind_of(n, s) == "gemm-fp32"}
    assert fp32 == {n for n, _, _ in names if "_ffma_" in n} and len(fp32) == 7
    share = sum(t for n, _, t in names if n in fp32) / sum(t for _, _, t in names)
    assert share > 0.8  # FP32 GEMMs are most of its kernel time
