// cz_h5_probe FILE MEMORY_BYTES SAMPLE_BYTES SECONDS: opens FILE with libhdf5 under a memory limit and walks
// all its metadata and a bounded sample of its data, so that a crash inside the library happens here rather
// than in the program that wants to read the file (Note [Probing HDF5 files] in h5_probe.h). A standalone
// executable: libhdf5 and the C++ runtime only, none of convnext_zero's libraries.
#include <hdf5.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "h5_probe_protocol.h"

namespace {

namespace protocol = cz::h5::probe_protocol;

// Attribute values and sampled elements larger than this are not read (the metadata still is).
constexpr size_t kMaxValueBytes = size_t{1} << 20;

// One line to stdout with one write(2), nothing buffered: the caller must see it even if the next call
// crashes.
void say(const char* format, ...) {
  char line[1024];
  va_list args;
  va_start(args, format);
  int n = std::vsnprintf(line, sizeof(line) - 1, format, args);
  va_end(args);
  n = std::clamp(n, 0, int(sizeof(line)) - 2);
  line[n] = '\n';
  for (size_t done = 0; done < size_t(n) + 1;) {
    const ssize_t w = ::write(1, line + done, size_t(n) + 1 - done);
    if (w <= 0) return;
    done += size_t(w);
  }
}

// Names from a corrupt file may hold anything: keep them printable and short.
std::string printable(const char* name) {
  std::string s;
  for (const char* p = name; *p && s.size() < 200; ++p) s += (*p >= 0x20 && *p < 0x7f) ? *p : '?';
  return s;
}

// HDF5 closes nothing for us: every id we open is closed when it leaves scope.
class Id {
 public:
  explicit Id(hid_t id) : id_(id) {}
  ~Id() {
    if (id_ >= 0) H5Idec_ref(id_);
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
};

struct Walk {
  size_t sample_budget = 0;
  size_t sampled = 0;
  int64_t objects = 0, datasets = 0, unsampled = 0;
  std::string phase;
  std::set<std::string> sources;    // files virtual datasets map from, reported once each
  std::set<std::string> externals;  // files external links point into, reported once each
};

void at(Walk& w, std::string phase) {
  w.phase = std::move(phase);
  say("%s%s", protocol::kAt, w.phase.c_str());
}

[[noreturn]] void unsafe(const std::string& reason) {
  say("%s%s", protocol::kUnsafe, reason.c_str());
  ::_exit(protocol::kExitUnsafe);
}

[[noreturn]] void out_of_memory(const Walk& w) {
  say("%s%s", protocol::kMemory, w.phase.c_str());
  ::_exit(protocol::kExitMemory);
}

// After an HDF5 call failed: a failed allocation (the memory limit) ends the probe; any other error is HDF5
// refusing the file cleanly, which the caller's own open will report, so the walk goes on elsewhere.
void failed(const Walk& w) {
  bool memory = false;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* data) -> herr_t {
        // "Can't allocate space" is reported under the failing layer's major (H5E_CACHE, H5E_HEAP, ...).
        if (e->min_num == H5E_NOSPACE || e->min_num == H5E_CANTALLOC) *static_cast<bool*>(data) = true;
        return 0;
      },
      &memory);
  H5Eclear2(H5E_DEFAULT);
  if (memory) out_of_memory(w);
}

bool has_variable_parts(hid_t type) {
  return H5Tdetect_class(type, H5T_VLEN) != 0 || H5Tis_variable_str(type) != 0;
}

