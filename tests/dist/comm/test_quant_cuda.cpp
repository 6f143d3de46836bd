// The block-quantized kernels of dist/comm/cuda/quant_kernels.h on a GPU against the host kernels of
// dist/comm/quant.h on the same inputs, bit for bit (Note [Quantized blocks], Note [INT4 blocks]): every
// launcher, every input and output dtype, blocks of one to four warps up to 4096 values, partial last blocks,
// and inputs built to reach zero, tiny, mixed-magnitude, tied and non-finite blocks. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "dist/comm/cuda/quant_kernels.h"
#include "dist/comm/quant.h"
#include "tensor/cuda/runtime.h"
#include "tensor/cuda_test_util.h"
#include "tensor/half.h"
#include "tensor/stream.h"
#include "tensor/tensor.h"

namespace cz::testing {
namespace {

// quant_threads(B) = min(B, 128): one, two, three and four warps, 128 threads striding over 160 values, and
// the largest block.
constexpr int64_t kBlocks[] = {32, 64, 96, 128, 160, 256, 1024, 4096};
// Past the elementwise grids' 8192 x 256 threads (every thread loops) and 187,502 CUDA blocks at B = 32.
constexpr int64_t kLargeN = 6'000'037;
constexpr int64_t kLargeBlocks[] = {32, 160, 4096};

// Empty, one value, one partial block, one full block, an odd partial last block, whole blocks, whole blocks
// and a partial one (every kind of block_values), an odd prime, and, for some blocks, kLargeN.
std::vector<int64_t> lengths(int64_t block) {
  std::vector<int64_t> ns = {0, 1, 31, block, 2 * block - 1, 8 * block, 8 * block + 13, 10007};
  for (int64_t b : kLargeBlocks)
    if (b == block) ns.push_back(kLargeN);
  return ns;
}

// --- Inputs -----------------------------------------------------------------------------------------------

// Block k of block_values is of kind (k + shift) % kKinds.
enum Kind { kNormal, kZero, kMixed, kTies8, kTies4, kTiny, kOnePeak, kTwinPeaks, kKinds };

// f32 values, block by block, finite once stored in `dtype` (f16: 6e-8 to 65504).
std::vector<float> block_values(int64_t n, int64_t block, DType dtype, uint32_t seed, int shift) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen); };
  auto sign = [&] { return pick(0, 1) ? 1.f : -1.f; };
  const bool f16 = dtype == DType::f16;
  std::vector<float> v(static_cast<size_t>(n), 0.f);
  for (int64_t k = 0; k * block < n; ++k) {
    const int64_t first = k * block, len = std::min(block, n - first);
    float* x = v.data() + first;
    switch ((k + shift) % kKinds) {
      case kNormal: {  // one magnitude per block, 1e-3 to 1e3
        const float mag = std::pow(10.f, float(pick(-3, 3)));
        for (int64_t i = 0; i < len; ++i) x[i] = normal(gen) * mag;
        break;
      }
      case kZero:
        break;
      case kMixed: {  // every value its own magnitude: 1e-30 to 1e30 (f16: 1e-7 to 2.5e4), either sign
        std::uniform_real_distribution<float> exponent(f16 ? -7.f : -30.f, f16 ? 4.4f : 30.f);
        for (int64_t i = 0; i < len; ++i) x[i] = sign() * std::pow(10.f, exponent(gen));
        break;
      }
      case kTies8:    // peak 127 2^e: INT8 scale 2^e, and every (m + 1/2) 2^e lands on a tie (exact in bf16)
      case kTies4: {  // peak 7 2^e: the same for INT4
        const int qmax = (k + shift) % kKinds == kTies8 ? 127 : 7;
        const int e = int(pick(f16 ? -6 : -40, f16 ? 8 : 40));
        for (int64_t i = 0; i < len; ++i)
          x[i] = std::ldexp(float(pick(-qmax, qmax - 1)) + (i % 5 ? 0.5f : 0.f), e);
        x[pick(0, len - 1)] = sign() * std::ldexp(float(qmax), e);
        break;
      }
      case kTiny: {
        if (f16) {  // subnormal halves
          for (int64_t i = 0; i < len; ++i) x[i] = unit(gen) * 6e-5f;
          break;
        }
        // Peaks at INT8's and INT4's tiny thresholds and just below them (scale FLT_MIN, 0, FLT_MIN, 0),
        // under values down to 2^-12 of the peak, most of them subnormal.
        constexpr uint32_t kPeaks[] = {dist::quant::kMinAmaxBits, dist::quant::kMinAmaxBits - 1,
                                       dist::quant::kMinAmaxBits4, dist::quant::kMinAmaxBits4 - 1};
        float peak;
        const uint32_t bits = kPeaks[(k / kKinds) % 4];
        std::memcpy(&peak, &bits, sizeof peak);
        for (int64_t i = 0; i < len; ++i) x[i] = std::ldexp(unit(gen) * peak, -int(pick(0, 12)));
        x[pick(0, len - 1)] = sign() * peak;
        break;
      }
      case kOnePeak:  // one value, anywhere: one thread of one warp holds the block's maximum
        x[pick(0, len - 1)] = -(1.f + std::fabs(normal(gen)));
        break;
      case kTwinPeaks:  // +p and -p, the second at the block's last value
        for (int64_t i = 0; i < len; ++i) x[i] = unit(gen);
        x[pick(0, len - 1)] = 4.f;
        x[len - 1] = -4.f;
        break;
    }
  }
  return v;
}

