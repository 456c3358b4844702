// skvq quantize: run the SKVQ layer cache over keys/values from .npy files
// and write what the last update_and_fetch returned, the permutations and a
// report of every accounting property.
#include <charconv>
#include <cstring>
#include <map>
#include <sstream>

#include "cli_common.hpp"
#include "commands.hpp"
#include "io/npy.hpp"
#include "io/report_json.hpp"
#include "skvq/skvq.hpp"

namespace skvq::tools {

namespace {

struct QuantizeArgs {
  std::string keys, values, out, calls;
  std::vector<std::string> sets;
};

struct Input {
  io::NpyArray arr;
  DType dtype = DType::f32;
  Shape4 shape{};
};

Input load_input(const std::string& flag, const std::string& path) {
  Input in;
  try {
    in.arr = io::read_npy(path);
  } catch (const Error& e) {
    throw UsageError(flag + " " + std::string(e.what()).substr(6));
  }
  if (in.arr.descr == "<f2") in.dtype = DType::f16;
  else if (in.arr.descr == "<f4") in.dtype = DType::f32;
  else throw UsageError(flag + " " + path + ": dtype " + in.arr.descr + " must be float16 or float32");
  if (in.arr.shape.size() != 4) {
    throw UsageError(flag + " " + path + ": must be 4-d [B, H, S, D], got " +
                     std::to_string(in.arr.shape.size()) + "-d");
  }
  for (int i = 0; i < 4; ++i) in.shape[i] = in.arr.shape[static_cast<std::size_t>(i)];
  for (int i = 0; i < 4; ++i) {
    if (in.shape[i] < 1) throw UsageError(flag + " " + path + ": shape " + shape_string(in.shape) + " has an empty axis");
  }
  return in;
}

std::vector<std::int64_t> parse_calls(const std::string& spec, std::int64_t S) {
  if (spec.empty()) return {S};
  if (spec == "each") return std::vector<std::int64_t>(static_cast<std::size_t>(S), 1);
  std::vector<std::int64_t> out;
  std::stringstream ss(spec);
  std::string item;
  std::int64_t sum = 0;
  if (spec.back() == ',') {  // (getline yields no empty last item)
    throw UsageError("--calls " + spec + ": '' (after the last comma) is not a positive token count");
  }
  while (std::getline(ss, item, ',')) {
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (ec == std::errc::result_out_of_range) {
      throw UsageError("--calls " + spec + ": '" + item + "' is more tokens than the inputs' S=" + std::to_string(S));
    }
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 1) {
      throw UsageError("--calls " + spec + ": '" + item + "' is not a positive token count");
    }
    out.push_back(v);
    if (__builtin_add_overflow(sum, v, &sum)) {
      throw UsageError("--calls " + spec + ": counts sum past the inputs' S=" + std::to_string(S) + " tokens");
    }
  }
  if (out.empty() || sum != S) {
    throw UsageError("--calls " + spec + ": counts sum to " + std::to_string(sum) +
                     " but the inputs hold S=" + std::to_string(S) + " tokens");
  }
  return out;
}

std::string tensor_npy(const TensorView& v) {
  const Tensor t = Tensor::copy_of(v);
  const std::string descr = v.dtype == DType::f16 ? "<f2" : "<f4";
  return io::npy_bytes(descr, {v.shape[0], v.shape[1], v.shape[2], v.shape[3]}, t.data(), t.nbytes());
}

std::string perms_npy(const std::vector<std::int32_t>& p, std::int64_t D) {
  const std::int64_t H = static_cast<std::int64_t>(p.size()) / D;
  return io::npy_bytes("<i4", {H, D}, p.data(), p.size() * 4);
}

int run_quantize(const QuantizeArgs& a) {
  Input k = load_input("--keys", a.keys);
  Input v = load_input("--values", a.values);
  if (k.dtype != v.dtype) throw UsageError("--values " + a.values + ": dtype differs from --keys");
  for (int i = 0; i < 3; ++i) {
    if (k.shape[i] != v.shape[i]) {
      throw UsageError("--values " + a.values + ": shape " + shape_string(v.shape) +
                       " does not match --keys " + shape_string(k.shape) + " in [B, H, S]");
    }
  }
  Config cfg;
  cfg.head_dim = static_cast<int>(k.shape[3]);
  apply_sets(cfg, a.sets, "--set");
  const auto calls = parse_calls(a.calls, k.shape[2]);

  SkvqCache cache(cfg);
  const TensorView kv = TensorView::contiguous(k.arr.data.data(), k.dtype, k.shape);
  const TensorView vv = TensorView::contiguous(v.arr.data.data(), v.dtype, v.shape);
  std::pair<TensorView, TensorView> last;
  std::int64_t t = 0;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    try {
      if (cfg.dense_view) last = cache.update_and_fetch(kv.slice_tokens(t, calls[i]), vv.slice_tokens(t, calls[i]));
      else cache.append(kv.slice_tokens(t, calls[i]), vv.slice_tokens(t, calls[i]));
    } catch (const Error& e) {
      throw UsageError("call " + std::to_string(i + 1) + " of " + std::to_string(calls.size()) +
                       " (tokens " + std::to_string(t) + ".." + std::to_string(t + calls[i] - 1) + "): " +
                       std::string(e.what()).substr(6));
    }
    t += calls[i];
  }
  std::map<std::string, std::string> files;
  if (cfg.dense_view) {
    files["keys.npy"] = tensor_npy(last.first);
    files["values.npy"] = tensor_npy(last.second);
  } else {
    Tensor ko(k.dtype, {k.shape[0], k.shape[1], cache.offset(), k.shape[3]});
    Tensor vo(v.dtype, {v.shape[0], v.shape[1], cache.offset(), v.shape[3]});
    cache.fetch_into(ko.view(), vo.view());
    files["keys.npy"] = tensor_npy(ko.view());
    files["values.npy"] = tensor_npy(vo.view());
  }
  if (auto p = cache.key_perms()) files["key_perms.npy"] = perms_npy(*p, k.shape[3]);
  if (auto p = cache.value_perms()) files["value_perms.npy"] = perms_npy(*p, v.shape[3]);
  nlohmann::json report = io::report_json(cache);
  report["calls"] = calls.size();
  files["report.json"] = report.dump(2) + "\n";
  write_all_or_nothing(a.out, files, {"key_perms.npy", "value_perms.npy"});
  const Accounting acc = cache.accounting();
  std::printf("quantized %lld of %lld tokens in %zu call(s); end-to-end ratio %.4f; stored %lld bytes; wrote %s\n",
              static_cast<long long>(acc.quantized_tokens), static_cast<long long>(acc.tokens_seen), calls.size(),
              acc.end_to_end_ratio(), static_cast<long long>(cache.stored_bytes().total()), a.out.c_str());
  return 0;
}

}  // namespace

void register_quantize(CLI::App& app, CommandList& commands) {
  auto args = std::make_shared<QuantizeArgs>();
  CLI::App* sub = app.add_subcommand("quantize", "Run the SKVQ cache over keys/values stored as .npy files");
  sub->add_option("--keys", args->keys, "keys .npy, float16 or float32, C order, [B, H, S, D]")->required();
  sub->add_option("--values", args->values, "values .npy, same dtype, [B, H, S, Dv]")->required();
  sub->add_option("--out", args->out, "output directory (created if missing)")->required();
  sub->add_option("--calls", args->calls,
                  "split S into update_and_fetch calls: comma list of counts summing to S, or 'each'");
  sub->add_option("--set", args->sets, "config FIELD=VALUE (spec field names, plus metadata, dense_view)");
  commands.emplace_back(sub, [args] { return run_quantize(*args); });
}

}  // namespace skvq::tools
