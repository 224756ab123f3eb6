// Vector loads and stores; scale, mask and causal limit applied as a row is loaded.
//
// A row is read in whole vectors of VEC elements: the dispatch takes VEC > 1 only when the row length is a
// multiple of VEC and every row starts aligned, so a vector lies wholly inside or wholly outside its row; or, in the
// register kernels, when every operand's row starts as far into a vector as x's (kShifted): the row is then read
// from the vector boundary before its start, the elements before it and past its end masked and never written.
// Loads are issued for all of a thread's vectors before any value is used (fetch, then convert), so that many
// loads are in flight per thread instead of one.
#pragma once

#include <cuda_runtime.h>

#include <limits>
#include <type_traits>

#include "../params.h"
#include "reduce.cuh"

namespace sms {

template <typename T, int N>
struct alignas(sizeof(T) * N) Vector {
  T element[N];
};

template <int VEC, typename T, typename Index>
__device__ __forceinline__ Vector<T, VEC> load_vector(const T* row, Index col) {
  return *reinterpret_cast<const Vector<T, VEC>*>(row + col);
}

// L2 eviction priorities for loads (sm_80+): the two-pass kernels read a slice with kKeepInL2 in pass 1, so that
// it is still in L2 when pass 2 reads it for the last time, with kLeaveL2, making room for the slices after it.
enum class L2Priority { kKeepInL2, kLeaveL2 };

// The cache policy (createpolicy) that loads pass to ld's L2::cache_hint.
__device__ __forceinline__ uint64_t l2_policy(L2Priority priority) {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (priority == L2Priority::kKeepInL2) {
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  } else {
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  }
#endif
  return policy;
}

// How a two-pass kernel's loads of one pass are cached: pass 1 keeps its slice in L1 as well as L2
// (L1::evict_last), pass 2 lets it go first from both (L1::evict_first). A block reads its slice again on the same
// multiprocessor; without the L1 qualifiers the backward's second read measured 1-9% slower (benchmarks/NOTES.md,
// v33). The forward's loads of x take L2's policy alone (hint_l1 false): with the L1 qualifiers its rows of 32 KiB
// measured 2-4% slower (v35).
struct PassCaching {
  enum class L1 { kUnhinted, kEvictLast, kEvictFirst };
  uint64_t policy = 0;  // l2_policy
  L1 l1 = L1::kUnhinted;

  __device__ static PassCaching of(L2Priority priority, bool hint_l1 = true) {
    const L1 l1 = !hint_l1 ? L1::kUnhinted : priority == L2Priority::kKeepInL2 ? L1::kEvictLast : L1::kEvictFirst;
    return {l2_policy(priority), l1};
  }
};

// load_vector, cached as `caching` says, where the vector is 16 bytes.
template <int VEC, typename T, typename Index>
__device__ __forceinline__ Vector<T, VEC> load_vector(const T* row, Index col, const PassCaching& caching) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (sizeof(Vector<T, VEC>) == 16) {
    uint32_t words[4];
    if (caching.l1 == PassCaching::L1::kUnhinted) {
      asm("ld.global.L2::cache_hint.v4.b32 {%0, %1, %2, %3}, [%4], %5;"
          : "=r"(words[0]), "=r"(words[1]), "=r"(words[2]), "=r"(words[3])
          : "l"(row + col), "l"(caching.policy));
    } else if (caching.l1 == PassCaching::L1::kEvictLast) {
      asm volatile("ld.global.L1::evict_last.L2::cache_hint.v4.b32 {%0, %1, %2, %3}, [%4], %5;"
                   : "=r"(words[0]), "=r"(words[1]), "=r"(words[2]), "=r"(words[3])
                   : "l"(row + col), "l"(caching.policy));
    } else {
      asm volatile("ld.global.L1::evict_first.L2::cache_hint.v4.b32 {%0, %1, %2, %3}, [%4], %5;"
                   : "=r"(words[0]), "=r"(words[1]), "=r"(words[2]), "=r"(words[3])
                   : "l"(row + col), "l"(caching.policy));
    }
    Vector<T, VEC> v;
    memcpy(&v, words, sizeof(v));
    return v;
  }
#endif
  return load_vector<VEC>(row, col);
}

