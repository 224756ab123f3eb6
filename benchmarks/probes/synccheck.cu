// compute-sanitizer's synccheck against a kernel that does nothing but initialise an mbarrier (thread 0) between two
// cluster barriers, in clusters of `blocks` (up to 16 with the non-portable size allowed), `grid` blocks in all:
//   nvcc -std=c++17 -arch=sm_90 -o /tmp/synccheck benchmarks/probes/synccheck.cu
//   compute-sanitizer --tool synccheck /tmp/synccheck 16 640   (and 8 640, 16 16; and each without the sanitizer)
// On an H100 (CUDA 13): clusters of 9, 12 and 16 over several clusters stop with an illegal address and no report;
// one cluster of 16, clusters of 8, and every case without the sanitizer run clean (benchmarks/NOTES.md, "synccheck").
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__device__ __forceinline__ void cluster_barrier() {
  asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}

__global__ void mbarrier_in_cluster(int* out) {
  __shared__ uint64_t barrier;
  if (threadIdx.x == 0) {
    const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(&barrier));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(address));
  }
  cluster_barrier();
  cluster_barrier();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

int main(int argc, char** argv) {
  const int blocks = argc > 1 ? atoi(argv[1]) : 16;
  const int grid = argc > 2 ? atoi(argv[2]) : 640;
  int* out;
  cudaMalloc(&out, sizeof(int) * grid * 256);
  cudaFuncSetAttribute(mbarrier_in_cluster, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaLaunchAttribute cluster = {};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = blocks;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(256);
  config.attrs = &cluster;
  config.numAttrs = 1;
  const cudaError_t launched = cudaLaunchKernelEx(&config, mbarrier_in_cluster, out);
  const cudaError_t finished = cudaDeviceSynchronize();
  printf("clusters of %d, %d blocks: launch %s, run %s\n", blocks, grid, cudaGetErrorString(launched),
         cudaGetErrorString(finished));
  return finished != cudaSuccess;
}
