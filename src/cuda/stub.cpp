// The GPU backend's API in builds without CUDA: nothing is available and
// every entry point says so.
#include "skvq/cuda.hpp"
#include "skvq/error.hpp"
#include "cuda/selfcheck.hpp"

namespace skvq::cuda {

namespace {
[[noreturn]] void no_cuda() { throw Error("skvq: this build has no CUDA backend (configure with -DSKVQ_CUDA=ON)"); }
}  // namespace

struct DeviceCacheImpl {};

bool available() { return false; }
std::string device_description() { return "built without CUDA"; }
DeviceCache::DeviceCache(const Config&, std::int64_t, std::int64_t, std::int64_t, std::int64_t) { no_cuda(); }
DeviceCache::DeviceCache(const Config&, std::int64_t, std::int64_t, std::int64_t, std::int64_t, int) { no_cuda(); }
DeviceCache::DeviceCache(const SkvqCache&, std::int64_t) { no_cuda(); }
DeviceCache::DeviceCache(const DeviceCache&, std::int64_t, std::int64_t) { no_cuda(); }
DeviceCache::~DeviceCache() = default;
DeviceCache::DeviceCache(DeviceCache&&) noexcept = default;
DeviceCache& DeviceCache::operator=(DeviceCache&&) noexcept = default;
void DeviceCache::append_device(const void*, const void*, std::int64_t, Stream) { no_cuda(); }
void DeviceCache::append_device(const void*, const void*, std::int64_t, DType, Stream) { no_cuda(); }
void DeviceCache::append(const TensorView&, const TensorView&) { no_cuda(); }
void DeviceCache::attend_device(const float*, std::int64_t, std::int64_t, float, float*, int, Stream) const { no_cuda(); }
void DeviceCache::attend_device(const void*, DType, std::int64_t, std::int64_t, float, void*, DType, int, Stream) const {
  no_cuda();
}
Tensor DeviceCache::attend(const TensorView&, float) const { no_cuda(); }
const Config& DeviceCache::config() const { no_cuda(); }
std::int64_t DeviceCache::batch() const { no_cuda(); }
std::int64_t DeviceCache::num_kv_heads() const { no_cuda(); }
std::int64_t DeviceCache::capacity() const { no_cuda(); }
std::int64_t DeviceCache::offset() const { no_cuda(); }
std::int64_t DeviceCache::q_end() const { no_cuda(); }
std::int64_t DeviceCache::bytes_allocated() const { no_cuda(); }
std::int64_t DeviceCache::bytes_held() const { no_cuda(); }
std::int64_t DeviceCache::bytes_read_per_step() const { no_cuda(); }
int DeviceCache::device() const { no_cuda(); }
SkvqCache DeviceCache::to_host() const { no_cuda(); }
void attend_dense_fp16(const float*, const void*, const void*, float*, std::int64_t, std::int64_t, std::int64_t,
                       std::int64_t, std::int64_t, std::int64_t, std::int64_t, float, int, Stream) {
  no_cuda();
}
void release_workspace(Stream) { no_cuda(); }
void* device_alloc(std::size_t) { no_cuda(); }
void device_free(void*) {}
void copy_to_device(void*, const void*, std::size_t) { no_cuda(); }
void copy_to_host(void*, const void*, std::size_t) { no_cuda(); }
void synchronize() { no_cuda(); }
void flush_quotients(const float*, const float*, float*, std::int64_t) { no_cuda(); }

}  // namespace skvq::cuda
