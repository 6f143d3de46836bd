// The MPI backend: host buffers directly, CUDA buffers staged through pinned host memory (so several ranks
// can share one GPU). One communication thread per communicator runs the calls in order (Note [Comm
// streams]).
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "dist/comm/communicator.h"

namespace cz::dist {

// What a backend is built on (Note [Groups]): an MPI communicator over the group's ranks, owned by the
// backend from then on, and this process's rank in it.
struct GroupComm {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
};

std::unique_ptr<Communicator> make_mpi_communicator(World& world, const CommOptions& options,
                                                    std::vector<int> ring, GroupComm group);

// Default ring slice for host transfers: large enough to amortise a message, small enough that reducing one
// slice overlaps receiving the next.
inline constexpr int64_t kMpiSliceBytes = 1 << 20;

}  // namespace cz::dist
