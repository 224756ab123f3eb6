// Whether every row of an operand may be read in vectors of `vec` elements.
#pragma once

#include <cstdint>

#include "../params.h"

namespace sms {

inline bool rows_aligned(const void* data, const RowStrides& strides, const RowShape& shape, int vec,
                         int element_bytes) {
  if (reinterpret_cast<uintptr_t>(data) % (static_cast<uintptr_t>(vec) * element_bytes) != 0) return false;
  for (int d = 0; d < shape.dims; ++d) {
    if (strides.stride[d] % vec != 0) return false;
  }
  return true;
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

}  // namespace sms
