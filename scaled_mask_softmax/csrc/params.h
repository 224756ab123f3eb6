// What the kernels see: pointers, sizes and strides in plain structs, no torch headers.
// Sizes and strides count elements, not bytes.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#if defined(__CUDACC__)
#define SMS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SMS_HOST_DEVICE inline
#endif

namespace sms {

// Rows are addressed through the outer (non-softmax) dims of x, after dims of size 1 are dropped and
// neighbours merged wherever every operand allows it; six is more than any real attention layout needs.
constexpr int kMaxOuterDims = 6;

// n / d and n % d for a divisor d fixed before the launch. For n and d below 2^31, a multiply-high, an add and a
// shift (Granlund and Montgomery's round-up method, as in PyTorch's IntDivider), where a 32-bit division takes
// about twenty instructions on a GPU; 64-bit division otherwise.
struct Divisor {
  int64_t value = 1;
  uint32_t magic = 1;  // 0: divide in 64 bits
  int shift = 0;

  Divisor() = default;

  // On the host: the shift and the magic number of d >= 1 (d = 0, an empty dim, is never divided by).
  explicit Divisor(int64_t d) : value(d), magic(0) {
    if (d < 1 || d >= (int64_t{1} << 31)) return;
    while ((int64_t{1} << shift) < d) ++shift;
    magic = static_cast<uint32_t>((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d) / d + 1);
  }

  SMS_HOST_DEVICE int64_t quotient(int64_t n) const {
    if (magic != 0 && (n >> 31) == 0) {
      const uint32_t n32 = static_cast<uint32_t>(n);
#if defined(__CUDA_ARCH__)
      const uint32_t high = __umulhi(n32, magic);
#else
      const uint32_t high = static_cast<uint32_t>((static_cast<uint64_t>(n32) * magic) >> 32);
#endif
      return (high + n32) >> shift;
    }
    return n / value;
  }

  // n / d for n and d below 2^31 (magic != 0), known so by the caller: the multiply-high, add and shift alone, with
  // no 64-bit division beside them (on a GPU a call, whose registers saved across it can take a stack frame).
  SMS_HOST_DEVICE uint32_t small_quotient(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    return (__umulhi(n, magic) + n) >> shift;
#else
    return (static_cast<uint32_t>((static_cast<uint64_t>(n) * magic) >> 32) + n) >> shift;
#endif
  }

  // n / d, with n % d in `rest`.
  SMS_HOST_DEVICE int64_t quotient(int64_t n, int64_t& rest) const {
    const int64_t q = quotient(n);
    rest = n - q * value;
    return q;
  }

  SMS_HOST_DEVICE int64_t remainder(int64_t n) const {
    int64_t rest;
    quotient(n, rest);
    return rest;
  }
};

struct RowShape {
  int dims;
  Divisor size[kMaxOuterDims];
};

// One operand's strides over RowShape; within a row every operand is contiguous.
struct RowStrides {
  int64_t stride[kMaxOuterDims];
};

// Where row `row` starts in two operands that share `shape`. kEvenRows: the caller knows that shape has one dim
// (rows evenly spaced in both), so that a multiply is all that stands between a row's number and its first load.
template <bool kEvenRows = false>
SMS_HOST_DEVICE void row_starts(const RowShape& shape, int64_t row, const RowStrides& a, const RowStrides& b,
                                int64_t& a_start, int64_t& b_start) {
  // One dim (collapse_rows leaves contiguous operands so) tested first: the loop's bounds and its branches took
  // two reads of the parameters before the first load of every block.
  if (kEvenRows || shape.dims == 1) {
    a_start = row * a.stride[0];
    b_start = row * b.stride[0];
    return;
  }
  a_start = 0;
  b_start = 0;
  for (int d = shape.dims - 1; d > 0; --d) {
    int64_t index;
    row = shape.size[d].quotient(row, index);
    a_start += index * a.stride[d];
    b_start += index * b.stride[d];
  }
  // What is left is the outermost index (row < rows): no division needed.
  if (shape.dims > 0) {
    a_start += row * a.stride[0];
    b_start += row * b.stride[0];
  }
}

// The order in which the CUDA kernels take rows: visit v is row (v % outer) * inner + v / outer, so that the
// `outer` rows that read one row of a mask broadcast over the outermost dim (a bias over the batch) run together,
// and all but the first find it in L2. outer = 1 (the default): row v.
struct RowOrder {
  Divisor outer;
  int64_t inner = 0;