// One 16-byte store, as four 32-bit words. Written out because the compiler split some stores of a struct of
// 16-bit class members (c10::Half, c10::BFloat16) into four 32-bit stores, four times the store requests.
// kEvictFirst: marked streaming (.cs): what a kernel writes it never reads, and in L2 it would push out what the
// two-pass kernels' second pass is still to read (benchmarks/NOTES.md, v9; measured in v10). The kernels that hold
// a row in registers store without it, measured faster: the single-pass backward on causal rows (after v13), the
// forward on rows of 128-65,536 columns (v57).
template <int VEC, bool kEvictFirst = true, typename T, typename Index>
__device__ __forceinline__ void store_bits(T* row, Index col, const Vector<T, VEC>& v) {
  if constexpr (sizeof(v) == 16) {
    uint32_t words[4];
    memcpy(words, &v, sizeof(v));
    if constexpr (kEvictFirst) {
      asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(row + col), "r"(words[0]), "r"(words[1]),
                   "r"(words[2]), "r"(words[3])
                   : "memory");
    } else {
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(row + col), "r"(words[0]), "r"(words[1]),
                   "r"(words[2]), "r"(words[3])
                   : "memory");
    }
  } else {
    *reinterpret_cast<Vector<T, VEC>*>(row + col) = v;
  }
}

template <typename T, int VEC, typename acc_t>
__device__ __forceinline__ Vector<T, VEC> converted(const acc_t (&values)[VEC]) {
  Vector<T, VEC> v;
#pragma unroll
  for (int i = 0; i < VEC; ++i) v.element[i] = static_cast<T>(values[i]);
  return v;
}

// Makes the compiler form `v` here, in registers of its own: where a vector is only stored, the compiler sinks its
// conversion to the store, and gives each such vector the registers of the last, whose store must first read them.
template <typename T, int VEC>
__device__ __forceinline__ void form_here(Vector<T, VEC>& v) {
  if constexpr (sizeof(v) == 16) {
    uint32_t words[4];
    memcpy(words, &v, sizeof(v));
    asm volatile("" : "+r"(words[0]), "+r"(words[1]), "+r"(words[2]), "+r"(words[3]));
    memcpy(&v, words, sizeof(v));
  }
}

template <int VEC, bool kEvictFirst = true, typename acc_t, typename T, typename Index>
__device__ __forceinline__ void store_vector(T* row, Index col, const acc_t (&values)[VEC]) {
  store_bits<VEC, kEvictFirst>(row, col, converted<T>(values));
}

// The elements [before, within) of the vector `values` stored at `col`, a vector boundary, as pieces of kPiece
// elements and smaller: each aligned piece that lies in the range where the piece twice its size that holds it does
// not. So the fewest aligned stores, at most two of each size, where one store an element was up to VEC - 1 (bf16
// rows of 49 and 97 columns up to 20% faster: benchmarks/NOTES.md, v113).
template <int kPiece, int VEC, typename acc_t, typename T, typename Index>
__device__ __forceinline__ void store_pieces(T* row, Index col, const acc_t (&values)[VEC], Index before,
                                             Index within) {
#pragma unroll
  for (int p = 0; p < VEC; p += kPiece) {
    const int holder = p / (2 * kPiece) * (2 * kPiece);
    const bool piece_in = p >= before && p + kPiece <= within;
    const bool holder_in = holder >= before && holder + 2 * kPiece <= within;
    if (piece_in && !holder_in) {
      Vector<T, kPiece> piece;
#pragma unroll
      for (int i = 0; i < kPiece; ++i) piece.element[i] = static_cast<T>(values[p + i]);
      *reinterpret_cast<Vector<T, kPiece>*>(row + col + p) = piece;
    }
  }
  if constexpr (kPiece > 1) store_pieces<kPiece / 2>(row, col, values, before, within);
}