// Reads `count` elements selected in `file_space` (nullptr: the whole, scalar, space) with the native form
// of `type`, and gives back what HDF5 allocated for variable-length values.
void read_values(const Walk& w, hid_t type, hsize_t count, bool attribute, hid_t object, hid_t file_space) {
  const Id native(H5Tget_native_type(type, H5T_DIR_ASCEND));
  if (!native.ok()) return failed(w);
  const size_t size = H5Tget_size(native.get());
  if (size == 0 || count == 0 || size > kMaxValueBytes / count) return;
  std::vector<unsigned char> buffer(size * count);
  const Id memory_space(H5Screate_simple(1, &count, nullptr));
  herr_t status;
  if (attribute)
    status = H5Aread(object, native.get(), buffer.data());
  else
    status = H5Dread(object, native.get(), memory_space.get(), file_space, H5P_DEFAULT, buffer.data());
  if (status < 0) return failed(w);
  if (has_variable_parts(native.get()))
    H5Dvlen_reclaim(native.get(), memory_space.get(), H5P_DEFAULT, buffer.data());
}

herr_t visit_attribute(hid_t object, const char* name, const H5A_info_t*, void* data) {
  Walk& w = *static_cast<Walk*>(data);
  const Id attr(H5Aopen(object, name, H5P_DEFAULT));
  if (!attr.ok()) return failed(w), 0;
  const Id type(H5Aget_type(attr.get()));
  const Id space(H5Aget_space(attr.get()));
  if (!type.ok() || !space.ok()) return failed(w), 0;
  const hssize_t count = H5Sget_simple_extent_npoints(space.get());
  if (count < 0) return failed(w), 0;
  read_values(w, type.get(), hsize_t(count), /*attribute=*/true, attr.get(), H5S_ALL);
  return 0;
}

// Every chunk's entry in the chunk index (B-tree, fixed or extensible array), through the first and the
// last chunk's address.
void walk_chunk_index(const Walk& w, hid_t ds) {
  hsize_t chunks = 0;
  if (H5Dget_num_chunks(ds, H5S_ALL, &chunks) < 0) return failed(w);
  hsize_t offset[H5S_MAX_RANK];
  unsigned mask = 0;
  haddr_t address = 0;
  hsize_t bytes = 0;
  for (hsize_t i : {hsize_t{0}, chunks - 1})
    if (chunks > 0 && H5Dget_chunk_info(ds, H5S_ALL, i, offset, &mask, &address, &bytes) < 0)
      return failed(w);
}

// Every mapping's selections and names. The source files are named to the caller ("source" lines), which
// probes them before reading through the virtual dataset ("." is this file).
void walk_virtual_mappings(Walk& w, hid_t dcpl) {
  size_t count = 0;
  if (H5Pget_virtual_count(dcpl, &count) < 0) return failed(w);
  std::vector<char> text;
  for (size_t i = 0; i < count; ++i) {
    const Id vspace(H5Pget_virtual_vspace(dcpl, i));
    const Id source_space(H5Pget_virtual_srcspace(dcpl, i));
    if (!vspace.ok() || !source_space.ok()) return failed(w);
    for (auto get : {H5Pget_virtual_dsetname, H5Pget_virtual_filename}) {
      const ssize_t n = get(dcpl, i, nullptr, 0);
      if (n < 0) return failed(w);
      text.resize(size_t(n) + 1);
      if (get(dcpl, i, text.data(), text.size()) < 0) return failed(w);
    }
    const std::string file = text.data();  // the file name, read last
    if (file != "." && file.find('\n') == std::string::npos && w.sources.insert(file).second)
      say("%s%s", protocol::kSource, file.c_str());
  }
}

