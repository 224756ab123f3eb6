// The CPU engine: y = softmax(scale * x + mask) and dx = scale * y * (dy - sum(dy * y)) over rows, a row at a time,
// in vectors of kLanes elements of the compute type (fp32, fp64 for fp64) held in SIMD registers. Every function is
// inlined into its caller, so that one compiled for a wider instruction set (scaled_mask_softmax.cpp) takes all of
// it in that set.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "params.h"

#if defined(__GNUC__)
#define SMS_CPU_INLINE [[gnu::always_inline]] inline
// On the engine's lambdas too, which are functions of their own: so that their bodies are compiled in their
// caller's instruction set.
#define SMS_CPU_LAMBDA_INLINE __attribute__((always_inline))
// Vectors pass only between inlined functions, so no call's ABI depends on the instruction set.
#pragma GCC diagnostic ignored "-Wpsabi"
#else
#define SMS_CPU_INLINE inline
#define SMS_CPU_LAMBDA_INLINE
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define SMS_CPU_F16C 1
// Declares the F16C builtins that the engine takes in functions compiled for F16C.
#include <immintrin.h>
#endif

namespace sms::cpu {

// Vectors of N elements of T (GCC's vector extensions, which compilers lower to the instruction set a function is
// compiled for); with N = 1, T itself, for compilers without the extensions (MSVC). GCC takes vector_size only on
// a type that is not a template's parameter, hence a specialization for each.
template <typename T, int N>
struct LanesOf {
  static_assert(N == 1, "vectors of these lane counts are declared below");
  using type = T;
};

#if defined(__GNUC__)
#define SMS_LANES_OF(T, N)                                          \
  template <>                                                       \
  struct LanesOf<T, N> {                                            \
    using type = T __attribute__((vector_size(N * sizeof(T))));     \
  };
#define SMS_LANES_OF_EACH_TYPE(N) \
  SMS_LANES_OF(float, N)          \
  SMS_LANES_OF(double, N)         \
  SMS_LANES_OF(uint8_t, N)        \
  SMS_LANES_OF(uint16_t, N)       \
  SMS_LANES_OF(uint32_t, N)       \
  SMS_LANES_OF(int32_t, N)        \
  SMS_LANES_OF(int64_t, N)
SMS_LANES_OF_EACH_TYPE(2)
SMS_LANES_OF_EACH_TYPE(4)
SMS_LANES_OF_EACH_TYPE(8)
SMS_LANES_OF_EACH_TYPE(16)
#undef SMS_LANES_OF_EACH_TYPE
#undef SMS_LANES_OF
#endif

// Elements of a buffer that holds a row of `cols` in whole vectors of any engine below (16 lanes at most).
inline int64_t row_room(int64_t cols) { return (cols + 15) / 16 * 16; }

// The engine for vectors of kLanes elements of the compute type, as many as one of the instruction set's registers
// holds (so that every operation maps to instructions: GCC takes some operations on wider vectors an element at a
// time); kF16C: the instruction set has F16C's fp16 conversions (every x86-64 CPU with AVX2 has).
template <int kLanes, bool kF16C>
struct Engine {
  template <typename T>
  using Lanes = typename LanesOf<T, kLanes>::type;

  template <typename Vector>
  SMS_CPU_INLINE static auto lane(const Vector& lanes, int index) {
    if constexpr (kLanes == 1) {
      return lanes;
    } else {
      return lanes[index];
    }
  }

  template <typename To, typename From>
  SMS_CPU_INLINE static Lanes<To> convert(const From& lanes) {
    if constexpr (kLanes == 1) {
      return static_cast<To>(lanes);
    } else {
      return __builtin_convertvector(lanes, Lanes<To>);
    }
  }

  template <typename To, typename From>
  SMS_CPU_INLINE static Lanes<To> bit_cast(const From& lanes) {
    static_assert(sizeof(Lanes<To>) == sizeof(From), "bit_cast keeps the bits");
    Lanes<To> result;
    std::memcpy(&result, &lanes, sizeof(result));
    return result;
  }

