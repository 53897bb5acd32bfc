// Fused CPU kernels for one decoding step of a Llama-family layer (see grpokit/native/fused.py).
//
// Each replaces a run of small eager operations that, at the batch sizes of a rollout, cost more
// in dispatch and in intermediate tensors than in arithmetic; what is between the linear layers
// is here, and (blocked_linear) the float32 products themselves where they are faster than
// oneDNN's (grpokit/native/heuristics.py says where). Every kernel rounds where the eager decoder
// (and the training forward under autocast) rounds, so the compute dtype T (float or bfloat16)
// is rounded to at the same points; the residual stream, norms, rotary embedding and softmax
// are float32.

#include "common.h"

namespace {

using namespace grpokit_kernels;

// hidden (rows, width) float32, in place: hidden += delta (if given); returns
// weight * rmsnorm(hidden) in T, as transformers' LlamaRMSNorm computes it in float32.
template <typename T>
void add_rms_norm_kernel(float* hidden, const T* delta, const float* weight, T* out, int64_t rows,
                         int64_t width, double eps) {
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* h = hidden + r * width;
      if (delta != nullptr) {
        const T* d = delta + r * width;
#pragma omp simd
        for (int64_t i = 0; i < width; ++i) h[i] += to_float(d[i]);
      }
      float squares = 0.f;
#pragma omp simd reduction(+ : squares)
      for (int64_t i = 0; i < width; ++i) squares += h[i] * h[i];
      const float mean = squares / static_cast<float>(width);
      const float inv = 1.f / std::sqrt(mean + static_cast<float>(eps));
      T* o = out + r * width;
#pragma omp simd
      for (int64_t i = 0; i < width; ++i) o[i] = from_float<T>(weight[i] * (h[i] * inv));
    }
  });
}

at::Tensor add_rms_norm(at::Tensor hidden, const std::optional<at::Tensor>& delta,
                        const at::Tensor& weight, double eps, bool bf16) {
  TORCH_CHECK(hidden.scalar_type() == at::kFloat && hidden.is_contiguous(),
              "hidden must be contiguous float32");
  const int64_t width = hidden.size(-1);
  const int64_t rows = hidden.numel() / width;
  const auto dtype = bf16 ? at::kBFloat16 : at::kFloat;
  auto out = at::empty(hidden.sizes(), hidden.options().dtype(dtype));
  auto w = weight.contiguous().to(at::kFloat);
  std::optional<at::Tensor> d;
  if (delta.has_value()) {
    d = delta->contiguous();
    TORCH_CHECK(d->scalar_type() == dtype && d->numel() == hidden.numel(), "delta mismatch");
  }
  if (bf16) {
    add_rms_norm_kernel<uint16_t>(hidden.data_ptr<float>(), d ? bf16_data(*d) : nullptr,
                              w.data_ptr<float>(), bf16_data(out), rows, width, eps);
  } else {
    add_rms_norm_kernel<float>(hidden.data_ptr<float>(), d ? d->data_ptr<float>() : nullptr,
                               w.data_ptr<float>(), out.data_ptr<float>(), rows, width, eps);
  }
  return out;
}

// One head of d values from T, optionally RMS-normalised per head (Qwen3's q_norm / k_norm:
// normalised in float32, rounded to T, then scaled by the float32 weight), then rotated:
// x cos + rotate_half(x) sin, with the sign of rotate_half carried by signed_sin.
template <typename T>
inline void head_rotated(const T* x, const float* norm_w, float eps, const float* cos,
                         const float* signed_sin, int64_t d, float* scratch, float* out) {
  for (int64_t i = 0; i < d; ++i) scratch[i] = to_float(x[i]);
  if (norm_w != nullptr) {
    float squares = 0.f;
    for (int64_t i = 0; i < d; ++i) squares += scratch[i] * scratch[i];
    const float inv = 1.f / std::sqrt(squares / static_cast<float>(d) + eps);
    for (int64_t i = 0; i < d; ++i) scratch[i] = norm_w[i] * rounded<T>(scratch[i] * inv);
  }
  const int64_t half = d / 2;  // rotate_half: the halves swapped, in two loops (no modulo)
  for (int64_t i = 0; i < half; ++i) {
    out[i] = scratch[i] * cos[i] + scratch[i + half] * signed_sin[i];
  }
  for (int64_t i = half; i < d; ++i) {
    out[i] = scratch[i] * cos[i] + scratch[i - half] * signed_sin[i];
  }
}

