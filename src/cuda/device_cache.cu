// DeviceCache: the host side of the GPU layer cache (allocation, the append
// state machine, flush launches, attention launches, moves between host and device).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/input_check.hpp"
#include "core/skvq_state.hpp"
#include "core/thread_pool.hpp"
#include "cpu/convert_simd.hpp"
#include "cuda/common.cuh"
#include "cuda/kernels.cuh"
#include "ref/meta.hpp"
#include "skvq/cuda.hpp"

namespace skvq::cuda {

// The kernels use cp.async and int8 mma.sync: compute capability 8.0 or newer
// (the build carries sm_90 code and compute_80 PTX).
constexpr int kMinMajor = 8;

// Both look at the calling thread's current device: the one a new cache would live on.
bool available() {
  int n = 0, dev = 0, major = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0 && cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= kMinMajor;
}

std::string device_description() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(e);
  if (n == 0) return "no CUDA device";
  const int dev = current_device();
  cudaDeviceProp prop{};
  SKVQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  std::string d = std::string(prop.name) + " (device " + std::to_string(dev) + " of " + std::to_string(n) + "), " +
                  std::to_string(prop.multiProcessorCount) + " SMs, " + std::to_string(prop.totalGlobalMem >> 20) + " MiB";
  if (prop.major < kMinMajor) {
    d += " (compute capability " + std::to_string(prop.major) + "." + std::to_string(prop.minor) +
         "; the skvq kernels need " + std::to_string(kMinMajor) + ".0 or newer)";
  }
  return d;
}

namespace {

// The current device: `device` for the guard's lifetime (set only where another is current), then the
// one that was current before.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    const int current = current_device();
    if (current != device) {
      SKVQ_CUDA_CHECK(cudaSetDevice(device));
      prev_ = current;
    }
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

}  // namespace

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  SKVQ_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)));
  return p;
}
void device_free(void* p) {
  if (p) cudaFree(p);
}
// cudaMemcpy from pageable host memory may return before the DMA from its staging buffer has
// landed: work on the legacy default stream is ordered after it, work on a non-blocking stream is
// not (the runtime's documented behaviour). Waiting for the legacy stream makes the bytes visible to
// every stream on return.
void copy_to_device(void* dst, const void* src, std::size_t bytes) {
  SKVQ_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  SKVQ_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}