  // `value` in every lane; -0.0 too, which a sum with zeros would make +0.0.
  template <typename T>
  SMS_CPU_INLINE static Lanes<T> broadcast(T value) {
    return repeated(value, std::make_index_sequence<kLanes>{});
  }

  template <typename T, size_t... kIndex>
  SMS_CPU_INLINE static Lanes<T> repeated(T value, std::index_sequence<kIndex...>) {
    return Lanes<T>{(static_cast<void>(kIndex), value)...};
  }

  // Lane-wise `condition ? if_true : if_false`, condition being a comparison's result.
  template <typename Condition, typename Vector>
  SMS_CPU_INLINE static Vector select(const Condition& condition, const Vector& if_true, const Vector& if_false) {
    return condition ? if_true : if_false;
  }

  template <typename Condition>
  SMS_CPU_INLINE static bool any(const Condition& condition) {
    for (int index = 0; index < kLanes; ++index) {
      if (lane(condition, index)) return true;
    }
    return false;
  }

  template <typename Vector>
  SMS_CPU_INLINE static double lane_sum(const Vector& lanes) {
    double sum = 0;
    for (int index = 0; index < kLanes; ++index) sum += lane(lanes, index);
    return sum;
  }

  template <typename Vector>
  SMS_CPU_INLINE static auto lane_max(const Vector& lanes) {
    auto max = lane(lanes, 0);
    for (int index = 1; index < kLanes; ++index) max = std::max(max, lane(lanes, index));
    return max;
  }

  // exp(t) for t <= 0 or -inf (never NaN): 2^n * e^r with t = n ln2 + r, |r| <= ln2 / 2, e^r by its Taylor series to
  // r^7 (truncation below 6e-9, a tenth of fp32's ulp). Results below fp32's normal range (t < -87) are 0, as the
  // GPU's ex2.approx.ftz gives them.
  SMS_CPU_INLINE static Lanes<float> exp_nonpositive(const Lanes<float>& t) {
    constexpr float kLog2e = 1.44269504f;
    // ln 2 in two parts, the first with its low 12 bits zero, so that n * kLn2High is exact.
    constexpr float kLn2High = 0.693359375f;
    constexpr float kLn2Low = -2.12194440e-4f;
    // Adding and subtracting 1.5 * 2^23 rounds an fp32 of magnitude below 2^22 to the nearest integer.
    constexpr float kRound = 12582912.0f;
    const auto underflows = t < -87.0f;
    const Lanes<float> in_range = select(underflows, broadcast(-87.0f), t);
    const Lanes<float> n = (in_range * kLog2e + kRound) - kRound;
    const Lanes<float> r = (in_range - n * kLn2High) - n * kLn2Low;
    Lanes<float> series = broadcast(1.0f / 5040);
    series = series * r + 1.0f / 720;
    series = series * r + 1.0f / 120;
    series = series * r + 1.0f / 24;
    series = series * r + 1.0f / 6;
    series = series * r + 0.5f;
    series = series * r + 1.0f;
    series = series * r + 1.0f;
    // 2^n for n in [-126, 0]: n + 127 in the exponent field.
    const Lanes<float> power = bit_cast<float>((convert<int32_t>(n) + 127) << 23);
    return select(underflows, Lanes<float>{}, series * power);
  }

