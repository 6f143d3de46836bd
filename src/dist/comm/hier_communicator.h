// Node-aware ("hier") collectives: all-reduce, reduce-scatter and all-gather in two levels, inside each host
// and across hosts, over a host communicator and a cross-host communicator; and the automatic choice between
// them and the flat ring (Note [Two-level cost model] in topology.h).
//
// Note [Two-level collectives]: the world is H hosts of R ranks each (HostMap; every host must have the
// same number); world rank w is local rank l = local_index[w] on host h = host_of[w]. The host group is the
// R ranks of a host, the cross group l the ranks with local index l on every host (rank h in it is on host
// h). Each collective is a chain of collectives on those groups, each waiting for the one before:
//   all-reduce:     reduce-scatter inside the host (local rank l keeps host shard l of the buffer),
//   all-reduce
//                   of that shard across hosts in cross group l, all-gather inside the host. No copy.
//   reduce-scatter: rank w must end with world shard w (Note [Uneven shards], n = HR), which lies wherever
//                   the count puts it. One local copy packs the input into a scratch buffer of HR slots of
//                   S = ceil(count / HR) elements: slot l*H + h holds world shard ranks[h][l] (zero-padded to
//                   S; in pieces, Note [Two-level pipeline]). A reduce-scatter of that inside the host leaves
//                   local rank l the slots of its cross group, all even shards, summed over the host; a
//                   reduce-scatter of those in the cross group leaves cross rank h its slot, summed over the
//                   world; its first shard_count elements are the result. The padding is fewer than HR
//                   elements.
//   all-gather:     the reverse: the shard goes to its slot, all-gather in the cross group, then inside the
//                   host, and one local copy unpacks the slots into the flat layout.
// Note [Two-level pipeline]: the levels depend on each other, so run as three whole steps the host's network
// idles while the host reduces, and the host's links while the network works: on the bed (2 hosts x 2 CPU
// ranks, 1 Gbit/s) a 4 MiB all-reduce reached 1.24x the flat ring's bus bandwidth where the bytes on the
// network promised 1.5x. A call of more than kPieceBytes is cut into up to kMaxPieces pieces (of the buffer
// for all-reduce; of every slot for reduce-scatter and all-gather, the scratch laid out piece by piece so
// that each piece's slots are one contiguous buffer), and each piece's next step is submitted as soon as its
// previous one finished: piece k crosses hosts while piece k+1 is reduced inside the host. Every rank cuts
// alike and submits in the same order, so each sub-communicator runs the same sequence on every rank (host:
// the first steps of pieces 0..P-1, then their last steps; cross: pieces 0..P-1). The sums are those of the
// unpieced algorithm, element by element.
//
// Averages average at each level (1/R, then 1/H). Broadcast, barrier and send/recv go to a flat ring
// communicator over the world, at once: they do not queue behind the two-level calls (a send must be able to
// meet its receive while a two-level call waits). With one host, or one rank per host, the two levels are
// the flat ring, and the factory returns one.
//
// CPU (MPI backend): submit() queues the call to the communicator's own thread, which issues each step on
// the sub-communicators and waits for its Work before the next (Note [Comm streams]: the caller never
// blocks). The sub-communicators have their own threads, so this thread only waits, and packs and unpacks
// reduce-scatter's and all-gather's slots through its scratch (kept between calls, grown as a larger call
// comes). Each thread goes by a label of its own (current_communicator(), and the planner's replay of their
// scratch, src/dist/plan/engine_events.cpp): this thread by the communicator's label, the flat ring, host and
// cross communicators' by that label with kFlatLevel, kHostLevel and kCrossLevel after it ("world.host").
// CUDA (NCCL backend): a sub-collective's Work::wait() only orders the caller's stream after it, so the steps
// are issued inline from submit(), the copies on the caller's current stream (not run on a GPU yet: no GPU
// here). CUDA buffers through the MPI backend are not taken by hier (the flat ring stages them; auto routes
// them there).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/comm/communicator.h"

namespace cz::dist {

class Topology;
struct HostMap;

// The inner communicators' labels: the two-level communicator's own label followed by these.
inline constexpr const char* kFlatLevel = ".flat";
inline constexpr const char* kHostLevel = ".host";
inline constexpr const char* kCrossLevel = ".cross";

// Note [Two-level pipeline]: pieces of at least this size, at most this many.
inline constexpr int64_t kTwoLevelPieceBytes = 1 << 20;
inline constexpr int64_t kTwoLevelMaxPieces = 4;

// The pieces a two-level `kind` call of `count` elements (`bytes`) is cut into on hosts of `n` ranks in all
// (all-reduce: pieces of the buffer; reduce-scatter and all-gather: of every slot, of ceil(count / n)).
int two_level_pieces(Collective kind, int64_t count, size_t bytes, int n);

// Whether a `kind` call of `bytes` on `device` takes the two levels on a world communicator of `algorithm`
// (hier or automatic) over `backend`, whose flat ring is `ring` on `topology`, with `host_groups` the world
// ranks of each host (equal sizes, more than one rank each): hier always (ValueError for CUDA buffers through
// the MPI backend); auto where the cost model says (Note [Two-level cost model]). What the communicator
// decides per call, and what the memory planner replays.
bool takes_two_levels(Algorithm algorithm, Backend backend, const Topology& topology,
                      const std::vector<int>& ring, const std::vector<std::vector<int>>& host_groups,
                      Collective kind, size_t bytes, Device device);

// What --impl / --comm-impl hier or auto does on this launch (collective over the world: it detects the
// topology). `options.algorithm` is hier or automatic, options.members empty. Returns the flat ring when
// there is one host or one rank per host, and for auto when the hosts differ in size; ValueError for hier
// when they do.
std::unique_ptr<Communicator> make_two_level_communicator(World& world, const CommOptions& options);

// The communicator behind it when two levels apply; `flat`, `host` and `cross` are this rank's world ring,
// host group and cross group communicators (the host group ordered by local index, the cross group by host).
std::unique_ptr<Communicator> make_hier_communicator(const CommOptions& options, const HostMap& hosts,
                                                     const Topology& topology,
                                                     std::unique_ptr<Communicator> flat,
                                                     std::unique_ptr<Communicator> host,
                                                     std::unique_ptr<Communicator> cross);

}  // namespace cz::dist