// qkv (rows, (heads + 2 kv_heads) d) in T: returns the rotated queries (rows, heads, d) in T and
// writes the rotated keys to column `column` of keys (rows, kv_heads, d, width) and the values to
// values (rows, kv_heads, width, d).
template <typename T>
void rope_cache_kernel(const T* qkv, const float* cos, const float* sin, T* keys, T* values,
                       T* q_out, int64_t rows, int64_t heads, int64_t kv_heads, int64_t d,
                       int64_t width, int64_t column, const float* q_norm, const float* k_norm,
                       float eps) {
  const int64_t stride = (heads + 2 * kv_heads) * d;
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(d), rotated(d);
    for (int64_t r = begin; r < end; ++r) {
      const T* base = qkv + r * stride;
      const float* c = cos + r * d;
      const float* s = sin + r * d;
      for (int64_t h = 0; h < heads; ++h) {
        head_rotated<T>(base + h * d, q_norm, eps, c, s, d, scratch.data(), rotated.data());
        T* q = q_out + (r * heads + h) * d;
        for (int64_t i = 0; i < d; ++i) q[i] = from_float<T>(rotated[i]);
      }
      for (int64_t h = 0; h < kv_heads; ++h) {
        head_rotated<T>(base + (heads + h) * d, k_norm, eps, c, s, d, scratch.data(),
                        rotated.data());
        T* k = keys + (r * kv_heads + h) * d * width + column;
        for (int64_t i = 0; i < d; ++i) k[i * width] = from_float<T>(rotated[i]);
        const T* v_in = base + (heads + kv_heads + h) * d;
        T* v = values + ((r * kv_heads + h) * width + column) * d;
        std::memcpy(v, v_in, d * sizeof(T));
      }
    }
  });
}

const float* optional_float(const std::optional<at::Tensor>& t, at::Tensor& keep) {
  if (!t.has_value()) return nullptr;
  keep = t->contiguous().to(at::kFloat);
  return keep.data_ptr<float>();
}

at::Tensor rope_cache(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& signed_sin,
                      at::Tensor keys, at::Tensor values, int64_t column, int64_t heads,
                      const std::optional<at::Tensor>& q_norm,
                      const std::optional<at::Tensor>& k_norm, double eps) {
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous(), "the cache must be contiguous");
  const int64_t rows = keys.size(0), kv_heads = keys.size(1), d = keys.size(2),
                width = keys.size(3);
  TORCH_CHECK(column >= 0 && column < width, "column outside the cache");
  auto x = qkv.contiguous();
  TORCH_CHECK(x.numel() == rows * (heads + 2 * kv_heads) * d, "qkv does not match the cache");
  TORCH_CHECK(x.scalar_type() == keys.scalar_type() && values.scalar_type() == keys.scalar_type(),
              "qkv and the cache must share a dtype");
  auto c = cos.contiguous().to(at::kFloat);
  auto s = signed_sin.contiguous().to(at::kFloat);
  TORCH_CHECK(c.numel() == rows * d && s.numel() == rows * d, "cos / sin must be (rows, d)");
  at::Tensor qn, kn;
  const float* qw = optional_float(q_norm, qn);
  const float* kw = optional_float(k_norm, kn);
  auto q = at::empty({rows, heads, d}, x.options());
  if (x.scalar_type() == at::kBFloat16) {
    rope_cache_kernel<uint16_t>(bf16_data(x), c.data_ptr<float>(), s.data_ptr<float>(),
                            bf16_data(keys), bf16_data(values), bf16_data(q),
                            rows, heads, kv_heads, d, width, column, qw, kw,
                            static_cast<float>(eps));
  } else {
    TORCH_CHECK(x.scalar_type() == at::kFloat, "float32 or bfloat16 only");
    rope_cache_kernel<float>(x.data_ptr<float>(), c.data_ptr<float>(), s.data_ptr<float>(),
                             keys.data_ptr<float>(), values.data_ptr<float>(),
                             q.data_ptr<float>(), rows, heads, kv_heads, d, width, column, qw,
                             kw, static_cast<float>(eps));
  }
  return q;
}

