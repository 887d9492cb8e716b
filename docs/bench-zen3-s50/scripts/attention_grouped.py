# ruff: noqa: E501  (C++ source in a string)
"""Scratch (not landed): decode_stack.cpp's attention as landed against a grouped one, whose unit
is a row of the batch, a key/value head and up to 64 queries (the group's heads times a chunk
of tokens) that share each block of 8 keys and of 8 values widened to fp32 once. Checked
bitwise against the landed one (320 cases: shapes, spans, masks, bf16 and fp32 caches), then
timed over a model's layers at 2 threads.

    python docs/bench-zen3-s50/scripts/attention_grouped.py

Why: a 5-token verify pass of the 1.5B spends ~5 ms of its ~190 in attention at a 250-token
context (perf, `target_step.log`), and the landed loop widens each bf16 key once per query
head (6 heads share a key/value head) and per token.
"""

import statistics
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load_inline

ROOT = Path(__file__).resolve().parents[3] / "specdec/models/native"
GROUPED = r"""
// acc[0, 8 V) += sum over the n keys j of a block with weight p[j] != 0, in order, of
// p[j] v_j[0, 8 V) (v_j = v + j D, fp32): weigh_values over one block, its sums carried in acc.
template <int V>
inline void weigh_block(const float* p, const float* v, int64_t n, int64_t D, float* acc) {
  __m256 a[V];
  for (int c = 0; c < V; ++c) a[c] = _mm256_loadu_ps(acc + 8 * c);
  for (int64_t j = 0; j < n; ++j) {
    if (p[j] == 0.f) continue;
    const __m256 pv = _mm256_set1_ps(p[j]);
    for (int c = 0; c < V; ++c) a[c] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + j * D + 8 * c), a[c]);
  }
  for (int c = 0; c < V; ++c) _mm256_storeu_ps(acc + 8 * c, a[c]);
}
// The grouped attention (candidate): a unit is one row of the batch, one key/value head and a
// chunk of its tokens; every query head of the group and token of the chunk share each block
// of 8 keys (and of 8 values) widened to fp32 once.
template <typename C>
void attention_grouped(const float* qkv, int64_t B, int64_t T, int64_t heads, int64_t kv_heads, int64_t D,
                       const at::Tensor& k_cache, const at::Tensor& v_cache, int64_t first_row,
                       int64_t span, const bool* mask, float* out, const Round& rnd) {
  const int64_t width = (heads + 2 * kv_heads) * D, group = heads / kv_heads, L1 = k_cache.size(2);
  const int64_t blocks = (span + 7) / 8 * 8;
  const C* kc = k_cache.data_ptr<C>();
  const C* vc = v_cache.data_ptr<C>();
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const float hidden = -std::numeric_limits<float>::infinity();
  const int64_t chunk = std::min<int64_t>(T, std::max<int64_t>(1, 64 / group));  // tokens a unit
  const int64_t chunks = (T + chunk - 1) / chunk;
  at::parallel_for(0, B * kv_heads * chunks, 1, [&](int64_t begin, int64_t end) {
    const int64_t most = chunk * group;
    std::vector<float> scores(most * blocks), acc(most * D), wide(8 * D), tops(most);
    std::vector<char> sees(most * 8), any_of(most), used_block(blocks / 8);
    float dots[8];
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t b = unit / (kv_heads * chunks), g = unit / chunks % kv_heads, c0 = unit % chunks;
      const int64_t t0 = c0 * chunk, t1 = std::min(T, t0 + chunk), Q = (t1 - t0) * group;
      const int64_t base = ((first_row + b) * kv_heads + g) * L1 * D;
      // query qi: token t0 + qi / group of row b, head g group + qi % group
      auto query = [&](int64_t qi) { return qkv + (b * T + t0 + qi / group) * width + (g * group + qi % group) * D; };
      auto visible = [&](int64_t qi) { return mask ? mask + (b * T + t0 + qi / group) * span : nullptr; };
      std::fill(tops.begin(), tops.begin() + Q, hidden);
      for (int64_t j = 0; j < blocks; j += 8) {
        bool block_any = false;
        for (int64_t qi = 0; qi < Q; ++qi) {
          const bool* vis = visible(qi);
          uint64_t word = 0;
          if (j + 8 <= span) {
            if (vis) std::memcpy(&word, vis + j, 8);  // bools are bytes 0 or 1
            else word = 0x0101010101010101ull;
          } else {
            for (int c = 0; c < 8; ++c)
              if (j + c < span && (!vis || vis[j + c])) word |= 1ull << (8 * c);
          }
          std::memcpy(sees.data() + qi * 8, &word, 8);
          any_of[qi] = word != 0;
          block_any = block_any || word != 0;
        }
        const bool full = j + 8 <= span;
        used_block[j / 8] = block_any;
        const float* keys = nullptr;
        if (block_any && full) {
          if constexpr (std::is_same_v<C, float>) {
            keys = kc + base + j * D;
          } else {
            for (int64_t i = 0; i < 8 * D; i += 8) _mm256_storeu_ps(wide.data() + i, load8(kc + base + j * D + i));
            keys = wide.data();
          }
        }
        for (int64_t qi = 0; qi < Q; ++qi) {
          const char* shown = sees.data() + qi * 8;
          float* sc = scores.data() + qi * blocks;
          if (!any_of[qi]) {
            std::fill(sc + j, sc + j + 8, hidden);
            continue;
          }
          const float* q = query(qi);
          if (full) {
            dot8(q, keys, D, dots);
          } else {
            for (int c = 0; c < 8; ++c) dots[c] = shown[c] ? dot(q, kc + base + (j + c) * D, D) : 0.f;
          }
          for (int c = 0; c < 8; ++c) {
            sc[j + c] = shown[c] ? dots[c] * scale : hidden;
            tops[qi] = std::max(tops[qi], sc[j + c]);
          }
        }
      }
      std::vector<float> totals(Q);
      for (int64_t qi = 0; qi < Q; ++qi) {
        float* sc = scores.data() + qi * blocks;
        __m256 sum = _mm256_setzero_ps();
        for (int64_t j = 0; j < blocks; j += 8) {
          const __m256 s = _mm256_loadu_ps(sc + j);
          const __m256 shown = _mm256_cmp_ps(s, _mm256_set1_ps(hidden), _CMP_NEQ_OQ);
          const __m256 p = _mm256_and_ps(exp8(_mm256_sub_ps(s, _mm256_set1_ps(tops[qi]))), shown);
          _mm256_storeu_ps(sc + j, p);
          sum = _mm256_add_ps(sum, p);
        }
        totals[qi] = simd::hsum(sum);
      }
      std::fill(acc.begin(), acc.begin() + Q * D, 0.f);
      for (int64_t j = 0; j < span; j += 8) {
        const int64_t n = std::min<int64_t>(8, span - j);
        if (!used_block[j / 8]) continue;
        const float* values;
        if constexpr (std::is_same_v<C, float>) {
          values = vc + base + j * D;
        } else {
          for (int64_t i = 0; i < n * D; i += 8) _mm256_storeu_ps(wide.data() + i, load8(vc + base + j * D + i));
          values = wide.data();
        }
        for (int64_t qi = 0; qi < Q; ++qi) {
          const float* p = scores.data() + qi * blocks + j;
          float* a = acc.data() + qi * D;
          int64_t i = 0;
          for (; i + 64 <= D; i += 64) weigh_block<8>(p, values + i, n, D, a + i);
          for (; i + 32 <= D; i += 32) weigh_block<4>(p, values + i, n, D, a + i);
          for (; i < D; i += 8) weigh_block<1>(p, values + i, n, D, a + i);
        }
      }
      for (int64_t qi = 0; qi < Q; ++qi) {
        float* o = out + (b * T + t0 + qi / group) * heads * D + (g * group + qi % group) * D;
        const float* a = acc.data() + qi * D;
        for (int64_t d = 0; d < D; ++d) o[d] = a[d] / totals[qi];
        round_all(o, D, rnd);
      }
    }
  });
}
"""
src_text = (ROOT / "decode_stack.cpp").read_text()
body = src_text[src_text.index("namespace {") : src_text.index("// act = silu(gate)")]
SOURCE = f"""
#include "{ROOT}/bf16_kernel.h"
#include "{ROOT}/q4_kernel.h"
#include <cmath>
#include <limits>
#include <type_traits>
#include <cstring>
{body}
{GROUPED}
}}  // namespace
torch::Tensor run(torch::Tensor qkv, int64_t B, int64_t T, int64_t heads, int64_t kv_heads, int64_t D,
                  torch::Tensor kc, torch::Tensor vc, int64_t first_row, int64_t span, c10::optional<torch::Tensor> mask, int64_t which) {{
  auto out = torch::empty({{B * T, heads * D}}, torch::kFloat);
  const Round rnd{{kc.scalar_type() == at::kBFloat16}};
  const bool* m = mask.has_value() ? mask->data_ptr<bool>() : nullptr;
  if (kc.scalar_type() == at::kBFloat16) {{
    if (which == 0) attention<c10::BFloat16>(qkv.data_ptr<float>(), B, T, heads, kv_heads, D, kc, vc, first_row, span, m, out.data_ptr<float>(), rnd);
    else attention_grouped<c10::BFloat16>(qkv.data_ptr<float>(), B, T, heads, kv_heads, D, kc, vc, first_row, span, m, out.data_ptr<float>(), rnd);
  }} else {{
    if (which == 0) attention<float>(qkv.data_ptr<float>(), B, T, heads, kv_heads, D, kc, vc, first_row, span, m, out.data_ptr<float>(), rnd);
    else attention_grouped<float>(qkv.data_ptr<float>(), B, T, heads, kv_heads, D, kc, vc, first_row, span, m, out.data_ptr<float>(), rnd);
  }}
  return out;
}}
"""
ext = load_inline(
    "attn_s50",
    [SOURCE],
    functions=["run"],
    extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp", "-std=c++17"],
    extra_ldflags=["-fopenmp"],
)
torch.manual_seed(0)


