// Sharded training checkpoints (docs/checkpoints.md): every rank writes the slices of per-element state it
// owns into its own HDF5 file, in parallel; rank 0 ties them together with an index file whose virtual
// datasets show each full tensor under its timm name in PyTorch shape. A checkpoint becomes visible by a
// directory rename and `latest` is updated after it, so a crash leaves the previous one loadable. Any range
// of any tensor can be read back, at any world size: resharding is a matter of which ranges a rank asks for.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/checkpoint/weights.h"
#include "tensor/flat.h"
#include "tensor/tensor.h"

namespace cz::ckpt {

inline constexpr const char* kFormat = "convnext_zero.checkpoint";
inline constexpr int64_t kVersion = 1;
inline constexpr const char* kIndexFile = "checkpoint.h5";

// A piece of one parameter's per-element state that this rank owns: elements [begin, begin + numel) of the
// row-major flattening of a tensor of `shape` named `name` (a timm parameter name).
// local: (numel) contiguous f32, CPU or CUDA; written from on save, read into on load.
struct ShardSlice {
  std::string name;
  Shape shape;
  int64_t begin = 0;
  int64_t numel = 0;
  Tensor local;
};

// One kind of per-element state with its slices on this rank: "params" (fp32 master weights), "exp_avg",
// "exp_avg_sq", "momentum_buffer", "ema", ... Across all ranks, every element of every tensor of a group must
// be in exactly one slice (save checks it).
struct StateGroup {
  std::string name;
  std::vector<ShardSlice> slices;
};

// The slices of `layout`'s parameters that fall in flat elements [begin, end), whose values are `shard`
// ((end - begin), f32): what a ZeRO partition of a flat buffer owns. Alignment padding is skipped.
std::vector<ShardSlice> slices_of_flat_range(const FlatLayout& layout, int64_t begin, int64_t end,
                                             const Tensor& shard);

// Named small values. Stored as attributes (ints as i64, floats as f64, strings as UTF-8) and, for bytes
// (RNG states and other opaque arrays), as checksummed u8 datasets.
struct Scalars {
  std::map<std::string, int64_t> ints;
  std::map<std::string, double> floats;
  std::map<std::string, std::string> strings;
  std::map<std::string, std::vector<uint8_t>> bytes;

  bool operator==(const Scalars&) const = default;
};

// The few collectives a save needs (no barrier: the broadcasts order everything). src/io sits below the
// communication layer, so the caller adapts its communicator (tests use MPI directly or threads). Every rank
// calls them in the same order, on the thread that called begin_save / finish / save_checkpoint.
class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int64_t all_reduce_max(int64_t value) = 0;
  // Root's `value` on every rank.
  virtual std::string broadcast(const std::string& value, int root) = 0;
};

// A world of one process (single-process training, tools, tests).
class SoloCollective final : public Collective {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int64_t all_reduce_max(int64_t value) override { return value; }
  std::string broadcast(const std::string& value, int) override { return value; }
};

struct TensorInfo {
  std::string name;
  Shape shape;
};

struct SaveRequest {
  std::string dir{};  // the checkpoint folder; the checkpoint is dir/step_<step>
  int64_t step = 0;   // optimizer steps done
  int stage = 0;      // ZeRO stage, recorded for the reader
  int64_t keep = 0;   // keep this many complete checkpoints (the new one included); 0: keep all
  std::vector<StateGroup> groups{};
  // Every tensor each group holds, in model order (rank 0's list is used). When given, a group must cover
  // exactly these, so a tensor no rank wrote is refused instead of silently missing; the checkpoint lists
  // them in this order. When empty, a group holds whatever tensors the ranks' slices name.
  std::vector<TensorInfo> tensors{};
  Scalars scalars{};       // global: rank 0's are written (step, epoch, LR schedule, loss scale, config, ...)
  Scalars rank_scalars{};  // this rank's own (its RNG states), read back with Checkpoint::rank_scalars(rank)
  // Called on the saving thread as the save passes each point ("prepared", "slice", "rank_file",
  // "agreed", "index", "renamed", "latest", "pruned"); the fault tests kill the process from it.
  std::function<void(std::string_view phase)> on_phase{};
};

struct SaveResult {
  std::string path;          // dir/step_<step>
  int64_t bytes = 0;         // all ranks' files together
  int64_t rank_bytes = 0;    // this rank's file
  double write_seconds = 0;  // this rank's file: create to synced
  double prune_seconds = 0;  // rank 0 removing older checkpoints (keep) after the new one became latest
                             // (a background save only renames them here; see ~PendingSave)
};

