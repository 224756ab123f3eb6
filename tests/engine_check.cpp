// The CPU engine on its own, without torch's libraries, so that it can be built by any compiler for any target
// (tests/test_cpu.py: Clang, aarch64 under an emulator) and run there. Both of its portable builds, the fallback of
// one lane and vectors of 16 bytes, are checked: their 16-bit loads and stores bit for bit against c10's own
// conversions, and their forward and backward against a float64 reference over row lengths, masks and causal
// limits. Prints one line a failure, then "ok" or "FAILED"; the exit status is 0 only when every check passed.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>

#include "../scaled_mask_softmax/csrc/cpu_kernels.h"

namespace {

int failures = 0;

void fail(const char* engine, const char* what, double got, double expected, long detail) {
  if (++failures <= 20) std::printf("%s: %s: got %.9g, expected %.9g (%ld)\n", engine, what, got, expected, detail);
}

template <typename T>
uint16_t bits_of(T value) {
  uint16_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

template <typename T>
T from_bits(uint16_t bits) {
  T value;
  std::memcpy(&value, &bits, sizeof(bits));
  return value;
}

// Every 16-bit pattern loaded, and stored again from fp32 values around and between them, as c10 converts them.
template <typename Engine, typename T>
void check_conversions(const char* engine) {
  std::vector<float> values;
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const T element = from_bits<T>(static_cast<uint16_t>(bits));
    const auto lanes = Engine::template load<float>(&element, 0, std::true_type{}, 1);
    const float loaded = Engine::lane(lanes, 0), expected = static_cast<float>(element);
    if (!(std::memcmp(&loaded, &expected, sizeof(float)) == 0 || (std::isnan(loaded) && std::isnan(expected)))) {
      fail(engine, "16-bit load", loaded, expected, bits);
    }
    const float next = static_cast<float>(from_bits<T>(static_cast<uint16_t>(bits + 1)));
    values.insert(values.end(), {expected, (expected + next) / 2, std::nextafter(expected, next)});
  }
  std::mt19937 generator(7);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t bits = generator();
    float value;
    std::memcpy(&value, &bits, sizeof(value));
    values.push_back(value);
  }
  T stored[16];
  for (size_t i = 0; i < values.size(); ++i) {
    Engine::template store<float>(stored, 0, std::true_type{}, 1, 1, Engine::broadcast(values[i]));
    const T expected = static_cast<T>(values[i]);
    const bool both_nan = std::isnan(static_cast<float>(stored[0])) && std::isnan(values[i]);
    if (bits_of(stored[0]) != bits_of(expected) && !both_nan) {
      fail(engine, "16-bit store", static_cast<float>(stored[0]), static_cast<float>(expected), static_cast<long>(i));
    }
  }
}

double tolerance(float) { return 2e-6; }
double tolerance(double) { return 1e-13; }
double tolerance(c10::Half) { return 2e-3; }
double tolerance(c10::BFloat16) { return 1.6e-2; }

