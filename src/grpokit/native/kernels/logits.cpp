// The log-softmax statistics the training loss needs from a block of logits (see
// grpokit/core/logprobs.py): per row, log-sum-exp, the chosen token's logit and the entropy, and
// the log-softmax's gradient written straight into the logits' dtype.
//
// The torch operations they replace make four or five passes over a (rows, V) block, each
// writing a new float32 temporary of the block's size: with a 128k vocabulary that is 0.5 GB per
// 1,024 rows, freshly mapped (and page-faulted in) every time, which cost 3-4x the arithmetic
// (bench/README.md). Here each row is read twice (its maximum, then the exponentials; the row is
// in the cache the second time) and nothing of the row's size is allocated. Sums of a row are
// float32 within blocks of BLOCK values and double across blocks, no less exact than torch's.

#include "common.h"

namespace {

using namespace grpokit_kernels;

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// Values of a row summed in float32 before the partial sum goes into a double.
constexpr int64_t BLOCK = 2048;

struct RowStats {
  float lse;
  float entropy;
};

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)

// The first `count` (< 16) values widened to float32, the other lanes -inf.
inline __m512 load_tail(const float* p, int64_t count) {
  const __mmask16 m = static_cast<__mmask16>((1u << count) - 1);
  return _mm512_mask_loadu_ps(_mm512_set1_ps(NEG_INF), m, p);
}
inline __m512 load_tail(const uint16_t* p, int64_t count) {
  const __mmask16 m = static_cast<__mmask16>((1u << count) - 1);
  const __m256i bits = _mm256_maskz_loadu_epi16(m, p);
  const __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
  return _mm512_mask_mov_ps(_mm512_set1_ps(NEG_INF), m, v);
}

// fast_exp (common.h) on 16 lanes, the same steps; a NaN stays NaN.
inline __m512 exp16(__m512 x) {
  namespace c = exp_constants;
  const __m512 lo = _mm512_set1_ps(c::lo), hi = _mm512_set1_ps(c::hi);
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  const __m512 shift = _mm512_set1_ps(c::round_shift);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(c::log2e), shift), shift);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(c::ln2_hi), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(c::ln2_lo), r);
  __m512 p = _mm512_set1_ps(c::p0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c::p1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c::p2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c::p3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c::p4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c::p5));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.f));
  const __m512i e = _mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), _mm512_setzero_ps());
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ),
                         _mm512_set1_ps(std::numeric_limits<float>::infinity()));
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

// Round to bfloat16 as from_float<uint16_t> does (nearest even; NaN kept, made quiet).
inline __m256i to_bf16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i high = _mm512_srli_epi32(bits, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  __m512i out = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  out = _mm512_mask_mov_epi32(out, nan, _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(out);
}

inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(uint16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16(v));
}
inline void store_tail(float* p, __m512 v, int64_t count) {
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << count) - 1), v);
}
inline void store_tail(uint16_t* p, __m512 v, int64_t count) {
  _mm256_mask_storeu_epi16(p, static_cast<__mmask16>((1u << count) - 1), to_bf16(v));
}

// The row's maximum; NaNs are passed over (the sums below carry them).
template <typename T>
float row_max(const T* x, int64_t n) {
  __m512 m0 = _mm512_set1_ps(NEG_INF), m1 = m0, m2 = m0, m3 = m0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    // _mm512_max_ps returns its second operand where either is NaN: the running maximum.
    m0 = _mm512_max_ps(load16(x + i), m0);
    m1 = _mm512_max_ps(load16(x + i + 16), m1);
    m2 = _mm512_max_ps(load16(x + i + 32), m2);
    m3 = _mm512_max_ps(load16(x + i + 48), m3);
  }
  for (; i + 16 <= n; i += 16) m0 = _mm512_max_ps(load16(x + i), m0);
  if (i < n) m1 = _mm512_max_ps(load_tail(x + i, n - i), m1);
  return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
}