// How far ahead of a block accumulate_product prefetches each row, in elements (64 bytes of
// bfloat16, one cache line).
constexpr int64_t PREFETCH_AHEAD = 32;

// out (G, cols) += coef (G, n) @ matrix (n, cols), the matrix's rows `stride` apart in T. The
// columns go in blocks of 16 whose G partial sums stay in registers through all n rows, so each
// element of the matrix is read and widened once for all G groups and `out` is written once.
// G is a template argument so that the loops over groups and lanes unroll.
template <typename T, int G>
void accumulate_product(const float* coef, const T* matrix, int64_t stride, int64_t n,
                        int64_t cols, float* out) {
  constexpr int64_t B = 16;
  for (int64_t j0 = 0; j0 < cols; j0 += B) {
    const int64_t w = std::min(B, cols - j0);
    float acc[G][B] = {};
    if (w == B) {
#if defined(__AVX512F__)
      // Written out in intrinsics: left to itself gcc widened a bfloat16 row element by element
      // (seen on AMD EPYC), or, under `omp simd`, through the stack with a store-forwarding
      // stall on every row. The G sums stay in registers.
      __m512 sums[G];
      for (int g = 0; g < G; ++g) sums[g] = _mm512_setzero_ps();
      for (int64_t i = 0; i < n; ++i) {
        const T* row = matrix + i * stride + j0;
        // The n rows are n strided streams, more than the hardware prefetcher follows: fetch
        // this row's part of a later block while this one is computed.
        __builtin_prefetch(row + PREFETCH_AHEAD);
        const __m512 k = load16(row);
        for (int g = 0; g < G; ++g) {
          sums[g] = _mm512_fmadd_ps(_mm512_set1_ps(coef[g * n + i]), k, sums[g]);
        }
      }
      for (int g = 0; g < G; ++g) {
        float* o = out + g * cols + j0;
        _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), sums[g]));
      }
      continue;
#else
      for (int64_t i = 0; i < n; ++i) {
        const T* row = matrix + i * stride + j0;
        __builtin_prefetch(row + PREFETCH_AHEAD);  // as above
        float k[B];
#pragma omp simd
        for (int64_t b = 0; b < B; ++b) k[b] = to_float(row[b]);
        for (int g = 0; g < G; ++g) {
          const float c = coef[g * n + i];
#pragma omp simd
          for (int64_t b = 0; b < B; ++b) acc[g][b] += c * k[b];
        }
      }
#endif
    } else {  // the last, narrower block
      for (int64_t i = 0; i < n; ++i) {
        const T* row = matrix + i * stride + j0;
        for (int g = 0; g < G; ++g) {
          const float c = coef[g * n + i];
          for (int64_t b = 0; b < w; ++b) acc[g][b] += c * to_float(row[b]);
        }
      }
    }
    for (int g = 0; g < G; ++g) {
      for (int64_t b = 0; b < w; ++b) out[g * cols + j0 + b] += acc[g][b];
    }
  }
}

// The same for any number of groups, in blocks of at most 8 (the largest share of query heads
// per key/value head in common models: Llama 3 has 4, Qwen2.5-7B 7, SmolLM2 3).
template <typename T>
void accumulate_product(const float* coef, const T* matrix, int64_t stride, int64_t n,
                        int64_t cols, int64_t groups, float* out) {
  for (int64_t g0 = 0; g0 < groups; g0 += 8) {
    const float* c = coef + g0 * n;
    float* o = out + g0 * cols;
    switch (std::min<int64_t>(groups - g0, 8)) {
      case 1: accumulate_product<T, 1>(c, matrix, stride, n, cols, o); break;
      case 2: accumulate_product<T, 2>(c, matrix, stride, n, cols, o); break;
      case 3: accumulate_product<T, 3>(c, matrix, stride, n, cols, o); break;
      case 4: accumulate_product<T, 4>(c, matrix, stride, n, cols, o); break;
      case 5: accumulate_product<T, 5>(c, matrix, stride, n, cols, o); break;
      case 6: accumulate_product<T, 6>(c, matrix, stride, n, cols, o); break;
      case 7: accumulate_product<T, 7>(c, matrix, stride, n, cols, o); break;
      default: accumulate_product<T, 8>(c, matrix, stride, n, cols, o); break;
    }
  }
}

