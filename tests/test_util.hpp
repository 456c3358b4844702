// Shared helpers for the tests: deterministic inputs, the spec's standard
// cases, and comparisons.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <initializer_list>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/input_check.hpp"
#include "core/skvq_state.hpp"
#include "ref/meta.hpp"
#include "skvq/skvq.hpp"
#include "workload/synthetic.hpp"

namespace skvq::test {

// The shared models and text (../shared/data beside the checkout): the directory named by the
// environment variable SKVQ_SHARED_DATA when set and not empty (a GPU machine's run, where the
// data travels beside the binaries: scripts/gpu.sh), else the one the build saw.
inline std::filesystem::path shared_data() {
  const char* e = std::getenv("SKVQ_SHARED_DATA");
  return e && *e ? std::filesystem::path(e) : std::filesystem::path(SKVQ_SHARED_DATA);
}

// A file's bytes ("" where it cannot be opened).
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

#ifdef SKVQ_CLI_PATH
// The skvq program run with `args` through the shell, stdout discarded: its exit status (-1 when it
// did not exit) and its stderr, caught in `err_file` (left behind).
struct CliRun {
  int status = -1;
  std::string err;
};
inline CliRun run_cli(const std::string& args, const std::filesystem::path& err_file) {
  const int rc = std::system((std::string(SKVQ_CLI_PATH) + " " + args + " >/dev/null 2>" + err_file.string()).c_str());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_file(err_file)};
}
#endif

using workload::Normal;

// f throws skvq::Error whose message holds every needle.
template <typename F>
void expect_error(F&& f, std::initializer_list<const char*> needles) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming " << *needles.begin();
  } catch (const Error& e) {
    for (const char* n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "'" << n << "' not in: " << e.what();
  }
}

// Standard normal values, rounded to `dtype`; optionally channel c multiplied
// by a fixed per-channel scale from logspace(-2, 1, D), shuffled.
inline Tensor randn(Shape4 shape, std::uint32_t seed, DType dtype = DType::f16, bool heterogeneous = false) {
  Tensor t(dtype, shape);
  Normal rng(seed);
  std::vector<float> ch(static_cast<std::size_t>(shape[3]), 1.0f);
  if (heterogeneous) {
    const std::int64_t D = shape[3];
    for (std::int64_t c = 0; c < D; ++c) {
      const double e = D == 1 ? -2.0 : -2.0 + 3.0 * static_cast<double>(c) / static_cast<double>(D - 1);
      ch[static_cast<std::size_t>(c)] = static_cast<float>(std::pow(10.0, e));
    }
    std::mt19937 sh(seed ^ 0x5eedu);
    std::shuffle(ch.begin(), ch.end(), sh);
  }
  const auto v = t.view();
  for (std::int64_t b = 0; b < shape[0]; ++b)
    for (std::int64_t h = 0; h < shape[1]; ++h)
      for (std::int64_t s = 0; s < shape[2]; ++s)
        for (std::int64_t d = 0; d < shape[3]; ++d) v.set(b, h, s, d, rng() * ch[static_cast<std::size_t>(d)]);
  return t;
}

// The spec's test default: D = head_dim = 64, window 16, n_sink 4, group 16, 2/2 bits.
inline Config spec_config() {
  Config c;
  c.head_dim = 64;
  c.window = 16;
  c.n_sink = 4;
  c.group_size = 16;
  c.bits_key = 2;
  c.bits_value = 2;
  return c;
}

inline bool row_bits_equal(const TensorView& a, const TensorView& b, std::int64_t bb, std::int64_t h,
                           std::int64_t ta, std::int64_t tb) {
  if (a.dtype != b.dtype || a.shape[3] != b.shape[3]) return false;
  for (std::int64_t d = 0; d < a.shape[3]; ++d) {
    if (std::memcmp(a.ptr(bb, h, ta, d), b.ptr(bb, h, tb, d), dtype_size(a.dtype)) != 0) return false;
  }
  return true;
}

