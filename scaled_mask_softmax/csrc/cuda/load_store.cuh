// Vector loads and stores with scalar tails; scale, mask and causal limit applied as a row is loaded.
#pragma once

#include <cuda_runtime.h>

#include <limits>

#include "../params.h"

namespace sms {

template <typename T, int N>
struct alignas(sizeof(T) * N) Vector {
  T element[N];
};

// Loads [col, col + VEC) of a row of `cols` as acc_t; a vector that crosses the end is read element by
// element and padded with `fill`. `row` must be aligned to VEC elements.
template <int VEC, typename acc_t, typename T>
__device__ __forceinline__ void load_vector(const T* row, int64_t col, int64_t cols, acc_t fill, acc_t (&out)[VEC]) {
  if (col + VEC <= cols) {
    const Vector<T, VEC> v = *reinterpret_cast<const Vector<T, VEC>*>(row + col);
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = static_cast<acc_t>(v.element[i]);
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = col + i < cols ? static_cast<acc_t>(row[col + i]) : fill;
  }
}

template <int VEC, typename acc_t, typename T>
__device__ __forceinline__ void store_vector(T* row, int64_t col, int64_t cols, const acc_t (&in)[VEC]) {
  if (col + VEC <= cols) {
    Vector<T, VEC> v;
#pragma unroll
    for (int i = 0; i < VEC; ++i) v.element[i] = static_cast<T>(in[i]);
    *reinterpret_cast<Vector<T, VEC>*>(row + col) = v;
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      if (col + i < cols) row[col + i] = static_cast<T>(in[i]);
    }
  }
}

// The scores s = x * scale + mask of one row, -inf past the keys the row may see.
template <typename scalar_t, typename mask_t, typename acc_t>
struct ScoreLoader {
  const scalar_t* x;
  const mask_t* mask;
  acc_t scale;
  int64_t visible_end;

  __device__ ScoreLoader(const ForwardParams& p, int64_t row) : scale(static_cast<acc_t>(p.scale)) {
    int64_t x_start, mask_start;
    row_starts(p.shape, row, p.x_strides, p.mask_strides, x_start, mask_start);
    x = static_cast<const scalar_t*>(p.x) + x_start;
    mask = static_cast<const mask_t*>(p.mask) + mask_start;
    visible_end = sms::visible_end(p, row);
  }

  template <int VEC>
  __device__ __forceinline__ void load(int64_t col, acc_t (&s)[VEC]) const {
    constexpr acc_t kMasked = -std::numeric_limits<acc_t>::infinity();
    if (col >= visible_end) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) s[i] = kMasked;
      return;
    }
    load_vector<VEC>(x, col, visible_end, acc_t(0), s);
#pragma unroll
    for (int i = 0; i < VEC; ++i) s[i] *= scale;
    if constexpr (!std::is_same_v<mask_t, NoMask>) {
      acc_t m[VEC];
      load_mask<VEC>(col, m);
#pragma unroll
      for (int i = 0; i < VEC; ++i) s[i] += m[i];
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      if (col + i >= visible_end) s[i] = kMasked;
    }
  }

 private:
  template <int VEC>
  __device__ __forceinline__ void load_mask(int64_t col, acc_t (&m)[VEC]) const {
    if (col + VEC <= visible_end) {
      const Vector<mask_t, VEC> v = *reinterpret_cast<const Vector<mask_t, VEC>*>(mask + col);
#pragma unroll
      for (int i = 0; i < VEC; ++i) m[i] = additive_mask<acc_t>(v.element[i]);
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) m[i] = col + i < visible_end ? additive_mask<acc_t>(mask[col + i]) : acc_t(0);
    }
  }
};

}  // namespace sms
