// Per-block timestamps of the attention kernels, for finding where a decode
// step's time goes (which blocks start late, which finish last, how long the
// combine waits). Built only with the CMake option SKVQ_CUDA_TRACE=ON (a
// diagnostic build: bench_cuda --trace reads it); otherwise the device hooks
// are empty inline functions and nothing here costs a register.
#pragma once

#include <cstdint>
#include <vector>

namespace skvq::cuda::trace {

// One block of a traced kernel: %globaltimer (ns) at its start (t0), at a
// kernel-specific mid point (t1: the body's end of its tile loop, the
// combine's return from its wait on the body), at its end (t2).
struct Record {
  std::uint64_t t0 = 0, t1 = 0, t2 = 0;
  // the token-major body (else 0): when its query setup is done and the tile loop begins (tq), when
  // its first tile has landed (tf), and how many tiles it took
  std::uint64_t tq = 0, tf = 0;
  std::uint32_t kind = 0, sm = 0;
  std::uint32_t block = 0;  // blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)
  std::uint32_t tiles = 0;
};
enum Kind : std::uint32_t { kBody = 1, kCombine = 2 };
constexpr std::uint32_t kCapacity = 1u << 16;

#ifdef SKVQ_CUDA_TRACE
void reset();                 // forget the records so far (synchronizes the device)
// The records since the last reset, in no order (synchronizes): one a block, in a slot of its own
// (no shared counter to contend for at the blocks' end), of the kind's last launch.
std::vector<Record> fetch();
#endif

}  // namespace skvq::cuda::trace