// scores (n) <- softmax(scores + bias), in place. A function of its own, outside the parallel
// region's closure, so that gcc vectorises its loops.
inline void softmax(float* scores, const float* bias, int64_t n) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    scores[j] += bias[j];
    top = std::max(top, scores[j]);
  }
  float total = 0.f;
#pragma omp simd reduction(+ : total)
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = fast_exp(scores[j] - top);
    total += scores[j];
  }
  const float inv = 1.f / total;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) scores[j] *= inv;
}

// One query per row and head against the first `upto` columns of the cache. The heads sharing
// a key/value head (a group) are computed together, so each cached key and value is read once
// per group: at long lengths the step is bound by reading the cache.
template <typename T>
void attention_kernel(const T* q, const T* keys, const T* values, const float* bias,
                      int64_t bias_stride, T* out, int64_t rows, int64_t heads, int64_t kv_heads,
                      int64_t d, int64_t width, int64_t upto, float scale) {
  const int64_t groups = heads / kv_heads;
  at::parallel_for(0, rows * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> query(groups * d), scores(groups * upto), acc(groups * d);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / kv_heads, h = task % kv_heads;
      const T* qh = q + (r * heads + h * groups) * d;
      for (int64_t i = 0; i < groups * d; ++i) query[i] = to_float(qh[i]) * scale;
      std::fill(scores.begin(), scores.end(), 0.f);
      accumulate_product(query.data(), keys + (r * kv_heads + h) * d * width, width, d, upto,
                         groups, scores.data());
      const float* b = bias + r * bias_stride;
      for (int64_t g = 0; g < groups; ++g) softmax(scores.data() + g * upto, b, upto);
      std::fill(acc.begin(), acc.end(), 0.f);
      accumulate_product(scores.data(), values + (r * kv_heads + h) * width * d, d, upto, d,
                         groups, acc.data());
      T* o = out + (r * heads + h * groups) * d;
      for (int64_t i = 0; i < groups * d; ++i) o[i] = from_float<T>(acc[i]);
    }
  });
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                            const at::Tensor& bias, int64_t upto, double scale) {
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous(), "the cache must be contiguous");
  const int64_t rows = keys.size(0), kv_heads = keys.size(1), d = keys.size(2),
                width = keys.size(3);
  auto x = q.contiguous();
  const int64_t heads = x.numel() / (rows * d);
  TORCH_CHECK(heads * rows * d == x.numel() && heads % kv_heads == 0, "q does not match");
  TORCH_CHECK(upto > 0 && upto <= width, "upto outside the cache");
  auto b = bias.to(at::kFloat);
  TORCH_CHECK(b.dim() == 2 && b.size(0) == rows && b.size(1) >= upto && b.stride(1) == 1,
              "bias must be (rows, >= upto) with unit column stride");
  auto out = at::empty({rows, heads * d}, x.options());
  if (x.scalar_type() == at::kBFloat16) {
    attention_kernel<uint16_t>(bf16_data(x), bf16_data(keys), bf16_data(values),
                           b.data_ptr<float>(), b.stride(0), bf16_data(out), rows, heads,
                           kv_heads, d, width, upto, static_cast<float>(scale));
  } else {
    attention_kernel<float>(x.data_ptr<float>(), keys.data_ptr<float>(),
                            values.data_ptr<float>(), b.data_ptr<float>(), b.stride(0),
                            out.data_ptr<float>(), rows, heads, kv_heads, d, width, upto,
                            static_cast<float>(scale));
  }
  return out;
}

template <typename T>
inline void silu_mul_row(const T* gate, const T* up, T* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float x = to_float(gate[i]);
    out[i] = from_float<T>(rounded<T>(x / (1.f + fast_exp(-x))) * to_float(up[i]));
  }
}

