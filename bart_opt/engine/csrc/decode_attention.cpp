// bart_opt's attention kernel for decoding in bfloat16 on CPUs: AVX512-BF16 (the fast mode's), or AVX2 with FMA
// (the fast mode and the int8 mode's bfloat16 attention state on CPUs without AVX512-BF16). One source, built twice
// by bart_opt.engine.native with each ISA's flags; the preprocessor picks the block below that the flags allow.
//
// A decoder step asks few queries of many keys: per (row, head), one query against the cached
// positions (self-attention), or one input's beams against its encoder states (cross-attention).
// torch's half-precision flash kernel spends most of such a call setting up per-head products.
// This kernel takes up to 4 queries of a head at a time through its keys and values (16 keys a
// step with AVX-512, 8 with AVX2, their dot products summed across lanes in one transpose) and keeps every
// intermediate in float32: scores (bfloat16 pairs multiplied and summed in float32 by vdpbf16ps; with AVX2,
// bfloat16 widened exactly to float32 by a shift and multiplied by FMA), softmax, the weighted sum of values;
// only the output is rounded to bfloat16 (to nearest even), once.
//
// Inputs are strided views whose last dimension d (32, 64, 96 or 128; BART's is 64) is contiguous:
//   q   (G, H, M, d)  queries
//   k   (G, H, N, d)  keys;  v likewise
//   out (G, H, M, d)  written in place (any strides), e.g. a transposed (G, M, H, d) buffer.
//   rows (G, N) int32 (rows contiguous), optional: key/value position j of group g lives in group
//        rows[g][j] of k and v (a beam's history in a self-attention cache that beam search reorders
//        by this table instead of by copying the cache's rows).

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

