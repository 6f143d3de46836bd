// Names and parsers for the communication layer's enums.
#include "dist/comm/types.h"

#include <array>

#include "tensor/check.h"

namespace cz::dist {
namespace {
template <class E, size_t N>
E parse_enum(std::string_view s, const std::array<E, N>& values, const char* what) {
  std::string accepted;
  for (E v : values) {
    if (name(v) == s) return v;
    accepted += (accepted.empty() ? "" : ", ") + std::string(name(v));
  }
  throw ValueError(fmt::format("unknown {} '{}' (expected one of: {})", what, s, accepted));
}
}  // namespace

std::string_view name(ReduceOp op) {
  return op == ReduceOp::sum ? "sum" : "avg";
}
std::string_view name(Algorithm algo) {
  switch (algo) {
    case Algorithm::builtin:
      return "builtin";
    case Algorithm::ring:
      return "ring";
    case Algorithm::hier:
      return "hier";
    case Algorithm::automatic:
      return "auto";
  }
  return "?";
}
std::string_view name(Backend backend) {
  return backend == Backend::mpi ? "mpi" : "nccl";
}
std::string_view name(Collective kind) {
  switch (kind) {
    case Collective::all_reduce:
      return "all_reduce";
    case Collective::reduce_scatter:
      return "reduce_scatter";
    case Collective::all_gather:
      return "all_gather";
    case Collective::broadcast:
      return "broadcast";
    case Collective::send:
      return "send";
    case Collective::recv:
      return "recv";
    case Collective::barrier:
      return "barrier";
  }
  return "?";
}

ReduceOp parse_reduce_op(std::string_view s) {
  return parse_enum(s, std::array{ReduceOp::sum, ReduceOp::avg}, "reduction op");
}
Algorithm parse_algorithm(std::string_view s) {
  return parse_enum(s, std::array{Algorithm::builtin, Algorithm::ring, Algorithm::hier, Algorithm::automatic},
                    "algorithm");
}
Backend parse_backend(std::string_view s) {
  return parse_enum(s, std::array{Backend::mpi, Backend::nccl}, "backend");
}
Collective parse_collective(std::string_view s) {
  return parse_enum(
      s,
      std::array{Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather,
                 Collective::broadcast, Collective::send, Collective::recv, Collective::barrier},
      "collective");
}

bool is_comm_dtype(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

std::string rank_list(const std::vector<int>& ranks) {
  bool contiguous = !ranks.empty();
  for (size_t i = 1; contiguous && i < ranks.size(); ++i) contiguous = ranks[i] == ranks[i - 1] + 1;
  if (contiguous && ranks.size() > 16) return fmt::format("[{}..{}]", ranks.front(), ranks.back());
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

std::string rank_list(int world_size) {
  std::vector<int> ranks(size_t(std::max(world_size, 0)));
  for (int r = 0; r < world_size; ++r) ranks[size_t(r)] = r;
  return rank_list(ranks);
}

std::string describe_call(Collective kind, size_t bytes, const std::vector<int>& ranks) {
  return fmt::format("{} of {} bytes on ranks {}", name(kind), bytes, rank_list(ranks));
}

double busbw_factor(Collective kind, int n) {
  switch (kind) {
    case Collective::all_reduce:
      return 2.0 * (n - 1) / n;
    case Collective::reduce_scatter:
    case Collective::all_gather:
      return double(n - 1) / n;
    default:
      return 1.0;
  }
}

}  // namespace cz::dist
