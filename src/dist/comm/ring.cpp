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

// Reduce-scatter and all-gather at ring position `pos` (Note [Ring schedule]): steps [0, rs_steps) reduce-
// scatter, the rest all-gather; each step moves every slice of one chunk to the next rank.
class RingSteps {
 public:
  RingSteps(const RingSpec& s, RingTransport& t, int pos)
      : s_(s),
        t_(t),
        n_(int(s.order.size())),
        pos_(pos),
        rs_steps_(reduces(s.kind) ? n_ - 1 : 0),
        steps_(rs_steps_ + (gathers(s.kind) ? n_ - 1 : 0)),
        L_(make_layout(s, shard_count(s.count, n_, 0), steps_)),
        next_(s.order[size_t(mod(pos + 1, n_))]),
        prev_(s.order[size_t(mod(pos - 1, n_))]),
        in_(static_cast<const char*>(s.send)),
        out_(static_cast<char*>(s.recv)),
        ticket_(size_t(steps_) * size_t(L_.nslices), -1) {
    CZ_ASSERT(reduces(s.kind) || gathers(s.kind), "run_ring: unsupported collective {}", name(s.kind));
    // Two scratch slots of one (largest) chunk each for the partial sums of reduce-scatter.
    const size_t slot_bytes = size_t(L_.len(0)) * L_.es;
    if (rs_steps_ > 1) {
      slot_[0] = static_cast<char*>(t.scratch(2 * slot_bytes));
      slot_[1] = slot_[0] + slot_bytes;
    } else if (rs_steps_ == 1) {
      slot_[0] = static_cast<char*>(t.scratch(slot_bytes));
    }
  }

  void run() {
    // Step 0 keeps a window of slices in flight, so that a slice is still in cache when it is reduced; later
    // steps are posted as their slices come in.
    const int window = std::min(L_.nslices, kRingWindow);
    for (int j = 0; j < window; ++j) post(0, j);
    // Out-of-place all-gather: our own shard goes into the output locally, while the neighbour pulls it.
    const size_t own = size_t(L_.off(s_.rank)) * L_.es;
    if (s_.kind == Collective::all_gather && in_ != out_ + own && L_.len(s_.rank))
      t_.copy(out_ + own, in_, size_t(L_.len(s_.rank)) * L_.es);
    for (int st = 0; st < steps_; ++st) {
      for (int j = 0; j < L_.nslices; ++j) {
        t_.wait_recv(ticket(st, j));
        if (st < rs_steps_) reduce(st, j);
        if (st + 1 < steps_) post(st + 1, j);
        if (st == 0 && j + window < L_.nslices) post(0, j + window);
      }
    }
    t_.finish();
  }

 private:
  static bool reduces(Collective k) { return k == Collective::all_reduce || k == Collective::reduce_scatter; }
  static bool gathers(Collective k) { return k == Collective::all_reduce || k == Collective::all_gather; }

  // The chunk step `st` sends (back = 0) or receives (back = 1).
  int chunk(int st, int back) const {
    const int behind = st < rs_steps_ ? st + 1 : st - rs_steps_;
    return s_.order[size_t(mod(pos_ - behind - back, n_))];
  }
  int& ticket(int st, int j) { return ticket_[size_t(st) * size_t(L_.nslices) + size_t(j)]; }

  void post(int st, int j) {
    const size_t es = L_.es;
    const int cs = chunk(st, 0), cr = chunk(st, 1);
    const int64_t b = L_.slice_begin(j);
    const size_t sbytes = size_t(L_.slice_len(cs, j)) * es, rbytes = size_t(L_.slice_len(cr, j)) * es;
    const char* src;
    char* dst;
    if (st < rs_steps_) {
      src = st == 0 ? in_ + size_t(L_.off(cs) + b) * es : slot_[(st - 1) % 2] + size_t(b) * es;
      // slot[st % 2] slice j was last read by step st-1's send.
      if (st >= 2) t_.wait_send(ticket(st - 1, j));
      dst = slot_[st % 2] + size_t(b) * es;
    } else {
      const int agst = st - rs_steps_;
      // All-gather's step 0 sends our own shard straight from the send buffer.
      src = agst == 0 && s_.kind == Collective::all_gather ? in_ + size_t(b) * es
                                                           : out_ + size_t(L_.off(cs) + b) * es;
      // In-place all-reduce: step 0 of reduce-scatter may still be sending this region of the input.
      if (agst == 0 && rs_steps_ > 0 && in_ == out_) t_.wait_send(ticket(0, j));
      dst = out_ + size_t(L_.off(cr) + b) * es;
    }
    ticket(st, j) = t_.exchange(next_, src, sbytes, prev_, dst, rbytes, s_.tag_base + st * L_.nslices + j);
  }

  // Adds our own values to the partial sum of slice j that step st received.
  void reduce(int st, int j) {
    const size_t es = L_.es;
    const int c = chunk(st, 1);
    const int64_t b = L_.slice_begin(j), m = L_.slice_len(c, j);
    if (m <= 0) return;
    char* part = slot_[st % 2] + size_t(b) * es;
    const char* mine = in_ + size_t(L_.off(c) + b) * es;
    if (st + 1 < rs_steps_) return t_.reduce(part, part, mine, m, s_.dtype, 1.0);
    // The last step completes our own chunk (c == our rank).
    char* res =
        s_.kind == Collective::reduce_scatter ? out_ + size_t(b) * es : out_ + size_t(L_.off(c) + b) * es;
    t_.reduce(res, part, mine, m, s_.dtype, s_.op == ReduceOp::avg ? 1.0 / n_ : 1.0);
  }

  const RingSpec& s_;
  RingTransport& t_;
  const int n_, pos_, rs_steps_, steps_;
  const Layout L_;
  const int next_, prev_;
  const char* in_;
  char* out_;  // all-gather's view of the full buffer: the all-reduce or the all-gather output
  char* slot_[2] = {nullptr, nullptr};
  std::vector<int> ticket_;
};

}  // namespace

void run_ring(const RingSpec& s, RingTransport& t) {
  const auto me = std::find(s.order.begin(), s.order.end(), s.rank);
  CZ_ASSERT(me != s.order.end(), "rank {} is not on the ring {}", s.rank, s.order);
  const int pos = int(me - s.order.begin());
  if (s.count == 0) return;
  if (s.order.size() == 1) return run_single_rank(s, t);
  if (s.kind == Collective::broadcast) return run_broadcast(s, t, pos);
  RingSteps(s, t, pos).run();
}

}  // namespace cz::dist