namespace {

constexpr int64_t kQueryBlock = 4;  // queries taken through the keys and values together (one value row load)

// Where key/value position j is: `base` plus j rows (`step` apart), plus `rows[j]` groups (`group` apart)
// when a row table is given.
struct Positions {
  const uint16_t* base;
  int64_t step, group;
  const int32_t* rows;
  const uint16_t* operator[](int64_t j) const { return base + j * step + (rows ? rows[j] * group : 0); }
};

#if defined(__AVX512BF16__)

// exp(x) for x <= 0 (scores minus their maximum), to about one float32 ulp: 2^n * p(r) with
// r = x - n*ln2 in [-ln2/2, ln2/2] and p the degree-7 Taylor polynomial of exp.
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-87.0f), x);  // below, exp underflows float32 anyway; NaN stays NaN
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln2 in two parts
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 5040);
  for (const float c : {1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
}

// Lane i of the result: the sum of the 16 lanes of x[i] (a transpose and add in four levels, instead
// of 16 horizontal sums).
inline __m512 sum_lanes16(const __m512 x[16]) {
  __m512 pairs[8], quads[4], halves[2];
  for (int i = 0; i < 8; ++i)  // each 128-bit lane: x[2i], x[2i+1] interleaved, two partial sums each
    pairs[i] =
        _mm512_add_ps(_mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]), _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // each 128-bit lane: x[4i..4i+3], one partial sum each
    const __m512d a = _mm512_castps_pd(pairs[2 * i]), b = _mm512_castps_pd(pairs[2 * i + 1]);
    quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  for (int i = 0; i < 2; ++i)  // 128-bit lanes: x[8i..8i+3] twice, x[8i+4..8i+7] twice
    halves[i] = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(halves[0], halves[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(halves[0], halves[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// Attention of up to kQueryBlock queries (rows `qs` apart) over N keys/values of one head of width D;
// `scores` holds kQueryBlock * N floats.
template <int D>
void attend_block(const uint16_t* q, int64_t qs, int64_t mb, const Positions& k, const Positions& v, int64_t n,
                  float scale, uint16_t* out, int64_t os, float* scores) {
  constexpr int kPairs = D / 32, kFloats = D / 16;  // 512-bit registers of a row: bfloat16 / float32
  __m512bh qr[kQueryBlock][kPairs];  // each query's D values, 32 to a register
  for (int64_t m = 0; m < mb; ++m)
    for (int c = 0; c < kPairs; ++c) qr[m][c] = (__m512bh)_mm512_loadu_si512(q + m * qs + 32 * c);
  __m512 top[kQueryBlock];  // running maxima of each query's scores, lane-wise
  for (auto& t : top) t = _mm512_set1_ps(-INFINITY);
  for (int64_t j0 = 0; j0 < n; j0 += 16) {  // scores (mb, N), 16 keys at a time
    const int64_t count = std::min<int64_t>(16, n - j0);
    const __mmask16 live = count == 16 ? 0xffff : (__mmask16)((1u << count) - 1);
    for (int64_t m = 0; m < mb; ++m) {
      __m512 dots[16];  // per key: float32 sums of its bfloat16 pair products with the query
      for (int64_t jj = 0; jj < 16; ++jj) {
        dots[jj] = _mm512_setzero_ps();
        if (jj < count)
          for (int c = 0; c < kPairs; ++c)
            dots[jj] = _mm512_dpbf16_ps(dots[jj], qr[m][c], (__m512bh)_mm512_loadu_si512(k[j0 + jj] + 32 * c));
      }
      const __m512 block = _mm512_mul_ps(sum_lanes16(dots), _mm512_set1_ps(scale));
      _mm512_mask_storeu_ps(scores + m * n + j0, live, block);
      top[m] = _mm512_mask_max_ps(top[m], live, top[m], block);
    }
  }
  float total[kQueryBlock];
  for (int64_t m = 0; m < mb; ++m) {  // scores -> exp(score - max), and their sum
    float* row = scores + m * n;
    const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(top[m]));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 live = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
      const __m512 shifted = _mm512_sub_ps(_mm512_maskz_loadu_ps(live, row + j), max);
      const __m512 e = _mm512_maskz_mov_ps(live, exp_nonpositive(shifted));
      _mm512_mask_storeu_ps(row + j, live, e);
      sum = _mm512_add_ps(sum, e);
    }
    total[m] = _mm512_reduce_add_ps(sum);
  }
  __m512 acc[kQueryBlock][kFloats];  // (mb, D) float32 weighted sums of the values
  for (auto& a : acc) for (auto& part : a) part = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    __m512 value[kFloats];  // value row j widened to float32 (exact)
    for (int c = 0; c < kFloats; ++c)
      value[c] = _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256((const __m256i*)(v[j] + 16 * c)));
    for (int64_t m = 0; m < mb; ++m) {
      const __m512 weight = _mm512_set1_ps(scores[m * n + j]);
      for (int c = 0; c < kFloats; ++c) acc[m][c] = _mm512_fmadd_ps(weight, value[c], acc[m][c]);
    }
  }
  for (int64_t m = 0; m < mb; ++m) {  // normalize, round to bfloat16 (to nearest even) once
    const __m512 inverse = _mm512_set1_ps(1.f / total[m]);
    for (int c = 0; c < kFloats; ++c)
      _mm256_storeu_si256((__m256i*)(out + m * os + 16 * c),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(acc[m][c], inverse)));
  }
}

#else  // AVX2 and FMA

// exp(x) for x <= 0 as above, 8 lanes: 2^n by the exponent field (n >= -126 once x >= -87: a normal float).
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
  __m256 p = _mm256_set1_ps(1.f / 5040);
  for (const float c : {1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f})
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));  // a NaN x made p NaN: it stays NaN
}

// Lane i of the result: the sum of the 8 lanes of x[i].
inline __m256 sum_lanes8(const __m256 x[8]) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(x[0], x[1]), _mm256_hadd_ps(x[2], x[3]));  // x0..x3 | x0..x3
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(x[4], x[5]), _mm256_hadd_ps(x[6], x[7]));  // x4..x7 | x4..x7
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

inline float reduce_add8(__m256 x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// 8 bfloat16 values widened to float32 (exactly: a bfloat16 is the top half of a float32).
inline __m256 widen8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}

