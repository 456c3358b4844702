// Saving and loading prompt caches: bit-identical continuation, atomic
// writes, and clear errors for damaged or foreign files.
#include <gtest/gtest.h>

#include <cstring>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "skvq/cache_file.hpp"
#include "test_util.hpp"

namespace skvq::test {
namespace {

namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("skvq_cf_" + std::to_string(::getpid()) + "_" + name)).string();
}

PromptCache make_cache(MetaType meta, bool dense) {
  ModelDesc m;
  m.layers = {{true, 64}, {false, 64}, {true, 32}, {true, 64}};
  Config cfg = spec_config();
  cfg.metadata = meta;
  cfg.dense_view = dense;
  cfg.group_size = 12;
  cfg.bits_value = 3;
  return PromptCache::build(m, CacheKind::skvq, cfg);
}

// Feed tokens [t0, t1) of a fixed stream to every layer except the last (left empty).
void feed(PromptCache& pc, std::int64_t t0, std::int64_t t1, std::vector<Tensor>* outs = nullptr) {
  for (std::size_t l = 0; l + 1 < pc.size(); ++l) {
    const std::int64_t D = l == 2 ? 32 : 64;
    Tensor k = randn({1, 2, 100, D}, 40 + static_cast<std::uint32_t>(l), DType::f16, true);
    Tensor v = randn({1, 2, 100, D}, 50 + static_cast<std::uint32_t>(l), DType::f16, true);
    LayerCache& c = pc.layer(l);
    c.append(k.view().slice_tokens(t0, t1 - t0), v.view().slice_tokens(t0, t1 - t0));
    if (outs) {
      Tensor ko(DType::f16, {1, 2, c.offset(), D}), vo(DType::f16, {1, 2, c.offset(), D});
      c.fetch_into(ko.view(), vo.view());
      outs->push_back(std::move(ko));
      outs->push_back(std::move(vo));
      Tensor q = randn({1, 4, 1, D}, 60, DType::f32);
      outs->push_back(attend(c, q.view(), 0.125f));
    }
  }
}

TEST(CacheFile, LoadedCacheContinuesBitIdentically) {
  for (MetaType meta : {MetaType::fp16, MetaType::fp32, MetaType::fp8_e4m3}) {
    for (bool dense : {true, false}) {
      for (std::int64_t cut : {1, 16, 37, 64}) {
        PromptCache a = make_cache(meta, dense);
        feed(a, 0, cut);
        const std::string path = temp_path("cont.safetensors");
        CacheFileExtras ex;
        ex.strings["model"] = "test";
        ex.int_arrays["tokens"] = {1, 2, 3};
        save_prompt_cache(a, path, ex);
        CacheFileExtras ex2;
        PromptCache b = load_prompt_cache(path, &ex2);
        fs::remove(path);
        EXPECT_EQ(ex2.strings, ex.strings);
        EXPECT_EQ(ex2.int_arrays, ex.int_arrays);
        ASSERT_EQ(b.size(), a.size());
        for (std::size_t l = 0; l < a.size(); ++l) {
          EXPECT_EQ(a.layer(l).kind(), b.layer(l).kind());
          if (auto* s = dynamic_cast<SkvqCache*>(&a.layer(l))) {
            EXPECT_TRUE(s->same_state(dynamic_cast<SkvqCache&>(b.layer(l)))) << "layer " << l << " cut " << cut;
          }
        }
        std::vector<Tensor> oa, ob;
        feed(a, cut, 100, &oa);
        feed(b, cut, 100, &ob);
        ASSERT_EQ(oa.size(), ob.size());
        for (std::size_t i = 0; i < oa.size(); ++i) {
          ASSERT_EQ(oa[i].nbytes(), ob[i].nbytes());
          EXPECT_EQ(std::memcmp(oa[i].data(), ob[i].data(), oa[i].nbytes()), 0) << "output " << i << " cut " << cut;
        }
        const Accounting x = a.accounting(), y = b.accounting();
        EXPECT_EQ(x.compressed_key_bytes, y.compressed_key_bytes);
        EXPECT_EQ(x.fp16_value_bytes, y.fp16_value_bytes);
        EXPECT_EQ(x.tokens_seen, y.tokens_seen);
        EXPECT_EQ(x.residual_fp16_bytes, y.residual_fp16_bytes);
        EXPECT_EQ(a.stored_bytes().total(), b.stored_bytes().total());
      }
    }
  }
}