// sum exp(x - top) and, with Entropy, sum exp(x - top) * x over the -inf-free values.
template <typename T, bool Entropy>
void row_sums(const T* x, int64_t n, float top, double& sum, double& weighted) {
  const __m512 t = _mm512_set1_ps(top), neg_inf = _mm512_set1_ps(NEG_INF);
  auto add = [&](__m512 v, __m512& s, __m512& w) {
    const __m512 e = exp16(_mm512_sub_ps(v, t));
    s = _mm512_add_ps(s, e);
    if constexpr (Entropy) {
      // e * x is 0 * -inf = NaN at a -inf logit, whose term is 0 (a NaN logit keeps its NaN)
      w = _mm512_mask3_fmadd_ps(e, v, w, _mm512_cmp_ps_mask(v, neg_inf, _CMP_NEQ_UQ));
    }
  };
  for (int64_t b = 0; b < n; b += BLOCK) {
    const int64_t end = std::min(n, b + BLOCK);
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    __m512 w0 = s0, w1 = s0, w2 = s0, w3 = s0;
    int64_t i = b;
    for (; i + 64 <= end; i += 64) {
      add(load16(x + i), s0, w0);
      add(load16(x + i + 16), s1, w1);
      add(load16(x + i + 32), s2, w2);
      add(load16(x + i + 48), s3, w3);
    }
    for (; i + 16 <= end; i += 16) add(load16(x + i), s0, w0);
    if (i < end) add(load_tail(x + i, end - i), s1, w1);
    sum += _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
    if constexpr (Entropy) {
      weighted +=
          _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(w0, w1), _mm512_add_ps(w2, w3)));
    }
  }
}

// out = -g * exp(x - lse), in T.
template <typename T>
void row_gradient(const T* x, int64_t n, float lse, float g, T* out) {
  const __m512 l = _mm512_set1_ps(lse), neg_g = _mm512_set1_ps(-g);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    store16(out + i, _mm512_mul_ps(neg_g, exp16(_mm512_sub_ps(load16(x + i), l))));
  }
  if (i < n) {
    store_tail(out + i, _mm512_mul_ps(neg_g, exp16(_mm512_sub_ps(load_tail(x + i, n - i), l))),
               n - i);
  }
}

inline float exp1(float x) { return _mm512_cvtss_f32(exp16(_mm512_set1_ps(x))); }

#elif defined(__AVX2__) && defined(__FMA__)  // 8 lanes: CPUs with AVX2 and no AVX-512

// Written out for the same reason as the AVX-512 path: gcc vectorised the plain loops below, yet
// they ran at 3.6 ns a value on an AVX2 AMD EPYC (Zen 3), no faster than torch's operations.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// fast_exp (common.h) on 8 lanes, the same steps; a NaN stays NaN.
inline __m256 exp8(__m256 x) {
  namespace c = exp_constants;
  const __m256 lo = _mm256_set1_ps(c::lo), hi = _mm256_set1_ps(c::hi);
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const __m256 shift = _mm256_set1_ps(c::round_shift);
  const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(c::log2e), shift), shift);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(c::ln2_hi), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(c::ln2_lo), r);
  __m256 p = _mm256_set1_ps(c::p0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c::p1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c::p2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c::p3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c::p4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c::p5));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.f));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(std::numeric_limits<float>::infinity()),
                       _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

inline float reduce_max(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  float m = lanes[0];
  for (int i = 1; i < 8; ++i) m = std::max(m, lanes[i]);
  return m;
}
inline float reduce_add(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  float s = 0.f;
  for (int i = 0; i < 8; ++i) s += lanes[i];
  return s;
}

// The row's maximum; NaNs are passed over (the sums below carry them).
template <typename T>
float row_max(const T* x, int64_t n) {
  __m256 m0 = _mm256_set1_ps(NEG_INF), m1 = m0, m2 = m0, m3 = m0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    // _mm256_max_ps returns its second operand where either is NaN: the running maximum.
    m0 = _mm256_max_ps(load8(x + i), m0);
    m1 = _mm256_max_ps(load8(x + i + 8), m1);
    m2 = _mm256_max_ps(load8(x + i + 16), m2);
    m3 = _mm256_max_ps(load8(x + i + 24), m3);
  }
  for (; i + 8 <= n; i += 8) m0 = _mm256_max_ps(load8(x + i), m0);
  float m = reduce_max(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
  for (; i < n; ++i) m = std::max(to_float(x[i]), m);
  return m;
}

