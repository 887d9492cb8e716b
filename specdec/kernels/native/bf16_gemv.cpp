// y = x @ W.T for the few rows of a decode or verify step, W in bf16, on CPUs whose vector
// units have no bf16 arithmetic, or with AVX-512 BF16's pair products (the product itself is
// in bf16_kernel.h). The pure-PyTorch equivalent, which the tests compare against, is
// F.linear(x.float(), W.float()); the AVX-512 BF16 build's panels round x to bf16 first
// (F.linear(x.bfloat16().float(), W.float()): no change for a bf16 model's activations).

#include "bf16_kernel.h"

// x [R, K] fp32, w [N, K] bf16 contiguous, K % 8 == 0 -> y [R, N] fp32. `panels`: W in the
// panel layout ([ceil(N / PANEL), K / KSTEP, PANEL * KSTEP] bf16 for one of the build's
// LAYOUTS, bf16_kernel.h), or None: the row layout.
at::Tensor bf16_gemv(at::Tensor x, at::Tensor w, c10::optional<at::Tensor> panels_or_none) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "shapes");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kBFloat16, "dtypes");
  TORCH_CHECK(w.size(1) % 8 == 0 && x.size(0) >= 1, "K % 8, at least one row");
  x = x.contiguous();
  const int64_t R = x.size(0), K = x.size(1), N = w.size(0);
  auto y = at::empty({R, N}, x.options());
  if (panels_or_none.has_value()) {
    const at::Tensor& panels = *panels_or_none;
    const int kstep = bf16::check_panels(panels, N, K);
    bf16::run_panels(x.data_ptr<float>(), R, reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>()),
                     y.data_ptr<float>(), K, N, kstep);
    return y;
  }
  w = w.contiguous();
  bf16::run(x.data_ptr<float>(), R, reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()),
            y.data_ptr<float>(), K, N);
  return y;
}

void register_bf16_gemv(pybind11::module_& m) {  // module.cpp
  m.def("bf16_gemv", &bf16_gemv, "y = x @ W.T, W bf16 widened in registers (AVX2 + FMA)",
        pybind11::arg("x"), pybind11::arg("w"), pybind11::arg("panels") = pybind11::none(),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  // The panel layouts the build reads, as (outputs a panel, k of an output in a line), its
  // default first: [(8, 1)] in AVX2 builds, [(32, 1)] in AVX-512, [(16, 2), (32, 1)] in BF16.
  m.attr("LAYOUTS") = bf16::layouts();
}