void visit_dataset(Walk& w, hid_t ds, const std::string& name) {
  ++w.datasets;
  const Id type(H5Dget_type(ds));
  const Id space(H5Dget_space(ds));
  const Id dcpl(H5Dget_create_plist(ds));
  if (!type.ok() || !space.ok() || !dcpl.ok()) return failed(w);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  const hssize_t points = H5Sget_simple_extent_npoints(space.get());
  if (rank < 0 || rank > H5S_MAX_RANK || points < 0) return failed(w);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0 && H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0) return failed(w);
  const int filters = H5Pget_nfilters(dcpl.get());
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, config = 0, values[16];
    size_t nvalues = 16;
    char filter_name[128];
    if (H5Pget_filter2(dcpl.get(), unsigned(i), &flags, &nvalues, values, sizeof(filter_name), filter_name,
                       &config) < 0)
      failed(w);
  }
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  const size_t element = H5Tget_size(type.get());
  size_t touched = 2 * element;  // bytes a sample of the first and the last element makes HDF5 read
  if (layout == H5D_CHUNKED) {
    hsize_t chunk[H5S_MAX_RANK];
    const int chunk_rank = H5Pget_chunk(dcpl.get(), H5S_MAX_RANK, chunk);
    if (chunk_rank < 0) return failed(w);
    touched = 2 * element;
    for (int i = 0; i < chunk_rank; ++i)
      touched = chunk[i] > 0 && touched > SIZE_MAX / chunk[i] ? SIZE_MAX : touched * chunk[i];
    walk_chunk_index(w, ds);
  } else if (layout == H5D_VIRTUAL) {
    // The sources are other files, probed when they are opened (a checkpoint's rank files); our readers
    // never read through the virtual dataset.
    walk_virtual_mappings(w, dcpl.get());
    return;
  } else if (layout == H5D_COMPACT && !has_variable_parts(type.get())) {
    // libhdf5 1.10 copies a compact dataset out of its stored bytes without checking that they hold the
    // whole dataset (fuzz/known_crashes/libhdf5_memcpyvv_heap_overflow.h5: 9 bytes for 16).
    const hsize_t stored = H5Dget_storage_size(ds);
    if (stored < hsize_t(points) * element) {
      char reason[512];
      std::snprintf(reason, sizeof(reason),
                    "dataset '%s' is stored compactly in %llu bytes, but its %lld elements of %zu bytes need "
                    "%llu",
                    name.c_str(), (unsigned long long)stored, (long long)points, element,
                    (unsigned long long)(hsize_t(points) * element));
      unsafe(reason);
    }
  } else if (layout < 0) {
    return failed(w);
  }
  if (points == 0) return;
  if (touched > w.sample_budget - std::min(w.sampled, w.sample_budget)) {
    ++w.unsampled;
    return;
  }
  w.sampled += touched;
  at(w, "reading a sample of dataset '" + name + "'");
  if (rank == 0) return read_values(w, type.get(), 1, /*attribute=*/false, ds, H5S_ALL);
  // The first and the last element: the first and last chunk of a chunked dataset, through its filters.
  std::vector<hsize_t> coords(dims.size() * 2);
  for (size_t d = 0; d < dims.size(); ++d) coords[dims.size() + d] = dims[d] - 1;
  const hsize_t count = points > 1 ? 2 : 1;
  if (H5Sselect_elements(space.get(), H5S_SELECT_SET, count, coords.data()) < 0) return failed(w);
  read_values(w, type.get(), count, /*attribute=*/false, ds, space.get());
}

void visit_object(Walk& w, hid_t location, const char* name) {
  ++w.objects;
  const std::string shown = printable(name);
  at(w, "reading the metadata of '" + shown + "'");
  const Id object(H5Oopen(location, name, H5P_DEFAULT));
  if (!object.ok()) return failed(w);
  hsize_t index = 0;
  if (H5Aiterate2(object.get(), H5_INDEX_NAME, H5_ITER_NATIVE, &index, visit_attribute, &w) < 0) failed(w);
  if (H5Iget_type(object.get()) == H5I_DATASET) visit_dataset(w, object.get(), shown);
}

// An external link's file is named to the caller, which probes it too: opening a dataset by name follows
// the link into that file. Soft links lead to objects the hard links reach anyway.
void note_external_link(Walk& w, hid_t group, const char* name, size_t size) {
  if (size == 0 || size > 65536) return;
  std::vector<char> value(size);
  unsigned flags = 0;
  const char* file = nullptr;
  const char* object = nullptr;
  if (H5Lget_val(group, name, value.data(), size, H5P_DEFAULT) < 0 ||
      H5Lunpack_elink_val(value.data(), size, &flags, &file, &object) < 0 || file == nullptr)
    return failed(w);
  const std::string f = file;
  if (f.find('\n') == std::string::npos && w.externals.insert(f).second)
    say("%s%s", protocol::kExternal, f.c_str());
}

