// Every decoder layer of a decode or verify step in one call, for int4 or bf16 models on CPUs
// with AVX2 (`specdec.kernels.decode_stack` decides when).
//
// Why: at one to a few rows per step a layer's arithmetic is four int4 products and a few
// loops over vectors of the hidden size, while the eager PyTorch layer spends ~40 ops on it
// (norms, RoPE, cache writes, attention, activations), each a few microseconds of dispatch
// and allocation. Measured on a Zen 3: a 0.5B int4 draft step took 46 ms eagerly, of which
// its int4 products took ~13. Here nothing but the products and those loops is left. The
// products are q4_kernel.h's for int4 weights and bf16_kernel.h's for bf16 ones.
//
// Numerics follow transformer.py op for op: each value PyTorch rounds to the model dtype
// (bf16) is rounded here at the same point, so the result differs from the eager layers only
// in the order of a few fp32 reductions (the norm's sum of squares, attention's dot products
// and softmax). Batch-invariant like the two kernels: a row's result depends neither on how
// many rows share the call nor on the keys it cannot see, so a verify pass scores each token
// bitwise as a one-token step does.
//
// Inputs (the eager path's own, see Transformer.forward): x [B, T, H] embedded tokens, the
// cache tensors [max_batch, Hkv, max_len + 1, D] of every layer, the batch's first cache row,
// slots [B, T] (where each token's key/value is written), cos/sin [B, T, 1, D], span (keys
// [0, span) exist), an optional mask [B, 1, T, span] (None: every key of span is visible) and
// the layers whose inputs are handed back too (`keep`: an EAGLE-3 head's auxiliary states).

#include "bf16_kernel.h"
#include "q4_kernel.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

