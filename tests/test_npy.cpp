// .npy files and the `skvq quantize` command line, run as a user would.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/npy.hpp"
#include "test_util.hpp"

namespace skvq::test {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/skvq_test_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void write_tensor(const fs::path& p, const Tensor& t) {
  write_file(p, io::npy_bytes(t.dtype() == DType::f16 ? "<f2" : "<f4",
                              {t.shape()[0], t.shape()[1], t.shape()[2], t.shape()[3]}, t.data(), t.nbytes()));
}

TEST(Npy, RoundTripAndErrors) {
  TempDir d;
  const std::vector<float> data{1, 2, 3, 4, 5, 6};
  write_file(d.path / "a.npy", io::npy_bytes("<f4", {2, 3}, data.data(), 24));
  const auto a = io::read_npy((d.path / "a.npy").string());
  EXPECT_EQ(a.descr, "<f4");
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(a.data.data(), data.data(), 24), 0);
  const std::string good = read_file(d.path / "a.npy");
  write_file(d.path / "trunc.npy", good.substr(0, good.size() - 3));
  EXPECT_THROW(io::read_npy((d.path / "trunc.npy").string()), Error);
  write_file(d.path / "magic.npy", "hello world, not numpy");
  EXPECT_THROW(io::read_npy((d.path / "magic.npy").string()), Error);
  write_file(d.path / "hdr.npy", good.substr(0, 20));
  EXPECT_THROW(io::read_npy((d.path / "hdr.npy").string()), Error);
  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  write_file(d.path / "f.npy", fortran);
  EXPECT_THROW(io::read_npy((d.path / "f.npy").string()), Error);
  EXPECT_THROW(io::read_npy((d.path / "missing.npy").string()), Error);
  // a directory opens as a stream on Linux and fails only when read: refused by name
  try {
    io::read_npy(d.path.string());
    ADD_FAILURE() << "a directory read as .npy";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(d.path.string() + ": is a directory"), std::string::npos) << e.what();
  }
  write_file(d.path / "long.npy", good + "xx");
  EXPECT_THROW(io::read_npy((d.path / "long.npy").string()), Error);
}

// Headers the fuzzer was written for: a shape whose element count overflows
// (it wrapped to 0 bytes and was accepted with no data), one past int64, and
// a shape that is not a tuple (it threw std::out_of_range, not skvq::Error).
TEST(Npy, HostileShapesAreClearErrors) {
  const float one = 1.0f;
  auto with_shape = [&](const std::string& shape) {
    std::string b = io::npy_bytes("<f4", {1}, &one, 4);
    const std::size_t at = b.find("(1,)");
    b.replace(at, 4, shape);
    // keep the header length field true to the header
    const std::size_t hlen = b.size() - 4 - 10;
    b[8] = static_cast<char>(hlen & 0xff);
    b[9] = static_cast<char>(hlen >> 8);
    return b;
  };
  EXPECT_EQ(io::parse_npy(with_shape("(1,)"), "ok.npy").shape, (std::vector<std::int64_t>{1}));
  EXPECT_EQ(io::parse_npy(with_shape("(1, 1)"), "ok.npy").numel(), 1);
  expect_error([&] { io::parse_npy(with_shape("(4294967296, 4294967296)"), "a.npy"); }, {"a.npy", "is too large"});
  expect_error([&] { io::parse_npy(with_shape("(4611686018427387904, 4)"), "a.npy"); }, {"is too large"});
  expect_error([&] { io::parse_npy(with_shape("(99999999999999999999,)"), "b.npy"); }, {"b.npy", "is malformed"});
  expect_error([&] { io::parse_npy(with_shape("7"), "c.npy"); }, {"c.npy", "shape 7 is not a tuple"});
  std::string empty_shape = with_shape("(1,)");
  empty_shape.replace(empty_shape.find("'shape': (1,)"), 13, "'shape':}    ");
  expect_error([&] { io::parse_npy(empty_shape, "e.npy"); }, {"e.npy", "is not a tuple"});
  // a header length past the file's end
  std::string long_hdr = with_shape("(1,)");
  long_hdr[9] = '\x7f';
  expect_error([&] { io::parse_npy(long_hdr, "h.npy"); }, {"h.npy", "truncated npy header"});
}

TEST(Cli, QuantizeWorkedExampleAndSplits) {
  TempDir d;
  Tensor k = randn({1, 2, 35, 64}, 21), v = randn({1, 2, 35, 64}, 22);
  write_tensor(d.path / "k.npy", k);
  write_tensor(d.path / "v.npy", v);
  const std::string common = "quantize --keys " + (d.path / "k.npy").string() + " --values " + (d.path / "v.npy").string() +
                             " --set window=16 --set n_sink=4 --set group_size=16";
  CliRun r = run_cli(common + " --out " + (d.path / "one").string(), d.path / "stderr.txt");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto rep = nlohmann::json::parse(read_file(d.path / "one" / "report.json"));
  EXPECT_EQ(rep["compressed_key_bytes"], 1792);
  EXPECT_EQ(rep["fp16_key_bytes"], 8960);
  EXPECT_EQ(rep["residual_fp16_bytes"], 3584);
  EXPECT_EQ(rep["perm_bytes"], 1024);
  EXPECT_EQ(rep["assigned_avg_bits"], 4.0);
  EXPECT_EQ(rep["quantized_tokens"], 32);
  EXPECT_EQ(rep["tokens_seen"], 35);
  EXPECT_EQ(rep["config"]["head_dim"], 64);
  EXPECT_EQ(rep["config"]["metadata"], "fp16");
  EXPECT_TRUE(rep["stored_bytes"].is_number_integer());
  EXPECT_EQ(rep["key_perms"].size(), 2u);
  const auto perms = io::read_npy((d.path / "one" / "key_perms.npy").string());
  EXPECT_EQ(perms.descr, "<i4");
  EXPECT_EQ(perms.shape, (std::vector<std::int64_t>{2, 64}));
  // The library gives the same bytes.
  SkvqCache c(spec_config());
  auto [ko, vo] = c.update_and_fetch(k.view(), v.view());
  const auto kout = io::read_npy((d.path / "one" / "keys.npy").string());
  EXPECT_EQ(std::memcmp(kout.data.data(), Tensor::copy_of(ko).data(), kout.data.size()), 0);
  for (const std::string calls : {"each", "16,1,1,17", "3,32"}) {
    const fs::path out = d.path / ("split" + std::to_string(calls.size()));
    r = run_cli(common + " --calls " + calls + " --out " + out.string(), d.path / "stderr.txt");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(read_file(out / "keys.npy"), read_file(d.path / "one" / "keys.npy")) << calls;
    EXPECT_EQ(read_file(out / "values.npy"), read_file(d.path / "one" / "values.npy")) << calls;
  }
  // packed-only mode writes the same history
  r = run_cli(common + " --set dense_view=false --out " + (d.path / "packed").string(), d.path / "stderr.txt");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_file(d.path / "packed" / "keys.npy"), read_file(d.path / "one" / "keys.npy"));
}

