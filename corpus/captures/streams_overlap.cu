// A healthy pipeline, the pattern the book recommends: pinned host memory, 4 streams, and each chunk copied in,
// processed and copied out asynchronously on its own stream so copies overlap kernels. One sync at the end.
// Build: nvcc -O2 -o streams_overlap streams_overlap.cu
#include <cstdio>
#include <cuda_runtime.h>

__global__ void process(float* data, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = data[i];
    for (int k = 0; k < 200; ++k) v = v * 0.999f + 0.001f;
    data[i] = v;
}

int main() {
    const int streams = 4, chunks = 64, chunk = 1 << 22;
    float* host;
    float* device;
    cudaMallocHost(&host, sizeof(float) * chunk * streams);
    cudaMalloc(&device, sizeof(float) * chunk * streams);
    for (long i = 0; i < (long)chunk * streams; ++i) host[i] = 1.0f;
    cudaStream_t s[streams];
    for (int k = 0; k < streams; ++k) cudaStreamCreateWithFlags(&s[k], cudaStreamNonBlocking);
    for (int c = 0; c < chunks; ++c) {
        int k = c % streams;
        float* h = host + (size_t)k * chunk;
        float* d = device + (size_t)k * chunk;
        cudaMemcpyAsync(d, h, sizeof(float) * chunk, cudaMemcpyHostToDevice, s[k]);
        process<<<(chunk + 255) / 256, 256, 0, s[k]>>>(d, chunk);
        cudaMemcpyAsync(h, d, sizeof(float) * chunk, cudaMemcpyDeviceToHost, s[k]);
    }
    cudaDeviceSynchronize();
    printf("%f %s\n", host[0], cudaGetErrorString(cudaGetLastError()));
    for (int k = 0; k < streams; ++k) cudaStreamDestroy(s[k]);
    cudaFree(device);
    cudaFreeHost(host);
    return 0;
}
