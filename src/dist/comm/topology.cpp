// Topology trees: JSON in and out, the depth-first ring, and the link-load cost model.
#include "dist/comm/topology.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include "tensor/check.h"

namespace cz::dist {

Topology::Topology(std::vector<TopoNode> nodes) : nodes_(std::move(nodes)) {
  index();
}

void Topology::index() {
  const int n = int(nodes_.size());
  std::set<std::string> ids;
  for (auto& node : nodes_) {
    CZ_CHECK(!node.id.empty(), "topology: a node has no id");
    CZ_CHECK(ids.insert(node.id).second, "topology: node id '{}' appears twice", node.id);
    node.children.clear();
  }
  for (int i = 0; i < n; ++i) {
    const int p = nodes_[size_t(i)].parent;
    CZ_CHECK(p >= -1 && p < n && p != i, "topology: node '{}' has an invalid parent", nodes_[size_t(i)].id);
    if (p >= 0) nodes_[size_t(p)].children.push_back(i);
  }
  for (int i = 0; i < n; ++i) {  // no cycles: every chain of parents ends within n steps
    int p = i, steps = 0;
    while (p >= 0 && steps <= n) p = nodes_[size_t(p)].parent, ++steps;
    CZ_CHECK(p < 0, "topology: the parents of node '{}' form a cycle", nodes_[size_t(i)].id);
  }
  std::map<int, int> where;
  for (int i = 0; i < n; ++i) {
    for (int r : nodes_[size_t(i)].ranks) {
      CZ_CHECK(r >= 0, "topology: node '{}' has negative rank {}", nodes_[size_t(i)].id, r);
      auto [it, fresh] = where.emplace(r, i);
      CZ_CHECK(fresh, "topology: rank {} is on both '{}' and '{}'", r, nodes_[size_t(it->second)].id,
               nodes_[size_t(i)].id);
    }
  }
  num_ranks_ = int(where.size());
  rank_node_.assign(size_t(num_ranks_), -1);
  for (auto [r, i] : where) {
    CZ_CHECK(r < num_ranks_, "topology: ranks must be 0..{} (each once) but rank {} appears", num_ranks_ - 1,
             r);
    rank_node_[size_t(r)] = i;
  }
}

int Topology::find(const std::string& id) const {
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].id == id) return int(i);
  return -1;
}

Topology Topology::from_json(const nlohmann::json& j) {
  CZ_CHECK(j.is_object() && j.contains("nodes") && j["nodes"].is_array(),
           "topology: expected an object with a \"nodes\" array");
  std::vector<TopoNode> nodes;
  std::vector<std::string> parents;
  std::map<std::string, int> index;
  for (const auto& jn : j["nodes"]) {
    CZ_CHECK(jn.is_object(), "topology: every node must be an object, got {}", jn.dump());
    CZ_CHECK(jn.contains("id") && jn["id"].is_string(), "topology: node without a string \"id\": {}",
             jn.dump());
    TopoNode node;
    node.id = jn["id"].get<std::string>();
    node.type = jn.value("type", std::string());
    node.extra = nlohmann::ordered_json::object();
    for (auto it = jn.begin(); it != jn.end(); ++it) {
      const std::string& key = it.key();
      if (key == "id" || key == "type" || key == "parent") continue;
      if (key == "up_gbps") {
        CZ_CHECK(it->is_number() && it->get<double>() >= 0,
                 "topology: node '{}': up_gbps must be a number >= 0", node.id);
        node.up_gbps = it->get<double>();
      } else if (key == "rank") {
        CZ_CHECK(it->is_number_integer(), "topology: node '{}': rank must be an integer", node.id);
        node.ranks.push_back(it->get<int>());
      } else if (key == "ranks") {
        CZ_CHECK(it->is_array(), "topology: node '{}': ranks must be an array of integers", node.id);
        for (const auto& r : *it) {
          CZ_CHECK(r.is_number_integer(), "topology: node '{}': ranks must be integers", node.id);
          node.ranks.push_back(r.get<int>());
        }
      } else {
        node.extra[key] = nlohmann::ordered_json::parse(it->dump());
      }
    }
    parents.push_back(jn.contains("parent") && !jn["parent"].is_null() ? jn["parent"].get<std::string>()
                                                                       : "");
    CZ_CHECK(index.emplace(node.id, int(nodes.size())).second, "topology: node id '{}' appears twice",
             node.id);
    nodes.push_back(std::move(node));
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (parents[i].empty()) continue;
    auto it = index.find(parents[i]);
    CZ_CHECK(it != index.end(), "topology: node '{}' names parent '{}', which is not a node", nodes[i].id,
             parents[i]);
    nodes[i].parent = it->second;
  }
  return Topology(std::move(nodes));
}