// sum exp(x - top) and, with Entropy, sum exp(x - top) * x over the -inf-free values.
template <typename T, bool Entropy>
void row_sums(const T* x, int64_t n, float top, double& sum, double& weighted) {
  const __m256 t = _mm256_set1_ps(top), neg_inf = _mm256_set1_ps(NEG_INF);
  auto add = [&](__m256 v, __m256& s, __m256& w) {
    const __m256 e = exp8(_mm256_sub_ps(v, t));
    s = _mm256_add_ps(s, e);
    if constexpr (Entropy) {
      // e * x is 0 * -inf = NaN at a -inf logit, whose term is 0 (a NaN logit keeps its NaN)
      const __m256 keep = _mm256_cmp_ps(v, neg_inf, _CMP_NEQ_UQ);
      w = _mm256_add_ps(w, _mm256_and_ps(keep, _mm256_mul_ps(e, v)));
    }
  };
  for (int64_t b = 0; b < n; b += BLOCK) {
    const int64_t end = std::min(n, b + BLOCK);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    __m256 w0 = s0, w1 = s0, w2 = s0, w3 = s0;
    int64_t i = b;
    for (; i + 32 <= end; i += 32) {
      add(load8(x + i), s0, w0);
      add(load8(x + i + 8), s1, w1);
      add(load8(x + i + 16), s2, w2);
      add(load8(x + i + 24), s3, w3);
    }
    for (; i + 8 <= end; i += 8) add(load8(x + i), s0, w0);
    float s = reduce_add(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    float w = reduce_add(_mm256_add_ps(_mm256_add_ps(w0, w1), _mm256_add_ps(w2, w3)));
    for (; i < end; ++i) {
      const float v = to_float(x[i]);
      const float e = fast_exp(v - top);
      s += e;
      if constexpr (Entropy) w += v == NEG_INF ? 0.f : e * v;
    }
    sum += s;
    if constexpr (Entropy) weighted += w;
  }
}

inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store8(uint16_t* p, __m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  for (int i = 0; i < 8; ++i) p[i] = from_float<uint16_t>(lanes[i]);
}

// out = -g * exp(x - lse), in T.
template <typename T>
void row_gradient(const T* x, int64_t n, float lse, float g, T* out) {
  const __m256 l = _mm256_set1_ps(lse), neg_g = _mm256_set1_ps(-g);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    store8(out + i, _mm256_mul_ps(neg_g, exp8(_mm256_sub_ps(load8(x + i), l))));
  }
  for (; i < n; ++i) out[i] = from_float<T>(-g * fast_exp(to_float(x[i]) - lse));
}

inline float exp1(float x) { return fast_exp(x); }

#else  // the same in plain loops, for CPUs without AVX2 or AVX-512

template <typename T>
float row_max(const T* x, int64_t n) {
  float m = NEG_INF;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = std::max(m, to_float(x[i]));  // NaNs passed over
  return m;
}

template <typename T, bool Entropy>
void row_sums(const T* x, int64_t n, float top, double& sum, double& weighted) {
  for (int64_t b = 0; b < n; b += BLOCK) {
    const int64_t end = std::min(n, b + BLOCK);
    float s = 0.f, w = 0.f;
#pragma omp simd reduction(+ : s, w)
    for (int64_t i = b; i < end; ++i) {
      const float v = to_float(x[i]);
      const float e = fast_exp(v - top);
      s += e;
      if constexpr (Entropy) w += v == NEG_INF ? 0.f : e * v;
    }
    sum += s;
    weighted += w;
  }
}

template <typename T>
void row_gradient(const T* x, int64_t n, float lse, float g, T* out) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = from_float<T>(-g * fast_exp(to_float(x[i]) - lse));
}

inline float exp1(float x) { return fast_exp(x); }

#endif

template <typename T, bool Entropy>
RowStats row_stats(const T* x, int64_t n) {
  const float top = row_max(x, n);
  if (top == NEG_INF) {
    // All -inf: log-sum-exp -inf and entropy 0, as torch's operations give; NaN with a NaN.
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(to_float(x[i]))) return {to_float(x[i]), to_float(x[i])};
    }
    return {NEG_INF, 0.f};
  }
  if (top == -NEG_INF) {
    return {top, std::numeric_limits<float>::quiet_NaN()};
  }
  double sum = 0.0, weighted = 0.0;
  row_sums<T, Entropy>(x, n, top, sum, weighted);
  const float lse = top + static_cast<float>(std::log(sum));
  // -sum p log p = lse - sum p x, with p = e / sum
  const float entropy = Entropy ? lse - static_cast<float>(weighted / sum) : 0.f;
  return {lse, entropy};
}

template <typename T>
void stats_kernel(const T* logits, int64_t rows, int64_t n, int64_t stride, const int64_t* ids,
                  bool entropy, float* lse, float* chosen, float* ent) {
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* x = logits + r * stride;
      const RowStats s = entropy ? row_stats<T, true>(x, n) : row_stats<T, false>(x, n);
      lse[r] = s.lse;
      if (ids != nullptr) chosen[r] = to_float(x[ids[r]]);
      if (entropy) ent[r] = s.entropy;
    }
  });
}

