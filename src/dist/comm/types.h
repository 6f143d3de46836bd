// Vocabulary of the communication layer: reduction ops, algorithms, backends, collectives, and how a buffer
// of `count` elements is split into per-rank shards (Note [Uneven shards]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"

namespace cz::dist {

enum class ReduceOp : uint8_t { sum, avg };
// builtin: the library's own collectives; ring: our pipelined ring; hier: two levels, inside each host then
// across hosts (Note [Two-level collectives] in hier_communicator.h); automatic ("auto"): hier where the
// topology's cost model predicts it faster for a call, else the ring.
enum class Algorithm : uint8_t { builtin, ring, hier, automatic };
enum class Backend : uint8_t { mpi, nccl };
enum class Collective : uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, send, recv, barrier };

std::string_view name(ReduceOp op);
std::string_view name(Algorithm algo);
std::string_view name(Backend backend);
std::string_view name(Collective kind);
// nccl-tests' bus bandwidth factor for a collective on n ranks (busbw = algbw x factor): commbench's and the
// trainer's comms table's (comms_table.h).
double busbw_factor(Collective kind, int n);
// Parsers throw ValueError listing the accepted names.
ReduceOp parse_reduce_op(std::string_view s);
Algorithm parse_algorithm(std::string_view s);
Backend parse_backend(std::string_view s);
Collective parse_collective(std::string_view s);

// The dtypes collectives move and reduce: f32, f64, f16, bf16 (16-bit types accumulate in f32).
bool is_comm_dtype(DType t);

// Note [Uneven shards]: a buffer of `count` elements is split over `n` ranks in rank order; rank r holds
// shard_count(count, n, r) elements starting at shard_offset(count, n, r), and the first count % n ranks hold
// one element more than the others. Any count works, including count < n (some shards are then empty).
// reduce_scatter leaves rank r with its shard; all_gather assembles the buffer from the shards.
inline int64_t shard_count(int64_t count, int n, int r) {
  return count / n + (r < count % n ? 1 : 0);
}
inline int64_t shard_offset(int64_t count, int n, int r) {
  const int64_t rem = count % n;
  return r * (count / n) + (r < rem ? r : rem);
}

// "all_reduce of 4096 bytes on ranks [0, 1, 2, 3]", for error messages: `ranks` are the world ranks taking
// part.
std::string describe_call(Collective kind, size_t bytes, const std::vector<int>& ranks);
// "[0, 1, 2]" (or "[0..63]" for a long contiguous list).
std::string rank_list(const std::vector<int>& ranks);
std::string rank_list(int world_size);  // ranks 0..world_size-1

}  // namespace cz::dist
