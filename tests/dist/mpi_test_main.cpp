// main() for multi-rank GoogleTest suites run under mpirun: every rank runs the same tests in the same order
// (they are collective), rank 0 prints the usual report, other ranks print only their failures, and all ranks
// exit with the same status.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "dist/comm/bootstrap.h"

namespace {
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  cz::dist::World& world = cz::dist::World::init(&argc, &argv);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (world.rank() != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(world.rank()));
  }
  const int failed = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (world.rank() == 0 && any && !failed) std::fprintf(stderr, "tests failed on another rank (see above)\n");
  cz::dist::World::finalize();
  return any;
}