namespace {

// Rounds to the model dtype: bf16 (round to nearest even, as `.to(torch.bfloat16)`) or fp32.
struct Round {
  bool bf16;
  float operator()(float v) const { return bf16 ? static_cast<float>(c10::BFloat16(v)) : v; }
};

// Eight floats rounded to the nearest bf16, ties to even (finite inputs; NaN stays NaN).
inline __m256 round_bf16(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i up = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd));
  return _mm256_castsi256_ps(_mm256_and_si256(up, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// v[i] rounded to the model dtype, in place: the vectorized form of Round, bit for bit.
void round_all(float* v, int64_t n, const Round& rnd) {
  if (!rnd.bf16) return;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(v + i, round_bf16(_mm256_loadu_ps(v + i)));
  for (; i < n; ++i) v[i] = rnd(v[i]);
}

// exp(x) for eight floats to about 2 ulp (Cephes' expf: x = n ln2 + r, a degree-6
// polynomial in r, times 2^n); the eager path's Sleef expf is 1 ulp: values agree after
// rounding to bf16 but at near-ties.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
}

struct Projection {  // one int4 layer (the buffers of quant.Int4Linear) or one bf16 layer
  at::Tensor qs, sc, mn, d, dmin, bias;  // bias fp32 [N], or empty
  at::Tensor w;                          // bf16 [N, K], or undefined for int4
  at::Tensor tiles;                      // int4 in the tile layout (q4_tiles), bf16 in the
                                         // panel layout (bf16_kernel.h), or empty
  int64_t N, K, S;
  int kstep = 1;                         // bf16 panels: which of the build's layouts
};

// (qs, sc, mn, d, dmin, bias, tiles) of an int4 layer (tiles: empty where the layer has
// none), or (weight, 4 empty tensors, bias, panels) of a bf16 one (panels: its weight in the
// panel layout, which the product then reads, or an empty tensor).
Projection projection(const std::vector<at::Tensor>& t, size_t at) {
  if (t[at].scalar_type() == at::kBFloat16) {
    // With panels the weight gives its shape only (it may be a zero-stride placeholder once
    // its rows are dropped: Linear.drop_rows), so it is not made contiguous.
    const bool panels = t[at + 6].numel() > 0;
    Projection p{{}, {}, {}, {}, {}, t[at + 5].contiguous(), panels ? t[at] : t[at].contiguous(),
                 t[at + 6].contiguous(), 0, 0, 0};
    TORCH_CHECK(p.w.dim() == 2 && p.w.size(1) % 8 == 0, "bf16 weight: [N, K], K % 8 == 0");
    TORCH_CHECK(p.bias.numel() == 0 || p.bias.scalar_type() == at::kFloat, "bias: fp32 or empty");
    p.N = p.w.size(0);
    p.K = p.w.size(1);
    TORCH_CHECK(p.bias.numel() == 0 || p.bias.numel() == p.N, "bias: [N]");
    if (p.tiles.numel()) p.kstep = bf16::check_panels(p.tiles, p.N, p.K);
    return p;
  }
  Projection p{t[at].contiguous(),     t[at + 1].contiguous(), t[at + 2].contiguous(),
               t[at + 3].contiguous(), t[at + 4].contiguous(), t[at + 5].contiguous(),
               {}, t[at + 6].contiguous(), 0, 0, 0};
  TORCH_CHECK(p.qs.scalar_type() == at::kByte && p.d.scalar_type() == at::kFloat, "int4 buffers");
  TORCH_CHECK(p.bias.numel() == 0 || p.bias.scalar_type() == at::kFloat, "bias: fp32 or empty");
  p.N = p.qs.size(0);
  p.K = p.qs.size(1) * 2;
  p.S = (p.K + q4::SB - 1) / q4::SB;
  TORCH_CHECK(p.K % 64 == 0 && p.sc.size(1) == p.S * q4::GROUPS && p.d.size(1) == p.S, "int4 shapes");
  TORCH_CHECK(p.bias.numel() == 0 || p.bias.numel() == p.N, "bias: [N]");
  TORCH_CHECK(p.tiles.numel() == 0 || p.tiles.numel() == p.N / q4::TILE * p.S * q4::TILE_BLOCK, "int4 tiles");
  return p;
}

// y [R, N] = x [R, K] @ W.T (+ bias), rounded to the model dtype as the eager layer returns
// it (the bf16 layer: `(x.float() @ W.T + bias.float()).to(bf16)`, quant.Int4Linear alike).
void product(const Projection& p, const float* x, int64_t R, float* y, const Round& rnd) {
  if (p.w.defined()) {
    if (p.tiles.numel())
      bf16::run_panels(x, R, reinterpret_cast<const uint16_t*>(p.tiles.data_ptr<at::BFloat16>()), y, p.K, p.N,
                       p.kstep);
    else
      bf16::run(x, R, reinterpret_cast<const uint16_t*>(p.w.data_ptr<at::BFloat16>()), y, p.K, p.N);
    if (p.bias.numel()) {
      const float* b = p.bias.data_ptr<float>();
      for (int64_t r = 0; r < R; ++r)
        for (int64_t n = 0; n < p.N; ++n) y[r * p.N + n] += b[n];
    }
    round_all(y, R * p.N, rnd);
    return;
  }
  const q4::Activations a = q4::quantize_rows(x, R, p.K, p.S);
  const float* bias = p.bias.numel() ? p.bias.data_ptr<float>() : nullptr;
  if (p.tiles.numel())
    q4::run_tiles(a, R, p.tiles.data_ptr<uint8_t>(), bias, y, p.K, p.N, p.S);
  else
    q4::run(a, R, p.qs.data_ptr<uint8_t>(), p.sc.data_ptr<uint8_t>(), p.mn.data_ptr<uint8_t>(),
            p.d.data_ptr<float>(), p.dmin.data_ptr<float>(), bias, y, p.K, p.N, p.S);
  round_all(y, R * p.N, rnd);
}

// RMSNorm as transformer.RMSNorm: normalised in fp32, rounded, scaled in the model dtype.
void rms_norm(const float* x, const std::vector<float>& w, float* out, int64_t R, int64_t H,
              float eps, const Round& rnd) {
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x + r * H;
    float* o = out + r * H;
    float squares = 0.f;
    for (int64_t i = 0; i < H; ++i) squares += xr[i] * xr[i];
    const float inverse = 1.f / std::sqrt(squares / static_cast<float>(H) + eps);
    for (int64_t i = 0; i < H; ++i) o[i] = xr[i] * inverse;
    round_all(o, H, rnd);
    for (int64_t i = 0; i < H; ++i) o[i] *= w[i];
    round_all(o, H, rnd);
  }
}