// The values as stored in `dtype` (bf16 and f16 rounded to nearest even by the project's converters).
std::vector<uint8_t> stored(const std::vector<float>& v, DType dtype) {
  std::vector<uint8_t> out(v.size() * dtype_size(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::f32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = dtype == DType::bf16 ? BFloat16::from_float(v[i]) : Half::from_float(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> scales;
};

Quantized host_quantize(const std::vector<float>& v, int64_t block) {
  const int64_t n = int64_t(v.size());
  Quantized r{std::vector<int8_t>(v.size()), std::vector<float>(size_t(dist::quant_scale_count(n, block)))};
  dist::quantize(DType::f32, v.data(), n, block, r.q.data(), r.scales.data());
  return r;
}

// Codes and scales for the dequantizers' conversions, by block (k % 8): a random scale; scale 0 (with codes:
// -0 products); 1 + 2^-8 and 1 + 3 2^-8 (with power-of-two codes: bf16 ties, to even below and above);
// 1 + 2^-11 (f16 ties); FLT_MIN (normal in bf16, 0 in f16); 1e36 (f16 overflows to Inf); 0.75 2^-24 (f16
// subnormal ties). qmax: 127 (INT8) or 7 (INT4).
Quantized dequantize_inputs(int64_t n, int64_t block, int qmax, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen); };
  const int64_t blocks = dist::quant_scale_count(n, block);
  Quantized r{std::vector<int8_t>(static_cast<size_t>(n)), std::vector<float>(static_cast<size_t>(blocks))};
  const int max_pow2 = qmax == 127 ? 6 : 2;
  for (int64_t k = 0; k < blocks; ++k) {
    const int kind = int(k % 8);
    float& s = r.scales[size_t(k)];
    switch (kind) {
      case 0:
        s = std::fabs(normal(gen)) * std::pow(10.f, float(pick(-3, 3))) / 127.f;
        break;
      case 1:
        s = 0.f;
        break;
      case 2:
        s = 1.f + 0x1p-8f;
        break;
      case 3:
        s = 1.f + 0x3p-8f;
        break;
      case 4:
        s = 1.f + 0x1p-11f;
        break;
      case 5:
        s = FLT_MIN;
        break;
      case 6:
        s = 1e36f;
        break;
      default:
        s = 0x3p-26f;
        break;
    }
    const bool pow2 = kind >= 2 && kind <= 4;
    for (int64_t i = k * block; i < std::min(n, (k + 1) * block); ++i)
      r.q[size_t(i)] = int8_t(pow2 ? (pick(0, 1) ? 1 : -1) * (1 << pick(0, max_pow2)) : pick(-qmax, qmax));
  }
  return r;
}

// INT4 codes two to a byte, element 2k in the low nibble (Note [INT4 blocks]); an odd count's last high
// nibble 0.
std::vector<uint8_t> pack4(const std::vector<int8_t>& q) {
  std::vector<uint8_t> p((q.size() + 1) / 2, 0);
  for (size_t i = 0; i < q.size(); ++i) p[i / 2] = uint8_t(p[i / 2] | ((q[i] & 0x0f) << (i % 2 ? 4 : 0)));
  return p;
}

// --- Device buffers and comparisons -----------------------------------------------------------------------

constexpr size_t kGuard = 256;  // bytes on each side; keeps the payload as aligned as the allocation
constexpr uint8_t kPattern = 0xa5;

// Bytes on the GPU (a u8 tensor of the caching allocator, moved by Tensor::to on the current stream) between
// two guard zones of kPattern: reading back fails when a launch wrote outside its buffer. An output starts as
// kPattern too, so an element a launch failed to write differs from the host's.
class DeviceBytes {
 public:
  DeviceBytes(const void* init, size_t bytes) : bytes_(bytes) {
    Tensor host = empty({int64_t(bytes + 2 * kGuard)}, DType::u8);
    uint8_t* h = host.data<uint8_t>();
    std::memset(h, kPattern, bytes + 2 * kGuard);
    if (init && bytes) std::memcpy(h + kGuard, init, bytes);
    dev_ = host.to(gpu());
  }
  template <class T>
  explicit DeviceBytes(const std::vector<T>& v) : DeviceBytes(v.data(), v.size() * sizeof(T)) {}

  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(dev_.raw_data()) + kGuard);
  }
  // The payload, once both guards are found intact.
  ::testing::AssertionResult read(const std::string& what, std::vector<uint8_t>& out) const {
    const Tensor host = dev_.cpu();
    const uint8_t* h = host.data<uint8_t>();
    for (size_t i = 0; i < kGuard; ++i)
      if (h[i] != kPattern)
        return ::testing::AssertionFailure()
               << what << ": written " << kGuard - i << " bytes before the buffer";
    for (size_t i = kGuard; i-- > 0;)
      if (h[kGuard + bytes_ + i] != kPattern)
        return ::testing::AssertionFailure()
               << what << ": written " << i + 1 << " bytes past the buffer's end (" << bytes_ << " bytes)";
    out.assign(h + kGuard, h + kGuard + bytes_);
    return ::testing::AssertionSuccess();
  }

 private:
  size_t bytes_;
  Tensor dev_;
};

