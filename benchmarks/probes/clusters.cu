// How many blocks the GPU holds at once in thread-block clusters of 1-16 blocks, at one to three blocks of 512
// threads a multiprocessor (shared memory decides how many): a GPC holds whole clusters, and GPCs differ in size.
//   nvcc -arch=sm_90 -o /tmp/clusters benchmarks/probes/clusters.cu && /tmp/clusters
#include <cstdio>
#include <cuda_runtime.h>
__global__ void empty_kernel() {
  extern __shared__ char s[];
  if (threadIdx.x == 1234567) s[0] = 0;
}
int main() {
  cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  const int smem[3] = {150 * 1024, 100 * 1024, 70 * 1024};
  printf("blocks/SM:");
  for (int c = 1; c <= 16; ++c) printf(" c%d", c);
  printf("\n");
  for (int per = 0; per < 3; ++per) {
    printf("%d:", per + 1);
    for (int c = 1; c <= 16; ++c) {
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(c * 64);
      config.blockDim = dim3(512);
      config.dynamicSmemBytes = smem[per];
      cudaLaunchAttribute attr;
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = c; attr.val.clusterDim.y = 1; attr.val.clusterDim.z = 1;
      config.attrs = &attr; config.numAttrs = 1;
      int clusters = -1;
      cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, empty_kernel, &config);
      if (e != cudaSuccess) { printf(" err"); cudaGetLastError(); } else printf(" %d", clusters * c);
    }
    printf("\n");
  }
  return 0;
}
