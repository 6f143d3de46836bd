#include "dist/plan/run_spec.h"

namespace cz::plan {

int shard_group_size(const std::string& shard_group, int world, int per_host) {
  if (shard_group == "world") return world;
  if (shard_group == "host") return per_host;
  return std::stoi(shard_group);
}

}  // namespace cz::plan