// float32 rounded to bfloat16, to nearest even (NaN kept a quiet NaN).
inline uint16_t round_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// Attention of up to kQueryBlock queries (rows `qs` apart) over N keys/values of one head of width D;
// `scores` holds kQueryBlock * N floats.
template <int D>
void attend_block(const uint16_t* q, int64_t qs, int64_t mb, const Positions& k, const Positions& v, int64_t n,
                  float scale, uint16_t* out, int64_t os, float* scores) {
  constexpr int kFloats = D / 8;  // 256-bit registers of a row in float32
  __m256 qr[kQueryBlock][kFloats];  // each query's D values, widened
  for (int64_t m = 0; m < mb; ++m)
    for (int c = 0; c < kFloats; ++c) qr[m][c] = widen8(q + m * qs + 8 * c);
  float top[kQueryBlock];
  for (auto& t : top) t = -INFINITY;
  for (int64_t j0 = 0; j0 < n; j0 += 8) {  // scores (mb, N), 8 keys at a time
    const int64_t count = std::min<int64_t>(8, n - j0);
    __m256 key[8][kFloats];
    for (int64_t jj = 0; jj < count; ++jj)
      for (int c = 0; c < kFloats; ++c) key[jj][c] = widen8(k[j0 + jj] + 8 * c);
    for (int64_t m = 0; m < mb; ++m) {
      __m256 dots[8];  // per key: lane-wise products with the query, summed over the row's registers
      for (int64_t jj = 0; jj < 8; ++jj) {
        dots[jj] = _mm256_setzero_ps();
        if (jj < count)
          for (int c = 0; c < kFloats; ++c) dots[jj] = _mm256_fmadd_ps(qr[m][c], key[jj][c], dots[jj]);
      }
      alignas(32) float block[8];
      _mm256_store_ps(block, _mm256_mul_ps(sum_lanes8(dots), _mm256_set1_ps(scale)));
      for (int64_t jj = 0; jj < count; ++jj) {
        scores[m * n + j0 + jj] = block[jj];
        top[m] = std::max(top[m], block[jj]);
      }
    }
  }
  float total[kQueryBlock];
  for (int64_t m = 0; m < mb; ++m) {  // scores -> exp(score - max), and their sum
    float* row = scores + m * n;
    const __m256 max = _mm256_set1_ps(top[m]);
    __m256 sum = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(row + j), max));
      _mm256_storeu_ps(row + j, e);
      sum = _mm256_add_ps(sum, e);
    }
    total[m] = reduce_add8(sum);
    if (j < n) {  // the last keys, through the same 8-lane exp
      alignas(32) float tail[8] = {0};
      for (int64_t jj = j; jj < n; ++jj) tail[jj - j] = row[jj] - top[m];
      alignas(32) float e[8];
      _mm256_store_ps(e, exp_nonpositive(_mm256_load_ps(tail)));
      for (int64_t jj = j; jj < n; ++jj) {
        row[jj] = e[jj - j];
        total[m] += e[jj - j];
      }
    }
  }
  __m256 acc[kQueryBlock][kFloats];  // (mb, D) float32 weighted sums of the values
  for (auto& a : acc) for (auto& part : a) part = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    __m256 value[kFloats];  // value row j widened to float32 (exact)
    for (int c = 0; c < kFloats; ++c) value[c] = widen8(v[j] + 8 * c);
    for (int64_t m = 0; m < mb; ++m) {
      const __m256 weight = _mm256_set1_ps(scores[m * n + j]);
      for (int c = 0; c < kFloats; ++c) acc[m][c] = _mm256_fmadd_ps(weight, value[c], acc[m][c]);
    }
  }
  for (int64_t m = 0; m < mb; ++m) {  // normalize, round to bfloat16 once
    const __m256 inverse = _mm256_set1_ps(1.f / total[m]);
    for (int c = 0; c < kFloats; ++c) {
      alignas(32) float lane[8];
      _mm256_store_ps(lane, _mm256_mul_ps(acc[m][c], inverse));
      for (int i = 0; i < 8; ++i) out[m * os + 8 * c + i] = round_bf16(lane[i]);
    }
  }
}

#endif