// gate_up (rows, 2 I) in T -> silu(gate) * up (rows, I), rounded to T after the silu and after
// the product, as the two eager operations round.
template <typename T>
void silu_mul_kernel(const T* gate_up, T* out, int64_t rows, int64_t inner) {
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gate_up + r * 2 * inner;
      const T* u = g + inner;
      silu_mul_row(g, u, out + r * inner, inner);
    }
  });
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  auto x = gate_up.contiguous();
  const int64_t inner = x.size(-1) / 2;
  const int64_t rows = x.numel() / (2 * inner);
  auto out = at::empty({rows, inner}, x.options());
  if (x.scalar_type() == at::kBFloat16) {
    silu_mul_kernel<uint16_t>(bf16_data(x), bf16_data(out), rows, inner);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kFloat, "float32 or bfloat16 only");
    silu_mul_kernel<float>(x.data_ptr<float>(), out.data_ptr<float>(), rows, inner);
  }
  return out;
}

// A plain LoRA adapter's share of a projection, unmerged, added in place as peft computes it
// under autocast: out (rows, N) += round(round(t_p B_p^T) * scale_p) for each part p in order,
// with t = round(x A^T) (rows, R) the products with every part's A at once, rounded to T after
// each of those steps. A^T (in, R) comes with R a multiple of 16 (zero columns pad it); part p
// covers outputs [o_p, o_p + n_p) and ranks [k_p, k_p + r_p), its B^T (r_p, n_p) starting at
// bt + b_p in blocks of 64 outputs, each block's (r_p, 64) contiguous (zero columns pad the
// last): a decoding step reads every layer's adapter from memory, and a block read as r_p rows
// of B^T far apart would be r_p streams, more than the hardware prefetcher follows. Parts of
// several adapters may cover the same outputs. The adapter stays in T: float32 copies would
// double what a step reads.
template <typename T>
void lora_add_kernel(T* out, const T* x, const T* a_t, const T* bt, const int64_t* parts,
                     const double* scales, int64_t n_parts, int64_t rows, int64_t width,
                     int64_t in, int64_t ranks) {
  // t, four rows and 16 ranks at a time: 4 independent sums in registers (a single dot
  // product's sum waits on its own latency at every step), each row of A^T widened once.
  constexpr int64_t kRows = 4, kLanes = 16;
  const int64_t padded_rows = (rows + kRows - 1) / kRows * kRows;
  std::vector<float> xf(padded_rows * in, 0.f), t(padded_rows * ranks);
  for (int64_t i = 0; i < rows * in; ++i) xf[i] = to_float(x[i]);
  for (int64_t r0 = 0; r0 < padded_rows; r0 += kRows) {
    for (int64_t c = 0; c < ranks; c += kLanes) {
      float acc[kRows][kLanes] = {};
      for (int64_t i = 0; i < in; ++i) {
        const T* a_row = a_t + i * ranks + c;
        float a_wide[kLanes];
#pragma omp simd
        for (int64_t l = 0; l < kLanes; ++l) a_wide[l] = to_float(a_row[l]);
        for (int64_t rr = 0; rr < kRows; ++rr) {
          const float xv = xf[(r0 + rr) * in + i];
#pragma omp simd
          for (int64_t l = 0; l < kLanes; ++l) acc[rr][l] += xv * a_wide[l];
        }
      }
      for (int64_t rr = 0; rr < kRows; ++rr) {
        for (int64_t l = 0; l < kLanes; ++l) t[(r0 + rr) * ranks + c + l] = rounded<T>(acc[rr][l]);
      }
    }
  }
  // Each part's outputs in blocks of 64: the block's B^T widened once into a buffer that stays
  // in L1 for every row, each row's products for the block in registers.
  constexpr int64_t block = 64;
  for (int64_t p = 0; p < n_parts; ++p) {
    const int64_t* part = parts + 5 * p;
    const int64_t offset = part[0], n = part[1], first = part[2], rank = part[3];
    const T* b = bt + part[4];
    const float scale = static_cast<float>(scales[p]);
    const int64_t blocks = (n + block - 1) / block;
    at::parallel_for(0, blocks, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> wide(rank * block);
      for (int64_t blk = begin; blk < end; ++blk) {
        const int64_t i0 = blk * block, w = std::min(block, n - i0);
        const T* b_block = b + blk * rank * block;
#pragma omp simd
        for (int64_t i = 0; i < rank * block; ++i) wide[i] = to_float(b_block[i]);
        for (int64_t r = 0; r < rows; ++r) {
          float acc[block] = {};
          const float* tr = t.data() + r * ranks + first;
          for (int64_t j = 0; j < rank; ++j) {
            const float tj = tr[j];
            const float* bj = wide.data() + j * block;
#pragma omp simd
            for (int64_t i = 0; i < block; ++i) acc[i] += tj * bj[i];
          }
          T* o = out + r * width + offset + i0;
#pragma omp simd
          for (int64_t i = 0; i < w; ++i) {
            o[i] = from_float<T>(to_float(o[i]) + rounded<T>(rounded<T>(acc[i]) * scale));
          }
        }
      }
    });
  }
}