  // kShortcut: rows in their own order (inner 0, most launches) take no division before their first load: causal
  // forwards 0.5-1.6% faster (v60). The register forward without a causal limit goes without it: with it, 0.3-0.9%
  // slower at 4096 columns (v60), without it 0.6-1.0% faster again (v61).
  template <bool kShortcut = true>
  SMS_HOST_DEVICE int64_t row(int64_t visit) const {
    if (kShortcut && inner == 0) return visit;
    int64_t rest;
    const int64_t quotient = outer.quotient(visit, rest);
    return rest * inner + quotient;
  }
};

// One past the last element of an operand that its rows reach: the start of its last row (strides are not negative,
// so every index at its largest) plus `cols`.
inline int64_t rows_extent(const RowShape& shape, const RowStrides& strides, int64_t cols) {
  int64_t last = 0;
  for (int d = 0; d < shape.dims; ++d) last += (shape.size[d].value - 1) * strides.stride[d];
  return last + cols;
}

// An operand's last bytes from `from` (a boundary of 16 bytes, or of its vectors where those are longer) on, copied
// to `copy` (another) and padded to whole vectors past the operand's end: what rows that start mid-vector read where
// their vectors would pass it.
struct TailCopy {
  const void* from = nullptr;
  const void* copy = nullptr;
};

// y = softmax(x * scale + mask) over rows of `cols` elements; row r of y starts at r * output_row_stride.
struct ForwardParams {
  const void* x;
  const void* mask;  // nullptr when there is no mask; otherwise read through mask_strides (0 = broadcast)
  void* y;
  int64_t rows;
  int64_t cols;
  RowShape shape;
  RowStrides x_strides;
  RowStrides mask_strides;
  RowOrder order;
  // Row r holds query r % queries; with is_causal, key j is visible to query i iff j <= i + causal_offset.
  Divisor queries;
  bool is_causal;
  int64_t causal_offset;
  double scale;
  // cols, but where a launch takes only the keys before some column (narrowed_to_visible): y's own row length.
  int64_t output_row_stride = 0;
  // One past x's and the mask's last elements (rows_extent): rows that start mid-vector read the vectors that would
  // pass them from x_tail and mask_tail, set at their launch.
  const void* x_end = nullptr;
  const void* mask_end = nullptr;
  TailCopy x_tail;
  TailCopy mask_tail;
  // A zeroed counter from which a launch's blocks draw their rows in order, set at its launch: forward_staged's
  // (for_each_drawn_row, by launch_staged) and forward_staged_in_cluster's in clusters of two
  // (for_each_cluster_drawn_row).
  unsigned long long* next_row = nullptr;
};

// dx = scale * y * (dy - sum(dy * y)) over rows of `cols` elements; row r of dx starts at r * output_row_stride.
struct BackwardParams {
  const void* y;
  const void* dy;
  void* dx;
  int64_t rows;
  int64_t cols;
  RowShape shape;
  RowStrides y_strides;
  RowStrides dy_strides;
  // As in ForwardParams: hidden keys are never read and get zero gradient.
  Divisor queries;
  bool is_causal;
  int64_t causal_offset;
  double scale;
  // As in ForwardParams, for dx.
  int64_t output_row_stride = 0;
  // As in ForwardParams, for y and dy.
  const void* y_end = nullptr;
  const void* dy_end = nullptr;
  TailCopy y_tail;
  TailCopy dy_tail;
  // As in ForwardParams, for backward_staged.
  unsigned long long* next_row = nullptr;
  // backward_with_bias_grad: row r's scores took bias row r % bias_rows, whose gradient, the sum of the rows' score
  // gradients y * (dy - sum(dy * y)), is formed in the compute type in parts of up to rows_per_part of those rows
  // each: part t's sum of bias row k is row t * bias_rows + k of bias_grad, which holds bias_grad_rows rows.
  void* bias_grad = nullptr;
  Divisor bias_rows;
  int64_t rows_per_part = 0;
  int64_t bias_grad_rows = 0;
};

// One past the last key that row `row` may see: the keys [0, visible_end) take part in its softmax.
template <typename Params>
SMS_HOST_DEVICE int64_t visible_end(const Params& p, int64_t row) {
  if (!p.is_causal) return p.cols;
  const int64_t end = p.queries.remainder(row) + p.causal_offset + 1;
  return end < 0 ? 0 : (end > p.cols ? p.cols : end);
}

// Where row `row` of the output (y or dx) starts. Only causal launches are narrowed (narrowed_to_visible): kernels
// without a causal limit step by `cols`, which their loops hold already.
template <bool kCausal, typename Params>
SMS_HOST_DEVICE int64_t output_row_start(const Params& p, int64_t row) {
  return row * (kCausal ? p.output_row_stride : p.cols);
}

// The mask types a kernel is instantiated for: none, bool (true = attend) or a floating type added as is.
struct NoMask {};

template <typename mask_t>
constexpr bool has_mask_v = !std::is_same_v<mask_t, NoMask>;

// Bytes of one mask element; 0 without a mask.
template <typename mask_t>
constexpr int mask_bytes_v = has_mask_v<mask_t> ? static_cast<int>(sizeof(mask_t)) : 0;

template <typename acc_t, typename mask_t>
SMS_HOST_DEVICE acc_t additive_mask(mask_t value) {
  if constexpr (std::is_same_v<mask_t, bool>) {
    return value ? acc_t(0) : -std::numeric_limits<acc_t>::infinity();
  } else {
    return static_cast<acc_t>(value);
  }
}

}  // namespace sms
