// What the kernels of this directory share (see grpokit/native/build.py): bfloat16 as raw bits,
// its widening and rounding, 16-lane AVX-512 loads, and a vectorisable exp.

#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace grpokit_kernels {

using BF16 = c10::BFloat16;

// The kernels see bfloat16 as its raw bits (uint16_t): loads and stores of c10's BFloat16 struct
// keep gcc from vectorising some loops.
inline float to_float(float x) { return x; }
inline float to_float(uint16_t x) {
  // The exact widening of a bfloat16: its bits are the upper half of a float's.
  return std::bit_cast<float>(static_cast<uint32_t>(x) << 16);
}

template <typename T>
inline T from_float(float x);

#if defined(__AVX512F__)
// 16 values widened to float32 in one register.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
#endif

inline uint16_t* bf16_data(const at::Tensor& t) {
  return reinterpret_cast<uint16_t*>(t.data_ptr<BF16>());
}

template <>
inline float from_float<float>(float x) {
  return x;
}

// Round to nearest even, as a tensor cast does; a NaN stays a NaN of the same sign, made quiet.
// Branch-free, unlike c10's conversion, so that the loops it is in vectorise.
template <>
inline uint16_t from_float<uint16_t>(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t rounded_bits = bits + 0x7fffu + ((bits >> 16) & 1u);
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  const uint32_t out = nan ? (bits >> 16) | 0x40u : rounded_bits >> 16;
  return static_cast<uint16_t>(out);
}

template <typename T>
inline float rounded(float x) {
  return to_float(from_float<T>(x));
}

// The constants of fast_exp (below), shared with its 16-lane version in logits.cpp.
namespace exp_constants {
constexpr float lo = -87.33654f, hi = 88.37626f;
// n = round(x / ln2), by the float adder's own rounding (1.5 * 2^23 leaves no fraction bits):
// floorf does not vectorise in loops that also hold 16-bit data.
constexpr float round_shift = 12582912.f;
constexpr float log2e = 1.44269504088896341f;
constexpr float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
constexpr float p0 = 1.9875691500e-4f, p1 = 1.3981999507e-3f, p2 = 8.3334519073e-3f,
                p3 = 4.1665795894e-2f, p4 = 1.6666665459e-1f, p5 = 5.0000001201e-1f;
}  // namespace exp_constants

// exp(x) for float, branch-free so that loops over it vectorise (std::exp does not without
// -ffast-math): x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two for exactness), exp(r) by
// Cephes' degree-6 polynomial (about 1 ulp), 2^n by building the exponent bits. Below the
// smallest normal result it returns 0 (a -inf attention bias gives exactly 0), above the
// largest finite one +inf.
inline float fast_exp(float x) {
  using namespace exp_constants;
  const float xc = std::min(std::max(x, lo), hi);
  const float n = (xc * log2e + round_shift) - round_shift;
  float r = xc - n * ln2_hi;
  r = r - n * ln2_lo;
  float p = p0;
  p = p * r + p1;
  p = p * r + p2;
  p = p * r + p3;
  p = p * r + p4;
  p = p * r + p5;
  p = p * r * r + r + 1.f;
  float y = p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  y = x < lo ? 0.f : y;
  y = x > hi ? std::numeric_limits<float>::infinity() : y;
  return y;
}

}  // namespace grpokit_kernels