Topology Topology::load(const std::string& path) {
  std::ifstream f(path);
  CZ_CHECK_IO(f.good(), "topology: cannot open '{}'", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw IoError(fmt::format("topology: '{}' is not valid JSON: {}", path, e.what()));
  }
  return from_json(j);
}

nlohmann::ordered_json Topology::to_json() const {
  nlohmann::ordered_json nodes = nlohmann::ordered_json::array();
  for (const auto& n : nodes_) {
    nlohmann::ordered_json j;
    j["id"] = n.id;
    j["type"] = n.type;
    if (n.parent >= 0) j["parent"] = nodes_[size_t(n.parent)].id;
    j["up_gbps"] = n.up_gbps;
    if (n.ranks.size() == 1) j["rank"] = n.ranks[0];
    if (n.ranks.size() > 1) j["ranks"] = n.ranks;
    if (n.extra.is_object())
      for (auto it = n.extra.begin(); it != n.extra.end(); ++it) j[it.key()] = *it;
    nodes.push_back(std::move(j));
  }
  nlohmann::ordered_json out;
  out["nodes"] = std::move(nodes);
  return out;
}

std::string Topology::to_json_string() const {
  const auto j = to_json();
  std::string s = "{\"nodes\": [\n";
  const auto& nodes = j["nodes"];
  for (size_t i = 0; i < nodes.size(); ++i)
    s += "  " + nodes[i].dump() + (i + 1 < nodes.size() ? ",\n" : "\n");
  return s + "]}\n";
}

std::vector<int> Topology::ring_order() const {
  const int n = int(nodes_.size());
  // Lowest rank in each subtree, to order siblings (and roots) deterministically.
  std::vector<int> lowest(size_t(n), std::numeric_limits<int>::max());
  std::function<int(int)> low = [&](int i) {
    int m = std::numeric_limits<int>::max();
    for (int r : nodes_[size_t(i)].ranks) m = std::min(m, r);
    for (int c : nodes_[size_t(i)].children) m = std::min(m, low(c));
    return lowest[size_t(i)] = m;
  };
  std::vector<int> roots;
  for (int i = 0; i < n; ++i)
    if (nodes_[size_t(i)].parent < 0) roots.push_back(i), low(i);
  auto by_lowest = [&](int a, int b) {
    return lowest[size_t(a)] != lowest[size_t(b)] ? lowest[size_t(a)] < lowest[size_t(b)] : a < b;
  };
  std::vector<int> order;
  std::function<void(int)> walk = [&](int i) {
    std::vector<int> ranks = nodes_[size_t(i)].ranks;
    std::sort(ranks.begin(), ranks.end());
    order.insert(order.end(), ranks.begin(), ranks.end());
    std::vector<int> kids = nodes_[size_t(i)].children;
    std::sort(kids.begin(), kids.end(), by_lowest);
    for (int c : kids) walk(c);
  };
  std::sort(roots.begin(), roots.end(), by_lowest);
  for (int r : roots) walk(r);
  return order;
}

void Topology::path(int a, int b, std::vector<int>& up, std::vector<int>& down) const {
  up.clear();
  down.clear();
  if (a == b) return;
  std::vector<int> anc_a, anc_b;  // the node itself first, then its ancestors
  for (int p = a; p >= 0; p = nodes_[size_t(p)].parent) anc_a.push_back(p);
  for (int p = b; p >= 0; p = nodes_[size_t(p)].parent) anc_b.push_back(p);
  // Strip the common top; what remains below the common ancestor are the links crossed. Without a common
  // ancestor (different hosts) both chains go all the way up: the hosts' network links are crossed.
  while (!anc_a.empty() && !anc_b.empty() && anc_a.back() == anc_b.back()) anc_a.pop_back(), anc_b.pop_back();
  up = anc_a;
  down.assign(anc_b.rbegin(), anc_b.rend());
}

std::vector<LinkLoad> Topology::link_loads(const std::vector<int>& order) const {
  std::vector<LinkLoad> loads(nodes_.size());
  for (size_t i = 0; i < nodes_.size(); ++i) loads[i].node = int(i);
  std::vector<int> up, down;
  const size_t n = order.size();
  for (size_t i = 0; i < n && n > 1; ++i) {
    path(node_of_rank(order[i]), node_of_rank(order[(i + 1) % n]), up, down);
    for (int u : up) ++loads[size_t(u)].up;
    for (int d : down) ++loads[size_t(d)].down;
  }
  return loads;
}

RingPrediction Topology::predict(const std::vector<int>& order, double bytes, Collective kind,
                                 const CostModel& model) const {
  CZ_CHECK(int(order.size()) == num_ranks_, "topology: a ring of {} ranks on a topology of {}", order.size(),
           num_ranks_);
  return predict_rings({order}, bytes, kind, model);
}