// The elements of `values` that lie in [begin, end) stored at `col`: in one vector where all of them do, in aligned
// pieces (store_pieces) at the ends of a row that starts or ends mid-vector (kShifted).
// The bounds are compared as counts against constants, as in ScoreLoader::scores.
template <int VEC, bool kEvictFirst = true, typename acc_t, typename T, typename Index>
__device__ __forceinline__ void store_vector_within(T* row, Index col, const acc_t (&values)[VEC], Index begin,
                                                    Index end) {
  const Index before = begin - col;
  const Index within = end - col;
  if (before <= 0 && within >= VEC) {
    store_vector<VEC, kEvictFirst>(row, col, values);
    return;
  }
  if constexpr (VEC > 1) store_pieces<VEC / 2>(row, col, values, before, within);
}

// How many elements of a row's first vector lie before the row: its start's distance from the vector boundary.
template <int VEC, typename T>
__device__ __forceinline__ int lead_of(const T* row) {
  return static_cast<int>(reinterpret_cast<uintptr_t>(row) % (VEC * sizeof(T)) / sizeof(T));
}

// `value` in the vectors at `from`, from + step, ... before `end`: what a row holds past its visible keys. kShifted:
// the row may start and end mid-vector, and only its elements in [begin, end) are written (store_vector_within).
template <int VEC, bool kShifted = false, typename T>
__device__ __forceinline__ void store_filled(T* row, int64_t from, int64_t end, int64_t step, T value,
                                             int64_t begin = 0) {
  if constexpr (kShifted) {
    T values[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) values[i] = value;
    for (int64_t col = from; col < end; col += step) store_vector_within<VEC>(row, col, values, begin, end);
  } else {
    Vector<T, VEC> filled;
#pragma unroll
    for (int i = 0; i < VEC; ++i) filled.element[i] = value;
    for (int64_t col = from; col < end; col += step) store_bits(row, col, filled);
  }
}