void copy_to_host(void* dst, const void* src, std::size_t bytes) {
  SKVQ_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
void synchronize() { SKVQ_CUDA_CHECK(cudaDeviceSynchronize()); }

struct DeviceCacheImpl {
  int device = 0;  // where it lives (every member call runs there: DeviceGuard)
  Config cfg;
  std::int64_t B = 0, H = 0, Dv = 0, capacity = 0, slots = 0;
  std::int64_t offset = 0, q_end = 0, tokens_seen = 0, fp16_k = 0, fp16_v = 0;
  DevSide k, v;
  std::vector<float> grid;  // the clip factors
  std::vector<void*> allocations;
  std::int64_t allocated = 0;

  void* alloc(std::size_t n) {
    void* p = device_alloc(n);
    allocations.push_back(p);
    allocated += static_cast<std::int64_t>(n);
    return p;
  }
  // alloc, zero-filled: every buffer of the cache (slot 0's unused sink rows are read, and masked,
  // by the tiled kernel; to_host downloads whole tail and sink buffers, rows not yet written
  // included, and a download should never read memory nothing wrote: compute-sanitizer initcheck)
  void* alloc_zeroed(std::size_t n) {
    void* p = alloc(n);
    SKVQ_CUDA_CHECK(cudaMemset(p, 0, n));
    return p;
  }
  ~DeviceCacheImpl() {
    try {
      const DeviceGuard guard(device);
      for (void* p : allocations) cudaFree(p);
    } catch (...) {  // (a device error: nothing more can be freed)
    }
  }
  void init_side(DevSide& s, int D, int bits) {
    const int mb = meta_bytes(cfg.metadata);
    s.D = D;
    s.bits = bits;
    s.G = (D + cfg.group_size - 1) / cfg.group_size;
    s.row_bytes = static_cast<std::int64_t>(D) * bits / 8;
    s.slot_codes = B * H * cfg.window * s.row_bytes;
    s.slot_meta = B * H * cfg.window * s.G * mb;
    s.codes = static_cast<unsigned char*>(alloc_zeroed(static_cast<std::size_t>(slots * s.slot_codes)));
    s.lo = static_cast<unsigned char*>(alloc_zeroed(static_cast<std::size_t>(slots * s.slot_meta)));
    s.scale = static_cast<unsigned char*>(alloc_zeroed(static_cast<std::size_t>(slots * s.slot_meta)));
    s.tail = static_cast<__half*>(alloc_zeroed(static_cast<std::size_t>(B * H * cfg.window * D) * 2));
    s.sinks = static_cast<__half*>(alloc_zeroed(static_cast<std::size_t>(B * H * std::max(cfg.n_sink, 1) * D) * 2));
    s.perm = cfg.reorder ? static_cast<int*>(alloc(static_cast<std::size_t>(H * D) * 4)) : nullptr;
  }
  FlushParams flush_params(const void* src, DType src_type, std::int64_t src_tokens, std::int64_t first, int n_chunks) const {
    FlushParams f;
    f.src = static_cast<const __half*>(src);
    f.src_type = static_cast<signed char>(src_type);
    f.src_tokens = src_tokens;
    f.first = first;
    f.n_chunks = n_chunks;
    f.slot0 = q_end / cfg.window;
    f.B = static_cast<int>(B);
    f.H = static_cast<int>(H);
    f.window = cfg.window;
    f.n_sink = cfg.n_sink;
    f.group = cfg.group_size;
    f.meta = static_cast<int>(cfg.metadata);
    f.meta_bytes = meta_bytes(cfg.metadata);
    f.n_grid = static_cast<int>(grid.size());  // run_flush rejects a grid it has no kernel for
    std::copy_n(grid.begin(), std::min<std::size_t>(grid.size(), FlushParams::kMaxGrid), f.grid);
    return f;
  }
  // Flushes n_chunks windows of both sides; their rows are token `first` on in ks/vs, of type
  // src_type (bf16 and fp32 rounded to fp16 as the kernels read them).
  void flush(const void* ks, const void* vs, DType src_type, std::int64_t src_tokens, std::int64_t first, int n_chunks,
             cudaStream_t stream) {
    for (int side = 0; side < 2; ++side) {
      DevSide& s = side == 0 ? k : v;
      const FlushParams f = flush_params(side == 0 ? ks : vs, src_type, src_tokens, first, n_chunks);
      if (q_end == 0) {
        if (s.perm) run_perm(f, s, stream);
        if (cfg.n_sink > 0 && src_type == DType::f16) {
          SKVQ_CUDA_CHECK(cudaMemcpy2DAsync(s.sinks, static_cast<std::size_t>(cfg.n_sink) * s.D * 2,
                                            f.src + first * s.D,
                                            static_cast<std::size_t>(src_tokens) * s.D * 2,
                                            static_cast<std::size_t>(cfg.n_sink) * s.D * 2, static_cast<std::size_t>(B * H),
                                            cudaMemcpyDeviceToDevice, stream));
        } else if (cfg.n_sink > 0) {
          run_rows_to_half(f.src, src_type, B * H, src_tokens, first, cfg.n_sink, s.sinks, cfg.n_sink, 0, s.D, stream);
        }
      }
      run_flush(f, s, stream);
    }
    q_end += static_cast<std::int64_t>(n_chunks) * cfg.window;
  }
  // S more tokens against the capacity.
  void check_capacity(std::int64_t S) const {
    if (offset + S > capacity) {
      throw Error("skvq: context " + std::to_string(offset + S) + " exceeds the device cache capacity=" +
                  std::to_string(capacity));
    }
  }
  // An attention call's query heads and rows against the cache.
  void check_attend(std::int64_t num_q_heads, std::int64_t sq) const {
    if (offset == 0) throw Error("skvq: cuda attend on an empty cache");
    if (num_q_heads < H || num_q_heads % H != 0) {
      throw Error("skvq: cuda attend: Hq=" + std::to_string(num_q_heads) + " must be a multiple of H=" + std::to_string(H));
    }
    if (sq < 1 || sq > offset) throw Error("skvq: cuda attend: Sq=" + std::to_string(sq) + " must be in [1, offset]");
  }
  void to_tail(const __half* src, std::int64_t src_tokens, std::int64_t first, std::int64_t n, DevSide& s,
               cudaStream_t stream) {
    const std::int64_t live = offset - q_end;
    SKVQ_CUDA_CHECK(cudaMemcpy2DAsync(s.tail + live * s.D, static_cast<std::size_t>(cfg.window) * s.D * 2, src + first * s.D,
                                 static_cast<std::size_t>(src_tokens) * s.D * 2, static_cast<std::size_t>(n) * s.D * 2,
                                 static_cast<std::size_t>(B * H), cudaMemcpyDeviceToDevice, stream));
  }
};

DeviceCache::DeviceCache(const Config& config, std::int64_t batch, std::int64_t num_kv_heads, std::int64_t v_head_dim,
                         std::int64_t capacity)
    : DeviceCache(config, batch, num_kv_heads, v_head_dim, capacity, -1) {}

DeviceCache::DeviceCache(const Config& config, std::int64_t batch, std::int64_t num_kv_heads, std::int64_t v_head_dim,
                         std::int64_t capacity, int device) {
  config.validate();
  auto bad = [](const std::string& what) { throw Error("skvq: cuda::DeviceCache: " + what); };
  // The current device, checked by available() (its description names a compute capability below
  // kMinMajor); a fork names its source's, which passed that check when the source was made.
  if (device < 0) {
    if (!available()) bad(device_description());
    device = current_device();
  }
  const DeviceGuard guard(device);
  const std::string dims = " is not supported on the GPU (a multiple of 16 in [16, " + std::to_string(kGeneralMaxHeadDim) + "])";
  if (!head_dim_supported(config.head_dim)) bad("head_dim=" + std::to_string(config.head_dim) + dims);
  if (!head_dim_supported(v_head_dim)) bad("v_head_dim=" + std::to_string(v_head_dim) + dims);
  if (config.group_size % 16 != 0 && config.group_size < std::max<std::int64_t>(config.head_dim, v_head_dim)) {
    bad("group_size=" + std::to_string(config.group_size) + " must be a multiple of 16 (or >= the head dims) on the GPU");
  }
  if (batch < 1 || num_kv_heads < 1) bad("batch and num_kv_heads must be >= 1");
  if (capacity < 1) bad("capacity=" + std::to_string(capacity) + " must be >= 1");
  if (config.max_ctx && capacity > *config.max_ctx) capacity = *config.max_ctx;
  impl_ = std::make_unique<DeviceCacheImpl>();
  DeviceCacheImpl& d = *impl_;
  d.device = device;
  d.cfg = config;
  d.cfg.dense_view = false;
  d.B = batch;
  d.H = num_kv_heads;
  d.Dv = v_head_dim;
  d.capacity = capacity;
  d.slots = (capacity + config.window - 1) / config.window;
  d.init_side(d.k, config.head_dim, config.bits_key);
  d.init_side(d.v, static_cast<int>(v_head_dim), config.bits_value);
  // The zero fills (cudaMemset on the legacy default stream) may still be running when this returns;
  // a flush on a non-blocking stream is not ordered after them and could be overwritten (session 34:
  // Cuda.StreamsGiveTheDefaultStreamsResults, with fourteen test processes on the GPU). Wait for them.
  SKVQ_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  d.grid = config.clip_grid();
}

namespace {

// The largest magnitude the device cache takes as an exact or input value, and why (check_values'
// message): the metadata's limit, at most fp16's range, since the device holds fp16 rows.
float device_value_limit(MetaType m, std::string* why) {
  const float limit = detail::value_limit(m, why);
  if (limit <= ref::kMaxF16) return limit;
  *why = "the range of fp16 (the device cache holds fp16 keys and values)";
  return ref::kMaxF16;
}

// Pinned host buffers through which packed chunks move between host and device: two, so that the
// host fills (or empties) one while the other's copy runs. Allocated on the first move and kept for
// the process (pinning takes about 0.6 ms a MiB on the H200 machine, the time a pageable copy of
// 6 MiB takes: docs/performance.md), taken by one move at a time; a slot larger than a buffer makes
// them grow.
struct StagingPool {
  static constexpr std::size_t kBytes = std::size_t{16} << 20;
  std::mutex mu;
  unsigned char* buf[2] = {nullptr, nullptr};
  std::size_t bytes = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t done[2] = {nullptr, nullptr};  // the last copy through each buffer
};

// The current device's pool (its stream and events belong to that device). (Never destroyed: the
// CUDA runtime may be torn down before static destructors run.)
StagingPool& staging_pool() {
  struct Pools {
    std::mutex mu;
    std::map<int, StagingPool*> by_device;
  };
  static Pools* pools = new Pools;
  const int dev = current_device();
  const std::lock_guard<std::mutex> lock(pools->mu);
  StagingPool*& p = pools->by_device[dev];
  if (!p) p = new StagingPool;
  return *p;
}

// The pool, locked, with buffers of at least `bytes`.
std::unique_lock<std::mutex> take_staging(std::size_t bytes) {
  StagingPool& s = staging_pool();
  std::unique_lock<std::mutex> lock(s.mu);
  for (cudaEvent_t& e : s.done) {  // (the stream last: it marks the pool set up)
    if (!e) SKVQ_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  if (!s.stream) SKVQ_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  if (s.bytes < bytes) {
    for (unsigned char*& b : s.buf) {
      if (b) SKVQ_CUDA_CHECK(cudaFreeHost(b));
      b = nullptr;
    }
    s.bytes = 0;
    const std::size_t want = std::max(bytes, StagingPool::kBytes);
    for (unsigned char*& b : s.buf) SKVQ_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&b), want));
    s.bytes = want;
  }
  return lock;
}

