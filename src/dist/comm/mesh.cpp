// The hosts of a launch and the mesh's groups (Note [2-D mesh]).
#include "dist/comm/mesh.h"

#include <algorithm>
#include <charconv>

#include "dist/comm/bootstrap.h"
#include "tensor/check.h"

namespace cz::dist {

int HostMap::ranks_per_host() const {
  if (ranks.empty()) return 0;
  for (const auto& r : ranks)
    if (r.size() != ranks.front().size()) return 0;
  return int(ranks.front().size());
}

HostMap HostMap::of(const std::vector<std::string>& host_of_rank) {
  HostMap m;
  for (size_t r = 0; r < host_of_rank.size(); ++r) {
    const auto it = std::find(m.hosts.begin(), m.hosts.end(), host_of_rank[r]);
    const int h = int(it - m.hosts.begin());
    if (it == m.hosts.end()) {
      m.hosts.push_back(host_of_rank[r]);
      m.ranks.emplace_back();
    }
    m.host_of.push_back(h);
    m.local_index.push_back(int(m.ranks[size_t(h)].size()));
    m.ranks[size_t(h)].push_back(int(r));
  }
  return m;
}

HostMap host_map(const World& world) {
  std::vector<std::string> names;
  for (int r = 0; r < world.size(); ++r) names.push_back(world.peer(r).host);
  return HostMap::of(names);
}

void check_shard_group(const std::string& spec, std::string_view flag) {
  if (spec == "world" || spec == "host") return;
  int size = 0;
  const auto [end, ec] = std::from_chars(spec.data(), spec.data() + spec.size(), size);
  CZ_CHECK(ec == std::errc() && end == spec.data() + spec.size() && size >= 1,
           "{} must be world, host or a number of ranks >= 1, got '{}'", flag, spec);
}

std::vector<std::vector<int>> shard_groups(const std::string& spec, const HostMap& hosts) {
  const int world = int(hosts.host_of.size());
  if (spec == "host") {
    CZ_CHECK(hosts.ranks_per_host() > 0,
             "--shard-group host needs the same number of ranks on every host; this launch has {}", [&] {
               std::string s;
               for (size_t h = 0; h < hosts.hosts.size(); ++h)
                 s += fmt::format("{}{} on {}", h ? ", " : "", hosts.ranks[h].size(), hosts.hosts[h]);
               return s;
             }());
    return hosts.ranks;
  }
  check_shard_group(spec);
  int size = world;
  if (spec != "world") {
    std::from_chars(spec.data(), spec.data() + spec.size(), size);
    CZ_CHECK(world % size == 0, "--shard-group {} does not divide the {} ranks into equal groups", spec,
             world);
  }
  std::vector<std::vector<int>> groups(size_t(world / size));
  for (int r = 0; r < world; ++r) groups[size_t(r / size)].push_back(r);
  return groups;
}

std::vector<std::vector<int>> replicate_groups(const std::vector<std::vector<int>>& shards) {
  std::vector<std::vector<int>> out(shards.empty() ? 0 : shards.front().size());
  for (const auto& g : shards)
    for (size_t i = 0; i < g.size(); ++i) out[i].push_back(g[i]);
  return out;
}

namespace {

// The group among `groups` that holds `rank`.
const std::vector<int>& group_of(const std::vector<std::vector<int>>& groups, int rank) {
  for (const auto& g : groups)
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  throw InternalError(fmt::format("mesh: rank {} is in no group", rank));
}

}  // namespace

Mesh::Mesh(Device device)
    : world_(device), shard_(device), replicate_(device), host_(device), cross_(device) {
  hosts_ = HostMap::of({"localhost"});
}

Mesh::Mesh(World& world, const CommOptions& options, const std::string& shard_spec, bool host_levels,
           bool comm_of_one)
    : Mesh(options.device) {
  hosts_ = host_map(world);
  const int me = world.rank(), n = world.size();
  shard_ = replicate_ = host_ = cross_ = ProcessGroup(options.device, me);
  const auto shards = shard_groups(shard_spec, hosts_);
  const auto replicas = replicate_groups(shards);
  std::vector<std::vector<int>> host_groups, cross_groups;
  if (host_levels) {
    CZ_CHECK(
        hosts_.ranks_per_host() > 0,
        "node-aware communication needs the same number of ranks on every host; this launch has {} ranks "
        "on {} hosts",
        n, hosts_.num_hosts());
    host_groups = hosts_.ranks;
    cross_groups = replicate_groups(host_groups);
  }
  // Every rank creates the same communicators in the same order (each a collective over the world); a group
  // spanning the world shares the world's communicator, a group of one needs none.
  Communicator* world_comm = nullptr;
  if (n > 1 || comm_of_one) {
    CommOptions o = options;
    o.label = kWorldComm;
    comms_.push_back(make_communicator(world, o));
    world_comm = comms_.back().get();
  }
  world_ = ProcessGroup(world_comm, options.device);
  auto group = [&](const std::vector<std::vector<int>>& groups, const char* label) {
    const std::vector<int>& mine = group_of(groups, me);
    if (int(mine.size()) == n) return world_;
    if (mine.size() == 1) return ProcessGroup(options.device, me);
    CommOptions o = options;
    o.members = mine;
    o.ring.clear();
    o.label = label;
    comms_.push_back(make_communicator(world, o));
    return ProcessGroup(comms_.back().get(), options.device);
  };
  shard_ = group(shards, kShardComm);
  replicate_ = group(replicas, kReplicateComm);
  if (host_levels) {
    host_ = group(host_groups, kHostComm);
    cross_ = group(cross_groups, kCrossComm);
  }
}

Mesh::~Mesh() = default;
Mesh::Mesh(Mesh&&) noexcept = default;
Mesh& Mesh::operator=(Mesh&&) noexcept = default;

}  // namespace cz::dist
