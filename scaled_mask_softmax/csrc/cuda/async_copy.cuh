// sm_90 mbarriers in shared memory, for copies that run beside the threads: st.async between the blocks of a
// cluster, and bulk copies from global memory, count their bytes on the receiver's barrier, which the receiving
// threads wait on.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace sms {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A barrier whose phase completes once `arrivals` threads have arrived and every byte they announced has landed.
__device__ __forceinline__ void barrier_init(uint64_t* barrier, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(barrier)), "r"(arrivals));
}

// Makes the barriers this thread initialised visible to the copies and to the cluster's other blocks.
__device__ __forceinline__ void barrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Arrives, announcing `bytes` still to land before the phase may complete.
__device__ __forceinline__ void barrier_arrive_expecting(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
}

// Waits until the phase of parity `phase` (0 for the first, 1 for the second, ...) has completed.
__device__ __forceinline__ void barrier_wait(uint64_t* barrier, uint32_t phase) {
  uint32_t complete = 0;
  while (!complete) {
    asm volatile(
        "{\n\t.reg .pred done;\n\tmbarrier.try_wait.parity.shared::cta.b64 done, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, done;\n\t}"
        : "=r"(complete)
        : "r"(shared_address(barrier)), "r"(phase)
        : "memory");
  }
}

// Has the copy engine bring `bytes` (a multiple of 16; both addresses 16-byte aligned) from global memory into this
// block's shared memory, counting them on `barrier` as they land.
__device__ __forceinline__ void bulk_copy_to_shared(void* destination, const void* source, uint32_t bytes,
                                                    uint64_t* barrier) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(shared_address(destination)), "l"(__cvta_generic_to_global(source)), "r"(bytes),
               "r"(shared_address(barrier))
               : "memory");
}

// Where `p` (in this block's shared memory) lies in the shared memory of the cluster's block `rank`.
__device__ __forceinline__ uint32_t in_cluster_block(const void* p, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(shared_address(p)), "r"(rank));
  return remote;
}

// Stores `value` at `remote` (in_cluster_block) and counts its 8 bytes on the barrier `remote_barrier` there.
__device__ __forceinline__ void send_to_cluster_block(uint32_t remote, uint64_t value, uint32_t remote_barrier) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];" ::"r"(remote),
               "r"(static_cast<uint32_t>(value)), "r"(static_cast<uint32_t>(value >> 32)), "r"(remote_barrier)
               : "memory");
}

#endif

}  // namespace sms