RingPrediction Topology::predict_rings(const std::vector<std::vector<int>>& rings, double bytes,
                                       Collective kind, const CostModel& model) const {
  RingPrediction p;
  if (rings.empty()) return p;
  const int n = int(rings.front().size());
  for (const auto& r : rings)
    CZ_CHECK(int(r.size()) == n, "topology: rings running at once must have one size, got {} and {}", n,
             r.size());
  if (n < 2) return p;
  const double chunk = bytes / n;
  std::vector<LinkLoad> loads(nodes_.size());
  for (const auto& r : rings) {
    const auto one = link_loads(r);
    for (size_t i = 0; i < loads.size(); ++i) loads[i].up += one[i].up, loads[i].down += one[i].down;
  }
  double slowest = 0;
  for (size_t i = 0; i < loads.size(); ++i) {
    const int load = std::max(loads[i].up, loads[i].down);
    if (load == 0) continue;
    const TopoNode& node = nodes_[i];
    CZ_CHECK(node.up_gbps > 0, "topology: ring hops cross the uplink of '{}', which has no up_gbps", node.id);
    const double t = load * chunk / (node.up_gbps * 1e9);
    if (t > slowest) {
      slowest = t;
      p.max_link_load = load;
      p.bottleneck = fmt::format("{} (up {:g} GB/s, {} hop{} per direction)", node.id, node.up_gbps, load,
                                 load == 1 ? "" : "s");
    }
  }
  size_t longest = 0;
  std::vector<int> up, down;
  for (const auto& r : rings)
    for (int i = 0; i < n; ++i) {
      path(node_of_rank(r[size_t(i)]), node_of_rank(r[size_t((i + 1) % n)]), up, down);
      longest = std::max(longest, up.size() + down.size());
    }
  const double step = slowest + (model.step_overhead_us + model.link_latency_us * double(longest)) * 1e-6;
  const int steps = kind == Collective::all_reduce ? 2 * (n - 1) : n - 1;
  p.time_s = steps * step;
  p.algbw_gbps = bytes / p.time_s / 1e9;
  const double factor = kind == Collective::all_reduce ? 2.0 * (n - 1) / n : double(n - 1) / n;
  p.busbw_gbps = p.algbw_gbps * factor;
  return p;
}

std::vector<int> Topology::restrict_ring(const std::vector<int>& order, const std::vector<int>& ranks) const {
  std::vector<int> out;
  for (int r : order)
    if (std::find(ranks.begin(), ranks.end(), r) != ranks.end()) out.push_back(r);
  return out;
}

TwoLevelPrediction Topology::predict_two_level(const std::vector<int>& order,
                                               const std::vector<std::vector<int>>& host_groups, double bytes,
                                               Collective kind, const CostModel& model) const {
  CZ_CHECK(
      kind == Collective::all_reduce || kind == Collective::reduce_scatter || kind == Collective::all_gather,
      "topology: no two-level form of {}", name(kind));
  CZ_CHECK(!host_groups.empty(), "topology: no hosts");
  const size_t per_host = host_groups.front().size();
  std::vector<std::vector<int>> host_rings, cross_rings(per_host);
  for (const auto& g : host_groups) {
    CZ_CHECK(g.size() == per_host, "topology: two-level collectives need equal hosts, got {} and {} ranks",
             per_host, g.size());
    host_rings.push_back(restrict_ring(order, g));
    for (size_t l = 0; l < per_host; ++l) cross_rings[l].push_back(g[l]);
  }
  for (auto& c : cross_rings) c = restrict_ring(order, c);
  TwoLevelPrediction t;
  const RingPrediction flat = predict(order, bytes, kind, model);
  t.flat_s = flat.time_s;
  const double share = bytes / double(per_host);
  const Collective cross_kind = kind;  // all-reduce's middle phase is an all-reduce of the host shard
  const RingPrediction cross = predict_rings(cross_rings, share, cross_kind, model);
  const double inside = predict_rings(host_rings, bytes, Collective::reduce_scatter, model).time_s;
  t.hier_s = cross.time_s + (kind == Collective::all_reduce ? 2 * inside : inside);
  t.reason = fmt::format(
      "{}: predicted {:.3g} ms against {:.3g} ms for the flat ring ({} of {} bytes, {} hosts x {} ranks; "
      "flat "
      "ring bottleneck: {}; cross-host bottleneck: {})",
      t.hier_faster() ? "hier" : "ring", t.hier_s * 1e3, t.flat_s * 1e3, name(kind), bytes,
      host_groups.size(), per_host, flat.bottleneck.empty() ? "none" : flat.bottleneck,
      cross.bottleneck.empty() ? "none" : cross.bottleneck);
  return t;
}

}  // namespace cz::dist
