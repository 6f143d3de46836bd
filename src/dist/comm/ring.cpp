// The ring schedule of Note [Ring schedule], over any RingTransport.
#include "dist/comm/ring.h"

#include <algorithm>

#include "tensor/check.h"

namespace cz::dist {
namespace {

int mod(int a, int n) {
  return ((a % n) + n) % n;
}

struct Layout {
  int n = 1;
  int64_t count = 0;
  int64_t slice_elems = 1;  // every chunk's slice j covers [j * slice_elems, (j + 1) * slice_elems)
  int nslices = 1;
  size_t es = 4;

  int64_t off(int chunk) const { return shard_offset(count, n, chunk); }
  int64_t len(int chunk) const { return shard_count(count, n, chunk); }
  int64_t slice_begin(int j) const { return int64_t(j) * slice_elems; }
  int64_t slice_len(int chunk, int j) const {
    return std::clamp<int64_t>(len(chunk) - slice_begin(j), 0, slice_elems);
  }
};

Layout make_layout(const RingSpec& s, int64_t elems_to_slice, int steps) {
  Layout L;
  L.n = int(s.order.size());
  L.count = s.count;
  L.es = dtype_size(s.dtype);
  const int64_t per_slice = std::max<int64_t>(1, int64_t(s.slice_bytes / L.es));
  L.nslices = int(std::max<int64_t>(1, (elems_to_slice + per_slice - 1) / per_slice));
  // Keep every (step, slice) tag distinct within one collective.
  L.nslices = std::min(L.nslices, std::max(1, kRingMaxTags / std::max(1, steps)));
  L.slice_elems = std::max<int64_t>(1, (elems_to_slice + L.nslices - 1) / L.nslices);
  return L;
}

// One rank: every collective (an average too) is a copy, or nothing when in place.
void run_single_rank(const RingSpec& s, RingTransport& t) {
  if (s.send != s.recv) t.copy(s.recv, s.send, size_t(s.count) * dtype_size(s.dtype));
  t.finish();
}

void run_broadcast(const RingSpec& s, RingTransport& t, int pos) {
  const int n = int(s.order.size());
  const int root_pos = int(std::find(s.order.begin(), s.order.end(), s.root) - s.order.begin());
  const int dist = mod(pos - root_pos, n);
  const int next = s.order[size_t(mod(pos + 1, n))], prev = s.order[size_t(mod(pos - 1, n))];
  const Layout L = make_layout(s, s.count, 1);
  const char* src = static_cast<const char*>(dist == 0 ? s.send : s.recv);
  char* out = static_cast<char*>(s.recv);
  const bool forwards = dist < n - 1;
  auto slice_bytes = [&](int j) {
    return size_t(std::clamp<int64_t>(s.count - L.slice_begin(j), 0, L.slice_elems)) * L.es;
  };
  if (dist == 0) {
    for (int j = 0; j < L.nslices; ++j)
      t.exchange(next, src + size_t(L.slice_begin(j)) * L.es, slice_bytes(j), -1, nullptr, 0, s.tag_base + j);
    if (s.send != s.recv && s.count) t.copy(out, s.send, size_t(s.count) * L.es);
  } else {
    std::vector<int> tickets(size_t(L.nslices));
    for (int j = 0; j < L.nslices; ++j)
      tickets[size_t(j)] = t.exchange(-1, nullptr, 0, prev, out + size_t(L.slice_begin(j)) * L.es,
                                      slice_bytes(j), s.tag_base + j);
    for (int j = 0; j < L.nslices; ++j) {
      t.wait_recv(tickets[size_t(j)]);
      if (forwards)
        t.exchange(next, out + size_t(L.slice_begin(j)) * L.es, slice_bytes(j), -1, nullptr, 0,
                   s.tag_base + j);
    }
  }
  t.finish();
}

}  // namespace

void run_ring(const RingSpec& s, RingTransport& t) {
  const int n = int(s.order.size());
  const auto me = std::find(s.order.begin(), s.order.end(), s.rank);
  CZ_ASSERT(me != s.order.end(), "rank {} is not on the ring {}", s.rank, s.order);
  const int pos = int(me - s.order.begin());
  if (s.count == 0) return;
  if (n == 1) return run_single_rank(s, t);
  if (s.kind == Collective::broadcast) return run_broadcast(s, t, pos);

  const bool rs = s.kind == Collective::all_reduce || s.kind == Collective::reduce_scatter;
  const bool ag = s.kind == Collective::all_reduce || s.kind == Collective::all_gather;
  CZ_ASSERT(rs || ag, "run_ring: unsupported collective {}", name(s.kind));
  const int rs_steps = rs ? n - 1 : 0;
  const int steps = rs_steps + (ag ? n - 1 : 0);
  const Layout L = make_layout(s, shard_count(s.count, n, 0), steps);
  const int next = s.order[size_t(mod(pos + 1, n))], prev = s.order[size_t(mod(pos - 1, n))];
  const double scale = s.op == ReduceOp::avg ? 1.0 / n : 1.0;
  const size_t es = L.es;

  const char* in = static_cast<const char*>(s.send);
  char* out = static_cast<char*>(s.recv);
  // All-gather's view of the full buffer: the all-reduce output, or the all-gather output.
  char* full = out;
  const bool in_place = static_cast<const void*>(in) == static_cast<const void*>(out);
  const int me_rank = s.rank;

  // Two scratch slots of one (largest) chunk each for the partial sums of reduce-scatter.
  char* slot[2] = {nullptr, nullptr};
  if (rs && rs_steps > 1) {
    const size_t slot_bytes = size_t(L.len(0)) * es;
    char* base = static_cast<char*>(t.scratch(2 * slot_bytes));
    slot[0] = base;
    slot[1] = base + slot_bytes;
  } else if (rs) {
    slot[0] = static_cast<char*>(t.scratch(size_t(L.len(0)) * es));
  }

  auto send_chunk = [&](int st) {
    return st < rs_steps ? s.order[size_t(mod(pos - st - 1, n))]
                         : s.order[size_t(mod(pos - (st - rs_steps), n))];
  };
  auto recv_chunk = [&](int st) {
    return st < rs_steps ? s.order[size_t(mod(pos - st - 2, n))]
                         : s.order[size_t(mod(pos - (st - rs_steps) - 1, n))];
  };

  std::vector<int> ticket(size_t(steps) * size_t(L.nslices), -1);
  auto tk = [&](int st, int j) -> int& { return ticket[size_t(st) * size_t(L.nslices) + size_t(j)]; };

  auto post = [&](int st, int j) {
    const int cs = send_chunk(st), cr = recv_chunk(st);
    const int64_t b = L.slice_begin(j);
    const size_t sbytes = size_t(L.slice_len(cs, j)) * es, rbytes = size_t(L.slice_len(cr, j)) * es;
    const char* src;
    char* dst;
    if (st < rs_steps) {
      src = st == 0 ? in + size_t(L.off(cs) + b) * es : slot[(st - 1) % 2] + size_t(b) * es;
      // slot[st % 2] slice j was last read by step st-1's send.
      if (st >= 2) t.wait_send(tk(st - 1, j));
      dst = slot[st % 2] + size_t(b) * es;
    } else {
      const int agst = st - rs_steps;
      if (agst == 0 && s.kind == Collective::all_gather) {
        src = in + size_t(b) * es;  // our own shard, straight from the send buffer
      } else {
        src = full + size_t(L.off(cs) + b) * es;
      }
      // In-place all-reduce: step 0 of reduce-scatter may still be sending this region of the input.
      if (agst == 0 && rs_steps > 0 && in_place) t.wait_send(tk(0, j));
      dst = full + size_t(L.off(cr) + b) * es;
    }
    tk(st, j) = t.exchange(next, src, sbytes, prev, dst, rbytes, s.tag_base + st * L.nslices + j);
  };

  // Step 0 keeps a window of slices in flight, so that a slice is still in cache when it is reduced; later
  // steps are posted as their slices come in.
  const int window = std::min(L.nslices, kRingWindow);
  for (int j = 0; j < window; ++j) post(0, j);
  // Out-of-place all-gather: our own shard goes into the output locally, while the neighbour pulls it.
  if (s.kind == Collective::all_gather && in != full + size_t(L.off(me_rank)) * es && L.len(me_rank))
    t.copy(full + size_t(L.off(me_rank)) * es, in, size_t(L.len(me_rank)) * es);
  for (int st = 0; st < steps; ++st) {
    for (int j = 0; j < L.nslices; ++j) {
      t.wait_recv(tk(st, j));
      if (st < rs_steps) {
        const int c = recv_chunk(st);
        const int64_t b = L.slice_begin(j), m = L.slice_len(c, j);
        char* part = slot[st % 2] + size_t(b) * es;
        const char* mine = in + size_t(L.off(c) + b) * es;
        if (m > 0) {
          if (st + 1 < rs_steps) {
            t.reduce(part, part, mine, m, s.dtype, 1.0);
          } else {
            // The last step completes our own chunk (c == our rank).
            char* res = s.kind == Collective::reduce_scatter ? out + size_t(b) * es
                                                             : full + size_t(L.off(c) + b) * es;
            t.reduce(res, part, mine, m, s.dtype, scale);
          }
        }
      }
      if (st + 1 < steps) post(st + 1, j);
      if (st == 0 && j + window < L.nslices) post(0, j + window);
    }
  }
  t.finish();
}

}  // namespace cz::dist