// The elements of `vector` in acc_t. bf16 pairs are widened a 32-bit word at a time, one instruction an element
// (a shift, or a mask of the high half); the element-wise conversion took one and a half.
template <typename acc_t, typename T, int N>
__device__ __forceinline__ void widen(const Vector<T, N>& vector, acc_t (&out)[N]) {
  if constexpr (std::is_same_v<T, c10::BFloat16> && std::is_same_v<acc_t, float> && N % 2 == 0) {
    uint32_t words[N / 2];
    memcpy(words, &vector, sizeof(words));
#pragma unroll
    for (int w = 0; w < N / 2; ++w) {
      out[2 * w] = __uint_as_float(words[w] << 16);
      out[2 * w + 1] = __uint_as_float(words[w] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = static_cast<acc_t>(vector.element[i]);
  }
}

// What the keys of a bool mask add to their scores, four keys a 32-bit word: 0 where a key is seen (true), -inf
// where it is masked, as additive_mask. A bool is 0 or 1, so (byte ^ 1) << 7 turns a masked key's byte into 0x80
// and a seen key's into 0; one byte permute then copies that byte's sign into the top byte of the key's float and
// the byte itself into the next: 0xff800000 (-inf) or 0. Byte by byte, ptxas took five or six instructions a key.
template <int N>
__device__ __forceinline__ void additive_terms(const Vector<uint32_t, N / 4>& keys, float (&out)[N]) {
#pragma unroll
  for (int w = 0; w < N / 4; ++w) {
    const uint32_t signs = (keys.element[w] ^ 0x01010101u) << 7;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      // Selector nibbles from the top byte: byte k's sign (bit 3 set), byte k, then byte 4 (of the 0 operand).
      const uint32_t selector = 0x8044u | (k << 12) | (k << 8);
      uint32_t bits;
      asm("prmt.b32 %0, %1, %2, %3;" : "=r"(bits) : "r"(signs), "r"(0u), "r"(selector));
      out[4 * w + k] = __uint_as_float(bits);
    }
  }
}

// An empty asm that claims to change the words of `vector`: values formed from them before cannot be reused
// after, so they are formed again rather than held in registers in between.
template <typename T, int N>
__device__ __forceinline__ void reform_after(Vector<T, N>& vector) {
  static_assert(sizeof(vector) % 4 == 0, "whole 32-bit words");
  auto* words = reinterpret_cast<uint32_t*>(&vector);
#pragma unroll
  for (int w = 0; w < static_cast<int>(sizeof(vector) / 4); ++w) asm volatile("" : "+r"(words[w]));
}

// Calls visit(col, raw, whole) for each of a thread's vectors of a row (at first, first + step, ...) before
// `row.visible_end`, kUnroll loaded before any is used. Whole tiles of kUnroll are loaded without per-vector
// checks (whole: std::true_type), the last, partial tile through fetch() (whole: std::false_type). Returns the
// column of the thread's first vector past them. `Row` provides Raw, load(), fetch() and visible_end.
template <int VEC, int kUnroll, typename Row, typename Visit>
__device__ __forceinline__ int64_t for_each_visible_vector(const Row& row, int64_t first, int64_t step,
                                                           Visit visit) {
  // Tiles starting at or before this lie wholly before the visible end.
  const int64_t last_whole_tile = row.visible_end - (kUnroll - 1) * step - VEC;
  int64_t base = first;
#pragma unroll 1
  for (; base <= last_whole_tile; base += kUnroll * step) {
    typename Row::Raw raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) row.load(base + u * step, raw[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) visit(base + u * step, raw[u], std::true_type{});
  }
  if (base < row.visible_end) {
    // Zeroed first: partly assigned, an array of structs of 16-bit class members went to local memory.
    typename Row::Raw raw[kUnroll] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) row.fetch(base + u * step, raw[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) visit(base + u * step, raw[u], std::false_type{});
    base += kUnroll * step;
  }
  return base;
}

// `address`, formed once: seen through, the compiler folded a row's start into every vector's 64-bit address
// (base + (start + column) * size, four instructions an operand) where one IMAD.WIDE of a 32-bit column will do.
// The price: loads through it are generic (LD), no longer known to be global (LDG).
template <typename T>
__device__ __forceinline__ T* row_address(T* address) {
  asm("" : "+l"(address));
  return address;
}

// Issues the loads of `row`'s vector at `col` or, past the visible keys, of its last visible vector (its first if
// none is visible): in bounds with no branch or predicate, and what they bring past the visible keys is masked
// after. `Row` provides Raw, load() and visible_end.
template <int VEC, typename Row, typename Index>
__device__ __forceinline__ void load_clamped(const Row& row, Index col, typename Row::Raw& raw) {
  const auto last = row.visible_end > 0 ? (row.visible_end - 1) / VEC * VEC : 0;
  row.load(col < last ? col : last, raw);
}

// Whether the vectors of a row of `cols` that starts `lead` elements past `row` (a vector boundary) end before `end`.
template <int VEC, typename T, typename Index>
__device__ __forceinline__ bool vectors_fit(const T* row, Index lead, Index cols, const void* end) {
  return row + (lead + cols + VEC - 1) / VEC * VEC <= static_cast<const T*>(end);
}

// `row` (a vector boundary, its row starting `lead` elements further on), or where its vectors would pass its
// operand's `end`, the same place in the copy of the operand's last bytes (TailCopy), which holds them from
// `tail.from` on.
template <int VEC, typename T, typename Index>
__device__ __forceinline__ T* vectors_from(T* row, Index lead, Index cols, const void* end, const TailCopy& tail) {
  if (vectors_fit<VEC>(row, lead, cols, end)) return row;
  const auto offset = reinterpret_cast<const char*>(row) - static_cast<const char*>(tail.from);
  return reinterpret_cast<T*>(static_cast<const char*>(tail.copy) + offset);
}

// words[w] = words[w + kStep] for every w that has one, where `moved`. kStep a constant: the inner loop of a loop
// over the steps was left rolled where it had more than four 32-bit words to move (32-byte vectors), and `words` went
// to a stack frame indexed at run time (ptxas, sm_90).
template <int kStep, int kWords>
__device__ __forceinline__ void words_down_if(uint32_t (&words)[kWords], bool moved) {
#pragma unroll
  for (int w = 0; w + kStep < kWords; ++w) words[w] = moved ? words[w + kStep] : words[w];
}

// The vector that starts `shift_bytes` into `below`, the rest from `above`, the vector after it: 32-bit words
// chosen in halving steps, then a funnel shift within words. Where a row's elements lie elsewhere in their vectors
// than x's (MaskShift), two vector loads and this take the place of a load of each element.
template <typename V>
__device__ __forceinline__ V joined_at(const V& below, const V& above, int shift_bytes) {
  constexpr int kWords = static_cast<int>(sizeof(V) / 4);
  static_assert(kWords == 1 || kWords == 2 || kWords == 4 || kWords == 8, "vectors of 1, 2, 4 or 8 32-bit words");
  uint32_t words[2 * kWords];
  memcpy(words, &below, sizeof(below));
  memcpy(words + kWords, &above, sizeof(above));
  const int shift_words = shift_bytes / 4;
  if constexpr (kWords >= 8) words_down_if<4>(words, shift_words & 4);
  if constexpr (kWords >= 4) words_down_if<2>(words, shift_words & 2);
  if constexpr (kWords >= 2) words_down_if<1>(words, shift_words & 1);
  uint32_t joined[kWords];
#pragma unroll
  for (int w = 0; w < kWords; ++w) joined[w] = __funnelshift_r(words[w], words[w + 1], shift_bytes % 4 * 8);
  V v;
  memcpy(&v, joined, sizeof(v));
  return v;
}

// Where a row that may start mid-vector (kShifted) starts: its first column, counted from the vector boundary before
// it. A constant for the rows that start on a boundary.
template <typename Index, bool kShifted>
struct RowStart {
  static constexpr Index first = 0;
};

template <typename Index>
struct RowStart<Index, true> {
  Index first = 0;

  // `row` (its vector boundary), or the same place in `tail` where its vectors would pass `end` (vectors_from).
  template <int VEC, typename T>
  __device__ __forceinline__ T* read_from(T* row, Index cols, const void* end, const TailCopy& tail) const {
    return vectors_from<VEC>(row, first, cols, end, tail);
  }
};

// Where the rows of a mask lie in their vectors against x's, in the kernels that take rows starting mid-vector
// (kShifted): kAlike, as far in as x's, read one vector for each of x's; kHalfApart, as far in or half a vector
// further, read as two half vectors for each of x's; kApart, anywhere, read as the two vectors each of its vectors
// spans, joined.
enum class MaskPlacement { kAlike, kHalfApart, kApart };

// Where a mask row lies against x's row, where that may start mid-vector (kShifted): `shift` elements further into
// its vector (joined_at where not 0), its first and last vectors (or half vectors) at `low` and `high` (counted as
// x's columns). A constant 0 shift for the rows that start on a boundary.
template <typename Index, bool kShifted>
struct MaskShift {
  static constexpr int shift = 0;
};

template <typename Index>
struct MaskShift<Index, true> {
  int shift = 0;
  Index low = 0;
  Index high = 0;
};

// The scores s = x * scale + mask of one row, -inf past the keys the row may see. Index: the type of a column,
// int where rows are short enough (the register kernels), whose address arithmetic then takes 32 bits. kShifted: the
// row may start mid-vector, as y's does (rows_shifted_alike); its columns are counted from the vector boundary before
// it, from which x is read, and the row's own start from `first`. A mask row that starts as far into its vector is
// read in vectors too, any other as the two vectors each of its vectors spans (joined_at). kMask: where the mask's
// rows may start in their vectors against x's (MaskPlacement); where kAlike, every one starts as far in as x's
// (rows_shifted_alike), and no vector is joined or held for it.
template <typename scalar_t, typename mask_t, typename acc_t, int VEC, typename Index = int64_t, bool kShifted = false,
          MaskPlacement kMask = kShifted ? MaskPlacement::kApart : MaskPlacement::kAlike>
struct ScoreLoader : RowStart<Index, kShifted> {
  using RowStart<Index, kShifted>::first;
  static constexpr bool kHasMask = has_mask_v<mask_t>;
  static constexpr bool kShiftedRows = kShifted;
  static constexpr bool kJoinsMask = kShifted && kHasMask && kMask == MaskPlacement::kApart;
  static constexpr bool kHalves = kShifted && kHasMask && kMask == MaskPlacement::kHalfApart;
  static_assert(!kHalves || (VEC % 2 == 0 && !std::is_same_v<mask_t, bool>), "half vectors of a floating mask");
  // A bool mask's vector travels as 32-bit words (additive_terms): loaded as bools, it was split into bytes and
  // packed again.
  static constexpr bool kBoolWords = std::is_same_v<mask_t, bool> && std::is_same_v<acc_t, float> && VEC % 4 == 0;
  using MaskVector = std::conditional_t<kBoolWords, Vector<uint32_t, VEC / 4>, Vector<mask_t, VEC>>;
  // What one vector's loads bring: x, and the mask if there is one. A mask row that starts elsewhere in its vector
  // than x's (MaskShift) brings two vectors, `mask` and the one after it, joined where they are used (visible_scores):
  // joined as they came, each vector's loads waited for those of the vector before (v104).
  struct Raw {
    Vector<scalar_t, VEC> x;
    std::conditional_t<kHasMask, MaskVector, NoMask> mask;
    [[no_unique_address]] std::conditional_t<kJoinsMask, MaskVector, NoMask> mask_after;
  };

  const scalar_t* x;
  const mask_t* mask;
  acc_t scale;
  Index visible_end;
  [[no_unique_address]] MaskShift<Index, kJoinsMask || kHalves> mask_shift;
  // The two-pass kernels' loads of x are cached as each pass says (set_caching); the others load plainly.
  static constexpr bool kL2Hints = std::is_same_v<Index, int64_t>;
  PassCaching x_caching;

  // causal: whether the kernel takes rows with a causal limit; a constant where inlined, so that the others skip
  // the limit's arithmetic before their first loads.
  __device__ ScoreLoader(const ForwardParams& p, int64_t row, bool causal) : scale(static_cast<acc_t>(p.scale)) {
    int64_t x_start, mask_start;
    row_starts(p.shape, row, p.x_strides, p.mask_strides, x_start, mask_start);
    x = static_cast<const scalar_t*>(p.x) + x_start;
    mask = static_cast<const mask_t*>(p.mask) + mask_start;
    if constexpr (kShifted) {
      first = lead_of<VEC>(x);
      const auto cols = static_cast<Index>(p.cols);
      x = this->template read_from<VEC>(x - first, cols, p.x_end, p.x_tail);
      if constexpr (kJoinsMask) {
        const int shift = lead_of<VEC>(mask - first);
        const Index lead = first + shift;
        mask = vectors_from<VEC>(mask - lead, lead, cols, p.mask_end, p.mask_tail);
        mask_shift = {shift, lead / VEC * VEC, (lead + cols - 1) / VEC * VEC};
      } else if constexpr (kHalves) {
        // Read as far as the row's own half vectors, which lie within the mask (launch_shifted): no tail copy.
        constexpr int kHalf = VEC / 2;
        mask -= first;
        mask_shift = {0, first / kHalf * kHalf, (first + cols - 1) / kHalf * kHalf};
      } else if constexpr (kHasMask) {
        mask = vectors_from<VEC>(mask - first, first, cols, p.mask_end, p.mask_tail);
      }
    }
    pin_addresses();
    visible_end = static_cast<Index>(causal ? sms::visible_end(p, row) : p.cols);
    if constexpr (kShifted) visible_end += first;
  }

  // A row whose x and mask lie at `x_row` and `mask_row` (in shared memory, where the staged kernels bring them),
  // its columns before `visible` visible. Not delegated to by the constructor above, as GradientRow's is not. Not
  // pinned (row_address): its loads are then known to read shared memory (LDS), where pinned they were generic.
  __device__ ScoreLoader(const ForwardParams& p, const scalar_t* x_row, const mask_t* mask_row, Index visible)
      : x(x_row), mask(mask_row), scale(static_cast<acc_t>(p.scale)), visible_end(visible) {}

  // The row's addresses formed once (row_address) where columns are 32-bit.
  __device__ __forceinline__ void pin_addresses() {
    if constexpr (std::is_same_v<Index, int>) {
      x = row_address(x);
      mask = row_address(mask);
    }
  }

  // Takes only the keys before `end` (a block's slice of the row): those past it read as masked.
  __device__ __forceinline__ void clip(Index end) { visible_end = visible_end < end ? visible_end : end; }

  // How the loads of x are cached from here on, where kL2Hints.
  __device__ __forceinline__ void set_caching(const PassCaching& caching) { x_caching = caching; }

  // Takes the row from column `begin` on (a block's slice of the row), which becomes column 0. Where kShifted, begin
  // counts from the vector boundary before the row and is a whole number of vectors: a slice after the first starts
  // within the row, and the mask's own vectors are counted from the slice too.
  __device__ __forceinline__ void start_at(Index begin) {
    x += begin;
    mask += begin;
    pin_addresses();
    visible_end = visible_end > begin ? visible_end - begin : 0;
    if constexpr (kShifted) first = begin > 0 ? 0 : first;
    if constexpr (kJoinsMask || kHalves) {
      mask_shift.low -= begin;
      mask_shift.high -= begin;
    }
  }

  // Issues the loads of the vector at `col`, which must lie before visible_end.
  __device__ __forceinline__ void load(Index col, Raw& raw) const {
    if constexpr (kL2Hints) {
      raw.x = load_vector<VEC>(x, col, x_caching);
    } else {
      raw.x = load_vector<VEC>(x, col);
    }
    if constexpr (kJoinsMask) {
      // Loads kept to the row's own vectors, which hold every element used (at shift 0, as x's are).
      raw.mask = load_mask(col > mask_shift.low ? col : mask_shift.low);
      if (mask_shift.shift != 0) {
        raw.mask_after = load_mask(col + VEC < mask_shift.high ? col + VEC : mask_shift.high);
      }
    } else if constexpr (kHalves) {
      raw.mask = load_mask_halves(col);
    } else if constexpr (kHasMask) {
      raw.mask = load_mask(col);
    }
  }

  __device__ __forceinline__ MaskVector load_mask(Index col) const {
    if constexpr (kBoolWords) {
      return load_vector<VEC / 4>(reinterpret_cast<const uint32_t*>(mask + col), 0);
    } else {
      return load_vector<VEC>(mask, col);
    }
  }

  // The mask's vector at `col` as two half vectors, each kept to the row's own (which hold every element used).
  __device__ __forceinline__ MaskVector load_mask_halves(Index col) const {
    constexpr int kHalf = VEC / 2;
    union {
      MaskVector whole;
      Vector<mask_t, kHalf> half[2];
    } halves;
    halves.half[0] = load_vector<kHalf>(mask, col > mask_shift.low ? col : mask_shift.low);
    halves.half[1] = load_vector<kHalf>(mask, col + kHalf < mask_shift.high ? col + kHalf : mask_shift.high);
    return halves.whole;
  }

  // Issues the loads of the vector at `col`; keys past the visible ones are never read.
  __device__ __forceinline__ void fetch(Index col, Raw& raw) const {
    if (col < visible_end) load(col, raw);
  }

  __device__ __forceinline__ static void reform_after(Raw& raw) {
    sms::reform_after(raw.x);
    if constexpr (kHasMask) sms::reform_after(raw.mask);
    if constexpr (kJoinsMask) sms::reform_after(raw.mask_after);
  }

  // The scores of a vector wholly before visible_end.
  __device__ __forceinline__ void visible_scores(const Raw& raw, acc_t (&s)[VEC]) const {
    widen(raw.x, s);
#pragma unroll
    for (int i = 0; i < VEC; ++i) s[i] *= scale;
    if constexpr (kHasMask) {
      MaskVector mask_vector = raw.mask;
      if constexpr (kJoinsMask) {
        if (mask_shift.shift != 0) {
          mask_vector = joined_at(raw.mask, raw.mask_after, mask_shift.shift * static_cast<int>(sizeof(mask_t)));
        }
      }
      acc_t m[VEC];
      if constexpr (kBoolWords) {
        additive_terms(mask_vector, m);
      } else if constexpr (std::is_same_v<mask_t, bool>) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) m[i] = additive_mask<acc_t>(mask_vector.element[i]);
      } else {
        widen(mask_vector, m);
      }
#pragma unroll
      for (int i = 0; i < VEC; ++i) s[i] += m[i];
    }
  }

  // The max of the vector's scores. Without a mask, a wholly visible bf16 vector takes it on the packed pairs as
  // loaded (sm_80's max.bf16x2, half an instruction an element, no widening): the max of x * scale is |scale|
  // times the max of x with its sign bits flipped where scale < 0. Rounding is monotonic, so this is the max of
  // the scores exactly; a NaN loses here as in MaxOp.
  __device__ __forceinline__ acc_t max_score(Index col, const Raw& raw) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (std::is_same_v<scalar_t, c10::BFloat16> && !kHasMask && VEC % 2 == 0) {
      if (visible_end - col >= VEC && (!kShifted || col >= first)) {
        uint32_t words[VEC / 2];
        memcpy(words, &raw.x, sizeof(words));
        const uint32_t flip = scale < 0 ? 0x80008000u : 0u;
        uint32_t pair_max = words[0] ^ flip;
#pragma unroll
        for (int w = 1; w < VEC / 2; ++w) {
          asm("max.bf16x2 %0, %1, %2;" : "=r"(pair_max) : "r"(pair_max), "r"(words[w] ^ flip));
        }
        return fabsf(scale) * fmaxf(__uint_as_float(pair_max << 16), __uint_as_float(pair_max & 0xffff0000u));
      }
    }