// x * cos + rotate_half(x) * sin on `heads` vectors of D, each product and the sum rounded.
void rope(float* x, const float* cos, const float* sin, int64_t heads, int64_t D, const Round& rnd) {
  const int64_t half = D / 2;
  float a[512], b[512];
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * D;
    for (int64_t i = 0; i < half; ++i) {
      b[i] = -v[i + half] * sin[i];
      b[i + half] = v[i] * sin[i + half];
    }
    for (int64_t i = 0; i < D; ++i) a[i] = v[i] * cos[i];
    round_all(a, D, rnd);
    round_all(b, D, rnd);
    for (int64_t i = 0; i < D; ++i) v[i] = a[i] + b[i];
    round_all(v, D, rnd);
  }
}

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {
  return simd::widen_bf16(reinterpret_cast<const uint16_t*>(p));
}

template <typename C>
float dot(const float* q, const C* k, int64_t D) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < D; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k + i), acc);
  return simd::hsum(acc);
}

// dot(q, k + c D, D) for the eight keys c = 0..7 that follow one another at k, each summed as
// `dot` sums it (so bitwise the same), in eight chains that overlap: one chain alone waits
// out each fused multiply-add's latency, about 70 cycles a key of 128 dimensions.
template <typename C>
void dot8(const float* q, const C* k, int64_t D, float* out) {
  __m256 acc[8];
  for (int c = 0; c < 8; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t i = 0; i < D; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    for (int c = 0; c < 8; ++c) acc[c] = _mm256_fmadd_ps(qv, load8(k + c * D + i), acc[c]);
  }
  for (int c = 0; c < 8; ++c) out[c] = simd::hsum(acc[c]);
}

// acc[0, 8 V) = sum over keys j < span with weight p[j] != 0, in order, of p[j] v_j[0, 8 V)
// (v_j = v + j D), one fused multiply-add a key per element: V vectors of the output in
// registers, so a key's V products overlap.
template <int V, typename C>
void weigh_values(const float* p, const C* v, int64_t span, int64_t D, float* acc) {
  __m256 a[V];
  for (int c = 0; c < V; ++c) a[c] = _mm256_setzero_ps();
  for (int64_t j = 0; j < span; ++j) {
    if (p[j] == 0.f) continue;  // hidden (or too small to count): adds exactly nothing
    const __m256 pv = _mm256_set1_ps(p[j]);
    const C* vj = v + j * D;
    for (int c = 0; c < V; ++c) a[c] = _mm256_fmadd_ps(pv, load8(vj + 8 * c), a[c]);
  }
  for (int c = 0; c < V; ++c) _mm256_storeu_ps(acc + 8 * c, a[c]);
}

template <typename C>
void write_kv(const float* qkv, int64_t R, int64_t T, int64_t heads, int64_t kv_heads, int64_t D,
              const at::Tensor& k_cache, const at::Tensor& v_cache, int64_t first_row,
              const int64_t* slots) {
  const int64_t width = (heads + 2 * kv_heads) * D, L1 = k_cache.size(2);
  C* kc = k_cache.data_ptr<C>();
  C* vc = v_cache.data_ptr<C>();
  for (int64_t r = 0; r < R; ++r) {
    const int64_t row = first_row + r / T, slot = slots[r];
    for (int64_t g = 0; g < kv_heads; ++g) {
      const int64_t at = ((row * kv_heads + g) * L1 + slot) * D;
      const float* k = qkv + r * width + (heads + g) * D;
      const float* v = qkv + r * width + (heads + kv_heads + g) * D;
      for (int64_t i = 0; i < D; ++i) {
        kc[at + i] = static_cast<C>(k[i]);  // already rounded: exact
        vc[at + i] = static_cast<C>(v[i]);
      }
    }
  }
}

