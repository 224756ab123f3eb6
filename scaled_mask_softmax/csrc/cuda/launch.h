// How rows are spread over threads: one ladder by row length, shared by the forward and backward passes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace sms {

constexpr int kWarp = 32;
// Per-thread vectors of a row held in registers: 1, 2, 4 or 8.
constexpr int kMaxIters = 8;
// Blocks of the short-row tier: four warps, each split into groups of lanes, one group per row.
constexpr int kShortRowThreads = 128;
// Rows too long for registers: one block per row; 512 threads leave each room for kUnroll vectors of two operands.
constexpr int kLongRowThreads = 512;
// Vectors each thread of the two-pass kernels loads before using any.
constexpr int kUnroll = 4;
// Vectors each thread of the register kernels aims to hold: 64 bytes of bf16 in flight per thread, and the
// per-row work (finding where the row starts, the reductions) shared by enough elements.
constexpr int kTargetIters = 4;

// Threads per block that still leave a thread `data_registers` for its part of the row plus room for addresses,
// 64-bit row arithmetic and exp, so that nothing spills (65,536 registers per multiprocessor).
constexpr int max_threads_for(int data_registers) {
  return data_registers <= 32 ? 512 : data_registers <= 64 ? 256 : 128;
}

// Registers one vector of VEC elements of type T costs a thread that holds `operands` such vectors; fp64 counts
// double again, for the registers its exp and division take.
template <typename T>
constexpr int registers_for(int vec, int operands) {
  return operands * vec * static_cast<int>(sizeof(T)) / 4 * (sizeof(T) == 8 ? 2 : 1);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int next_power_of_two(int64_t n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

struct RowPlan {
  bool in_registers;  // false: the two-pass kernel, one block per row
  int iters;          // vectors per thread
  int width;          // threads per row: a power of two up to 32, or the whole block
  int threads;        // threads per block
};

// `registers_per_vector`: what one vector of the row costs a thread in registers (all operands it holds).
inline RowPlan plan_rows(int64_t cols, int vec, int registers_per_vector) {
  const int64_t vectors = ceil_div(cols, vec);
  if (vectors <= kWarp * kMaxIters) {
    // Short rows: a group of lanes per row, so that a warp may hold many rows.
    const int width = next_power_of_two(std::min<int64_t>(ceil_div(vectors, kTargetIters), kWarp));
    return {true, next_power_of_two(ceil_div(vectors, width)), width, kShortRowThreads};
  }
  for (int iters = kTargetIters; iters <= kMaxIters; iters *= 2) {
    const int threads = static_cast<int>(ceil_div(ceil_div(vectors, iters), kWarp) * kWarp);
    if (threads <= max_threads_for(iters * registers_per_vector)) return {true, iters, threads, threads};
  }
  return {false, 1, kLongRowThreads, kLongRowThreads};
}

// Calls body(std::integral_constant<int, iters>{}) for iters in 1, 2, 4, 8.
template <typename Body>
void with_iters(int iters, Body&& body) {
  switch (iters) {
    case 1: return body(std::integral_constant<int, 1>{});
    case 2: return body(std::integral_constant<int, 2>{});
    case 4: return body(std::integral_constant<int, 4>{});
    default: return body(std::integral_constant<int, 8>{});
  }
}

}  // namespace sms