// A batch of a side's window slots in a staging buffer: codes, then minima, then scales.
struct SlotBatch {
  std::int64_t first = 0, n = 0;
  unsigned char *codes = nullptr, *lo = nullptr, *scale = nullptr;
};

// The side's slots [0, n_slots) in batches of as many slots as a staging buffer holds (one copy of
// each array a batch: a copy a slot took 10-20 us, most of a small cache's download).
struct SlotBatches {
  const DevSide& ds;
  std::int64_t n_slots, per;
  SlotBatches(const DevSide& side, std::int64_t n) : ds(side), n_slots(n) {
    per = std::max<std::int64_t>(1, static_cast<std::int64_t>(staging_pool().bytes) / slot_bytes(ds));
  }
  static std::int64_t slot_bytes(const DevSide& ds) { return ds.slot_codes + 2 * ds.slot_meta; }
  std::int64_t count() const { return (n_slots + per - 1) / per; }
  SlotBatch at(std::int64_t j) const {
    SlotBatch b;
    b.first = j * per;
    b.n = std::min(per, n_slots - b.first);
    b.codes = staging_pool().buf[j % 2];
    b.lo = b.codes + b.n * ds.slot_codes;
    b.scale = b.lo + b.n * ds.slot_meta;
    return b;
  }
};

// A batch's three arrays between its staging buffer and the side's slots, on the pool's stream, then
// the buffer's event.
void copy_batch(const DevSide& ds, const SlotBatch& b, int buffer, cudaMemcpyKind kind) {
  const StagingPool& sp = staging_pool();
  const struct {
    unsigned char *dev, *host;
    std::int64_t bytes;
  } arrays[3] = {{ds.codes + b.first * ds.slot_codes, b.codes, b.n * ds.slot_codes},
                 {ds.lo + b.first * ds.slot_meta, b.lo, b.n * ds.slot_meta},
                 {ds.scale + b.first * ds.slot_meta, b.scale, b.n * ds.slot_meta}};
  const bool up = kind == cudaMemcpyHostToDevice;
  for (const auto& a : arrays) {
    const std::size_t bytes = static_cast<std::size_t>(a.bytes);
    SKVQ_CUDA_CHECK(cudaMemcpyAsync(up ? a.dev : a.host, up ? a.host : a.dev, bytes, kind, sp.stream));
  }
  SKVQ_CUDA_CHECK(cudaEventRecord(sp.done[buffer], sp.stream));
}

// The side's slots [0, n_slots) moved batch by batch through the staging buffers, fn(batch) on the
// host beside the copies. Host to device: fn fills a batch's buffer, which is then copied to the
// slots while the next batch is filled. Device to host: a batch is copied into its buffer, then fn
// reads it there while the next batch's copy runs.
template <class F>
void move_slots(const DevSide& ds, std::int64_t n_slots, cudaMemcpyKind kind, F&& fn) {
  if (n_slots == 0) return;
  const std::unique_lock<std::mutex> lock = take_staging(static_cast<std::size_t>(SlotBatches::slot_bytes(ds)));
  StagingPool& sp = staging_pool();
  const SlotBatches batches(ds, n_slots);
  const bool up = kind == cudaMemcpyHostToDevice;
  const auto copy = [&](std::int64_t j) { copy_batch(ds, batches.at(j), static_cast<int>(j % 2), kind); };
  try {
    if (!up) copy(0);
    for (std::int64_t j = 0; j < batches.count(); ++j) {
      if (up) {
        SKVQ_CUDA_CHECK(cudaEventSynchronize(sp.done[j % 2]));  // the copy from this buffer two batches ago
        fn(batches.at(j));
        copy(j);
      } else {
        if (j + 1 < batches.count()) copy(j + 1);  // into the buffer read in the last iteration
        SKVQ_CUDA_CHECK(cudaEventSynchronize(sp.done[j % 2]));
        fn(batches.at(j));
      }
    }
    SKVQ_CUDA_CHECK(cudaStreamSynchronize(sp.stream));
  } catch (...) {
    cudaStreamSynchronize(sp.stream);  // nothing may still use the buffers
    throw;
  }
}

// The rows of a batch's slots between the host chunks' layout ([B*H][n rows], n = window - first)
// and the slots' ([slot][B*H][window rows], rows [0, first) zero): fn(slot i of the batch, bh) moves
// one (slot, b, h)'s rows. The pairs run on the thread pool in a few ranges a thread (the pool
// takes a lock for each task).
template <class F>
void for_slot_rows(std::int64_t n_slots, std::int64_t BH, F&& fn) {
  detail::ThreadPool& pool = detail::ThreadPool::global();
  const std::int64_t n = n_slots * BH, parts = std::min<std::int64_t>(n, 4 * pool.size());
  pool.parallel_for(parts, pool.size(), [&](std::int64_t part) {
    for (std::int64_t t = n * part / parts; t < n * (part + 1) / parts; ++t) fn(t / BH, t % BH);
  });
}

// The host cache's state, checked for an upload of `capacity` tokens before anything is allocated.
const detail::SkvqState& upload_state(const SkvqCache& host, std::int64_t capacity) {
  const detail::SkvqState& st = host.state();
  const std::string what = "skvq: cuda::DeviceCache from a host cache: ";
  if (!st.initialized || st.offset == 0) {
    throw Error(what + "the host cache is empty (offset=0), so its batch and heads are not fixed yet; construct the "
                       "device cache from its config instead");
  }
  if (capacity < st.offset) {
    throw Error(what + "capacity=" + std::to_string(capacity) + " is below the host cache's offset=" + std::to_string(st.offset));
  }
  return st;
}