// softmax(q k^T / sqrt(D)) v for every (row, head) over the keys the mask shows, keys in order.
// Keys go in blocks of 8 from key 0, those past the span or hidden weighing exactly 0, so a
// row's sums see the same terms in the same lanes whatever the span (batch invariance).
// A block of keys none of which is shown is skipped; the others' scores come eight at a time
// (`dot8`), and the weighted values 64 dimensions at a time (`weigh_values`): each sum the
// same operations in the same order as one key and one dimension at a time: a 1,024-token
// prefill's attention took 18% of its time, now 12% (about 1.9x faster; Zen 3).
template <typename C>
void attention(const float* qkv, int64_t B, int64_t T, int64_t heads, int64_t kv_heads, int64_t D,
               const at::Tensor& k_cache, const at::Tensor& v_cache, int64_t first_row,
               int64_t span, const bool* mask, float* out, const Round& rnd) {
  const int64_t width = (heads + 2 * kv_heads) * D, group = heads / kv_heads, L1 = k_cache.size(2);
  const int64_t blocks = (span + 7) / 8 * 8;
  const C* kc = k_cache.data_ptr<C>();
  const C* vc = v_cache.data_ptr<C>();
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const float hidden = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, B * T * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(blocks), acc(D);
    float dots[8];
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t r = unit / heads, h = unit % heads, g = h / group;
      const int64_t base = ((first_row + r / T) * kv_heads + g) * L1 * D;
      const float* q = qkv + r * width + h * D;
      const bool* visible = mask ? mask + r * span : nullptr;
      float top = hidden;
      for (int64_t j = 0; j < blocks; j += 8) {
        bool shown[8], any = false;
        for (int c = 0; c < 8; ++c) {
          shown[c] = j + c < span && (!visible || visible[j + c]);
          any = any || shown[c];
        }
        if (!any) {
          std::fill(scores.begin() + j, scores.begin() + j + 8, hidden);
          continue;
        }
        if (j + 8 <= span) {
          dot8(q, kc + base + j * D, D, dots);
        } else {  // the last, partial block: keys past the span are not read
          for (int c = 0; c < 8; ++c) dots[c] = shown[c] ? dot(q, kc + base + (j + c) * D, D) : 0.f;
        }
        for (int c = 0; c < 8; ++c) {
          scores[j + c] = shown[c] ? dots[c] * scale : hidden;
          top = std::max(top, scores[j + c]);
        }
      }
      __m256 sum = _mm256_setzero_ps();
      for (int64_t j = 0; j < blocks; j += 8) {
        const __m256 s = _mm256_loadu_ps(scores.data() + j);
        const __m256 shown = _mm256_cmp_ps(s, _mm256_set1_ps(hidden), _CMP_NEQ_OQ);
        const __m256 p = _mm256_and_ps(exp8(_mm256_sub_ps(s, _mm256_set1_ps(top))), shown);
        _mm256_storeu_ps(scores.data() + j, p);
        sum = _mm256_add_ps(sum, p);
      }
      const float total = simd::hsum(sum);
      const C* v = vc + base;
      int64_t i = 0;
      for (; i + 64 <= D; i += 64) weigh_values<8>(scores.data(), v + i, span, D, acc.data() + i);
      for (; i + 32 <= D; i += 32) weigh_values<4>(scores.data(), v + i, span, D, acc.data() + i);
      for (; i < D; i += 8) weigh_values<1>(scores.data(), v + i, span, D, acc.data() + i);
      float* o = out + r * heads * D + h * D;
      for (int64_t d = 0; d < D; ++d) o[d] = acc[d] / total;
      round_all(o, D, rnd);
    }
  });
}

// act = silu(gate) * up for one row of the fused gate_up output [gate (I) | up (I)], with
// silu's result and the product rounded as F.silu(gate) * up rounds them.
void silu_times(const float* gate_up, float* act, int64_t I, const Round& rnd) {
  const float* up = gate_up + I;
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.f);
  for (; i + 8 <= I; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate_up + i);
    __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    if (rnd.bf16) silu = round_bf16(silu);
    _mm256_storeu_ps(act + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < I; ++i) act[i] = rnd(gate_up[i] / (1.f + std::exp(-gate_up[i]))) * up[i];
  round_all(act, I, rnd);
}

