// The NCCL backend for CUDA buffers (Note [Comm streams]): collectives on the communicator's stream after an
// event from the caller's stream, a watchdog thread that enforces the timeout and aborts the NCCL
// communicator (Note [Failure handling]), builtin NCCL collectives or our ring over ncclSend/ncclRecv. Built
// with CUDA only.
#pragma once

#include <memory>
#include <vector>

#include "dist/comm/communicator.h"
#include "dist/comm/mpi_communicator.h"

namespace cz::dist {

std::unique_ptr<Communicator> make_nccl_communicator(World& world, const CommOptions& options,
                                                     std::vector<int> ring, GroupComm group);

// Ring slice over NCCL: every exchange is a kernel launch, so slices are larger than for MPI.
inline constexpr int64_t kNcclSliceBytes = 8 << 20;

}  // namespace cz::dist