// Rows [0, n) of every (b, h) of exact rows held as [B, H, rows, D] in the host cache's dtype, as
// fp16 in the same layout (rows past n zero), after append()'s range check (`name` and `where` in its
// message).
std::vector<std::uint16_t> exact_rows_f16(const detail::SkvqState& st, const std::vector<std::byte>& bytes, std::int64_t rows,
                                          std::int64_t n, std::int64_t D, const char* name, const std::string& where,
                                          float limit, const std::string& why) {
  const std::int64_t B = st.batch, H = st.heads;
  std::vector<std::uint16_t> out(static_cast<std::size_t>(B * H * rows * D), 0);
  if (n == 0) return out;
  if (bytes.size() < static_cast<std::size_t>(B * H * rows * D * st.esize())) {
    throw Error(std::string("skvq: cuda::DeviceCache from a host cache: its ") + name + " hold " +
                std::to_string(bytes.size()) + " bytes, fewer than its shape needs");
  }
  const TensorView src{const_cast<std::byte*>(bytes.data()), st.dtype, {B, H, n, D}, {H * rows * D, rows * D, D, 1}};
  try {
    detail::check_values(src, name, limit, why);
  } catch (const Error& e) {
    std::string m = e.what();
    if (m.rfind("skvq: ", 0) == 0) m.erase(0, 6);
    throw Error("skvq: cuda::DeviceCache from a host cache: " + m + where);
  }
  const Tensor f16 = Tensor::copy_of(src, DType::f16);
  const auto* h = reinterpret_cast<const std::uint16_t*>(f16.data());
  for (std::int64_t bh = 0; bh < B * H; ++bh) std::copy_n(h + bh * n * D, n * D, out.data() + bh * rows * D);
  return out;
}

}  // namespace

DeviceCache::DeviceCache(const SkvqCache& host, std::int64_t capacity)
    : DeviceCache(host.config(), upload_state(host, capacity).batch, host.state().heads, host.state().v.head_dim, capacity) {
  const DeviceGuard guard(impl().device);
  // (an exception from here on destroys the cache constructed above: its device memory is freed)
  DeviceCacheImpl& d = impl();
  const detail::SkvqState& st = host.state();
  const std::int64_t r = d.cfg.window, BH = d.B * d.H, live = st.offset - st.q_end, sinks = st.sinks_held();
  // The exact rows in fp16 first: the one step that can refuse the upload.
  std::string why;
  const float limit = device_value_limit(d.cfg.metadata, &why);
  std::vector<std::uint16_t> exact[2][2];  // [keys, values][sinks, tail]
  for (int side = 0; side < 2; ++side) {
    const detail::Side& s = side == 0 ? st.k : st.v;
    const char* names[2][2] = {{"key sinks", "key tail"}, {"value sinks", "value tail"}};
    exact[side][0] = exact_rows_f16(st, s.sinks, sinks, sinks, s.head_dim, names[side][0], "", limit, why);
    exact[side][1] = exact_rows_f16(st, s.tail, r, live, s.head_dim, names[side][1],
                                    "; tail row 0 is token " + std::to_string(st.q_end), limit, why);
  }
  const int mb = meta_bytes(d.cfg.metadata);
  const std::int64_t n_chunks = st.q_end / r;
  for (int side = 0; side < 2; ++side) {
    const detail::Side& s = side == 0 ? st.k : st.v;
    const DevSide& ds = side == 0 ? d.k : d.v;
    const std::int64_t mrow = ds.G * mb;
    if (static_cast<std::int64_t>(s.chunks.size()) != n_chunks) {
      throw Error("skvq: cuda::DeviceCache from a host cache: it holds " + std::to_string(s.chunks.size()) +
                  " packed chunks where its flush frontier q_end=" + std::to_string(st.q_end) + " needs " +
                  std::to_string(n_chunks));
    }
    for (std::int64_t c = 0; c < n_chunks; ++c) {
      const detail::PackedChunk& ch = s.chunks[static_cast<std::size_t>(c)];
      const std::int64_t n = r - st.first_row(static_cast<std::size_t>(c));
      if (ch.n_rows != n || static_cast<std::int64_t>(ch.codes.size()) != BH * n * ds.row_bytes ||
          static_cast<std::int64_t>(ch.lo.size()) != BH * n * mrow || static_cast<std::int64_t>(ch.scale.size()) != BH * n * mrow) {
        throw Error("skvq: cuda::DeviceCache from a host cache: its packed chunk " + std::to_string(c) +
                    " does not have the size of " + std::to_string(n) + " rows a head");
      }
    }
    // The chunks into their slots, a batch at a time (chunk 0's sink rows zero: the kernels mask
    // them, to_host skips them).
    move_slots(ds, n_chunks, cudaMemcpyHostToDevice, [&](const SlotBatch& b) {
      for_slot_rows(b.n, BH, [&](std::int64_t i, std::int64_t bh) {
        const detail::PackedChunk& ch = s.chunks[static_cast<std::size_t>(b.first + i)];
        const std::int64_t first = r - ch.n_rows, n = ch.n_rows, row0 = (i * BH + bh) * r;
        std::fill_n(b.codes + row0 * ds.row_bytes, first * ds.row_bytes, 0);
        std::fill_n(b.lo + row0 * mrow, first * mrow, 0);
        std::fill_n(b.scale + row0 * mrow, first * mrow, 0);
        std::copy_n(ch.codes.data() + bh * n * ds.row_bytes, n * ds.row_bytes, b.codes + (row0 + first) * ds.row_bytes);
        std::copy_n(ch.lo.data() + bh * n * mrow, n * mrow, b.lo + (row0 + first) * mrow);
        std::copy_n(ch.scale.data() + bh * n * mrow, n * mrow, b.scale + (row0 + first) * mrow);
      });
    });
    if (sinks > 0) copy_to_device(ds.sinks, exact[side][0].data(), exact[side][0].size() * 2);
    copy_to_device(ds.tail, exact[side][1].data(), exact[side][1].size() * 2);
    if (ds.perm && st.q_end > 0) {
      if (static_cast<std::int64_t>(s.perm.size()) != d.H * ds.D) {
        throw Error("skvq: cuda::DeviceCache from a host cache: it holds " + std::to_string(s.perm.size()) +
                    " permutation entries where H * D = " + std::to_string(d.H * ds.D));
      }
      copy_to_device(ds.perm, s.perm.data(), s.perm.size() * 4);
    }
  }
  d.offset = st.offset;
  d.q_end = st.q_end;
  d.tokens_seen = st.tokens_seen;
  d.fp16_k = st.fp16_key_bytes;
  d.fp16_v = st.fp16_value_bytes;
}