// A non-blocking stream of this test's own (made once, kept for the process): a launcher that ignored its
// stream argument would race with the copies, rather than pass by luck on the legacy default stream.
Stream side_stream() {
  static const Stream s{gpu(), cuda_runtime::stream_create(gpu().index)};
  return s;
}
cudaStream_t stream() {
  return static_cast<cudaStream_t>(current_stream(gpu()).handle);
}

// A launcher's returned status, then the stream's: anything but cudaSuccess fails the test.
::testing::AssertionResult launched(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess)
    return ::testing::AssertionFailure() << what << ": the launcher returned " << cudaGetErrorName(status)
                                         << " (" << cudaGetErrorString(status) << ")";
  const cudaError_t sync = cudaStreamSynchronize(stream());
  if (sync != cudaSuccess)
    return ::testing::AssertionFailure() << what << ": cudaStreamSynchronize after it returned "
                                         << cudaGetErrorName(sync) << " (" << cudaGetErrorString(sync) << ")";
  return ::testing::AssertionSuccess();
}

enum class Elem { code8, code4, f32, bf16, f16 };  // code4: a byte of two INT4 codes
Elem elem_of(DType t) {
  return t == DType::f32 ? Elem::f32 : t == DType::bf16 ? Elem::bf16 : Elem::f16;
}
size_t elem_size(Elem e) {
  return e == Elem::f32 ? 4 : e == Elem::bf16 || e == Elem::f16 ? 2 : 1;
}
std::string show(Elem e, const uint8_t* p) {
  uint16_t h = 0;
  if (e == Elem::bf16 || e == Elem::f16) std::memcpy(&h, p, 2);
  auto nibble = [](int v) { return v >= 8 ? v - 16 : v; };
  switch (e) {
    case Elem::code8:
      return std::to_string(int(int8_t(*p)));
    case Elem::code4:
      return fmt::format("0x{:02x} (codes {}, {})", *p, nibble(*p & 0xf), nibble(*p >> 4));
    case Elem::f32: {
      float f;
      uint32_t u;
      std::memcpy(&f, p, 4);
      std::memcpy(&u, p, 4);
      return fmt::format("{:.9g} (0x{:08x})", f, u);
    }
    case Elem::bf16: {
      BFloat16 b;
      b.bits = h;
      return fmt::format("{:.9g} (0x{:04x})", float(b), h);
    }
    case Elem::f16:
      return fmt::format("{:.9g} (0x{:04x})", Half::to_float(h), h);
  }
  return "?";
}
bool is_nan(Elem e, const uint8_t* p) {
  if (e == Elem::f32) {
    uint32_t u;
    std::memcpy(&u, p, 4);
    return (u & 0x7fffffffu) > 0x7f800000u;
  }
  if (e == Elem::bf16 || e == Elem::f16) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return (h & 0x7fffu) > (e == Elem::bf16 ? 0x7f80u : 0x7c00u);
  }
  return false;
}

// exact: memcmp. any_nan: as exact, except that any NaN equals any NaN (a non-finite block's NaNs come from
// the arithmetic, and the GPU's canonical NaN, 0x7fffffff, is not x86's default one, 0xffc00000).
enum class Nan { exact, any_nan };

