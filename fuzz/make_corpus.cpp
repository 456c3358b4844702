// Writes a few valid prompt-cache files as the fuzzer's seed corpus.
#include <cstdio>
#include <string>

#include "skvq/cache_file.hpp"
#include "skvq/skvq.hpp"
#include "workload/synthetic.hpp"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  int n = 0;
  for (auto meta : {skvq::MetaType::fp16, skvq::MetaType::fp8_e4m3}) {
    for (std::int64_t len : {3, 21}) {
      skvq::Config cfg;
      cfg.head_dim = 8;
      cfg.window = 8;
      cfg.n_sink = 2;
      cfg.group_size = 4;
      cfg.metadata = meta;
      skvq::ModelDesc m;
      m.layers = {{true, 8}, {false, 8}};
      auto pc = skvq::PromptCache::build(m, skvq::CacheKind::skvq, cfg);
      skvq::workload::SyntheticSpec sp;
      sp.num_kv_heads = 1;
      sp.head_dim = 8;
      sp.kv_len = len;
      sp.outlier_channels = 1;
      skvq::Tensor k, v;
      skvq::workload::make_kv(sp, skvq::DType::f16, &k, &v);
      for (std::size_t l = 0; l < pc.size(); ++l) pc.layer(l).append(k.view(), v.view());
      skvq::CacheFileExtras ex;
      ex.int_arrays["tokens"] = {1, 2, 3};
      skvq::save_prompt_cache(pc, std::string(argv[1]) + "/seed" + std::to_string(n++) + ".safetensors", ex);
    }
  }
  return 0;
}