// Bitwise equality of two views over tokens [t0, t1) (default: all).
inline bool bits_equal(const TensorView& a, const TensorView& b, std::int64_t t0 = 0, std::int64_t t1 = -1) {
  if (a.shape[0] != b.shape[0] || a.shape[1] != b.shape[1] || a.shape[3] != b.shape[3]) return false;
  if (t1 < 0) {
    if (a.shape[2] != b.shape[2]) return false;
    t1 = a.shape[2];
  }
  for (std::int64_t bb = 0; bb < a.shape[0]; ++bb)
    for (std::int64_t h = 0; h < a.shape[1]; ++h)
      for (std::int64_t t = t0; t < t1; ++t)
        if (!row_bits_equal(a, b, bb, h, t, t)) return false;
  return true;
}

inline double mse(const TensorView& a, const TensorView& b) {
  double s = 0.0;
  std::int64_t n = 0;
  for (std::int64_t bb = 0; bb < a.shape[0]; ++bb)
    for (std::int64_t h = 0; h < a.shape[1]; ++h)
      for (std::int64_t t = 0; t < a.shape[2]; ++t)
        for (std::int64_t d = 0; d < a.shape[3]; ++d) {
          const double e = static_cast<double>(a.at(bb, h, t, d)) - b.at(bb, h, t, d);
          s += e * e;
          ++n;
        }
  return n ? s / static_cast<double>(n) : 0.0;
}

// max over visible rows of scale * sum_d |q_d k_d| and max |v|, per query row.
struct RowScale {
  double s_abs = 0, vmax = 0;
};

// The fused attention kernels (CPU SIMD, CUDA) read packed rows as x = lot + sct * f with
// sct = scale * 2^bits, lot = lo - sct, f in [1, 2), and (AVX3_DL, AVX2, CUDA) form the
// codes' part of q . x from q rounded to 16 bits (|q - q~| <= max|q| / 65024).
// Per query row, over the packed rows of its KV head (docs/numerics.md):
//   ak = softmax scale * max_t sum_d |q_d| (|lo| + 3 * 2^b * |scale|)  (magnitude of the fused score terms)
//   qk = softmax scale * max|q| / 65024 * max_t sum_d (2^b - 1) |scale|  (score error of the 16-bit q)
//   av = max over rows and groups of |lo| + 3 * 2^b * |scale|          (magnitude of the fused value terms)
//   vq = 128 (2^b - 1) max|scale| / 64000 of the values  (CPU AVX3_DL and AVX2: value weights rounded to 16 bits per
//        128-row block; bound on the output, relative to nothing: the weights sum to 1)
struct PackedBound {
  double ak = 0, qk = 0, av = 0, vq = 0;
};

// RowScale and PackedBound of the query rows [B, Hq, Sq, D] of one attention call over keys k and
// values v [B, Hkv, T, D] (row i sees tokens [0, T - Sq + i]) and the packed rows of `cache`. What
// does not depend on the query row (the keys and the metadata as doubles, the values' running
// maximum, the value side's bound) is computed once a KV head, for the rows of a (b, KV head) asked
// one after the other: the GPU tests bound thousands of rows over thousands of tokens.
class RowBounds {
 public:
  RowBounds(const SkvqCache& cache, const TensorView& q, const TensorView& k, const TensorView& v, float scale, std::int64_t G)
      : cache_(cache), q_(q), k_(k), v_(v), scale_(scale), G_(G) {}

  RowScale row_scale(std::int64_t b, std::int64_t hq, std::int64_t i) {
    load(b, hq / G_);
    RowScale r;
    const std::int64_t T = k_.shape[2], Sq = q_.shape[2], D = q_.shape[3], last = T - Sq + i;
    std::vector<double> qd(static_cast<std::size_t>(D));
    for (std::int64_t d = 0; d < D; ++d) qd[static_cast<std::size_t>(d)] = static_cast<double>(q_.at(b, hq, i, d));
    for (std::int64_t t = 0; t <= last; ++t) {
      const double* kt = kd_.data() + t * k_.shape[3];
      double s = 0;
      for (std::int64_t d = 0; d < D; ++d) s += std::fabs(qd[static_cast<std::size_t>(d)] * kt[d]);
      r.s_abs = std::max(r.s_abs, s * scale_);
    }
    if (last >= 0) r.vmax = vmax_[static_cast<std::size_t>(last)];
    return r;
  }