// `count` elements of the GPU buffer `dev` against the host's, bit for bit. per_block: elements per
// quantized block (block for values and codes, block / 2 for INT4 bytes, 1 for scales), for the message.
::testing::AssertionResult matches(const DeviceBytes& dev, Elem e, const void* host, int64_t count,
                                   int64_t per_block, const std::string& what, Nan nan = Nan::exact) {
  std::vector<uint8_t> got;
  if (auto ok = dev.read(what, got); !ok) return ok;
  const size_t es = elem_size(e);
  if (got.size() != size_t(count) * es)
    return ::testing::AssertionFailure()
           << what << ": the GPU buffer holds " << got.size() << " bytes, not " << size_t(count) * es;
  const auto* want = static_cast<const uint8_t*>(host);
  if (count == 0 || std::memcmp(got.data(), want, got.size()) == 0) return ::testing::AssertionSuccess();
  int64_t first = -1, differ = 0;
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* g = got.data() + size_t(i) * es;
    const uint8_t* w = want + size_t(i) * es;
    if (std::memcmp(g, w, es) == 0 || (nan == Nan::any_nan && is_nan(e, g) && is_nan(e, w))) continue;
    if (first < 0) first = i;
    ++differ;
  }
  if (differ == 0) return ::testing::AssertionSuccess();
  const size_t f = size_t(first) * es;
  return ::testing::AssertionFailure()
         << what << ": " << differ << " of " << count << " elements differ; the first at index " << first
         << " (block " << first / per_block << "): GPU " << show(e, got.data() + f) << ", host "
         << show(e, want + f);
}

// --- The launchers by dtype -------------------------------------------------------------------------------

using QuantizeFn = cudaError_t (*)(const void*, int64_t, int64_t, int8_t*, float*, cudaStream_t);
using DequantizeFn = cudaError_t (*)(const int8_t*, const float*, int64_t, int64_t, void*, cudaStream_t);
using Quantize4Fn = cudaError_t (*)(const void*, int64_t, int64_t, uint8_t*, float*, cudaStream_t);
using Dequantize4Fn = cudaError_t (*)(const uint8_t*, const float*, int64_t, int64_t, void*, cudaStream_t);

struct Launchers {
  DType dtype;
  const char* quantize_name;
  QuantizeFn quantize;
  const char* dequantize_name;
  DequantizeFn dequantize;
  const char* quantize4_name;
  Quantize4Fn quantize4;
  const char* dequantize4_name;
  Dequantize4Fn dequantize4;
};

const Launchers& launchers(DType t) {
  namespace k = dist::cuda;
  static const Launchers f32{DType::f32,       "quantize_f32",    k::quantize_f32,
                             "dequantize_f32", k::dequantize_f32, "quantize4_f32",
                             k::quantize4_f32, "dequantize4_f32", k::dequantize4_f32};
  static const Launchers bf16{DType::bf16,       "quantize_bf16",    k::quantize_bf16,
                              "dequantize_bf16", k::dequantize_bf16, "quantize4_bf16",
                              k::quantize4_bf16, "dequantize4_bf16", k::dequantize4_bf16};
  static const Launchers f16{DType::f16,       "quantize_f16",    k::quantize_f16,
                             "dequantize_f16", k::dequantize_f16, "quantize4_f16",
                             k::quantize4_f16, "dequantize4_f16", k::dequantize4_f16};
  return t == DType::f32 ? f32 : t == DType::bf16 ? bf16 : f16;
}

std::string case_name(const char* launcher, DType t, const char* io, int64_t block, int64_t n) {
  return fmt::format("{} ({} {}, B={}, n={})", launcher, dtype_name(t), io, block, n);
}

// --- INT8 -------------------------------------------------------------------------------------------------

// INT8 (a code a byte) or INT4 (two codes a byte, kInt4): the host kernels and the launchers of the format.
template <bool kInt4>
struct Format {
  using Code = std::conditional_t<kInt4, uint8_t, int8_t>;
  using QuantizeLauncher = cudaError_t (*)(const void*, int64_t, int64_t, Code*, float*, cudaStream_t);
  using DequantizeLauncher = cudaError_t (*)(const Code*, const float*, int64_t, int64_t, void*,
                                             cudaStream_t);
  static constexpr Elem kElem = kInt4 ? Elem::code4 : Elem::code8;
  static int64_t code_bytes(int64_t n) { return kInt4 ? dist::quant4_code_bytes(n) : n; }
  static void quantize(DType t, const void* x, int64_t n, int64_t block, Code* q, float* s) {
    if constexpr (kInt4)
      dist::quantize_int4(t, x, n, block, q, s);
    else
      dist::quantize(t, x, n, block, q, s);
  }
  static void dequantize(const Code* q, const float* s, int64_t n, int64_t block, DType t, void* out) {
    if constexpr (kInt4)
      dist::dequantize_int4(q, s, n, block, t, out);
    else
      dist::dequantize(q, s, n, block, t, out);
  }
  static const char* quantize_name(const Launchers& l) { return kInt4 ? l.quantize4_name : l.quantize_name; }
  static const char* dequantize_name(const Launchers& l) {
    return kInt4 ? l.dequantize4_name : l.dequantize_name;
  }
  static QuantizeLauncher quantize_launcher(const Launchers& l) {
    if constexpr (kInt4)
      return l.quantize4;
    else
      return l.quantize;
  }
  static DequantizeLauncher dequantize_launcher(const Launchers& l) {
    if constexpr (kInt4)
      return l.dequantize4;
    else
      return l.dequantize;
  }
};