namespace {

// The fork's batch, after its arguments are checked (before anything is allocated).
std::int64_t fork_batch(const DeviceCache& source, std::int64_t capacity, std::int64_t repeat) {
  const std::string what = "skvq: cuda::DeviceCache from a device cache: ";
  if (repeat < 1) throw Error(what + "repeat=" + std::to_string(repeat) + " must be >= 1");
  if (capacity < source.offset()) {
    throw Error(what + "capacity=" + std::to_string(capacity) + " is below the source cache's offset=" +
                std::to_string(source.offset()));
  }
  return source.batch() * repeat;
}

// An array of `outer` blocks, each the src_batch entries' `bytes` one after another, into one of
// src_batch * repeat entries a block: entry b's bytes to entries [b * repeat, (b + 1) * repeat).
// On the legacy stream.
void repeat_entries(void* dst, const void* src, std::int64_t outer, std::int64_t src_batch, std::int64_t repeat,
                    std::int64_t bytes) {
  if (outer == 0 || bytes == 0) return;
  const auto to = [](std::int64_t n) { return static_cast<std::size_t>(n); };
  for (std::int64_t b = 0; b < src_batch; ++b) {
    for (std::int64_t i = 0; i < repeat; ++i) {
      auto* d = static_cast<unsigned char*>(dst) + (b * repeat + i) * bytes;
      const auto* s = static_cast<const unsigned char*>(src) + b * bytes;
      SKVQ_CUDA_CHECK(cudaMemcpy2DAsync(d, to(src_batch * repeat * bytes), s, to(src_batch * bytes), to(bytes), to(outer),
                                        cudaMemcpyDeviceToDevice, cudaStreamLegacy));
    }
  }
}

}  // namespace

DeviceCache::DeviceCache(const DeviceCache& source, std::int64_t capacity, std::int64_t repeat)
    : DeviceCache(source.config(), fork_batch(source, capacity, repeat), source.num_kv_heads(), source.impl().Dv, capacity,
                  source.device()) {
  DeviceCacheImpl& d = impl();
  const DeviceGuard guard(d.device);
  const DeviceCacheImpl& src = source.impl();
  synchronize();  // the source's work on every stream
  const std::int64_t r = d.cfg.window, H = d.H, used = src.q_end / r;
  for (int side = 0; side < 2; ++side) {
    const DevSide& from = side == 0 ? src.k : src.v;
    const DevSide& to = side == 0 ? d.k : d.v;
    const std::int64_t rows_sinks = std::max(d.cfg.n_sink, 1);
    repeat_entries(to.codes, from.codes, used, src.B, repeat, from.slot_codes / src.B);
    repeat_entries(to.lo, from.lo, used, src.B, repeat, from.slot_meta / src.B);
    repeat_entries(to.scale, from.scale, used, src.B, repeat, from.slot_meta / src.B);
    repeat_entries(to.sinks, from.sinks, 1, src.B, repeat, H * rows_sinks * from.D * 2);
    repeat_entries(to.tail, from.tail, 1, src.B, repeat, H * r * from.D * 2);
    if (to.perm && src.q_end > 0) {  // (written by the first flush)
      SKVQ_CUDA_CHECK(cudaMemcpyAsync(to.perm, from.perm, static_cast<std::size_t>(H * from.D) * 4, cudaMemcpyDeviceToDevice,
                                      cudaStreamLegacy));
    }
  }
  SKVQ_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));  // visible to work on any stream
  d.offset = src.offset;
  d.q_end = src.q_end;
  d.tokens_seen = src.tokens_seen;
  d.fp16_k = src.fp16_k * repeat;
  d.fp16_v = src.fp16_v * repeat;
}

DeviceCache::~DeviceCache() = default;
DeviceCache::DeviceCache(DeviceCache&&) noexcept = default;
DeviceCache& DeviceCache::operator=(DeviceCache&&) noexcept = default;

DeviceCacheImpl& DeviceCache::impl() const {
  if (!impl_) throw Error("skvq: cuda::DeviceCache: this cache was moved from; it holds nothing");
  return *impl_;
}

namespace {

static_assert(static_cast<int>(DType::f16) == kTypeF16 && static_cast<int>(DType::bf16) == kTypeBF16 &&
              static_cast<int>(DType::f32) == kTypeF32);

// A device pointer the caller passed, against the alignment its kernels need (a misaligned one
// would fault on the device and leave the CUDA context unusable).
void check_aligned(const char* what, const char* name, const void* p, std::size_t align, DType t) {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  if (at % align == 0) return;
  char hex[32];
  std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(at));
  throw Error(std::string(what) + name + "=" + hex + " (" + std::string(dtype_name(t)) + ") must be aligned to " +
              std::to_string(align) + " bytes");
}

}  // namespace

void DeviceCache::append_device(const void* keys, const void* values, std::int64_t S, Stream stream) {
  append_device(keys, values, S, DType::f16, stream);
}

void DeviceCache::append_device(const void* keys, const void* values, std::int64_t S, DType dtype, Stream stream) {
  DeviceCacheImpl& d = impl();
  const DeviceGuard guard(d.device);
  const char* what = "skvq: cuda::DeviceCache::append_device: ";
  if (S < 1) throw Error(std::string(what) + "S=" + std::to_string(S) + " must be >= 1");
  check_aligned(what, "keys", keys, dtype_size(dtype), dtype);
  check_aligned(what, "values", values, dtype_size(dtype), dtype);
  d.check_capacity(S);
  const std::int64_t r = d.cfg.window, BH = d.B * d.H;
  const bool half = dtype == DType::f16;
  const auto* ks = static_cast<const __half*>(keys);
  const auto* vs = static_cast<const __half*>(values);
  for (std::int64_t t = 0; t < S;) {
    const std::int64_t live = d.offset - d.q_end;
    if (live == 0 && S - t >= r) {  // whole windows straight from the input, in its type (one launch a side)
      const std::int64_t n = (S - t) / r * r;
      d.flush(keys, values, dtype, S, t, static_cast<int>(n / r), stream);
      d.offset += n;
      t += n;
      continue;
    }
    const std::int64_t n = std::min(S - t, r - live);
    if (half) {
      d.to_tail(ks, S, t, n, d.k, stream);
      d.to_tail(vs, S, t, n, d.v, stream);
    } else {
      run_rows_to_half(keys, dtype, BH, S, t, n, d.k.tail, r, live, d.k.D, stream);
      run_rows_to_half(values, dtype, BH, S, t, n, d.v.tail, r, live, d.v.D, stream);
    }
    d.offset += n;
    t += n;
    if (d.offset - d.q_end == r) d.flush(d.k.tail, d.v.tail, DType::f16, r, 0, 1, stream);
  }
  d.tokens_seen += S;
  d.fp16_k += BH * S * d.k.D * 2;
  d.fp16_v += BH * S * d.v.D * 2;
}

