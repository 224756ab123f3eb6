// Whether every row of an operand may be read in vectors of `vec` elements, or from the vector boundary before it.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "../params.h"
#include "launch.h"

namespace sms {

inline bool rows_aligned(const void* data, const RowStrides& strides, const RowShape& shape, int vec,
                         int element_bytes) {
  if (reinterpret_cast<uintptr_t>(data) % (static_cast<uintptr_t>(vec) * element_bytes) != 0) return false;
  for (int d = 0; d < shape.dims; ++d) {
    if (strides.stride[d] % vec != 0) return false;
  }
  return true;
}

// Whether every row of operand `a` starts as far into a vector of `vec` elements as the same row of operand `b`,
// both starting on a vector boundary (of `vec` elements of each operand's own size): then a kernel may read and write
// both from the vector boundary before each row's start (rows that start mid-vector, ScoreLoader's and GradientRow's
// kShifted), one vector of `b` for each of `a`'s.
inline bool rows_shifted_alike(const void* a, const RowStrides& a_strides, int a_element_bytes, const void* b,
                               const RowStrides& b_strides, int b_element_bytes, const RowShape& shape, int vec) {
  if (reinterpret_cast<uintptr_t>(a) % (static_cast<uintptr_t>(vec) * a_element_bytes) != 0 ||
      reinterpret_cast<uintptr_t>(b) % (static_cast<uintptr_t>(vec) * b_element_bytes) != 0) {
    return false;
  }
  for (int d = 0; d < shape.dims; ++d) {
    if (shape.size[d].value > 1 && (a_strides.stride[d] - b_strides.stride[d]) % vec != 0) return false;
  }
  return true;
}

// Whether every row of p's mask (of `mask_bytes` elements) starts as far into a vector of `vec` elements as the same
// row of x (of `x_bytes` elements) or half a vector further, and the mask ends on a half vector's boundary: then the
// shifted kernels read a floating mask whose rows are not alike as two half vectors for each of x's
// (MaskPlacement::kHalfApart), none past its end, and it is not written out over batches (repeat_mask_alike).
inline bool mask_rows_in_half_vectors(const ForwardParams& p, int x_bytes, int mask_bytes, int vec) {
  return rows_shifted_alike(p.x, p.x_strides, x_bytes, p.mask, p.mask_strides, mask_bytes, p.shape, vec / 2) &&
         reinterpret_cast<uintptr_t>(p.mask_end) % (static_cast<uintptr_t>(vec / 2) * mask_bytes) == 0;
}

// Contiguous rows of `cols` (the outputs) start aligned when cols is a multiple of vec.
inline RowStrides contiguous_row_strides(const RowShape& shape, int64_t cols) {
  RowStrides strides{};
  int64_t stride = cols;
  for (int d = shape.dims - 1; d >= 0; --d) {
    strides.stride[d] = stride;
    stride *= shape.size[d].value;
  }
  return strides;
}

// The copy of an operand's last bytes (TailCopy) that its rows of `cols` elements of type T, read in vectors of VEC
// from the vector boundary before each row's start, read where their vectors would pass the operand's `end`, made
// on `stream`: from the boundary (of 16 bytes, or of a vector where that is longer) at or before the first vector of
// any such row (none starts before `data`) to `end`, padded with zeros to the next boundary. None (an undefined
// tensor, `tail` left unset) where `end` is a boundary itself. The returned tensor holds the copy; stream-ordered,
// it may be freed once the launch that reads it is on the stream.
template <typename T, int VEC>
at::Tensor copy_tail(const void* data, const void* end, int64_t cols, TailCopy& tail, cudaStream_t stream) {
  const uintptr_t boundary = std::max<uintptr_t>(VEC * sizeof(T), 16);
  // The most bytes the vectors of one row span.
  const auto span_bytes = static_cast<uintptr_t>((cols + 2 * VEC - 2) / VEC * VEC) * sizeof(T);
  const auto end_address = reinterpret_cast<uintptr_t>(end);
  if (end_address % boundary == 0) return {};
  const auto data_address = reinterpret_cast<uintptr_t>(data);
  const uintptr_t lowest = end_address - data_address > span_bytes ? end_address - span_bytes : data_address;
  const uintptr_t from = lowest / boundary * boundary;
  const auto bytes = static_cast<int64_t>(end_address - from);
  const auto padded = static_cast<int64_t>((end_address + boundary - 1) / boundary * boundary - from);
  at::Tensor copy = at::empty({padded}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, current_device()));
  auto* const bytes_of_copy = static_cast<char*>(copy.data_ptr());
  C10_CUDA_CHECK(cudaMemcpyAsync(bytes_of_copy, reinterpret_cast<const void*>(from), bytes, cudaMemcpyDeviceToDevice,
                                 stream));
  C10_CUDA_CHECK(cudaMemsetAsync(bytes_of_copy + bytes, 0, padded - bytes, stream));
  tail = {reinterpret_cast<const void*>(from), bytes_of_copy};
  return copy;
}

}  // namespace sms