// quantize_<t> (quantize4_<t>) against the host's quantize, then dequantize_<t> of the GPU's codes against
// the host's dequantize (the round trip).
template <bool kInt4>
void check_quantize(DType t, int64_t block, int64_t n, const std::vector<float>& values, Nan nan) {
  using F = Format<kInt4>;
  using Code = typename F::Code;
  const Launchers& l = launchers(t);
  const auto x = stored(values, t);
  const int64_t ns = dist::quant_scale_count(n, block), bytes = F::code_bytes(n);
  std::vector<Code> q(static_cast<size_t>(bytes));
  std::vector<float> s(static_cast<size_t>(ns));
  std::vector<uint8_t> out(x.size());
  F::quantize(t, x.data(), n, block, q.data(), s.data());
  F::dequantize(q.data(), s.data(), n, block, t, out.data());

  const DeviceBytes dx(x), dq(nullptr, q.size()), ds(nullptr, 4 * s.size()), dout(nullptr, out.size());
  const std::string what = case_name(F::quantize_name(l), t, "in", block, n);
  ASSERT_TRUE(launched(
      F::quantize_launcher(l)(dx.as<void>(), n, block, dq.as<Code>(), ds.as<float>(), stream()), what));
  ASSERT_TRUE(matches(dq, F::kElem, q.data(), bytes, kInt4 ? block / 2 : block,
                      what + (kInt4 ? ": packed codes" : ": q")));
  ASSERT_TRUE(matches(ds, Elem::f32, s.data(), ns, 1, what + ": scales", nan));

  const std::string deq =
      case_name(F::dequantize_name(l), t, "out", block, n) + " of " + F::quantize_name(l) + "'s codes";
  ASSERT_TRUE(launched(
      F::dequantize_launcher(l)(dq.as<Code>(), ds.as<float>(), n, block, dout.as<void>(), stream()), deq));
  ASSERT_TRUE(matches(dout, elem_of(t), out.data(), n, block, deq + ": out", nan));
}

template <bool kInt4>
void check_quantize_all(DType t) {
  const uint32_t seed_step = kInt4 ? 37 : 31;
  for (int64_t block : kBlocks)
    for (int64_t n : lengths(block))
      ASSERT_NO_FATAL_FAILURE(check_quantize<kInt4>(
          t, block, n, block_values(n, block, t, uint32_t(seed_step * n + block), 0), Nan::exact));
}

// dequantize_<t> (dequantize4_<t>) on codes and scales chosen for the output conversions' roundings.
template <bool kInt4>
void check_dequantize_all(DType t) {
  using F = Format<kInt4>;
  const Launchers& l = launchers(t);
  for (int64_t block : kBlocks)
    for (int64_t n : lengths(block)) {
      const Quantized in = kInt4 ? dequantize_inputs(n, block, 7, uint32_t(19 * n + block))
                                 : dequantize_inputs(n, block, 127, uint32_t(17 * n + block));
      std::vector<typename F::Code> q;
      if constexpr (kInt4)
        q = pack4(in.q);
      else
        q = in.q;
      std::vector<uint8_t> out(size_t(n) * dtype_size(t));
      F::dequantize(q.data(), in.scales.data(), n, block, t, out.data());
      const DeviceBytes dq(q), ds(in.scales), dout(nullptr, out.size());
      const std::string what = case_name(F::dequantize_name(l), t, "out", block, n);
      ASSERT_TRUE(launched(F::dequantize_launcher(l)(dq.as<typename F::Code>(), ds.as<float>(), n, block,
                                                     dout.as<void>(), stream()),
                           what));
      ASSERT_TRUE(matches(dout, elem_of(t), out.data(), n, block, what + ": out"));
    }
}

// What the per-hop step writes: q, scales and the f32 sum; q and scales only; the sum only.
enum class Outputs { all, no_sum, sum_only };
const char* outputs_name(Outputs o) {
  return o == Outputs::all      ? "q, scales and sum"
         : o == Outputs::no_sum ? "sum null"
                                : "q and scales null: sum only";
}

