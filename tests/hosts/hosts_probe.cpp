// What each rank of a job sees of its host: the host name, and the group MPI_Comm_split_type(SHARED) puts it
// in. Rank 0 prints one line per rank; a 1 MiB all-reduce inside each group (shared memory) and one across
// the world (TCP between hosts) check that both paths carry data. Used by tests/hosts/run_hosts_tests.sh.
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(local, &local_rank);
  MPI_Comm_size(local, &local_size);

  // Each rank's lowest world rank in its shared group names the group.
  int leader = rank;
  MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, local);

  constexpr int kCount = 1 << 18;  // 1 MiB of floats
  std::vector<float> buf(kCount, 1.0f);
  MPI_Allreduce(MPI_IN_PLACE, buf.data(), kCount, MPI_FLOAT, MPI_SUM, local);
  bool ok = buf.front() == float(local_size) && buf.back() == float(local_size);
  std::fill(buf.begin(), buf.end(), 1.0f);
  MPI_Allreduce(MPI_IN_PLACE, buf.data(), kCount, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  ok = ok && buf.front() == float(size) && buf.back() == float(size);

  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  constexpr int kLine = 256;
  char line[kLine] = {};
  std::snprintf(line, kLine, "rank %d host %s local_rank %d local_size %d group %d sums %s", rank, host,
                local_rank, local_size, leader, ok ? "ok" : "WRONG");
  std::vector<char> all(rank == 0 ? size_t(size) * kLine : 0);
  MPI_Gather(line, kLine, MPI_CHAR, all.data(), kLine, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank == 0)
    for (int r = 0; r < size; ++r) std::printf("%s\n", &all[size_t(r) * kLine]);
  MPI_Comm_free(&local);
  MPI_Finalize();
  return 0;
}