void lora_add(at::Tensor out, const at::Tensor& x, const at::Tensor& a_t, const at::Tensor& bt,
              const at::Tensor& parts, const at::Tensor& scales) {
  TORCH_CHECK(out.is_contiguous() && x.is_contiguous() && a_t.is_contiguous() &&
                  bt.is_contiguous(),
              "lora_add takes contiguous tensors");
  TORCH_CHECK(parts.scalar_type() == at::kLong && scales.scalar_type() == at::kDouble &&
                  parts.is_contiguous() && parts.size(-1) == 5 && parts.size(0) == scales.numel(),
              "parts must be (P, 5) int64 and scales (P,) float64");
  const auto dtype = out.scalar_type();
  TORCH_CHECK(x.scalar_type() == dtype && a_t.scalar_type() == dtype && bt.scalar_type() == dtype,
              "out, x, A^T and B^T must share a dtype");
  const int64_t width = out.size(-1), in = x.size(-1), ranks = a_t.size(1);
  const int64_t rows = out.numel() / width;
  TORCH_CHECK(a_t.size(0) == in && x.numel() == rows * in && ranks % 16 == 0, "shape mismatch");
  const int64_t* p = parts.data_ptr<int64_t>();
  for (int64_t i = 0; i < parts.size(0); ++i) {
    const int64_t* part = p + 5 * i;
    TORCH_CHECK(part[0] >= 0 && part[1] >= 0 && part[0] + part[1] <= width && part[2] >= 0 &&
                    part[3] >= 0 && part[2] + part[3] <= ranks && part[4] >= 0 &&
                    part[4] + (part[1] + 63) / 64 * 64 * part[3] <= bt.numel(),
                "a LoRA part lies outside its tensors");
  }
  if (dtype == at::kBFloat16) {
    lora_add_kernel<uint16_t>(bf16_data(out), bf16_data(x), bf16_data(a_t), bf16_data(bt), p,
                              scales.data_ptr<double>(), parts.size(0), rows, width, in, ranks);
  } else {
    TORCH_CHECK(dtype == at::kFloat, "float32 or bfloat16 only");
    lora_add_kernel<float>(out.data_ptr<float>(), x.data_ptr<float>(), a_t.data_ptr<float>(),
                           bt.data_ptr<float>(), p, scales.data_ptr<double>(), parts.size(0),
                           rows, width, in, ranks);
  }
}

// out (M, N) = x (M, K) W^T + bias in float32, W stored as blocks of 16 output features:
// blocks (ceil(N / 16), K, 16), block b's [k][j] = W[16 b + j][k], zeros past N. A decoding step
// reads each weight once for a few rows, so its speed is the memory's: one block is one
// contiguous stream (a row-major W read 16 rows at a time is 16 streams), prefetched a kilobyte
// ahead (measured on an AVX2 EPYC: oneDNN's prepacked product read the embedded model's weights
// at 8-10 GB/s at 4 rows, this at 16-17). For more rows the block, 16 K floats, stays in L2
// while every group of 6 rows passes over it: 12 accumulators of 8 lanes, each weight load
// feeding 6 multiply-adds. Each output is bias + sum over k in order, in float32 (fused
// multiply-adds), whatever the threads.
using F32x8 = float __attribute__((vector_size(32)));

constexpr int64_t kBlock = 16;
constexpr int64_t kPrefetch = 256;  // floats ahead in the block stream: 1 KB, 16 cache lines
constexpr int64_t kRowChunk = 256;  // rows per pass over the weights: their x stays in cache