// Both forms of the per-hop step, out of place, with every choice of outputs. a's zero blocks meet b's tied
// blocks (deq(a) + b is then b exactly, ties and all).
void check_per_hop(int64_t block, int64_t n, const Quantized& a, const std::vector<float>& b,
                   const Quantized& c, Nan nan) {
  const int64_t ns = dist::quant_scale_count(n, block);
  const DeviceBytes daq(a.q), das(a.scales), db(b), dcq(c.q), dcs(c.scales);
  for (const bool two_quantized : {false, true})
    for (const Outputs o : {Outputs::all, Outputs::no_sum, Outputs::sum_only}) {
      std::vector<int8_t> q(static_cast<size_t>(n));
      std::vector<float> s(static_cast<size_t>(ns)), sum(static_cast<size_t>(n));
      int8_t* hq = o == Outputs::sum_only ? nullptr : q.data();
      float* hs = o == Outputs::sum_only ? nullptr : s.data();
      float* hsum = o == Outputs::no_sum ? nullptr : sum.data();
      if (two_quantized)
        dist::dequantize_add_quantize(a.q.data(), a.scales.data(), c.q.data(), c.scales.data(), n, block, hq,
                                      hs, hsum);
      else
        dist::dequantize_add_quantize(a.q.data(), a.scales.data(), b.data(), n, block, hq, hs, hsum);

      const DeviceBytes dq(nullptr, q.size()), ds(nullptr, 4 * s.size()), dsum(nullptr, 4 * sum.size());
      int8_t* gq = hq ? dq.as<int8_t>() : nullptr;
      float* gs = hs ? ds.as<float>() : nullptr;
      float* gsum = hsum ? dsum.as<float>() : nullptr;
      const std::string what = fmt::format(
          "{} (B={}, n={}, {})", two_quantized ? "dequantize_add_quantize_q" : "dequantize_add_quantize",
          block, n, outputs_name(o));
      const cudaError_t status =
          two_quantized
              ? dist::cuda::dequantize_add_quantize_q(daq.as<int8_t>(), das.as<float>(), dcq.as<int8_t>(),
                                                      dcs.as<float>(), n, block, gq, gs, gsum, stream())
              : dist::cuda::dequantize_add_quantize(daq.as<int8_t>(), das.as<float>(), db.as<float>(), n,
                                                    block, gq, gs, gsum, stream());
      ASSERT_TRUE(launched(status, what));
      if (hq) {
        ASSERT_TRUE(matches(dq, Elem::code8, q.data(), n, block, what + ": q"));
        ASSERT_TRUE(matches(ds, Elem::f32, s.data(), ns, 1, what + ": scales", nan));
      }
      if (hsum) {
        ASSERT_TRUE(matches(dsum, Elem::f32, sum.data(), n, block, what + ": sum", nan));
      }
    }
}

void check_per_hop_all(int64_t block, int64_t n) {
  const uint32_t seed = uint32_t(7 * n + block);
  const Quantized a = host_quantize(block_values(n, block, DType::f32, seed, 0), block);
  const auto b = block_values(n, block, DType::f32, seed + 1, kTies8 - kZero);
  const Quantized c = host_quantize(block_values(n, block, DType::f32, seed + 2, 5), block);
  check_per_hop(block, n, a, b, c, Nan::exact);
}