  PackedBound packed_bound(std::int64_t b, std::int64_t hq, std::int64_t i) {
    load(b, hq / G_);
    PackedBound pb;
    const detail::SkvqState& st = cache_.state();
    if (!st.initialized) return pb;
    const std::int64_t h = hq / G_, D = st.k.head_dim;
    std::vector<double> qa(static_cast<std::size_t>(D));
    double qmax = 0;
    for (std::int64_t j = 0; j < D; ++j) {
      const std::int64_t src = st.k.perm.empty() ? j : st.k.perm[static_cast<std::size_t>(h * D + j)];
      qa[static_cast<std::size_t>(j)] = std::fabs(static_cast<double>(q_.at(b, hq, i, src))) * scale_;
      qmax = std::max(qmax, qa[static_cast<std::size_t>(j)]);
    }
    for (std::size_t r = 0; r < key_qk_.size(); ++r) {
      const double* w = key_w_.data() + r * static_cast<std::size_t>(D);
      double ak = 0;
      for (std::int64_t j = 0; j < D; ++j) ak += qa[static_cast<std::size_t>(j)] * w[j];
      pb.ak = std::max(pb.ak, ak);
      // + the CUDA token-major kernel's lo term by an fp16 MMA: q's group sums in two fp16 parts
      // after a power-of-two scale, 2^-25 2^e <= 2^-25 max|q| GS absolute a group (fp16
      // subnormals; docs/numerics.md), taken twice
      pb.qk = std::max(pb.qk, qmax / 65024.0 * key_qk_[r] + 0x1p-24 * qmax * key_los_[r]);
    }
    pb.av = av_;
    pb.vq = vq_;
    return pb;
  }

 private:
  void load(std::int64_t b, std::int64_t h) {
    if (b == b_ && h == h_) return;
    b_ = b, h_ = h;
    const std::int64_t T = k_.shape[2], D = k_.shape[3];
    kd_.assign(static_cast<std::size_t>(T * D), 0.0);
    vmax_.assign(static_cast<std::size_t>(T), 0.0);
    double vm = 0;
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t d = 0; d < D; ++d) kd_[static_cast<std::size_t>(t * D + d)] = k_.at(b, h, t, d);
      for (std::int64_t d = 0; d < v_.shape[3]; ++d) vm = std::max(vm, std::fabs(static_cast<double>(v_.at(b, h, t, d))));
      vmax_[static_cast<std::size_t>(t)] = vm;
    }
    key_w_.clear(), key_qk_.clear(), key_los_.clear();
    av_ = vq_ = 0;
    const detail::SkvqState& st = cache_.state();
    if (!st.initialized) return;
    const std::int64_t bh = b * st.heads + h;
    const int mb = meta_bytes(st.cfg.metadata), g = st.cfg.group_size;
    for (int side = 0; side < 2; ++side) {
      const detail::Side& s = side == 0 ? st.k : st.v;
      const std::int64_t Gs = st.groups(s), two_b = std::int64_t{1} << s.bits;
      for (const detail::PackedChunk& ch : s.chunks) {
        const std::int64_t mph = st.meta_per_head(s, ch.n_rows);
        for (std::int64_t r = 0; r < ch.n_rows; ++r) {
          double qk = 0, los = 0;
          for (std::int64_t j = 0; j < s.head_dim; ++j) {
            const std::int64_t at = bh * mph + (r * Gs + j / g) * mb;
            const double lo = std::fabs(ref::meta_load(ch.lo.data() + at, st.cfg.metadata));
            const double sc = std::fabs(ref::meta_load(ch.scale.data() + at, st.cfg.metadata));
            if (side == 0) {
              key_w_.push_back(lo + 3.0 * two_b * sc);
              qk += (two_b - 1) * sc;
              los += lo;
            } else {
              av_ = std::max(av_, lo + 3.0 * two_b * sc);
              vq_ = std::max(vq_, 128.0 * static_cast<double>(two_b - 1) * sc / 64000.0);
            }
          }
          if (side == 0) key_qk_.push_back(qk), key_los_.push_back(los);
        }
      }
    }
  }

  const SkvqCache& cache_;
  TensorView q_, k_, v_;
  float scale_;
  std::int64_t G_, b_ = -1, h_ = -1;
  std::vector<double> kd_, vmax_;                // the KV head's keys, the values' running max |v|
  std::vector<double> key_w_, key_qk_, key_los_;  // per packed key row (and channel, w)
  double av_ = 0, vq_ = 0;
};

}  // namespace skvq::test
