// h5::File::append: datasets that grow along their first dimension, one write per call (a training run's
// batches as they come, --dump-batches).
#include <hdf5.h>

#include <algorithm>
#include <vector>

#include "io/h5/h5_detail.h"
#include "io/h5/h5_file.h"

namespace cz::h5 {
using namespace detail;

void File::append(const std::string& key, const Tensor& rows) {
  check_writable("append");
  CZ_CHECK_IO(rows.defined() && rows.is_cpu() && rows.is_contiguous() && rows.dim() >= 1,
              "{}: rows appended to '{}' must be a contiguous CPU tensor of at least one dimension", path_,
              key);
  const FileTypes types = file_types(rows.dtype(), path_, key);
  std::vector<hsize_t> count(rows.sizes().begin(), rows.sizes().end());
  std::vector<hsize_t> start(count.size(), 0);
  Id ds;
  const htri_t exists = H5Lexists(hid_t(id_), key.c_str(), H5P_DEFAULT);
  write_ok(exists, fmt::format("looking up dataset '{}'", key));
  if (exists == 0) {
    std::vector<hsize_t> empty_dims = count, max_dims = count, chunk = count;
    empty_dims[0] = 0;
    max_dims[0] = H5S_UNLIMITED;
    chunk[0] = std::max<hsize_t>(count[0], 1);
    for (hsize_t& c : chunk) c = std::max<hsize_t>(c, 1);
    const Id space(check_id(H5Screate_simple(int(count.size()), empty_dims.data(), max_dims.data()), path_,
                            "creating a dataspace"));
    const Id lcpl(check_id(H5Pcreate(H5P_LINK_CREATE), path_, "creating a property list"));
    check_ok(H5Pset_create_intermediate_group(lcpl.get(), 1), path_, "creating a property list");
    const Id dcpl(check_id(H5Pcreate(H5P_DATASET_CREATE), path_, "creating a property list"));
    check_ok(H5Pset_chunk(dcpl.get(), int(chunk.size()), chunk.data()), path_, "setting chunks");
    ds = Id(write_id(
        H5Dcreate2(hid_t(id_), key.c_str(), types.file, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
        fmt::format("creating dataset '{}'", key)));
  } else {
    ds = Id(
        write_id(H5Dopen2(hid_t(id_), key.c_str(), H5P_DEFAULT), fmt::format("opening dataset '{}'", key)));
  }
  const Id old_space(write_id(H5Dget_space(ds.get()), fmt::format("reading the shape of '{}'", key)));
  const int rank = H5Sget_simple_extent_ndims(old_space.get());
  std::vector<hsize_t> dims(size_t(std::max(rank, 0)), 0);
  if (rank > 0) write_ok(H5Sget_simple_extent_dims(old_space.get(), dims.data(), nullptr), "reading a shape");
  const bool same_rows = rank == int(count.size()) &&
                         std::equal(dims.begin() + (rank > 0 ? 1 : 0), dims.end(), count.begin() + 1);
  CZ_CHECK_IO(same_rows, "{}: rows of shape {} cannot be appended to '{}', whose rows have {} dimensions",
              path_, shape_str(rows.sizes()), key, rank);
  if (count[0] == 0) return;
  start[0] = dims[0];
  dims[0] += count[0];
  write_ok(H5Dset_extent(ds.get(), dims.data()), fmt::format("growing dataset '{}'", key));
  const Id file_space(write_id(H5Dget_space(ds.get()), fmt::format("reading the shape of '{}'", key)));
  write_ok(
      H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
      fmt::format("selecting rows of '{}'", key));
  const Id mem_space(
      check_id(H5Screate_simple(int(count.size()), count.data(), nullptr), path_, "creating a dataspace"));
  write_ok(H5Dwrite(ds.get(), types.mem, mem_space.get(), file_space.get(), H5P_DEFAULT, rows.raw_data()),
           fmt::format("appending {} rows to '{}'", count[0], key));
}

}  // namespace cz::h5
