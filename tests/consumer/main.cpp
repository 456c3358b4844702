// A program outside the project that finds the installed package: find_package(skvq).
#include <skvq/skvq.hpp>
#include <cstdio>
int main() {
  skvq::Config cfg; cfg.head_dim = 8; cfg.window = 4; cfg.n_sink = 1; cfg.group_size = 4;
  skvq::SkvqCache c(cfg);
  skvq::Tensor k(skvq::DType::f32, {1, 1, 9, 8}), v(skvq::DType::f32, {1, 1, 9, 8});
  for (int i = 0; i < 72; ++i) { k.view().set(0, 0, i / 8, i % 8, 0.1f * i); v.view().set(0, 0, i / 8, i % 8, -0.05f * i); }
  c.update_and_fetch(k.view(), v.view());
  std::printf("quantized %lld, ratio %.3f\n", (long long)c.accounting().quantized_tokens, c.accounting().end_to_end_ratio());
}