template <int D>
void run(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& out, double scale,
         const int32_t* rows, int64_t rows_stride) {
  const int64_t g = q.size(0), h = q.size(1), m = q.size(2), n = k.size(2);
  const auto* qp = reinterpret_cast<const uint16_t*>(q.data_ptr());
  const auto* kp = reinterpret_cast<const uint16_t*>(k.data_ptr());
  const auto* vp = reinterpret_cast<const uint16_t*>(v.data_ptr());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  // One (g, h) pair per task: each head's result comes from one thread, in one order, at any thread count.
  at::parallel_for(0, g * h, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(kQueryBlock * n);
    for (int64_t gh = begin; gh < end; ++gh) {
      const int64_t i = gh / h, head = gh % h;
      const uint16_t* qh = qp + i * q.stride(0) + head * q.stride(1);
      uint16_t* oh = op + i * out.stride(0) + head * out.stride(1);
      const int32_t* table = rows ? rows + i * rows_stride : nullptr;
      const int64_t own = table ? 0 : i;  // with a row table, positions name their group themselves
      const Positions kh{kp + own * k.stride(0) + head * k.stride(1), k.stride(2), k.stride(0), table};
      const Positions vh{vp + own * v.stride(0) + head * v.stride(1), v.stride(2), v.stride(0), table};
      for (int64_t m0 = 0; m0 < m; m0 += kQueryBlock) {
        attend_block<D>(qh + m0 * q.stride(2), q.stride(2), std::min(kQueryBlock, m - m0), kh, vh, n, float(scale),
                        oh + m0 * out.stride(2), out.stride(2), scores.data());
      }
    }
  });
}

void decode_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& out,
                      double scale, const std::optional<torch::Tensor>& rows) {
  for (const torch::Tensor* t : std::initializer_list<const torch::Tensor*>{&q, &k, &v, &out}) {
    TORCH_CHECK(t->dim() == 4 && t->scalar_type() == torch::kBFloat16 && t->device().is_cpu(),
                "decode_attention takes 4-d bfloat16 CPU tensors");
    TORCH_CHECK(t->size(3) == q.size(3) && t->stride(3) == 1, "decode_attention needs one contiguous last dimension");
  }
  TORCH_CHECK(q.size(3) > 0 && q.size(3) % 32 == 0 && q.size(3) <= 128,
              "decode_attention takes heads 32, 64, 96 or 128 wide");
  const int64_t g = q.size(0), h = q.size(1), m = q.size(2), n = k.size(2);
  TORCH_CHECK(k.size(0) == g && v.size(0) == g && k.size(1) == h && v.size(1) == h && v.size(2) == n && n > 0,
              "decode_attention: keys/values must match the queries' (G, H) and each other");
  TORCH_CHECK(out.size(0) == g && out.size(1) == h && out.size(2) == m, "decode_attention: out must be (G, H, M, d)");
  TORCH_CHECK((g == 1 || out.stride(0) != 0) && (h == 1 || out.stride(1) != 0) && (m == 1 || out.stride(2) != 0),
              "decode_attention: out must not overlap itself");
  const int32_t* table = nullptr;
  int64_t rows_stride = 0;
  if (rows) {
    TORCH_CHECK(rows->device().is_cpu() && rows->scalar_type() == torch::kInt && rows->dim() == 2 &&
                    rows->size(0) == g && rows->size(1) == n && rows->stride(1) == 1,
                "decode_attention: rows must be a (G, N) int32 table, rows contiguous");
    TORCH_CHECK(rows->numel() == 0 || (rows->min().item<int32_t>() >= 0 && rows->max().item<int32_t>() < g),
                "decode_attention: rows must name groups of k and v");
    table = rows->data_ptr<int32_t>();
    rows_stride = rows->stride(0);
  }
  switch (q.size(3)) {
    case 32: return run<32>(q, k, v, out, scale, table, rows_stride);
    case 64: return run<64>(q, k, v, out, scale, table, rows_stride);
    case 96: return run<96>(q, k, v, out, scale, table, rows_stride);
    case 128: return run<128>(q, k, v, out, scale, table, rows_stride);
  }
}

// How many threads at::parallel_for runs the kernel's tasks on here (1 if built without OpenMP).
int64_t parallel_threads() {
  std::vector<int> ran(at::get_num_threads(), 0);
  at::parallel_for(0, 1024, 1, [&](int64_t, int64_t) {
    const size_t thread = at::get_thread_num();
    if (thread < ran.size()) ran[thread] = 1;  // one element per thread: no race
  });
  return std::count(ran.begin(), ran.end(), 1);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("parallel_threads", &parallel_threads, "threads at::parallel_for uses in this module");
  module.def("decode_attention", &decode_attention, "softmax(q k^T * scale) v into out; see the file's header",
             pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("out"), pybind11::arg("scale"),
             pybind11::arg("rows") = pybind11::none(), pybind11::call_guard<pybind11::gil_scoped_release>());
}