// The aliasing quant.h allows, on both sides: q == aq, scales == a_scales, sum == b; the sum alone into b;
// and for two quantized inputs, q and scales over either input's.
void check_per_hop_in_place(int64_t block, int64_t n) {
  const uint32_t seed = uint32_t(11 * n + block);
  const Quantized a = host_quantize(block_values(n, block, DType::f32, seed, 0), block);
  const auto b = block_values(n, block, DType::f32, seed + 1, kTies8 - kZero);
  const Quantized c = host_quantize(block_values(n, block, DType::f32, seed + 2, 5), block);
  const int64_t ns = dist::quant_scale_count(n, block);
  const std::string at = fmt::format(" (B={}, n={}, ", block, n);
  {
    Quantized h = a;
    auto hb = b;
    dist::dequantize_add_quantize(h.q.data(), h.scales.data(), hb.data(), n, block, h.q.data(),
                                  h.scales.data(), hb.data());
    const DeviceBytes dq(a.q), ds(a.scales), db(b);
    const std::string what = "dequantize_add_quantize" + at + "in place: q = aq, scales = a_scales, sum = b)";
    ASSERT_TRUE(launched(
        dist::cuda::dequantize_add_quantize(dq.as<int8_t>(), ds.as<float>(), db.as<float>(), n, block,
                                            dq.as<int8_t>(), ds.as<float>(), db.as<float>(), stream()),
        what));
    ASSERT_TRUE(matches(dq, Elem::code8, h.q.data(), n, block, what + ": q"));
    ASSERT_TRUE(matches(ds, Elem::f32, h.scales.data(), ns, 1, what + ": scales"));
    ASSERT_TRUE(matches(db, Elem::f32, hb.data(), n, block, what + ": sum"));
  }
  {
    auto hb = b;
    dist::dequantize_add_quantize(a.q.data(), a.scales.data(), hb.data(), n, block, nullptr, nullptr,
                                  hb.data());
    const DeviceBytes dq(a.q), ds(a.scales), db(b);
    const std::string what = "dequantize_add_quantize" + at + "sum only, in place: sum = b)";
    ASSERT_TRUE(
        launched(dist::cuda::dequantize_add_quantize(dq.as<int8_t>(), ds.as<float>(), db.as<float>(), n,
                                                     block, nullptr, nullptr, db.as<float>(), stream()),
                 what));
    ASSERT_TRUE(matches(db, Elem::f32, hb.data(), n, block, what + ": sum"));
  }
  for (const bool over_a : {true, false}) {
    Quantized ha = a, hc = c;
    std::vector<float> sum(static_cast<size_t>(n));
    Quantized& hout = over_a ? ha : hc;
    dist::dequantize_add_quantize(ha.q.data(), ha.scales.data(), hc.q.data(), hc.scales.data(), n, block,
                                  hout.q.data(), hout.scales.data(), sum.data());
    const DeviceBytes daq(a.q), das(a.scales), dcq(c.q), dcs(c.scales), dsum(nullptr, 4 * sum.size());
    const DeviceBytes& oq = over_a ? daq : dcq;
    const DeviceBytes& os = over_a ? das : dcs;
    const std::string what =
        "dequantize_add_quantize_q" + at +
        (over_a ? "in place: q = aq, scales = a_scales)" : "in place: q = bq, scales = b_scales)");
    ASSERT_TRUE(launched(dist::cuda::dequantize_add_quantize_q(
                             daq.as<int8_t>(), das.as<float>(), dcq.as<int8_t>(), dcs.as<float>(), n, block,
                             oq.as<int8_t>(), os.as<float>(), dsum.as<float>(), stream()),
                         what));
    ASSERT_TRUE(matches(oq, Elem::code8, hout.q.data(), n, block, what + ": q"));
    ASSERT_TRUE(matches(os, Elem::f32, hout.scales.data(), ns, 1, what + ": scales"));
    ASSERT_TRUE(matches(dsum, Elem::f32, sum.data(), n, block, what + ": sum"));
  }
}

// Error feedback over three steps, the residual carried on each side: q, scales and the residual after every
// step. Step 1's residual is zero where x's blocks are tied (x + r = x there).
void check_feedback(int64_t block, int64_t n, const std::vector<std::vector<float>>& xs, std::vector<float> r,
                    Nan nan) {
  const int64_t ns = dist::quant_scale_count(n, block);
  const DeviceBytes dr(r), dq(nullptr, size_t(n)), ds(nullptr, 4 * size_t(ns));
  std::vector<int8_t> q(static_cast<size_t>(n));
  std::vector<float> s(static_cast<size_t>(ns));
  for (size_t step = 0; step < xs.size(); ++step) {
    dist::quantize_with_feedback(xs[step].data(), r.data(), n, block, q.data(), s.data());
    const DeviceBytes dx(xs[step]);
    const std::string what = fmt::format("quantize_with_feedback (B={}, n={}, step {})", block, n, step + 1);
    ASSERT_TRUE(launched(dist::cuda::quantize_with_feedback(dx.as<float>(), dr.as<float>(), n, block,
                                                            dq.as<int8_t>(), ds.as<float>(), stream()),
                         what));
    ASSERT_TRUE(matches(dq, Elem::code8, q.data(), n, block, what + ": q"));
    ASSERT_TRUE(matches(ds, Elem::f32, s.data(), ns, 1, what + ": scales", nan));
    ASSERT_TRUE(matches(dr, Elem::f32, r.data(), n, block, what + ": residual"));
  }
}

void check_feedback_all(int64_t block, int64_t n) {
  const uint32_t seed = uint32_t(13 * n + block);
  std::vector<std::vector<float>> xs;
  for (uint32_t step = 0; step < 3; ++step)
    xs.push_back(block_values(n, block, DType::f32, seed + 10 * step, 0));
  // Residuals are small (2^-10 of the values, exactly), and zero where x is tied.
  auto r = block_values(n, block, DType::f32, seed + 1, kKinds + kZero - kTies8);
  for (float& v : r) v = std::ldexp(v, -10);
  check_feedback(block, n, xs, r, Nan::exact);
}

// --- INT4 -------------------------------------------------------------------------------------------------

// The INT4 checks are check_quantize_all<true> and check_dequantize_all<true>, above.

// --- Tests ------------------------------------------------------------------------------------------------

class QuantCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    CZ_REQUIRE_GPU();
    on_side_stream_.emplace(side_stream());
  }

 private:
  std::optional<StreamGuard> on_side_stream_;
};