TEST(Cli, BadArgumentsExit2WithOneLineAndNoOutput) {
  TempDir d;
  Tensor k = randn({1, 2, 35, 64}, 23), v = randn({1, 2, 35, 64}, 24);
  write_tensor(d.path / "k.npy", k);
  write_tensor(d.path / "v.npy", v);
  Tensor v3 = randn({1, 2, 34, 64}, 25);
  write_tensor(d.path / "v3.npy", v3);
  write_file(d.path / "junk.npy", "junk");
  const std::uint16_t none = 0;
  write_file(d.path / "s0.npy", io::npy_bytes("<f2", {1, 2, 0, 64}, &none, 0));
  const std::string kv = " --keys " + (d.path / "k.npy").string() + " --values " + (d.path / "v.npy").string();
  const fs::path out = d.path / "out";
  const std::string o = " --out " + out.string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"quantize" + kv + o + " --set bits_key=0", "bits_key=0"},
      {"quantize" + kv + o + " --set bogus=1", "bogus"},
      {"quantize" + kv + o + " --set window", "--set window"},
      {"quantize" + kv + o + " --set metadata=fp4", "metadata=fp4"},
      {"quantize" + kv + o + " --set clip_alpha=1e-50", "clip_alpha=1e-50"},
      {"quantize" + kv + o + " --set bits_key=99999999999999999999", "bits_key=99999999999999999999 is out of int range"},
      {"quantize" + kv + o + " --set head_dim=32", "head_dim=32"},
      {"quantize" + kv + o + " --calls 10,10", "--calls 10,10"},
      {"quantize" + kv + o + " --calls 10,x,25", "'x'"},
      {"quantize" + kv + o + " --calls 10,25,", "--calls 10,25,: '' (after the last comma) is not a positive token count"},
      {"quantize" + kv + o + " --calls 10,,25", "--calls 10,,25: '' is not a positive token count"},
      {"quantize" + kv + o + " --set max_ctx=20", "max_ctx=20"},
      {"quantize" + kv + o + " --calls 9223372036854775807,9223372036854775807", "counts sum past the inputs' S=35"},
      {"quantize" + kv + o + " --calls 99999999999999999999", "'99999999999999999999' is more tokens than the inputs' S=35"},
      {"quantize" + kv + o + " --calls +35", "'+35' is not a positive token count"},
      {"quantize" + kv + o + " --calls 10,' 25'", "' 25' is not a positive token count"},
      {"quantize --keys " + (d.path / "s0.npy").string() + " --values " + (d.path / "v.npy").string() + o,
       "shape [1, 2, 0, 64] has an empty axis"},
      {"quantize --keys " + (d.path / "junk.npy").string() + " --values " + (d.path / "v.npy").string() + o, "--keys"},
      {"quantize --keys " + (d.path / "k.npy").string() + " --values " + (d.path / "v3.npy").string() + o, "--values"},
      {"quantize --keys " + (d.path / "nope.npy").string() + " --values " + (d.path / "v.npy").string() + o, "nope.npy"},
      {"quantize --keys " + d.path.string() + " --values " + (d.path / "v.npy").string() + o, d.path.string() + ": is a directory"},
      {"inspect " + d.path.string(), d.path.string() + ": is a directory"},
      {"demo --kv-len 99999999999999999999", "99999999999999999999 is out of the 64-bit integer range"},
      {"demo --kv-len 100000000 --heads 64", "2^30 values"},
      {"demo --seed -5", "--seed: -5 must be a whole number in [0, 4294967295]"},
      {"demo --seed 4294967296", "--seed: 4294967296 must be a whole number in [0, 4294967295]"},
      {"generate --model m.bin --prompt hi --seed -1", "--seed: -1 must be a whole number in [0, 18446744073709551615]"},
      {"generate --model m.bin --prompt hi --seed 18446744073709551616", "18446744073709551616 must be a whole number"},
      {"generate --model m.bin --prompt hi --seed 0x10", "0x10 must be a whole number"},
      {"quantize" + kv, "--out"},
      {"frobnicate", "frobnicate"},
  };
  for (const auto& [args, needle] : cases) {
    const CliRun r = run_cli(args, d.path / "stderr.txt");
    EXPECT_EQ(r.status, 2) << args;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << " -> " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(out)) << args;
  }
}

}  // namespace
}  // namespace skvq::test