  // The same in fp64, the Taylor series to r^13 (truncation below 5e-18, a twentieth of fp64's ulp); results below
  // fp64's normal range (t < -708) are 0. n comes from the bits of the rounding sum itself: fp64 has no vector
  // conversion to 64-bit integers before AVX-512.
  SMS_CPU_INLINE static Lanes<double> exp_nonpositive(const Lanes<double>& t) {
    constexpr double kLog2e = 1.4426950408889634;
    // ln 2 in two parts, the first with its low 21 bits zero, so that n * kLn2High is exact.
    constexpr double kLn2High = 6.93147180369123816490e-01;
    constexpr double kLn2Low = 1.90821492927058770002e-10;
    // Adding 1.5 * 2^52 rounds to an integer, which the sum's low bits then hold.
    constexpr double kRound = 6755399441055744.0;
    const auto underflows = t < -708.0;
    const Lanes<double> in_range = select(underflows, broadcast(-708.0), t);
    const Lanes<double> shifted = in_range * kLog2e + kRound;
    const Lanes<double> n = shifted - kRound;
    const Lanes<double> r = (in_range - n * kLn2High) - n * kLn2Low;
    double factorial = 6227020800.0;  // 13!
    Lanes<double> series = broadcast(1.0 / factorial);
    for (int k = 12; k >= 1; --k) {
      factorial /= k + 1;
      series = series * r + 1.0 / factorial;
    }
    series = series * r + 1.0;
    // 2^n for n in [-1022, 0]: n + 1023 in the exponent field.
    const Lanes<int64_t> exponent = bit_cast<int64_t>(shifted) - bit_cast<int64_t>(broadcast(kRound)) + 1023;
    const Lanes<double> power = bit_cast<double>(exponent << 52);
    return select(underflows, Lanes<double>{}, series * power);
  }