namespace {

// Staging for the host-tensor calls (append, attend): two pinned host buffers and one device buffer,
// so that a decode step's host calls allocate nothing and copy without the runtime's pageable bounce.
// Sets live on a process-wide free list: a call takes one (a new one when calls on other threads hold
// every set) and gives it back. A set grows to the largest call it carried, in powers of two from
// 64 KiB; one grown past kMaxBytes (an attention call with a long query) is freed when given back.
// Appends move in pieces that fit kMaxBytes. Kept for the process, as the upload's StagingPool is.
struct CallStaging {
  static constexpr std::size_t kMaxBytes = std::size_t{8} << 20;
  int device = 0;                               // the device of `dev` and the events (set by StagingLease)
  unsigned char* host[2] = {nullptr, nullptr};  // pinned, `bytes` each
  unsigned char* dev = nullptr;                 // `bytes`
  std::size_t bytes = 0;
  cudaEvent_t uploaded[2] = {nullptr, nullptr};  // the last copy out of host[i]

  void release() {  // (after every copy through the buffers is done)
    SKVQ_CUDA_CHECK(cudaDeviceSynchronize());
    for (unsigned char*& h : host) {
      if (h) SKVQ_CUDA_CHECK(cudaFreeHost(h));
      h = nullptr;
    }
    if (dev) SKVQ_CUDA_CHECK(cudaFree(dev));
    dev = nullptr;
    bytes = 0;
  }
  void reserve(std::size_t want) {
    for (cudaEvent_t& e : uploaded) {
      if (!e) SKVQ_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    if (bytes >= want) return;
    std::size_t n = std::size_t{64} << 10;
    while (n < want && n < kMaxBytes) n *= 2;
    n = std::max(n, want);
    release();
    try {
      for (unsigned char*& h : host) SKVQ_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h), n));
      SKVQ_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dev), n));
    } catch (...) {
      release();
      throw;
    }
    bytes = n;
  }
  // Host buffer i, once the copy last made out of it is done.
  unsigned char* host_buffer(int i) {
    SKVQ_CUDA_CHECK(cudaEventSynchronize(uploaded[i]));
    return host[i];
  }
  // `n` bytes of host buffer i to the device buffer at `at`, on the legacy stream.
  void upload(int i, std::size_t at, std::size_t n) {
    SKVQ_CUDA_CHECK(cudaMemcpyAsync(dev + at, host[i], n, cudaMemcpyHostToDevice, cudaStreamLegacy));
    SKVQ_CUDA_CHECK(cudaEventRecord(uploaded[i], cudaStreamLegacy));
  }
};

// A set of the current device's free list for one call, with buffers of at least `bytes`.
class StagingLease {
 public:
  explicit StagingLease(std::size_t bytes) {
    const int dev = current_device();
    {
      const std::lock_guard<std::mutex> lock(list().mu);
      std::vector<CallStaging*>& free = list().free[dev];
      if (!free.empty()) {
        set_ = free.back();
        free.pop_back();
      }
    }
    if (!set_) {
      set_ = new CallStaging;
      set_->device = dev;
    }
    try {
      set_->reserve(bytes);
    } catch (...) {
      give_back();
      throw;
    }
  }
  ~StagingLease() { give_back(); }
  StagingLease(const StagingLease&) = delete;
  StagingLease& operator=(const StagingLease&) = delete;
  CallStaging* operator->() const { return set_; }

 private:
  struct List {
    std::mutex mu;
    std::map<int, std::vector<CallStaging*>> free;  // by device
  };
  static List& list() {  // (never destroyed: the CUDA runtime may be torn down before static destructors run)
    static List* l = new List;
    return *l;
  }
  void give_back() noexcept {
    try {
      if (set_->bytes > CallStaging::kMaxBytes) set_->release();
    } catch (...) {  // (a device error: a later call reports it)
    }
    const std::lock_guard<std::mutex> lock(list().mu);
    list().free[set_->device].push_back(set_);
  }
  CallStaging* set_ = nullptr;
};

// Rows [t0, t0 + n) of every (b, h) of `src` into dst as contiguous [B, H, n, D] elements of type `to`
// (any of them), converted as the CPU cache converts its input. dst is staging that the device copies
// from. Long copies run on the pool's threads (ThreadPool::parallel_rows: a head's rows shared by
// several threads where heads are few) and write dst by streaming stores (cpu::stream_copy), which
// spare reading its lines into the cache first: session 57 measured the conversion as most of a host
// append, and prefills of fp16 rows 1.2-2.1x faster with the streaming stores from 34 MB of input
// (docs/performance.md, "Host-tensor calls"); a decode step's few rows they made slower (a fence for
// every head), so short copies store as before.
void rows_into(const TensorView& src, std::int64_t t0, std::int64_t n, DType to, unsigned char* dst) {
  const std::int64_t B = src.shape[0], H = src.shape[1], D = src.shape[3];
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(to));
  const bool same = src.dtype == to && src.strides[3] == 1;
  const bool large = B * H * n * D >= detail::kParallelElements;
  const bool block = same && src.strides[2] == D;  // a head's rows adjacent in src as in dst
  // row i of head bh into `out`, converted; `row` is the conversion's float scratch
  const auto put_row = [&](std::int64_t bh, std::int64_t i, std::byte* out, std::vector<float>& row) {
    if (same) {
      std::memcpy(out, src.ptr(bh / H, bh % H, t0 + i, 0), static_cast<std::size_t>(D * es));
      return;
    }
    row.resize(static_cast<std::size_t>(D));
    cpu::load_view_rows(src, bh / H, bh % H, t0 + i, 1, row.data());
    cpu::store_row_f32(out, to, D, row.data());
  };
  const auto rows = [&](std::int64_t bh, std::int64_t i0, std::int64_t i1) {
    auto* out = reinterpret_cast<std::byte*>(dst + ((bh * n) + i0) * D * es);
    thread_local std::vector<float> row;
    if (!large) {
      for (std::int64_t i = i0; i < i1; ++i, out += D * es) put_row(bh, i, out, row);
      return;
    }
    if (block) {
      cpu::stream_copy(out, src.ptr(bh / H, bh % H, t0 + i0, 0), static_cast<std::size_t>((i1 - i0) * D * es));
      return;
    }
    // rows converted (or gathered) a batch at a time into a buffer this thread keeps, then streamed
    constexpr std::int64_t kBatch = 32;
    thread_local std::vector<std::byte> conv;
    conv.resize(static_cast<std::size_t>(kBatch * D * es));
    for (std::int64_t i = i0; i < i1;) {
      const std::int64_t m = std::min(kBatch, i1 - i);
      for (std::int64_t j = 0; j < m; ++j) put_row(bh, i + j, conv.data() + j * D * es, row);
      cpu::stream_copy(out, conv.data(), static_cast<std::size_t>(m * D * es));
      out += m * D * es;
      i += m;
    }
  };
  detail::ThreadPool& pool = detail::ThreadPool::global();
  pool.parallel_rows(B * H, n, large ? pool.size() : 1, rows);
}

}  // namespace