herr_t visit_link(hid_t group, const char* name, const H5L_info_t* info, void* data) {
  Walk& w = *static_cast<Walk*>(data);
  if (info->type == H5L_TYPE_EXTERNAL) note_external_link(w, group, name, info->u.val_size);
  if (info->type != H5L_TYPE_HARD) return 0;
  visit_object(w, group, name);
  at(w, "reading the links after '" + printable(name) + "'");
  return 0;
}

int probe(const char* path, size_t sample_budget) {
  Walk w;
  w.sample_budget = sample_budget;
  at(w, "opening the file");
  const hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) {
    failed(w);
  } else {
    visit_object(w, file, "/");
    at(w, "reading the file's links");
    if (H5Lvisit(file, H5_INDEX_NAME, H5_ITER_NATIVE, visit_link, &w) < 0) failed(w);
    at(w, "closing the file");
    if (H5Fclose(file) < 0) failed(w);
  }
  at(w, "shutting down libhdf5");
  H5close();
  say("%s%lld %lld %zu %lld", protocol::kDone, (long long)w.objects, (long long)w.datasets, w.sampled,
      (long long)w.unsampled);
  return protocol::kExitWalked;
}

bool parse(const char* text, unsigned long long& out) {
  char* end = nullptr;
  out = std::strtoull(text, &end, 10);
  return end != text && *end == '\0';
}

}  // namespace

int main(int argc, char** argv) {
  unsigned long long memory = 0, sample = 0, seconds = 0;
  if (argc != 5 || !parse(argv[2], memory) || !parse(argv[3], sample) || !parse(argv[4], seconds)) {
    std::fprintf(stderr, "usage: cz_h5_probe FILE MEMORY_BYTES SAMPLE_BYTES SECONDS\n");
    return protocol::kExitUsage;
  }
  // Note [Stop signals and the probe]: a stop request (SIGINT, SIGTERM, SIGUSR1: Note [Stopping on request])
  // often goes to every process of a rank's tree, not to the rank alone: slurmstepd signals all of a task's
  // processes, a terminal and Open MPI's daemon its process group. Taken by this helper at its default
  // action, it ended the probe and failed the resume of a requeued Slurm job with "the process reading it
  // with libhdf5 was killed (SIGUSR1) ...: the file is corrupt". The caller handles the stop after the probe,
  // and bounds the probe by its clock, so the helper ignores them; they come blocked from the caller
  // (spawn() in h5_probe.cpp), so that none lands before this line.
  for (int sig : {SIGINT, SIGTERM, SIGUSR1}) std::signal(sig, SIG_IGN);
  sigset_t stops;
  sigemptyset(&stops);
  for (int sig : {SIGINT, SIGTERM, SIGUSR1}) sigaddset(&stops, sig);
  ::sigprocmask(SIG_UNBLOCK, &stops, nullptr);
  // No core files from a crash we expect; the caller's clock is the real limit, this alarm only ends a
  // probe whose caller died.
  const rlimit no_core{0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
  ::alarm(unsigned(std::min<unsigned long long>(seconds + 10, 1u << 30)));
  // Never a sanitizer build (CMake turns them off for this target): their shadow memory would exceed any
  // address-space limit.
  const rlimit address_space{rlim_t(memory), rlim_t(memory)};
  ::setrlimit(RLIMIT_AS, &address_space);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  try {
    return probe(argv[1], size_t(sample));
  } catch (const std::bad_alloc&) {
    say("%sthe walk's own bookkeeping", protocol::kMemory);
    return protocol::kExitMemory;
  }
}