  // fp16 bits as fp32, exactly: normal numbers rebiased, subnormals as integers times 2^-24; or by F16C.
  SMS_CPU_INLINE static Lanes<float> half_to_float(const Lanes<uint16_t>& half) {
#if defined(SMS_CPU_F16C)
    // GCC's builtins rather than the intrinsics, which would have to be inlined into functions without F16C.
    if constexpr (kF16C && kLanes == 8) {
      using Halves = short __attribute__((vector_size(16)));
      return __builtin_ia32_vcvtph2ps256((Halves)half);
    } else if constexpr (kF16C && kLanes == 16) {
      using Halves = short __attribute__((vector_size(16)));
      const auto low = __builtin_ia32_vcvtph2ps256((Halves)__builtin_shufflevector(half, half, 0, 1, 2, 3, 4, 5, 6, 7));
      const auto high =
          __builtin_ia32_vcvtph2ps256((Halves)__builtin_shufflevector(half, half, 8, 9, 10, 11, 12, 13, 14, 15));
      return __builtin_shufflevector(low, high, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    }
#endif
    const Lanes<uint32_t> bits = convert<uint32_t>(half);
    const Lanes<uint32_t> magnitude = bits & 0x7fff;
    const Lanes<uint32_t> exponent = bits & 0x7c00;
    const Lanes<uint32_t> normal = (magnitude << 13) + ((127 - 15) << 23);
    // Infinities and NaN: exponent 31 becomes 255.
    const Lanes<uint32_t> widened = select(exponent == 0x7c00, normal + ((255 - 31 - (127 - 15)) << 23), normal);
    const Lanes<float> subnormal = convert<float>(convert<int32_t>(magnitude)) * (1.0f / (1 << 24));
    const Lanes<uint32_t> unsigned_bits = select(exponent == 0, bit_cast<uint32_t>(subnormal), widened);
    return bit_cast<float>(unsigned_bits | ((bits & 0x8000) << 16));
  }

  // fp32 as fp16 bits, rounded to nearest even: overflow to infinity, NaN kept quiet, values below fp16's normal
  // range rounded by the FPU's own addition to 0.5, whose ulp (2^-24) is fp16's smallest subnormal; or by F16C.
  SMS_CPU_INLINE static Lanes<uint16_t> float_to_half(const Lanes<float>& value) {
#if defined(SMS_CPU_F16C)
    // Rounding mode 0: to nearest even.
    if constexpr (kF16C && kLanes == 8) {
      return (Lanes<uint16_t>)__builtin_ia32_vcvtps2ph256(value, 0);
    } else if constexpr (kF16C && kLanes == 16) {
      using Halves = unsigned short __attribute__((vector_size(16)));
      const auto low =
          (Halves)__builtin_ia32_vcvtps2ph256(__builtin_shufflevector(value, value, 0, 1, 2, 3, 4, 5, 6, 7), 0);
      const auto high =
          (Halves)__builtin_ia32_vcvtps2ph256(__builtin_shufflevector(value, value, 8, 9, 10, 11, 12, 13, 14, 15), 0);
      return __builtin_shufflevector(low, high, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    }
#endif
    const Lanes<uint32_t> bits = bit_cast<uint32_t>(value);
    const Lanes<uint32_t> magnitude = bits & 0x7fffffff;
    const Lanes<uint32_t> normal = (magnitude - ((127 - 15) << 23) + 0xfff + ((magnitude >> 13) & 1)) >> 13;
    const Lanes<uint32_t> subnormal = bit_cast<uint32_t>(bit_cast<float>(magnitude) + 0.5f) - 0x3f000000;
    Lanes<uint32_t> half = select(magnitude < 0x38800000, subnormal, normal);
    // 65520 and more round to infinity; NaN's exponent is all ones and its mantissa nonzero.
    half = select(magnitude >= 0x477ff000, broadcast<uint32_t>(0x7c00), half);
    half = select(magnitude > 0x7f800000, broadcast<uint32_t>(0x7e00), half);
    return convert<uint16_t>(half | ((bits >> 16) & 0x8000));
  }

  // bf16 bits as fp32: the high half of its word.
  SMS_CPU_INLINE static Lanes<float> bfloat16_to_float(const Lanes<uint16_t>& bfloat16) {
    if constexpr (kLanes == 1) {
      return bit_cast<float>(convert<uint32_t>(bfloat16) << 16);
    } else {
      // Each value interleaved after a zero, as the high half of a 32-bit word: one or two shuffles, where GCC
      // widens 16-bit lanes to 32 bits in halves.
      return bit_cast<float>(interleaved_after_zeros(bfloat16, std::make_index_sequence<2 * kLanes>{}));
    }
  }

  template <size_t... kIndex>
  SMS_CPU_INLINE static auto interleaved_after_zeros(const Lanes<uint16_t>& values, std::index_sequence<kIndex...>) {
    return __builtin_shufflevector(Lanes<uint16_t>{}, values, (kIndex % 2 ? kLanes + kIndex / 2 : kIndex / 2)...);
  }

  // fp32 as bf16 bits, rounded to nearest even; NaN kept quiet.
  SMS_CPU_INLINE static Lanes<uint16_t> float_to_bfloat16(const Lanes<float>& value) {
    const Lanes<uint32_t> bits = bit_cast<uint32_t>(value);
    const Lanes<uint32_t> rounded = select(value != value, bits | 0x400000, bits + 0x7fff + ((bits >> 16) & 1));
    return convert<uint16_t>(rounded >> 16);
  }

  // The raw element type a vector of T is loaded and stored as.
  template <typename T>
  using RawOf = std::conditional_t<sizeof(T) == 2 && !std::is_integral_v<T>, uint16_t,
                                   std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>>;

  // Integers as wide as acc_t, and the lanes' indices in them, for selecting a vector's first lanes.
  template <typename acc_t>
  using LaneInt = std::conditional_t<sizeof(acc_t) == 4, int32_t, int64_t>;

  template <typename acc_t>
  SMS_CPU_INLINE static Lanes<LaneInt<acc_t>> lane_indices() {
    LaneInt<acc_t> indices[kLanes];
    for (int index = 0; index < kLanes; ++index) indices[index] = index;
    return bit_cast<LaneInt<acc_t>>(indices);
  }

  // The first `count` lanes of `lanes`, `filler` in the others.
  template <typename acc_t>
  SMS_CPU_INLINE static Lanes<acc_t> first_lanes(const Lanes<acc_t>& lanes, int64_t count, acc_t filler) {
    return select(lane_indices<acc_t>() < static_cast<LaneInt<acc_t>>(count), lanes, broadcast(filler));
  }

  // Calls body(col, std::false_type{}) for each whole vector of a row's first `count` elements, then body(col,
  // std::true_type{}) for the vector that holds their end, if any: the loop's body takes no branch by a row's length.
  template <typename Body>
  SMS_CPU_INLINE static void for_each_vector(int64_t count, Body&& body) {
    int64_t col = 0;
    for (; col + kLanes <= count; col += kLanes) body(col, std::false_type{});
    if (col < count) body(col, std::true_type{});
  }

  // Elements [col, col + kLanes) of a row of `length` elements in the compute type; a bool mask's as the additive
  // mask they stand for (0, or -inf where false). kTail: the vector that holds the end of the row's visible keys,
  // which may also hold its end (the lanes past it are then 0). The lanes past the visible keys hold what the row
  // holds there, which the caller drops: read whole, rather than left out by a branch per element.
  template <typename acc_t, typename T, bool kTail>
  SMS_CPU_INLINE static Lanes<acc_t> load(const T* row, int64_t col, std::bool_constant<kTail>, int64_t length) {
    Lanes<RawOf<T>> raw{};
    if (!kTail || col + kLanes <= length) {
      std::memcpy(&raw, row + col, sizeof(raw));
    } else {
      std::memcpy(&raw, row + col, (length - col) * sizeof(T));
    }
    Lanes<acc_t> lanes;
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      lanes = bfloat16_to_float(raw);
    } else if constexpr (std::is_same_v<T, c10::Half>) {
      lanes = half_to_float(raw);
    } else if constexpr (std::is_same_v<T, bool>) {
      // Through 16 bits: GCC widens bytes to 32 or 64 bits an element at a time.
      const Lanes<LaneInt<acc_t>> attend = convert<LaneInt<acc_t>>(convert<uint16_t>(raw));
      lanes = select(attend != 0, Lanes<acc_t>{}, broadcast(-std::numeric_limits<acc_t>::infinity()));
    } else {
      lanes = convert<acc_t>(raw);
    }
    return lanes;
  }

  // Stores `lanes` rounded to T at [col, col + kLanes) of a row of `length` elements. kTail: the vector that holds
  // the end of the row's first `count` elements, whose lanes from there on are stored as 0 where the row goes on
  // that far.
  template <typename acc_t, typename T, bool kTail>
  SMS_CPU_INLINE static void store(T* row, int64_t col, std::bool_constant<kTail>, int64_t count, int64_t length,
                                   const Lanes<acc_t>& lanes) {
    Lanes<acc_t> kept = lanes;
    if constexpr (kTail) kept = first_lanes(lanes, count - col, acc_t(0));
    Lanes<RawOf<T>> raw;
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      raw = float_to_bfloat16(kept);
    } else if constexpr (std::is_same_v<T, c10::Half>) {
      raw = float_to_half(kept);
    } else {
      raw = convert<T>(kept);
    }
    if (!kTail || col + kLanes <= length) {
      std::memcpy(row + col, &raw, sizeof(raw));
    } else {
      std::memcpy(row + col, &raw, (count - col) * sizeof(T));
    }
  }