// x is [2, queries, cols]; the mask [queries, cols], broadcast over the first dim.
template <typename Engine, typename T, typename mask_t>
void check_passes(const char* engine, int64_t queries, int64_t cols, bool is_causal, int64_t causal_offset) {
  using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int64_t rows = 2 * queries;
  std::mt19937 generator(static_cast<unsigned>(cols * 31 + queries));
  std::normal_distribution<double> normal;
  std::vector<T> x(rows * cols), y(rows * cols), dy(rows * cols), dx(rows * cols);
  constexpr bool kHasMask = sms::has_mask_v<mask_t>;
  const std::unique_ptr<mask_t[]> mask(new mask_t[queries * cols]);
  for (auto& value : x) value = static_cast<T>(3 * normal(generator));
  for (auto& value : dy) value = static_cast<T>(normal(generator));
  for (int64_t i = 0; i < queries * cols; ++i) {
    if constexpr (std::is_same_v<mask_t, bool>) {
      mask[i] = (i / cols) != 1 && generator() % 4 != 0;  // query 1 sees nothing
    } else if constexpr (kHasMask) {
      mask[i] = (i / cols) == 1 ? -std::numeric_limits<float>::infinity() : static_cast<float>(normal(generator));
    }
  }
  sms::ForwardParams forward{};
  forward.x = x.data();
  forward.mask = kHasMask ? mask.get() : nullptr;
  forward.y = y.data();
  forward.rows = rows;
  forward.cols = cols;
  forward.shape.dims = 2;
  forward.shape.size[0] = sms::Divisor(2);
  forward.shape.size[1] = sms::Divisor(queries);
  forward.x_strides.stride[0] = queries * cols;
  forward.x_strides.stride[1] = cols;
  forward.mask_strides.stride[0] = 0;
  forward.mask_strides.stride[1] = cols;
  forward.queries = sms::Divisor(queries);
  forward.is_causal = is_causal;
  forward.causal_offset = causal_offset;
  forward.scale = 0.7;
  std::vector<acc_t> buffer(2 * sms::cpu::row_room(cols));
  Engine::template forward_rows<T, mask_t>(forward, 0, rows, buffer.data());

  sms::BackwardParams backward{};
  backward.y = y.data();
  backward.dy = dy.data();
  backward.dx = dx.data();
  backward.rows = rows;
  backward.cols = cols;
  backward.shape.dims = 1;
  backward.shape.size[0] = sms::Divisor(rows);
  backward.y_strides.stride[0] = cols;
  backward.dy_strides.stride[0] = cols;
  backward.queries = sms::Divisor(queries);
  backward.is_causal = is_causal;
  backward.causal_offset = causal_offset;
  backward.scale = 0.7;
  Engine::template backward_rows<T, acc_t>(backward, 0, rows, buffer.data());

  for (int64_t row = 0; row < rows; ++row) {
    const int64_t query = row % queries;
    const int64_t visible = is_causal ? std::min(cols, std::max<int64_t>(0, query + causal_offset + 1)) : cols;
    std::vector<double> scores(cols, -INFINITY);
    double max = -INFINITY;
    for (int64_t col = 0; col < visible; ++col) {
      double score = 0.7 * static_cast<double>(x[row * cols + col]);
      if constexpr (std::is_same_v<mask_t, bool>) {
        if (!mask[query * cols + col]) score = -INFINITY;
      } else if constexpr (kHasMask) {
        score += mask[query * cols + col];
      }
      scores[col] = score;
      max = std::max(max, score);
    }
    double sum = 0;
    for (double& score : scores) sum += (score = max == -INFINITY ? 0 : std::exp(score - max));
    double dot = 0;
    for (int64_t col = 0; col < cols; ++col) {
      const double probability = sum == 0 ? 0 : scores[col] / sum;
      const double got = static_cast<double>(y[row * cols + col]);
      if (!(std::abs(got - probability) <= tolerance(T{}) * (1 + probability))) {
        fail(engine, "forward", got, probability, static_cast<long>(row * cols + col));
      }
      dot += got * static_cast<double>(dy[row * cols + col]) * (col < visible);
    }
    for (int64_t col = 0; col < cols; ++col) {
      const double y_value = static_cast<double>(y[row * cols + col]);
      const double expected = col < visible ? 0.7 * y_value * (static_cast<double>(dy[row * cols + col]) - dot) : 0;
      const double got = static_cast<double>(dx[row * cols + col]);
      if (!(std::abs(got - expected) <= tolerance(T{}) * (1 + std::abs(dy[row * cols + col]) + std::abs(dot)))) {
        fail(engine, "backward", got, expected, static_cast<long>(row * cols + col));
      }
    }
  }
}

template <typename Engine, typename T>
void check_dtype(const char* engine) {
  for (const int64_t cols : {1, 3, 8, 17, 64, 100, 1000, 5000}) {
    for (const int64_t queries : {1, 5}) {
      for (const int64_t offset : {int64_t{0}, cols - queries, int64_t{-2}}) {
        check_passes<Engine, T, sms::NoMask>(engine, queries, cols, true, offset);
      }
      check_passes<Engine, T, sms::NoMask>(engine, queries, cols, false, 0);
      check_passes<Engine, T, bool>(engine, queries, cols, queries > 1, 0);
      check_passes<Engine, T, float>(engine, queries, cols, false, 0);
    }
  }
}

template <typename Engine32, typename Engine64>
void check_build(const char* engine) {
  check_conversions<Engine32, c10::Half>(engine);
  check_conversions<Engine32, c10::BFloat16>(engine);
  check_dtype<Engine32, float>(engine);
  check_dtype<Engine32, c10::Half>(engine);
  check_dtype<Engine32, c10::BFloat16>(engine);
  check_dtype<Engine64, double>(engine);
}

}  // namespace

int main() {
  check_build<sms::cpu::Engine<1, false>, sms::cpu::Engine<1, false>>("one lane");
#if defined(__GNUC__)
  check_build<sms::cpu::Engine<4, false>, sms::cpu::Engine<2, false>>("16-byte vectors");
#endif
  std::printf(failures == 0 ? "ok\n" : "FAILED (%d)\n", failures);
  return failures == 0 ? 0 : 1;
}