#endif
    acc_t s[VEC];
    scores(col, raw, s);
    acc_t max = s[0];
#pragma unroll
    for (int v = 1; v < VEC; ++v) max = MaxOp()(max, s[v]);
    return max;
  }

  // scores() of a vector that for_each_visible_vector says is `whole`ly visible, or may not be. Where kShifted, a
  // whole vector may still begin before the row (at its first), and is checked as any other.
  template <bool kWhole>
  __device__ __forceinline__ void scores(Index col, const Raw& raw, std::integral_constant<bool, kWhole>,
                                         acc_t (&s)[VEC]) const {
    if constexpr (kWhole && !kShifted) {
      visible_scores(raw, s);
    } else {
      scores(col, raw, s);
    }
  }

  __device__ __forceinline__ void scores(Index col, const Raw& raw, acc_t (&s)[VEC]) const {
    constexpr acc_t kMasked = -std::numeric_limits<acc_t>::infinity();
    visible_scores(raw, s);
    // Compared as a count against constants: `col + i` for every element was hoisted out of the row loop, held
    // in 64-bit registers.
    const Index visible = visible_end - col;
    if (visible < VEC) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        if (i >= visible) s[i] = kMasked;
      }
    }
    if constexpr (kShifted) {
      const Index before = first - col;
      if (before > 0) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          if (i < before) s[i] = kMasked;
        }
      }
    }
  }
};

}  // namespace sms