  // The vector at `col` of a buffer, by memcpy: the buffer is allocated outside the functions compiled for wider
  // instruction sets, whose vectors want more alignment than it has.
  template <typename acc_t>
  SMS_CPU_INLINE static Lanes<acc_t> load_lanes(const acc_t* buffer, int64_t col) {
    Lanes<acc_t> lanes;
    std::memcpy(&lanes, buffer + col, sizeof(lanes));
    return lanes;
  }

  template <typename acc_t>
  SMS_CPU_INLINE static void store_lanes(acc_t* buffer, int64_t col, const Lanes<acc_t>& lanes) {
    std::memcpy(buffer + col, &lanes, sizeof(lanes));
  }

  // Sums vectors lane by lane in the compute type, kBlock vectors at a time, and the blocks in double: each lane
  // adds at most kBlock terms in fp32 (an error of a few ulps) however long the row.
  template <typename acc_t>
  class BlockedSum {
   public:
    SMS_CPU_INLINE void add(const Lanes<acc_t>& terms) {
      partial_ = partial_ + terms;
      if (++count_ == kBlock) {
        total_ += lane_sum(partial_);
        partial_ = Lanes<acc_t>{};
        count_ = 0;
      }
    }

    SMS_CPU_INLINE double total() const { return total_ + lane_sum(partial_); }