def case(heads, kv, D, B, T, span, dtype, masked, max_batch=None):
    max_batch = max_batch or B + 1
    L1 = span + 9
    kc = (torch.randn(max_batch, kv, L1, D) * 2).to(dtype)
    vc = torch.randn(max_batch, kv, L1, D).to(dtype)
    qkv = torch.randn(B * T, (heads + 2 * kv) * D)
    if dtype == torch.bfloat16:
        qkv = qkv.bfloat16().float()
    mask = None
    if masked:
        mask = torch.rand(B, 1, T, span) < 0.8
        mask[..., 0] = True
        mask[..., 8:24] = False
    return qkv, kc, vc, mask


checks = 0
for heads, kv, D in ((12, 2, 128), (14, 2, 64), (9, 3, 64), (4, 4, 32)):
    for B, T in ((1, 1), (1, 5), (3, 2), (2, 17)):
        for span in (1, 7, 8, 45, 64):
            for dtype in (torch.bfloat16, torch.float32):
                for masked in (False, True):
                    qkv, kc, vc, mask = case(heads, kv, D, B, T, span, dtype, masked)
                    a = ext.run(qkv, B, T, heads, kv, D, kc, vc, 1, span, mask, 0)
                    b = ext.run(qkv, B, T, heads, kv, D, kc, vc, 1, span, mask, 1)
                    assert torch.equal(a, b), (
                        heads,
                        kv,
                        D,
                        B,
                        T,
                        span,
                        dtype,
                        masked,
                        (a - b).abs().max(),
                    )
                    checks += 1
print("bitwise equal in", checks, "cases", flush=True)
torch.set_num_threads(2)
for name, heads, kv, D, layers in (("1.5B", 12, 2, 128, 28), ("0.5B", 14, 2, 64, 24)):
    for B, T in ((1, 1), (1, 5), (1, 8), (4, 5)):
        for span in (128, 512, 1024):
            qkv, kc, vc, _ = case(heads, kv, D, B, T, span, torch.bfloat16, False)
            res = {0: [], 1: []}
            for _rep in range(5):
                for which in (0, 1):
                    t0 = time.perf_counter()
                    for _ in range(layers):
                        ext.run(qkv, B, T, heads, kv, D, kc, vc, 0, span, None, which)
                    res[which].append(time.perf_counter() - t0)
            a, b = (1000 * statistics.median(res[w]) for w in (0, 1))
            print(
                f"{name} B={B} T={T} span={span}: {layers} layers landed {a:.2f} ms, grouped {b:.2f} ms ({a / b:.2f}x)",
                flush=True,
            )