template <typename T>
void gradient_kernel(const T* logits, int64_t rows, int64_t n, int64_t stride, const int64_t* ids,
                     const float* lse, const float* grad, T* out, int64_t out_stride) {
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* x = logits + r * stride;
      T* o = out + r * out_stride;
      // the chosen token's term: g * (1 - p), summed in the order torch's scatter_add_ sums it;
      // its logit read first, as out may be the logits themselves
      const int64_t id = ids[r];
      const float chosen = to_float(x[id]);
      row_gradient(x, n, lse[r], grad[r], o);
      o[id] = from_float<T>(-grad[r] * exp1(chosen - lse[r]) + grad[r]);
    }
  });
}

void check_logits(const at::Tensor& logits) {
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.stride(1) == 1,
              "logits must be a CPU (rows, V) tensor with contiguous rows");
  TORCH_CHECK(logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16,
              "logits must be float32 or bfloat16");
}

at::Tensor checked_ids(const at::Tensor& ids, const at::Tensor& logits) {
  TORCH_CHECK(ids.dim() == 1 && ids.size(0) == logits.size(0), "ids must be (rows,)");
  const at::Tensor out = ids.to(at::kLong).contiguous();
  if (out.numel() > 0) {
    TORCH_CHECK(out.min().item<int64_t>() >= 0 && out.max().item<int64_t>() < logits.size(1),
                "a token id is outside the vocabulary");
  }
  return out;
}

// logits (rows, V) float32 or bfloat16; ids (rows,) or none. Returns float32 (rows,) tensors:
// log-sum-exp, the logit at ids (empty without ids), the entropy (empty unless asked for).
std::tuple<at::Tensor, at::Tensor, at::Tensor> softmax_stats(
    const at::Tensor& logits, const std::optional<at::Tensor>& ids, bool entropy) {
  check_logits(logits);
  const int64_t rows = logits.size(0), n = logits.size(1);
  TORCH_CHECK(n > 0, "the vocabulary axis is empty");
  const auto f32 = logits.options().dtype(at::kFloat);
  at::Tensor lse = at::empty({rows}, f32);
  at::Tensor chosen = at::empty({ids ? rows : 0}, f32);
  at::Tensor ent = at::empty({entropy ? rows : 0}, f32);
  at::Tensor index = ids ? checked_ids(*ids, logits) : at::Tensor();
  const int64_t* id_data = ids ? index.data_ptr<int64_t>() : nullptr;
  if (logits.scalar_type() == at::kBFloat16) {
    stats_kernel(bf16_data(logits), rows, n, logits.stride(0), id_data, entropy,
                 lse.data_ptr<float>(), chosen.data_ptr<float>(), ent.data_ptr<float>());
  } else {
    stats_kernel(logits.data_ptr<float>(), rows, n, logits.stride(0), id_data, entropy,
                 lse.data_ptr<float>(), chosen.data_ptr<float>(), ent.data_ptr<float>());
  }
  return {lse, chosen, ent};
}

// out (rows, V), the logits' dtype, rows contiguous: out = grad * (onehot(ids) - softmax(logits)),
// given lse, the rows' log-sum-exp (float32), and grad (rows,) float32. out may be logits.
void softmax_gradient(const at::Tensor& logits, const at::Tensor& ids, const at::Tensor& lse,
                      const at::Tensor& grad, at::Tensor out) {
  check_logits(logits);
  TORCH_CHECK(out.sizes() == logits.sizes() && out.stride(1) == 1 &&
                  out.scalar_type() == logits.scalar_type(),
              "out must match logits");
  const int64_t rows = logits.size(0), n = logits.size(1);
  const at::Tensor index = checked_ids(ids, logits);
  const at::Tensor l = lse.to(at::kFloat).contiguous(), g = grad.to(at::kFloat).contiguous();
  TORCH_CHECK(l.numel() == rows && g.numel() == rows, "lse and grad must be (rows,)");
  if (logits.scalar_type() == at::kBFloat16) {
    gradient_kernel(bf16_data(logits), rows, n, logits.stride(0), index.data_ptr<int64_t>(),
                    l.data_ptr<float>(), g.data_ptr<float>(), bf16_data(out), out.stride(0));
  } else {
    gradient_kernel(logits.data_ptr<float>(), rows, n, logits.stride(0),
                    index.data_ptr<int64_t>(), l.data_ptr<float>(), g.data_ptr<float>(),
                    out.data_ptr<float>(), out.stride(0));
  }
}

}  // namespace

TORCH_LIBRARY(grpokit_logits, m) {
  m.def("softmax_stats", &softmax_stats);
  m.def("softmax_gradient", &softmax_gradient);
}