inline F32x8 load8(const float* p) {
  F32x8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store8(float* p, F32x8 v) { std::memcpy(p, &v, sizeof v); }

// R rows of x (stride K) against one block: out rows (stride ldo), the first cols of 16.
template <int R>
void blocked_tile(const float* x, int64_t K, const float* w, const float* bias, float* out,
                  int64_t ldo, int64_t cols) {
  const F32x8 zero = {};
  const F32x8 b0 = bias ? load8(bias) : zero, b1 = bias ? load8(bias + 8) : zero;
  F32x8 acc[R][2];
  for (int r = 0; r < R; ++r) {
    acc[r][0] = b0;
    acc[r][1] = b1;
  }
  for (int64_t k = 0; k < K; ++k) {
    __builtin_prefetch(w + k * kBlock + kPrefetch, 0, 0);
    const F32x8 w0 = load8(w + k * kBlock), w1 = load8(w + k * kBlock + 8);
    for (int r = 0; r < R; ++r) {
      const float xv = x[r * K + k];
      acc[r][0] += xv * w0;
      acc[r][1] += xv * w1;
    }
  }
  for (int r = 0; r < R; ++r) {
    if (cols == kBlock) {
      store8(out + r * ldo, acc[r][0]);
      store8(out + r * ldo + 8, acc[r][1]);
    } else {  // the last block of an N that is not a multiple of 16
      float tail[kBlock];
      store8(tail, acc[r][0]);
      store8(tail + 8, acc[r][1]);
      std::memcpy(out + r * ldo, tail, cols * sizeof(float));
    }
  }
}

template <int R>
void blocked_rows(const float* x, int64_t rows, int64_t K, const float* w, const float* bias,
                  float* out, int64_t ldo, int64_t cols) {
  int64_t r = 0;
  for (; r + R <= rows; r += R) blocked_tile<R>(x + r * K, K, w, bias, out + r * ldo, ldo, cols);
  if constexpr (R > 1) {
    if (r < rows) blocked_rows<R - 1>(x + r * K, rows - r, K, w, bias, out + r * ldo, ldo, cols);
  }
}

at::Tensor blocked_linear(const at::Tensor& x, const at::Tensor& blocks,
                          const std::optional<at::Tensor>& bias, int64_t out_features) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && blocks.scalar_type() == at::kFloat,
              "blocked_linear is float32 only");
  TORCH_CHECK(x.dim() == 2 && blocks.dim() == 3 && blocks.size(2) == kBlock &&
                  blocks.is_contiguous() && blocks.size(1) == x.size(1) &&
                  out_features > (blocks.size(0) - 1) * kBlock &&
                  out_features <= blocks.size(0) * kBlock,
              "blocked_linear: x (M, K), blocks (ceil(N / 16), K, 16)");
  const auto xc = x.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), N = out_features, nb = blocks.size(0);
  std::optional<at::Tensor> b;
  if (bias.has_value()) {
    b = bias->contiguous();
    TORCH_CHECK(b->scalar_type() == at::kFloat && b->numel() == nb * kBlock,
                "blocked_linear: bias padded to the blocks' 16 * ceil(N / 16) features");
  }
  auto out = at::empty({M, N}, xc.options());
  const float* xp = xc.data_ptr<float>();
  const float* wp = blocks.data_ptr<float>();
  const float* bp = b ? b->data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  for (int64_t r0 = 0; r0 < M; r0 += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, M - r0);
    at::parallel_for(0, nb, 4, [&](int64_t begin, int64_t end) {
      for (int64_t blk = begin; blk < end; ++blk) {
        blocked_rows<6>(xp + r0 * K, rows, K, wp + blk * K * kBlock,
                        bp ? bp + blk * kBlock : nullptr, op + r0 * N + blk * kBlock, N,
                        std::min(kBlock, N - blk * kBlock));
      }
    });
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(grpokit_decode, m) {
  m.def("add_rms_norm", &add_rms_norm);
  m.def("rope_cache", &rope_cache);
  m.def("decode_attention", &decode_attention);
  m.def("silu_mul", &silu_mul);
  m.def("lora_add", &lora_add);
  m.def("blocked_linear", &blocked_linear);
}
