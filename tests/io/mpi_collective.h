// ckpt::Collective over MPI_COMM_WORLD, for the multi-rank checkpoint tests and the checkpoint benchmark
// (the trainer adapts its own communicator instead; src/io cannot see src/dist).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

#include "io/checkpoint/checkpoint.h"

namespace cz::testing {

class MpiCollective final : public ckpt::Collective {
 public:
  int rank() const override {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }
  int size() const override {
    int n = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
  }
  void barrier() { MPI_Barrier(MPI_COMM_WORLD); }
  int64_t all_reduce_max(int64_t value) override {
    int64_t out = 0;
    MPI_Allreduce(&value, &out, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    return out;
  }
  std::string broadcast(const std::string& value, int root) override {
    int64_t n = int64_t(value.size());
    MPI_Bcast(&n, 1, MPI_INT64_T, root, MPI_COMM_WORLD);
    std::string out = rank() == root ? value : std::string(size_t(n), '\0');
    MPI_Bcast(out.data(), int(n), MPI_CHAR, root, MPI_COMM_WORLD);
    return out;
  }
};

}  // namespace cz::testing
