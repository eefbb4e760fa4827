// A Jacobi-style solver loop, written as a beginner might: each iteration allocates its scratch buffer with
// cudaMalloc, frees it again, and copies a 4-byte convergence flag back with a blocking cudaMemcpy.
// Each iteration is an NVTX range "iteration" (nvtx3 is header-only).
// Build: nvcc -O2 -o sync_alloc sync_alloc.cu   Profile: nsys profile -t cuda,nvtx,osrt -o sync_alloc ./sync_alloc
#include <cstdio>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

__global__ void relax(const float* x, float* next, const float* b, int n, int* changed) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= 0 || i >= n - 1) return;
    float value = 0.5f * (x[i - 1] + x[i + 1]) + b[i];
    if (fabsf(value - x[i]) > 1e-3f) *changed = 1;
    next[i] = value;
}

int main() {
    const int n = 1 << 22, iterations = 300;
    float *x, *b;
    int* changed;
    cudaMalloc(&x, n * sizeof(float));
    cudaMalloc(&b, n * sizeof(float));
    cudaMalloc(&changed, sizeof(int));
    cudaMemset(x, 0, n * sizeof(float));
    cudaMemset(b, 0, n * sizeof(float));
    int host_changed = 1, done = 0;
    for (int it = 0; it < iterations && host_changed; ++it, ++done) {
        nvtxRangePushA("iteration");
        float* next;
        cudaMalloc(&next, n * sizeof(float));
        cudaMemset(changed, 0, sizeof(int));
        relax<<<(n + 255) / 256, 256>>>(x, next, b, n, changed);
        cudaMemcpy(&host_changed, changed, sizeof(int), cudaMemcpyDeviceToHost);
        cudaMemcpy(x, next, n * sizeof(float), cudaMemcpyDeviceToDevice);
        cudaFree(next);
        host_changed = 1;  // a fixed iteration count: the flag is read as a real solver would, then ignored
        nvtxRangePop();
    }
    cudaDeviceSynchronize();
    printf("%d iterations, last error %s\n", done, cudaGetErrorString(cudaGetLastError()));
    cudaFree(x);
    cudaFree(b);
    cudaFree(changed);
    return 0;
}