void DeviceCache::append(const TensorView& keys, const TensorView& values) {
  DeviceCacheImpl& d = impl();
  const DeviceGuard guard(d.device);
  const Shape4 ks{d.B, d.H, keys.shape[2], d.k.D}, vs{d.B, d.H, keys.shape[2], d.v.D};
  if (keys.shape != ks || values.shape != vs) {
    throw Error("skvq: cuda::DeviceCache::append: keys " + shape_string(keys.shape) + " / values " +
                shape_string(values.shape) + " must be " + shape_string(ks) + " / " + shape_string(vs));
  }
  // the CPU cache's checks; the device cache holds fp16, so at most fp16's range whatever the metadata
  detail::check_kv_pair(keys, values);
  const std::int64_t S = keys.shape[2];
  d.check_capacity(S);  // (before any piece is appended)
  std::string why;
  const float limit = device_value_limit(d.cfg.metadata, &why);
  const int threads = detail::ThreadPool::global().size();
  detail::check_values(keys, "keys", limit, why, threads);
  detail::check_values(values, "values", limit, why, threads);
  // Pieces of whole windows where they fit a staging buffer: converted into one pinned buffer while
  // the last piece's copy and flush run from the other. At least four pieces where the input has
  // that many windows, so that most of the conversion overlaps the copies and flushes.
  const std::int64_t kbytes = d.B * d.H * d.k.D * 2, token = kbytes + d.B * d.H * d.v.D * 2, window = d.cfg.window;
  std::int64_t per = std::max<std::int64_t>(1, static_cast<std::int64_t>(CallStaging::kMaxBytes) / token);
  if (per >= window) per -= per % window;
  const std::int64_t quarter = (S + 3) / 4 / window * window;  // whole windows in a quarter of the input
  if (quarter > 0) per = std::min(per, quarter);
  per = std::min(per, S);
  StagingLease st(static_cast<std::size_t>(per * token));
  for (std::int64_t t = 0, j = 0; t < S; ++j) {
    const std::int64_t n = std::min(per, S - t);
    const int i = static_cast<int>(j % 2);
    unsigned char* h = st->host_buffer(i);
    rows_into(keys, t, n, DType::f16, h);
    rows_into(values, t, n, DType::f16, h + n * kbytes);
    st->upload(i, 0, static_cast<std::size_t>(n * token));
    append_device(st->dev, st->dev + n * kbytes, n);
    t += n;
  }
}

void DeviceCache::attend_device(const float* q, std::int64_t num_q_heads, std::int64_t sq, float scale, float* out,
                                int num_splits, Stream stream) const {
  attend_device(q, DType::f32, num_q_heads, sq, scale, out, DType::f32, num_splits, stream);
}

void DeviceCache::attend_device(const void* q, DType q_type, std::int64_t num_q_heads, std::int64_t sq, float scale, void* out,
                                DType out_type, int num_splits, Stream stream) const {
  const DeviceCacheImpl& d = impl();
  const DeviceGuard guard(d.device);
  d.check_attend(num_q_heads, sq);
  const char* what = "skvq: cuda::DeviceCache::attend_device: ";
  check_aligned(what, "q", q, 16, q_type);
  check_aligned(what, "out", out, dtype_size(out_type), out_type);
  AttnParams p;
  if (q_type == DType::f32) p.q = static_cast<const float*>(q);
  else p.q16 = q;
  p.q_type = static_cast<int>(q_type);
  p.out_type = static_cast<int>(out_type);
  p.k = d.k;
  p.v = d.v;
  p.B = static_cast<int>(d.B);
  p.Hq = static_cast<int>(num_q_heads);
  p.Hkv = static_cast<int>(d.H);
  p.Sq = static_cast<int>(sq);
  p.D = d.k.D;
  p.Dv = d.v.D;
  p.group = std::min(d.cfg.group_size, d.k.D);
  p.group_v = std::min(d.cfg.group_size, d.v.D);
  p.meta = static_cast<int>(d.cfg.metadata);
  p.meta_bytes = meta_bytes(d.cfg.metadata);
  p.window = d.cfg.window;
  p.sinks = std::min<std::int64_t>(d.cfg.n_sink, d.q_end);
  p.q_end = d.q_end;
  p.kv_len = d.offset;
  p.scale = scale;
  if (!d.cfg.reorder || d.q_end == 0) p.k.perm = p.v.perm = nullptr;  // no permutation before the first flush
  run_attention(p, false, num_splits, out, stream);
}

// fp32 bytes of a host attend()'s queries from which 16-bit ones are uploaded as they are.
constexpr std::int64_t kWideQueryBytes = std::int64_t{1} << 20;

Tensor DeviceCache::attend(const TensorView& queries, float scale) const {
  const DeviceCacheImpl& d = impl();
  const DeviceGuard guard(d.device);
  if (queries.shape[0] != d.B || queries.shape[3] != d.k.D) {
    throw Error("skvq: cuda attend: queries " + shape_string(queries.shape) + " do not match the cache's B and D");
  }
  const std::int64_t Hq = queries.shape[1], Sq = queries.shape[2];
  d.check_attend(Hq, Sq);
  if (queries.data == nullptr) throw Error("skvq: cuda attend: queries have no data");
  Tensor out(DType::f32, {d.B, Hq, Sq, d.v.D});
  // Long 16-bit queries (prefill) travel as they are, half the bytes of fp32, and are widened on the
  // device (exactly; one small kernel more); shorter ones, and fp32 ones, as fp32: below about 1 MiB
  // the bytes saved take less time than that kernel's launch.
  const bool q16 = queries.dtype == DType::f16 || queries.dtype == DType::bf16;
  const DType qt = q16 && queries.numel() * 4 >= kWideQueryBytes ? queries.dtype : DType::f32;
  const std::size_t qbytes = static_cast<std::size_t>(queries.numel()) * dtype_size(qt);
  const std::size_t at = (qbytes + 255) / 256 * 256;  // the output's place in the device buffer
  StagingLease st(at + out.nbytes());
  rows_into(queries, 0, Sq, qt, st->host_buffer(0));
  st->upload(0, 0, qbytes);
  auto* dout = reinterpret_cast<float*>(st->dev + at);
  attend_device(st->dev, qt, Hq, Sq, scale, dout, DType::f32);
  unsigned char* h = st->host_buffer(1);
  SKVQ_CUDA_CHECK(cudaMemcpyAsync(h, dout, out.nbytes(), cudaMemcpyDeviceToHost, cudaStreamLegacy));
  SKVQ_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  std::memcpy(out.data(), h, out.nbytes());
  return out;
}