// One test an input dtype: name_f32 runs check<int4>(f32), and so on for bf16 and f16.
#define QUANT_CUDA_EACH_DTYPE(name_f32, name_bf16, name_f16, check, int4) \
  TEST_F(QuantCuda, name_f32) {                                           \
    check<int4>(DType::f32);                                              \
  }                                                                       \
  TEST_F(QuantCuda, name_bf16) {                                          \
    check<int4>(DType::bf16);                                             \
  }                                                                       \
  TEST_F(QuantCuda, name_f16) {                                           \
    check<int4>(DType::f16);                                              \
  }

QUANT_CUDA_EACH_DTYPE(QuantizeF32MatchesHost, QuantizeBf16MatchesHost, QuantizeF16MatchesHost,
                      check_quantize_all, false)

QUANT_CUDA_EACH_DTYPE(DequantizeF32MatchesHost, DequantizeBf16MatchesHost, DequantizeF16MatchesHost,
                      check_dequantize_all, false)

TEST_F(QuantCuda, DequantizeAddQuantizeBothFormsMatchHost) {
  for (int64_t block : kBlocks)
    for (int64_t n : lengths(block)) ASSERT_NO_FATAL_FAILURE(check_per_hop_all(block, n));
}

TEST_F(QuantCuda, DequantizeAddQuantizeInPlaceMatchesHost) {
  for (int64_t block : kBlocks)
    for (int64_t n : lengths(block)) ASSERT_NO_FATAL_FAILURE(check_per_hop_in_place(block, n));
}

TEST_F(QuantCuda, QuantizeWithFeedbackMatchesHostWithResidual) {
  for (int64_t block : kBlocks)
    for (int64_t n : lengths(block)) ASSERT_NO_FATAL_FAILURE(check_feedback_all(block, n));
}

QUANT_CUDA_EACH_DTYPE(Quantize4F32MatchesHost, Quantize4Bf16MatchesHost, Quantize4F16MatchesHost,
                      check_quantize_all, true)

QUANT_CUDA_EACH_DTYPE(Dequantize4F32MatchesHost, Dequantize4Bf16MatchesHost, Dequantize4F16MatchesHost,
                      check_dequantize_all, true)

// NaN and Inf blocks (Note [Quantized blocks], "Non-finite input"): the same codes and residuals, and NaN
// wherever the host has NaN (any NaN: see Nan::any_nan), through every launcher.
std::vector<float> with_non_finite(std::vector<float> v, int64_t block) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const int64_t n = int64_t(v.size());
  auto set = [&](int64_t i, float x) {
    if (i < n) v[size_t(i)] = x;
  };
  set(5, nan);               // block 0
  set(3 * block - 1, inf);   // block 2, its last value
  set(4 * block, -inf);      // block 4, its first value
  set(6 * block + 1, -nan);  // block 6: a negative NaN beside -Inf
  set(6 * block + 2, -inf);
  set(n - 1, inf);  // the last (partial) block's last value
  return v;
}

TEST_F(QuantCuda, NonFiniteBlocksMatchHostUpToNaNPayloads) {
  for (int64_t block : {int64_t(32), int64_t(96), int64_t(256), int64_t(4096)}) {
    const int64_t n = 8 * block + 13;
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      const auto v = with_non_finite(block_values(n, block, t, uint32_t(block), 0), block);
      ASSERT_NO_FATAL_FAILURE(check_quantize<false>(t, block, n, v, Nan::any_nan));
      ASSERT_NO_FATAL_FAILURE(check_quantize<true>(t, block, n, v, Nan::any_nan));
    }
    // a and c with NaN and Inf scales; b with an Inf in a's finite block 1 and c's NaN blocks elsewhere.
    const Quantized a =
        host_quantize(with_non_finite(block_values(n, block, DType::f32, 1, 0), block), block);
    auto b = block_values(n, block, DType::f32, 2, kTies8 - kZero);
    b[size_t(block + 3)] = std::numeric_limits<float>::infinity();
    auto cv = block_values(n, block, DType::f32, 3, 5);
    cv[size_t(5 * block)] = std::numeric_limits<float>::quiet_NaN();
    ASSERT_NO_FATAL_FAILURE(check_per_hop(block, n, a, b, host_quantize(cv, block), Nan::any_nan));
    // The residual of a non-finite block is 0 on both sides: compared exactly.
    std::vector<std::vector<float>> xs;
    for (uint32_t step = 0; step < 3; ++step)
      xs.push_back(with_non_finite(block_values(n, block, DType::f32, 4 + step, 0), block));
    ASSERT_NO_FATAL_FAILURE(
        check_feedback(block, n, xs, block_values(n, block, DType::f32, 9, 3), Nan::any_nan));
  }
}

}  // namespace
}  // namespace cz::testing
