// The MPI backend: host buffers directly, CUDA buffers staged through pinned host memory (so several ranks
// can share one GPU). One communication thread per communicator runs the calls in order (Note [Comm
// streams]).
#pragma once

#include <memory>
#include <vector>

#include "dist/comm/communicator.h"

namespace cz::dist {

std::unique_ptr<Communicator> make_mpi_communicator(World& world, const CommOptions& options,
                                                    std::vector<int> ring);

// Default ring slice for host transfers: large enough to amortise a message, small enough that reducing one
// slice overlaps receiving the next.
inline constexpr int64_t kMpiSliceBytes = 1 << 20;

}  // namespace cz::dist
