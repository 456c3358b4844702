// The GPU backend: a device-resident SKVQ layer cache (same per-row codes
// and metadata as the CPU cache, flushed on the GPU) and fused attention
// straight from it. Builds without CUDA compile stubs whose available() is
// false and whose constructors throw skvq::Error.
#pragma once

#include <cstdint>
#include <memory>

#include "skvq/config.hpp"
#include "skvq/dtype.hpp"
#include "skvq/layer_cache.hpp"

struct CUstream_st;  // the CUDA runtime's stream type (cudaStream_t is CUstream_st*)

namespace skvq::cuda {

// A CUDA stream: pass a cudaStream_t as it is; nullptr is the legacy default
// stream (the default everywhere). Work given a stream is enqueued on it and
// ordered after that stream's earlier work; the caller orders streams against
// each other (events), as with any CUDA library. The cache's host-side state
// (offset, frontier) moves when a call is enqueued, so the calls on one cache
// must be enqueued in the order they are meant to run, and a cache must not
// be appended to on one stream while another stream may still read it.
using Stream = ::CUstream_st*;

// True when this build has the CUDA backend and the calling thread's current
// CUDA device (the one a new DeviceCache would live on; cudaSetDevice picks
// it) is usable: compute capability 8.0 or newer.
bool available();
// That device's name, number and size, or why none is usable.
std::string device_description();

struct DeviceCacheImpl;

// One layer's cache in device memory. Supported: head dims D and Dv each a
// multiple of 16 in [16, 256], every code width of the spec (1 to 8 bits a
// side), group_size a multiple of 16 (or >= both head dims), every metadata
// mode; the constructor refuses anything else with an error naming the field. Keys and
// values are fp16. The tuned attention kernels take D = Dv = 128 with bits
// (key, value) (1,1) (2,2) (4,4) (8,8) (4,2) (8,4) (1-bit grouped-query decode
// over long caches goes to the tensor-core kernel below, where it measured
// faster); other shapes go through a general-shape path: a tensor-core kernel
// at head dims 32, 64, 96, 256 (and 128) with 2- or 4-bit codes, or 1, 3, 5,
// 6 or 7 bits both sides, and groups of 32, 64 or 128 that divide the row, or
// of 96 at head dim 96 (faster than fp16 attention there), a float kernel
// elsewhere (correct everywhere, not tuned: docs/performance.md, "Other head
// dims" and "Every code width").
//
// Devices: a cache lives on the CUDA device that was current when it was
// made (a fork: on its source's device) and every call runs there, whatever
// device is current when the call is made, leaving the current device as it found
// it; so a process may hold caches on several GPUs (a model's layers split
// across them) and call them from any thread. Pointers and streams passed to a
// cache's calls must belong to its device.
//
// Device layout: window-sized slots, one per flushed chunk (rows of chunk 0
// below n_sink unused), each holding for every (b, h) the rows' codes
// (ceil(D * bits / 8) bytes a row, the CPU cache's bit order, permuted
// channel order) and their lo / scale (meta_bytes each, [row][group]); plus
// an exact fp16 tail [B, H, window, D] and exact sinks [B, H, n_sink, D].
class DeviceCache {
 public:
  // capacity: tokens the cache can hold (memory is reserved up front).
  DeviceCache(const Config& config, std::int64_t batch, std::int64_t num_kv_heads, std::int64_t v_head_dim,
              std::int64_t capacity);
  // Uploads a CPU cache (a prompt computed on the CPU, a cache file loaded by load_prompt_cache) into
  // a new device cache of `capacity` tokens, with the host cache's config (its dense view dropped):
  // the same packed codes, metadata, permutations, counters and byte accounting, so that attention
  // and later appends go on as on the CPU (to_host() gives the host cache back). The exact rows (the
  // sinks and the live tail) are held in fp16, as append() converts its input: from an fp32 or bf16
  // cache they are rounded, and the windows flushed after the upload are quantized from the rounded
  // rows. Errors, with nothing left allocated: an empty host cache (its batch and heads are not
  // fixed yet), capacity below its offset, a configuration the GPU does not support (as above), an
  // exact value beyond fp16's range (named by side, position and value).
  // The packed chunks move through two pinned 16 MiB host buffers that the first move of the process
  // allocates (about 20 ms) and keeps; moves from several threads take them in turn.
  DeviceCache(const SkvqCache& host, std::int64_t capacity);
  // A copy of a device cache in a new one of `capacity` tokens, made on the device: a prompt's cache
  // forked for several requests, or for several samples or beams of one (repeat > 1: entry b of the
  // copy is entry b / repeat of the source, so the copy's batch is source.batch() * repeat), or a
  // cache that ran out of capacity grown into a larger one (repeat 1, then drop the source). The
  // copy goes on as the source would (the same permutations, codes, metadata, exact rows and
  // counters; its fp16 byte accounting counts its own entries), and the two are independent from
  // then on. Waits for the device first. Errors, with nothing left allocated: repeat < 1, capacity
  // below the source's offset, a moved-from source.
  DeviceCache(const DeviceCache& source, std::int64_t capacity, std::int64_t repeat = 1);
  ~DeviceCache();
  DeviceCache(const DeviceCache&) = delete;
  DeviceCache& operator=(const DeviceCache&) = delete;
  // Movable (a model's layers in a std::vector): the device memory changes hands, nothing is copied.
  // A moved-from cache can only be destroyed or assigned to; any other call on it is an error.
  // Assigning over a cache frees its memory (waiting for the device, as the destructor does).
  DeviceCache(DeviceCache&&) noexcept;
  DeviceCache& operator=(DeviceCache&&) noexcept;