   private:
    static constexpr int kBlock = 64;
    Lanes<acc_t> partial_{};
    int count_ = 0;
    double total_ = 0;
  };

  // Rows [begin, end) of y = softmax(scale * x + mask): the scores into `scores` (room for a row rounded up to whole
  // vectors: row_room) with their max, then exp(score - max) in place with its sum, then y.
  template <typename scalar_t, typename mask_t, typename acc_t>
  SMS_CPU_INLINE static void forward_rows(const ForwardParams& p, int64_t begin, int64_t end, acc_t* scores) {
    constexpr acc_t kInfinity = std::numeric_limits<acc_t>::infinity();
    const acc_t scale = static_cast<acc_t>(p.scale);
    for (int64_t row = begin; row < end; ++row) {
      int64_t x_start, mask_start;
      row_starts(p.shape, row, p.x_strides, p.mask_strides, x_start, mask_start);
      const auto* x_row = static_cast<const scalar_t*>(p.x) + x_start;
      const auto* mask_row = static_cast<const mask_t*>(p.mask) + mask_start;
      auto* y_row = static_cast<scalar_t*>(p.y) + row * p.cols;
      const int64_t visible = visible_end(p, row);
      Lanes<acc_t> max = broadcast(-kInfinity);
      auto nan_seen = max != max;
      for_each_vector(visible, [&](int64_t col, auto tail) SMS_CPU_LAMBDA_INLINE {
        Lanes<acc_t> s = load<acc_t>(x_row, col, tail, p.cols) * scale;
        if constexpr (has_mask_v<mask_t>) s = s + load<acc_t>(mask_row, col, tail, p.cols);
        // Past the visible keys: -inf, which neither the max nor the sum sees.
        if constexpr (decltype(tail)::value) s = first_lanes(s, visible - col, -kInfinity);
        store_lanes(scores, col, s);
        max = select(s > max, s, max);
        nan_seen = nan_seen | (s != s);
      });
      const acc_t row_max = lane_max(max);
      // A NaN or +inf score makes the row NaN, as in torch.softmax.
      if (any(nan_seen) || row_max == kInfinity) {
        std::fill(y_row, y_row + p.cols, static_cast<scalar_t>(std::numeric_limits<acc_t>::quiet_NaN()));
        continue;
      }
      // A fully masked row (max -inf) shifts by 0, sums to 0 and is written as zeros.
      const acc_t shift = row_max == -kInfinity ? acc_t(0) : row_max;
      BlockedSum<acc_t> sum;
      for (int64_t col = 0; col < visible; col += kLanes) {
        const Lanes<acc_t> terms = exp_nonpositive(load_lanes(scores, col) - shift);
        store_lanes(scores, col, terms);
        sum.add(terms);
      }
      const double total = sum.total();
      const acc_t inverse = total == 0 ? acc_t(0) : static_cast<acc_t>(1 / total);
      for_each_vector(visible, [&](int64_t col, auto tail) SMS_CPU_LAMBDA_INLINE {
        store<acc_t>(y_row, col, tail, visible, p.cols, load_lanes(scores, col) * inverse);
      });
      std::fill(y_row + visible, y_row + p.cols, scalar_t(0));
    }
  }

  // Rows [begin, end) of dx = scale * y * (dy - sum(dy * y)). 16-bit y and dy are widened once, into `widened`
  // (two rows' row_room), which the second pass reads.
  template <typename scalar_t, typename acc_t>
  SMS_CPU_INLINE static void backward_rows(const BackwardParams& p, int64_t begin, int64_t end, acc_t* widened) {
    for (int64_t row = begin; row < end; ++row) backward_row<scalar_t, acc_t, false>(p, row, widened, nullptr);
  }