// A save in progress: this rank's file is being written on a background thread from a host copy of its
// slices, so training may go on (and change the slices) meanwhile.
class PendingSave {
 public:
  PendingSave(PendingSave&&) noexcept;
  PendingSave& operator=(PendingSave&&) noexcept;
  // Waits for the writer thread, and for the removal of the checkpoints this save pruned (Note [Pruning off
  // the critical path]); an unfinished save is abandoned (never visible).
  ~PendingSave();

  // This rank's file is written (or failed); does not block. Ranks may disagree: do not branch a collective
  // on it.
  bool written() const;
  // Collective: waits for this rank's file, agrees with the others that all are written, then makes the
  // checkpoint visible and updates `latest` (rank 0). Throws IoError (every rank, naming the failing rank's
  // file and reason) when any rank failed; the previous checkpoint is untouched then.
  SaveResult finish();

  struct State;  // defined in checkpoint_save.cpp
  explicit PendingSave(std::unique_ptr<State> state);

 private:
  std::unique_ptr<State> state_;
};

// Collective. Prepares dir/.tmp-step_<step> (rank 0), sends rank 0 this rank's slice table (rank 0 checks
// that the slices tile every tensor), copies this rank's slices into host memory (CUDA slices included: a
// device-to-host copy), and starts writing this rank's file on a background thread (then, on rank 0, the
// index). Training stops only for the copy and the small broadcasts; the collectives of the save all happen
// in begin_save and finish(), on the caller's thread. Throws (every rank) only when the folder cannot be
// prepared; any other failure is reported by finish(). One save at a time per folder; `comm` must outlive
// finish().
PendingSave begin_save(SaveRequest request, Collective& comm);

// Collective: begin_save + finish, writing straight from the slices (no host copy of CPU slices).
SaveResult save_checkpoint(SaveRequest request, Collective& comm);

// A complete checkpoint, opened for reading. Needs no collective: each rank reads what it needs. Not
// thread-safe (one Checkpoint per thread).
class Checkpoint {
 public:
  // `path`: a checkpoint folder (the checkpoint `latest` names, or the highest step_N when `latest` is
  // missing or names none) or one checkpoint dir/step_N. Checks the format, version and manifest, that every
  // rank file is present at its recorded size, and that every tensor is covered exactly once; data
  // checksums are verified as data is read (or all at once by verify()). IoError naming the path and what
  // is wrong.
  static Checkpoint open(const std::string& path);

  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;
  ~Checkpoint();

  const std::string& path() const;  // dir/step_N
  int64_t step() const;
  int world_size() const;  // of the run that saved it
  int stage() const;
  const Scalars& scalars() const;
  Scalars rank_scalars(int rank) const;  // 0 <= rank < world_size()

  std::vector<std::string> groups() const;
  bool has(const std::string& group, const std::string& name) const;
  const std::vector<TensorInfo>& tensors(const std::string& group) const;  // in save order
  const Shape& shape(const std::string& group, const std::string& name) const;

  // Elements [begin, begin + out.numel()) of the flattening of tensor `name` of `group` into `out` ((n)
  // contiguous f32, CPU or CUDA). Reads only the rank files' chunks that hold the range (each checksum
  // verified); a CUDA `out` goes through a host buffer of at most a few MiB.
  void read(const std::string& group, const std::string& name, int64_t begin, const Tensor& out) const;
  // Fills each slice's `local` from `group` (name, shape and range must match the checkpoint's).
  void read_slices(const std::string& group, const std::vector<ShardSlice>& slices) const;
  // One whole tensor, f32 on the CPU, in its shape.
  Tensor read_tensor(const std::string& group, const std::string& name) const;
  // Reads every dataset of every rank file (so every checksum), one at a time. Throws on the first fault.
  void verify() const;

  struct Impl;  // defined in checkpoint_load.cpp
  explicit Checkpoint(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

// Writes tensor group `group` ("params" or "ema") of a checkpoint as a weight file (timm names, PyTorch
// shapes; io/checkpoint/weights.h), one tensor at a time: no more than the largest tensor is in memory at
// once. The checkpoint's `class_names` scalar, when it has one, becomes the file's attribute (unless
// `options` name classes themselves).
void export_weights(const Checkpoint& ckpt, const std::string& group, const std::string& path,
                    const WeightExportOptions& options = {});

// The checkpoint `path` resolves to, as Checkpoint::open would pick it, without opening it.
std::string resolve_checkpoint(const std::string& path);

}  // namespace cz::ckpt