  // Appends S tokens from device memory: keys [B, H, S, D], values
  // [B, H, S, Dv], fp16, contiguous. Whole windows are flushed on the GPU in
  // one launch (the first flush computes the permutations), the tail rows by
  // asynchronous copies: all of it on `stream`, nothing waited for. The values
  // are not checked (that would read the input a second time): a non-finite
  // one gives codes of no use, as the CPU cache would refuse it.
  void append_device(const void* keys, const void* values, std::int64_t S, Stream stream = nullptr);
  // Same with keys and values of `dtype`: fp16 as above; bf16 or fp32 rounded to fp16 on the device
  // (to nearest, ties to even, as append() rounds host input; not checked either) as they are read:
  // rows for the tail by one kernel straight into it, whole windows by the flush kernels themselves
  // (one launch a side, as for fp16; no fp16 copy of the input is made).
  // Errors, before anything is enqueued (the cache unchanged): S < 1, a context past the capacity,
  // keys or values not aligned to their element size.
  void append_device(const void* keys, const void* values, std::int64_t S, DType dtype, Stream stream = nullptr);
  // Same from host tensors (any dtype/strides; converted to fp16 on the host),
  // checked as the CPU cache checks them (non-finite values and values past
  // the metadata's or fp16's range, or a context past the capacity, are errors;
  // nothing is appended then). The rows move through pinned staging buffers
  // that the process keeps (a set for each thread calling at once, at most
  // 2 x 8 MiB pinned and 8 MiB on the device), in pieces of whole windows that
  // fit them, each converted while the last one is copied and flushed; on the
  // legacy default stream. Returns once the input has been read: the device's
  // work may still run (later calls are ordered after it; to_host() and
  // attend() wait for it).
  void append(const TensorView& keys, const TensorView& values);