TEST(CacheFile, DamagedOrForeignFilesAreClearErrors) {
  PromptCache a = make_cache(MetaType::fp16, true);
  feed(a, 0, 40);
  const std::vector<std::uint8_t> good = prompt_cache_bytes(a);
  EXPECT_NO_THROW(load_prompt_cache_bytes(good));
  // every truncation
  for (std::size_t n = 0; n < good.size(); n += std::max<std::size_t>(1, good.size() / 97)) {
    EXPECT_THROW(load_prompt_cache_bytes(std::span(good.data(), n)), Error) << n;
  }
  // a flipped byte anywhere after the length prefix
  for (std::size_t pos = 8; pos < good.size(); pos += std::max<std::size_t>(1, good.size() / 61)) {
    std::vector<std::uint8_t> bad = good;
    bad[pos] ^= 0x5a;
    EXPECT_THROW(load_prompt_cache_bytes(bad), Error) << pos;
  }
  // a foreign safetensors file
  const std::string foreign_hdr = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  std::vector<std::uint8_t> foreign(8 + foreign_hdr.size() + 4, 0);
  foreign[0] = static_cast<std::uint8_t>(foreign_hdr.size());
  std::memcpy(foreign.data() + 8, foreign_hdr.data(), foreign_hdr.size());
  try {
    load_prompt_cache_bytes(foreign);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not an skvq prompt-cache file"), std::string::npos) << e.what();
  }
  // a newer version
  std::string s(good.begin(), good.end());
  const auto p = s.find("\"format_version\":\"1\"");
  ASSERT_NE(p, std::string::npos);
  s.replace(p, 20, "\"format_version\":\"9\"");
  try {
    load_prompt_cache_bytes(std::span(reinterpret_cast<const std::uint8_t*>(s.data()), s.size()));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("newer"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_prompt_cache(temp_path("does_not_exist")), Error);
}

// Rewrites the safetensors header of `bytes` through `edit` (the checksums
// cover the data and the skvq metadata, not the tensor table).
std::vector<std::uint8_t> with_header(const std::vector<std::uint8_t>& bytes,
                                      const std::function<void(nlohmann::json&)>& edit) {
  std::uint64_t hl = 0;
  for (int i = 0; i < 8; ++i) hl |= static_cast<std::uint64_t>(bytes[static_cast<std::size_t>(i)]) << (8 * i);
  nlohmann::json h = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(hl));
  edit(h);
  const std::string hs = h.dump();
  const std::size_t rest = bytes.size() - 8 - static_cast<std::size_t>(hl);
  std::vector<std::uint8_t> out(8 + hs.size() + rest);
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(hs.size() >> (8 * i));
  std::memcpy(out.data() + 8, hs.data(), hs.size());
  std::memcpy(out.data() + 8 + hs.size(), bytes.data() + 8 + hl, rest);
  return out;
}

TEST(CacheFile, NonIntegerOrHugeNumbersAreErrors) {
  PromptCache a = make_cache(MetaType::fp16, true);
  feed(a, 0, 40);
  const auto good = prompt_cache_bytes(a);
  EXPECT_NO_THROW(load_prompt_cache_bytes(with_header(good, [](nlohmann::json&) {})));
  // found by the fuzzer: a float where an integer belongs (1e44 does not fit any integer type)
  for (const nlohmann::json& bad : {nlohmann::json(1e44), nlohmann::json(3.5), nlohmann::json(-1), nlohmann::json("7"),
                                    nlohmann::json(18446744073709551615ULL)}) {
    const auto b1 = with_header(good, [&](nlohmann::json& h) { h["l0.keys.codes"]["data_offsets"][1] = bad; });
    EXPECT_THROW(load_prompt_cache_bytes(b1), Error) << bad.dump();
    const auto b2 = with_header(good, [&](nlohmann::json& h) { h["l0.keys.codes"]["shape"][0] = bad; });
    EXPECT_THROW(load_prompt_cache_bytes(b2), Error) << bad.dump();
  }
}

TEST(CacheFile, KilledSaveLeavesPreviousFileIntact) {
  const std::string path = temp_path("atomic.safetensors");
  PromptCache small = make_cache(MetaType::fp16, false);
  feed(small, 0, 20);
  save_prompt_cache(small, path);
  const auto before = prompt_cache_bytes(small);
  // A big cache whose save takes a while; kill the saving process mid-way.
  ModelDesc m = ModelDesc::uniform(8, 128);
  Config cfg;
  cfg.dense_view = false;
  PromptCache big = PromptCache::build(m, CacheKind::plain, cfg);
  Tensor k = randn({1, 8, 2048, 128}, 70), v = randn({1, 8, 2048, 128}, 71);
  for (std::size_t l = 0; l < big.size(); ++l) big.layer(l).append(k.view(), v.view());
  const auto after = prompt_cache_bytes(big);
  for (int delay_us : {200, 2000, 20000}) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (;;) save_prompt_cache(big, path);
    }
    usleep(static_cast<useconds_t>(delay_us));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    std::ifstream f(path, std::ios::binary);
    const std::vector<std::uint8_t> now((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(now == before || now == after) << "a partial file was left after " << delay_us << " us";
    EXPECT_NO_THROW(load_prompt_cache(path));
  }
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path())) {
    if (e.path().filename().string().find(".tmp.") != std::string::npos &&
        e.path().filename().string().find(fs::path(path).filename().string()) != std::string::npos) {
      fs::remove(e.path());  // the killed writer's temporary (never the target)
    }
  }
  fs::remove(path);
}

}  // namespace
}  // namespace skvq::test
