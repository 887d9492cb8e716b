// y = x @ W.T for the few rows of a decode or verify step, W in 4 bits with a scale and a
// minimum per 32 weights (GGUF Q4_K's layout), on CPUs with AVX2. PyTorch's int4 kernel
// widens every weight to floating point and multiplies in fp32, which on AVX2 costs more
// instructions per byte than memory delivers bytes: it runs below the bandwidth even for
// one row and slows with every extra row. Here, as in llama.cpp, the activations are
// quantized too (to int8, one scale per 256 inputs) and the products are integer dot
// products (`vpmaddubsw`: 32 multiply-adds of 4-bit weights by 8-bit activations per
// instruction), so one weight read serves several rows at little extra cost.
//
// Format, per output row n (S = ceil(K / 256) super-blocks, G = 8 S groups of 32):
//   qs   [N, K/2]  u8   bytes i of each 64-weight chunk: low nibble = weight i, high
//                       nibble = weight 32 + i (Q4_K's qs, byte for byte)
//   sc   [N, G]    u8   group scales, mn [N, G] u8 group minimums (0 past K)
//   d    [N, S]    f32  super-block scale of sc, dmin [N, S] f32 of mn
//   w[n, k] = d[n, s] * sc[n, g] * q[n, k] - dmin[n, s] * mn[n, g], g = k / 32, s = k / 256
// Activations, per row r and super-block s: dx = max|x| / 127, xq = round(x * 127 / max|x|).
//
// The row layout sums each output's exact integer products in 8 lanes and folds them into 8
// float partial sums per super-block (added up at the end). Any build may also take the
// weights in the tile layout (`q4_tiles`, q4_kernel.h), which takes fewer instructions per
// extra row (AVX-512: a third; AVX2: 9 multiplies where rows take 16); there each output sums,
// per super-block s, two exact integers (I: sum over groups of sc times the group's products
// q . xq; M: sum of mn times the group's sum of xq) into
//   y += I * (d dx) - M * (dmin dx)   (two fused multiply-adds, in order of s).
// The row layout computes the same floats in the AVX2 and the AVX-512 builds (tested); the
// tile layout takes the same operations per output in both (not yet compared on a machine).
// The two layouts differ in the last bits, so a layer keeps one layout for every row count.
//
// Batch-invariant: each row's result is computed by the same operations in the same order
// whatever the number of rows, so a one-token decode step and a verify pass agree bitwise.
// The pure-PyTorch equivalent, which the tests compare against, is q4.q4_reference.

#include "q4_kernel.h"