  // Attention of queries [B, Hq, Sq, D] (fp32, device, contiguous, 16-byte aligned) over the
  // cache; query row i sits at position offset - Sq + i (causal). Writes
  // out [B, Hq, Sq, Dv] fp32 (device). num_splits 0: chosen to fill the GPU.
  // Enqueued on `stream` (two kernels, no host wait). Each stream has its own
  // split workspace, so calls on different streams may run concurrently. A
  // call may be captured into a CUDA graph (stream capture) once the same
  // shape has run on that stream outside the capture: capture cannot allocate,
  // so a capture that would grow the stream's workspace is refused with an
  // error (nothing enqueued). The graph replays this call as it was: the
  // cache's length at capture time, whatever was appended since.
  // With grouped-query decode over long contexts the blocks share a KV head's
  // tiles out while the call runs (balanced claiming), so two identical calls
  // may sum in different orders and differ in the last bits (always within the
  // tested tolerance); SKVQ_CUDA_BALANCE=0 makes every call bit-reproducible.
  void attend_device(const float* q, std::int64_t num_q_heads, std::int64_t sq, float scale, float* out,
                     int num_splits = 0, Stream stream = nullptr) const;
  // Same with queries of q_type and output of out_type, each fp32, fp16 or bf16: 16-bit queries are
  // widened to fp32 (exactly) by one small kernel into the stream's split workspace before the
  // attention kernels, which read fp32 queries whatever the call's type; the output is the float32
  // result rounded to nearest. q must be 16-byte aligned, out aligned to its element size; otherwise
  // an error naming it, before anything is enqueued.
  void attend_device(const void* q, DType q_type, std::int64_t num_q_heads, std::int64_t sq, float scale, void* out,
                     DType out_type, int num_splits = 0, Stream stream = nullptr) const;
  // Same with host tensors (any dtype/strides); returns [B, Hq, Sq, Dv] fp32.
  // Through the same staging buffers as append() (a set grown past 8 MiB for
  // a long query is freed after the call); on the legacy default stream, and
  // waits for the result. Queries move as fp32, except fp16 and bf16 ones of
  // 1 MiB or more as fp32 (prefill), which move as they are (half the bytes)
  // and are widened on the device as above.
  Tensor attend(const TensorView& queries, float scale) const;

  const Config& config() const;  // as given, dense_view off (the device cache is packed-only)
  std::int64_t batch() const;
  std::int64_t num_kv_heads() const;
  std::int64_t capacity() const;  // tokens it can hold: as given, at most config().max_ctx
  std::int64_t offset() const;    // tokens it holds
  std::int64_t q_end() const;     // the flush frontier
  std::int64_t bytes_allocated() const;  // device bytes reserved
  std::int64_t bytes_held() const;       // packed chunks in use + tail + sinks + perms
  // Bytes one attention call reads (packed codes and metadata, sinks, live tail).
  std::int64_t bytes_read_per_step() const;
  int device() const;  // the CUDA device (ordinal) the cache lives on

  // Copies the whole state back into a CPU SkvqCache (packed-only): same codes, metadata, perms,
  // counters (for a cache file, or comparisons with the CPU cache). Waits for the device first;
  // moves through the upload's pinned buffers.
  SkvqCache to_host() const;

 private:
  // The public constructor's work on `device` (-1: the current one; a fork: its source's).
  DeviceCache(const Config& config, std::int64_t batch, std::int64_t num_kv_heads, std::int64_t v_head_dim,
              std::int64_t capacity, int device);
  DeviceCacheImpl& impl() const;  // throws where the cache was moved from
  std::unique_ptr<DeviceCacheImpl> impl_;
};

// Dense fp16 decode attention with the same kernel structure (the project's
// own fp16 baseline): q [B, Hq, Sq, D] fp32, k [B, Hkv, T, D] fp16,
// v [B, Hkv, T, Dv] fp16, out [B, Hq, Sq, Dv] fp32; all device pointers.
void attend_dense_fp16(const float* q, const void* k, const void* v, float* out, std::int64_t batch,
                       std::int64_t num_q_heads, std::int64_t num_kv_heads, std::int64_t sq, std::int64_t kv_len,
                       std::int64_t head_dim, std::int64_t v_head_dim, float scale, int num_splits = 0,
                       Stream stream = nullptr);

// Frees the split workspace that attention keeps for `stream` (on the current
// device; waits for the device). For a stream that will not attend again, before
// it is destroyed: a later stream may get the same handle, and the buffer would
// otherwise stay until the process ends. A buffer that a CUDA graph captured is
// kept (the graph may be replayed); the stream's next call allocates anew.
void release_workspace(Stream stream);

// Device memory helpers for tests and benchmarks (throw skvq::Error on failure).
void* device_alloc(std::size_t bytes);
void device_free(void* p);
void copy_to_device(void* dst, const void* src, std::size_t bytes);  // complete, for every stream, on return
void copy_to_host(void* dst, const void* src, std::size_t bytes);
void synchronize();

}  // namespace skvq::cuda