const Config& DeviceCache::config() const { return impl().cfg; }
std::int64_t DeviceCache::batch() const { return impl().B; }
std::int64_t DeviceCache::num_kv_heads() const { return impl().H; }
std::int64_t DeviceCache::capacity() const { return impl().capacity; }
std::int64_t DeviceCache::offset() const { return impl().offset; }
std::int64_t DeviceCache::q_end() const { return impl().q_end; }
std::int64_t DeviceCache::bytes_allocated() const { return impl().allocated; }
int DeviceCache::device() const { return impl().device; }

std::int64_t DeviceCache::bytes_held() const {
  const DeviceCacheImpl& d = impl();
  const std::int64_t used = d.q_end / d.cfg.window;
  std::int64_t b = 0;
  for (const DevSide* s : {&d.k, &d.v}) {
    b += used * (s->slot_codes + 2 * s->slot_meta) + d.B * d.H * (d.cfg.window + d.cfg.n_sink) * s->D * 2;
    if (s->perm) b += d.H * s->D * 4;
  }
  return b;
}

std::int64_t DeviceCache::bytes_read_per_step() const {
  const DeviceCacheImpl& d = impl();
  const std::int64_t sinks = std::min<std::int64_t>(d.cfg.n_sink, d.q_end);
  const std::int64_t packed_rows = d.q_end - sinks, live = d.offset - d.q_end;
  std::int64_t b = 0;
  for (const DevSide* s : {&d.k, &d.v}) {
    b += d.B * d.H * packed_rows * (s->row_bytes + 2 * s->G * meta_bytes(d.cfg.metadata));
    b += d.B * d.H * (sinks + live) * s->D * 2;
  }
  return b;
}

SkvqCache DeviceCache::to_host() const {
  const DeviceCacheImpl& d = impl();
  const DeviceGuard guard(d.device);
  synchronize();
  SkvqCache c(d.cfg);
  detail::SkvqState& st = c.mutable_state();
  if (d.offset == 0) return c;
  const std::int64_t r = d.cfg.window, BH = d.B * d.H;
  st.initialized = true;
  st.dtype = DType::f16;
  st.batch = d.B;
  st.heads = d.H;
  st.offset = d.offset;
  st.q_end = d.q_end;
  st.tokens_seen = d.tokens_seen;
  st.fp16_key_bytes = d.fp16_k;
  st.fp16_value_bytes = d.fp16_v;
  const int mb = meta_bytes(d.cfg.metadata);
  for (int side = 0; side < 2; ++side) {
    const DevSide& ds = side == 0 ? d.k : d.v;
    detail::Side& s = side == 0 ? st.k : st.v;
    s.head_dim = ds.D;
    s.bits = ds.bits;
    const std::int64_t n_chunks = d.q_end / r;
    const std::int64_t mrow = ds.G * mb;
    s.chunks.resize(static_cast<std::size_t>(n_chunks));
    detail::ThreadPool& pool = detail::ThreadPool::global();
    pool.parallel_for(n_chunks, pool.size(), [&](std::int64_t ci) {  // (the first touch of their pages, too)
      detail::PackedChunk& ch = s.chunks[static_cast<std::size_t>(ci)];
      ch.n_rows = r - st.first_row(static_cast<std::size_t>(ci));
      ch.codes.resize(static_cast<std::size_t>(BH * ch.n_rows * ds.row_bytes));
      ch.lo.resize(static_cast<std::size_t>(BH * ch.n_rows * mrow));
      ch.scale.resize(ch.lo.size());
    });
    move_slots(ds, n_chunks, cudaMemcpyDeviceToHost, [&](const SlotBatch& b) {
      for_slot_rows(b.n, BH, [&](std::int64_t i, std::int64_t bh) {
        detail::PackedChunk& ch = s.chunks[static_cast<std::size_t>(b.first + i)];
        const std::int64_t n = ch.n_rows, row0 = (i * BH + bh) * r + (r - n);
        std::copy_n(b.codes + row0 * ds.row_bytes, n * ds.row_bytes, ch.codes.data() + bh * n * ds.row_bytes);
        std::copy_n(b.lo + row0 * mrow, n * mrow, ch.lo.data() + bh * n * mrow);
        std::copy_n(b.scale + row0 * mrow, n * mrow, ch.scale.data() + bh * n * mrow);
      });
    });
    const std::int64_t sinks = std::min<std::int64_t>(d.cfg.n_sink, d.q_end);
    if (sinks > 0) {
      s.sinks.resize(static_cast<std::size_t>(BH * sinks * ds.D * 2));
      copy_to_host(s.sinks.data(), ds.sinks, s.sinks.size());
    }
    s.tail.resize(static_cast<std::size_t>(BH * r * ds.D * 2));
    copy_to_host(s.tail.data(), ds.tail, s.tail.size());
    if (ds.perm && d.q_end > 0) {
      s.perm.resize(static_cast<std::size_t>(d.H * ds.D));
      copy_to_host(s.perm.data(), ds.perm, s.perm.size() * 4);
      s.inv.resize(s.perm.size());
      for (std::int64_t h = 0; h < d.H; ++h)
        for (int j = 0; j < ds.D; ++j) s.inv[static_cast<std::size_t>(h * ds.D + s.perm[static_cast<std::size_t>(h * ds.D + j)])] = j;
    }
  }
  return c;
}

void attend_dense_fp16(const float* q, const void* k, const void* v, float* out, std::int64_t batch,
                       std::int64_t num_q_heads, std::int64_t num_kv_heads, std::int64_t sq, std::int64_t kv_len,
                       std::int64_t head_dim, std::int64_t v_head_dim, float scale, int num_splits, Stream stream) {
  if (!general_shape_supported(head_dim, v_head_dim)) {
    throw Error("skvq: cuda attend_dense_fp16: head_dim=" + std::to_string(head_dim) + ", v_head_dim=" + std::to_string(v_head_dim) +
                ": each must be a multiple of 16 in [16, " + std::to_string(kGeneralMaxHeadDim) + "]");
  }
  if (num_kv_heads < 1 || num_q_heads % num_kv_heads != 0 || sq < 1 || sq > kv_len) {
    throw Error("skvq: cuda attend_dense_fp16: inconsistent shapes");
  }
  AttnParams p;
  p.q = q;
  p.dense_k = static_cast<const __half*>(k);
  p.dense_v = static_cast<const __half*>(v);
  p.B = static_cast<int>(batch);
  p.Hq = static_cast<int>(num_q_heads);
  p.Hkv = static_cast<int>(num_kv_heads);
  p.Sq = static_cast<int>(sq);
  p.D = static_cast<int>(head_dim);
  p.Dv = static_cast<int>(v_head_dim);
  p.group = p.D;
  p.kv_len = kv_len;
  p.q_end = 0;
  p.sinks = 0;
  p.window = 1;
  p.scale = scale;
  run_attention(p, true, num_splits, out, stream);
}

}  // namespace skvq::cuda