// x [R, K] fp32 or bf16 (K % 64 == 0), the format above, an optional fp32 bias [N] ->
// y [R, N] in x's dtype: (product + bias) rounded once, as `(y + bias).to(x.dtype)` would.
at::Tensor q4_gemv(at::Tensor x, at::Tensor qs, at::Tensor sc, at::Tensor mn,
                      at::Tensor d, at::Tensor dmin, c10::optional<at::Tensor> bias,
                      c10::optional<at::Tensor> tiles) {
  TORCH_CHECK(x.dim() == 2, "x: [R, K]");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "x: fp32 or bf16");
  const int64_t R = x.size(0), K = x.size(1), N = qs.size(0), S = (K + q4::SB - 1) / q4::SB;
  TORCH_CHECK(K % 64 == 0 && qs.size(1) == K / 2 && qs.scalar_type() == at::kByte, "qs: [N, K/2] u8, K % 64 == 0");
  TORCH_CHECK(sc.sizes() == mn.sizes() && sc.size(0) == N && sc.size(1) == S * q4::GROUPS, "sc, mn: [N, 8 S] u8");
  TORCH_CHECK(sc.scalar_type() == at::kByte && mn.scalar_type() == at::kByte, "sc, mn: u8");
  TORCH_CHECK(d.sizes() == dmin.sizes() && d.size(0) == N && d.size(1) == S, "d, dmin: [N, S] f32");
  TORCH_CHECK(d.scalar_type() == at::kFloat && dmin.scalar_type() == at::kFloat, "d, dmin: f32");
  at::Tensor b;
  if (bias.has_value()) {
    b = bias->contiguous();
    TORCH_CHECK(b.dim() == 1 && b.size(0) == N && b.scalar_type() == at::kFloat, "bias: [N] f32");
  }
  x = x.contiguous();
  qs = qs.contiguous(); sc = sc.contiguous(); mn = mn.contiguous();
  d = d.contiguous(); dmin = dmin.contiguous();
  auto y = at::empty({R, N}, x.options().dtype(at::kFloat));
  const q4::Activations a = x.scalar_type() == at::kFloat
                            ? q4::quantize_rows(x.data_ptr<float>(), R, K, S)
                            : q4::quantize_rows(x.data_ptr<at::BFloat16>(), R, K, S);
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  if (tiles.has_value() && tiles->numel()) {
    TORCH_CHECK(tiles->is_contiguous() && tiles->numel() == N / q4::TILE * S * q4::TILE_BLOCK,
                "tiles: q4_tiles(qs, sc, mn, d, dmin) of these weights");
    q4::run_tiles(a, R, tiles->data_ptr<uint8_t>(), bp, y.data_ptr<float>(), K, N, S);
  } else {
    q4::run(a, R, qs.data_ptr<uint8_t>(), sc.data_ptr<uint8_t>(), mn.data_ptr<uint8_t>(),
            d.data_ptr<float>(), dmin.data_ptr<float>(), bp, y.data_ptr<float>(), K, N, S);
  }
  if (x.scalar_type() == at::kFloat) return y;
  auto out = at::empty({R, N}, x.options());
  const float* yp = y.data_ptr<float>();
  at::BFloat16* op = out.data_ptr<at::BFloat16>();
  for (int64_t i = 0; i < R * N; ++i) op[i] = at::BFloat16(yp[i]);  // round to nearest even
  return out;
}

// The weights in the tile layout (q4_kernel.h): u8 [N / 16, S, TILE_BLOCK], N % 16 == 0.
at::Tensor q4_tiles(at::Tensor qs, at::Tensor sc, at::Tensor mn, at::Tensor d,
                       at::Tensor dmin) {
  const int64_t N = qs.size(0), K = qs.size(1) * 2, S = (K + q4::SB - 1) / q4::SB;
  TORCH_CHECK(N % q4::TILE == 0 && K % 64 == 0, "tiles: N % 16 == 0 and K % 64 == 0");
  TORCH_CHECK(sc.size(1) == S * q4::GROUPS && d.size(1) == S, "tiles: q4_gemv's format");
  qs = qs.contiguous(); sc = sc.contiguous(); mn = mn.contiguous();
  d = d.contiguous(); dmin = dmin.contiguous();
  auto out = at::empty({N / q4::TILE, S, q4::TILE_BLOCK}, qs.options());
  q4::to_tiles(qs.data_ptr<uint8_t>(), sc.data_ptr<uint8_t>(), mn.data_ptr<uint8_t>(),
               d.data_ptr<float>(), dmin.data_ptr<float>(), out.data_ptr<uint8_t>(), N, K, S);
  return out;
}

void register_q4_gemv(py::module_& m) {  // module.cpp
  m.def("q4_gemv", &q4_gemv, "y = x @ W.T + b, W in Q4_K-style 4 bits, x quantized to int8 (AVX2)",
        py::arg("x"), py::arg("qs"), py::arg("sc"), py::arg("mn"), py::arg("d"), py::arg("dmin"),
        py::arg("bias") = py::none(), py::arg("tiles") = py::none(),
        py::call_guard<py::gil_scoped_release>());
  m.def("q4_tiles", &q4_tiles, "the weights in the tile layout (q4_kernel.h)");
  m.attr("TILES") = q4::TILES;
  m.def("block_rows", &q4::block_rows, "rows of one row block of an R-row product at width K",
        py::arg("R"), py::arg("K"));
  m.def("set_tile_prefetch", [](int level) { q4::tile_prefetch() = level; },
        "how the tile layout prefetches: 0 into L1, 1 into L2 (q4_kernel.h)");
}