struct Layer {
  std::vector<float> input_norm, post_norm;
  Projection qkv, o, gate_up, down;
};

class DecodeStack {
 public:
  // layers[i]: input norm, post-attention norm, then qkv, o, gate_up, down as (qs, sc, mn,
  // d, dmin, bias, tiles) each, or as (bf16 weight, 4 empty tensors, bias, an empty tensor)
  // (bias, tiles: an empty tensor where the layer has none).
  DecodeStack(const std::vector<std::vector<at::Tensor>>& layers, int64_t heads, int64_t kv_heads,
              int64_t head_dim, double eps)
      : heads_(heads), kv_heads_(kv_heads), D_(head_dim), eps_(static_cast<float>(eps)) {
    TORCH_CHECK(head_dim % 8 == 0 && head_dim <= 512 && heads % kv_heads == 0, "head shape");
    for (const auto& t : layers) {
      TORCH_CHECK(t.size() == 30, "a layer: 2 norms and 4 projections of 7 tensors");
      auto norm = [](const at::Tensor& w) {
        const at::Tensor f = w.to(at::kFloat).contiguous();
        return std::vector<float>(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
      };
      layers_.push_back({norm(t[0]), norm(t[1]), projection(t, 2), projection(t, 9),
                         projection(t, 16), projection(t, 23)});
    }
  }

  // Returns the hidden state after the last layer and, where `keep` names layers (ascending
  // or not, each once), the input of each of them side by side ([B, T, len(keep) * H], in
  // `keep`'s order; an undefined tensor where `keep` is empty): EAGLE-3 heads read them.
  std::tuple<at::Tensor, at::Tensor> run(const at::Tensor& x_in, const std::vector<at::Tensor>& k_caches,
                 const std::vector<at::Tensor>& v_caches, int64_t first_row,
                 const at::Tensor& slots_in, const at::Tensor& cos_in, const at::Tensor& sin_in,
                 int64_t span, const c10::optional<at::Tensor>& mask_in,
                 const std::vector<int64_t>& keep) const {
    TORCH_CHECK(x_in.dim() == 3, "x: [B, T, H]");
    TORCH_CHECK(k_caches.size() == layers_.size() && v_caches.size() == layers_.size(), "caches");
    const bool bf16 = x_in.scalar_type() == at::kBFloat16;
    TORCH_CHECK(bf16 || x_in.scalar_type() == at::kFloat, "x: bf16 or fp32");
    const Round rnd{bf16};
    const int64_t B = x_in.size(0), T = x_in.size(1), H = x_in.size(2), R = B * T, D = D_;
    const int64_t width = (heads_ + 2 * kv_heads_) * D;
    auto floats = [](const at::Tensor& t) { return t.to(at::kFloat).contiguous(); };
    const at::Tensor x0 = floats(x_in), cos = floats(cos_in), sin = floats(sin_in);
    const at::Tensor slots = slots_in.to(at::kLong).contiguous();
    TORCH_CHECK(cos.numel() == R * D && sin.numel() == R * D && slots.numel() == R, "cos, sin, slots");
    at::Tensor mask;
    if (mask_in.has_value()) {
      mask = mask_in->contiguous();
      TORCH_CHECK(mask.scalar_type() == at::kBool && mask.numel() == R * span, "mask: [B, 1, T, span] bool");
    }
    std::vector<float> h(x0.data_ptr<float>(), x0.data_ptr<float>() + R * H);
    std::vector<float> normed(R * H), qkv(R * width), attended(R * heads_ * D), delta(R * H);
    std::vector<float> gate_up, act;
    const int64_t K = static_cast<int64_t>(keep.size());
    std::vector<float> kept(R * K * H);  // [R, K * H]
    for (const int64_t id : keep) {
      TORCH_CHECK(id >= 0 && id < static_cast<int64_t>(layers_.size()), "keep: a layer id");
    }
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& L = layers_[l];
      for (int64_t j = 0; j < K; ++j) {  // this layer's input, already in the model's rounding
        if (keep[j] != static_cast<int64_t>(l)) continue;
        for (int64_t r = 0; r < R; ++r) std::copy_n(h.data() + r * H, H, kept.data() + (r * K + j) * H);
      }
      const at::Tensor& kc = k_caches[l];
      const at::Tensor& vc = v_caches[l];
      TORCH_CHECK(kc.is_contiguous() && vc.is_contiguous() && kc.scalar_type() == x_in.scalar_type(),
                  "cache: contiguous, the model dtype");
      rms_norm(h.data(), L.input_norm, normed.data(), R, H, eps_, rnd);
      product(L.qkv, normed.data(), R, qkv.data(), rnd);
      for (int64_t r = 0; r < R; ++r) {  // q and k heads are adjacent in the fused output
        rope(qkv.data() + r * width, cos.data_ptr<float>() + r * D, sin.data_ptr<float>() + r * D,
             heads_ + kv_heads_, D, rnd);
      }
      const bool* visible = mask.defined() ? mask.data_ptr<bool>() : nullptr;
      if (bf16) {
        write_kv<c10::BFloat16>(qkv.data(), R, T, heads_, kv_heads_, D, kc, vc, first_row, slots.data_ptr<int64_t>());
        attention<c10::BFloat16>(qkv.data(), B, T, heads_, kv_heads_, D, kc, vc, first_row, span, visible, attended.data(), rnd);
      } else {
        write_kv<float>(qkv.data(), R, T, heads_, kv_heads_, D, kc, vc, first_row, slots.data_ptr<int64_t>());
        attention<float>(qkv.data(), B, T, heads_, kv_heads_, D, kc, vc, first_row, span, visible, attended.data(), rnd);
      }
      product(L.o, attended.data(), R, delta.data(), rnd);
      for (int64_t i = 0; i < R * H; ++i) h[i] += delta[i];
      round_all(h.data(), R * H, rnd);
      rms_norm(h.data(), L.post_norm, normed.data(), R, H, eps_, rnd);
      const int64_t I = L.gate_up.N / 2;
      gate_up.resize(R * 2 * I);
      act.resize(R * I);
      product(L.gate_up, normed.data(), R, gate_up.data(), rnd);
      for (int64_t r = 0; r < R; ++r) silu_times(gate_up.data() + r * 2 * I, act.data() + r * I, I, rnd);
      product(L.down, act.data(), R, delta.data(), rnd);
      for (int64_t i = 0; i < R * H; ++i) h[i] += delta[i];
      round_all(h.data(), R * H, rnd);
    }
    auto model_dtype = [&](std::vector<float>& v, int64_t width) {  // v is freed on return
      const at::Tensor t = at::from_blob(v.data(), {B, T, width}, at::kFloat);
      return bf16 ? t.to(at::kBFloat16) : t.clone();
    };
    return {model_dtype(h, H), K ? model_dtype(kept, K * H) : at::Tensor()};
  }

 private:
  std::vector<Layer> layers_;
  int64_t heads_, kv_heads_, D_;
  float eps_;
};

}  // namespace

void register_decode_stack(py::module_& m) {  // module.cpp
  py::class_<DecodeStack>(m, "DecodeStack")
      .def(py::init<const std::vector<std::vector<at::Tensor>>&, int64_t, int64_t, int64_t, double>(),
           py::arg("layers"), py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("eps"))
      .def("run", &DecodeStack::run,
           "(hidden [B, T, H] after every layer (before the final norm), the inputs of the "
           "layers `keep` [B, T, len(keep) * H] or None)",
           py::arg("x"), py::arg("k_caches"), py::arg("v_caches"), py::arg("first_row"),
           py::arg("slots"), py::arg("cos"), py::arg("sin"), py::arg("span"), py::arg("mask"),
           py::arg("keep") = std::vector<int64_t>{}, py::call_guard<py::gil_scoped_release>());
}