  // Groups [begin, end) of backward_with_bias_grad (BackwardParams): group g sums the score gradients of its part of
  // the rows of bias row g % bias_rows into `sums` (row_room elements), taking dx of each, and stores them as row g
  // of bias_grad.
  template <typename scalar_t, typename acc_t>
  SMS_CPU_INLINE static void bias_grad_groups(const BackwardParams& p, int64_t begin, int64_t end, acc_t* widened,
                                              acc_t* sums) {
    const int64_t repeats = p.rows / p.bias_rows.value;
    for (int64_t group = begin; group < end; ++group) {
      int64_t bias_row;
      const int64_t part = p.bias_rows.quotient(group, bias_row);
      std::fill(sums, sums + row_room(p.cols), acc_t(0));
      const int64_t last = std::min(repeats, (part + 1) * p.rows_per_part);
      for (int64_t repeat = part * p.rows_per_part; repeat < last; ++repeat) {
        backward_row<scalar_t, acc_t, true>(p, repeat * p.bias_rows.value + bias_row, widened, sums);
      }
      auto* bias_grad_row = static_cast<acc_t*>(p.bias_grad) + group * p.cols;
      for_each_vector(p.cols, [&](int64_t col, auto tail) SMS_CPU_LAMBDA_INLINE {
        store<acc_t>(bias_grad_row, col, tail, p.cols, p.cols, load_lanes(sums, col));
      });
    }
  }

  // One row of dx; kSums: its score gradient y * (dy - sum(dy * y)) added to `sums` too, dx being scale times it.
  template <typename scalar_t, typename acc_t, bool kSums>
  SMS_CPU_INLINE static void backward_row(const BackwardParams& p, int64_t row, acc_t* widened, acc_t* sums) {
    constexpr bool kWiden = !std::is_same_v<scalar_t, acc_t>;
    const acc_t scale = static_cast<acc_t>(p.scale);
    const int64_t room = row_room(p.cols);
    int64_t y_start, dy_start;
    row_starts(p.shape, row, p.y_strides, p.dy_strides, y_start, dy_start);
    const auto* y_row = static_cast<const scalar_t*>(p.y) + y_start;
    const auto* dy_row = static_cast<const scalar_t*>(p.dy) + dy_start;
    auto* dx_row = static_cast<scalar_t*>(p.dx) + row * p.cols;
    const int64_t visible = visible_end(p, row);
    BlockedSum<acc_t> dot;
    for_each_vector(visible, [&](int64_t col, auto tail) SMS_CPU_LAMBDA_INLINE {
      const Lanes<acc_t> y_lanes = load<acc_t>(y_row, col, tail, p.cols);
      const Lanes<acc_t> dy_lanes = load<acc_t>(dy_row, col, tail, p.cols);
      if constexpr (kWiden) {
        store_lanes(widened, col, y_lanes);
        store_lanes(widened + room, col, dy_lanes);
      }
      const Lanes<acc_t> terms = y_lanes * dy_lanes;
      // Past the visible keys: nothing, whatever y and dy hold there.
      dot.add(decltype(tail)::value ? first_lanes(terms, visible - col, acc_t(0)) : terms);
    });
    const acc_t row_dot = static_cast<acc_t>(dot.total());
    for_each_vector(visible, [&](int64_t col, auto tail) SMS_CPU_LAMBDA_INLINE {
      Lanes<acc_t> y_lanes, dy_lanes;
      if constexpr (kWiden) {
        y_lanes = load_lanes(widened, col);
        dy_lanes = load_lanes(widened + room, col);
      } else {
        y_lanes = load<acc_t>(y_row, col, tail, p.cols);
        dy_lanes = load<acc_t>(dy_row, col, tail, p.cols);
      }
      if constexpr (kSums) {
        Lanes<acc_t> score_grad = y_lanes * (dy_lanes - row_dot);
        if constexpr (decltype(tail)::value) score_grad = first_lanes(score_grad, visible - col, acc_t(0));
        store_lanes(sums, col, load_lanes(sums, col) + score_grad);
        store<acc_t>(dx_row, col, tail, visible, p.cols, scale * score_grad);
      } else {
        store<acc_t>(dx_row, col, tail, visible, p.cols, scale * y_lanes * (dy_lanes - row_dot));
      }
    });
    std::fill(dx_row + visible, dx_row + p.cols, scalar_t(0));
  }
};

}  // namespace sms::cpu
