// The variable-size all-to-all (all_to_all_v) and the counts exchange before it
// (all_to_all_counts): argument checks, the rank's own block copied locally, every other
// exchange in flight at once (in windows, in a shifted order), and a size mismatch with a peer
// reported as an error naming it.
#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>

#include "kiln/comm/collectives.h"
#include "kiln/comm/detail.h"
#include "kiln/core/trace.h"

namespace kiln::comm {
namespace {

// One side of an all_to_all_v: the buffer and its blocks, in elements of es bytes.
struct Side {
  bool is_send;
  const std::byte* data;
  std::span<const int64_t> counts, displs;
  size_t es;
  const char* name() const { return is_send ? "send" : "recv"; }
  const char* counts_name() const { return is_send ? "send_counts" : "recv_counts"; }
  const char* displs_name() const { return is_send ? "send_displs" : "recv_displs"; }
  const std::byte* begin(int j) const { return data + displs[j] * es; }
  const std::byte* end(int j) const { return begin(j) + counts[j] * es; }
};

Status check_per_rank(const char* op, const char* name, size_t entries, int p) {
  if (entries != static_cast<size_t>(p))
    return invalid_argument("[{}] {} has {} entries, not one per rank of the communicator ({})", op,
                            name, entries, p);
  return Status::ok_status();
}

Status check_non_negative(const char* op, const char* name, std::span<const int64_t> v) {
  for (size_t j = 0; j < v.size(); ++j)
    if (v[j] < 0) return invalid_argument("[{}] {}[{}] = {} is negative", op, name, j, v[j]);
  return Status::ok_status();
}

// Each block of `s` alone: entries, signs, a message within 2 GiB, an end that a pointer can
// address, and a buffer when there is anything to move.
Status check_side(const Side& s, int p, int rank, DType dtype) {
  KILN_RETURN_IF_ERROR(check_per_rank("all_to_all_v", s.counts_name(), s.counts.size(), p));
  KILN_RETURN_IF_ERROR(check_per_rank("all_to_all_v", s.displs_name(), s.displs.size(), p));
  KILN_RETURN_IF_ERROR(check_non_negative("all_to_all_v", s.counts_name(), s.counts));
  KILN_RETURN_IF_ERROR(check_non_negative("all_to_all_v", s.displs_name(), s.displs));
  const int64_t es = static_cast<int64_t>(s.es), max_elements = PTRDIFF_MAX / es;
  bool any = false;
  for (int j = 0; j < p; ++j) {
    const int64_t c = s.counts[j], d = s.displs[j];
    any = any || c > 0;
    if (c > max_elements || d > max_elements - c)
      return out_of_range(
          "[all_to_all_v] {} block of rank {} ends at element {} + {}, past what a pointer can "
          "address",
          s.name(), j, d, c);
    if (j != rank && c > INT_MAX / es)  // the own block is copied, not sent
      return out_of_range(
          "[all_to_all_v] {} block of rank {}: {} elements of {} = {} bytes in one message "
          "(limit 2 GiB)",
          s.name(), j, c, dtype_name(dtype), c * es);
  }
  if (any && s.data == nullptr)
    return invalid_argument("[all_to_all_v] {} is null but {} are not all 0", s.name(),
                            s.counts_name());
  return Status::ok_status();
}

uintptr_t addr(const std::byte* b) {
  return reinterpret_cast<uintptr_t>(b);
}

// The ranks with a nonzero block in `s`, by address, into `order`; returns how many.
int sort_blocks(const Side& s, int p, int* order) {
  int n = 0;
  for (int j = 0; j < p; ++j)
    if (s.counts[j] > 0) order[n++] = j;
  std::sort(order, order + n, [&](int a, int b) { return s.begin(a) < s.begin(b); });
  return n;
}

// recv blocks that overlap each other (two peers writing the same memory) or a send block (a
// peer's data overwriting data still to be sent). Send blocks may overlap each other.
Status check_overlaps(Communicator& comm, const Side& send, const Side& recv) {
  const int p = comm.size();
  int* order = reinterpret_cast<int*>(comm.scratch(0, 2 * p * sizeof(int)));
  int* send_order = order + p;
  const int nr = sort_blocks(recv, p, order), ns = sort_blocks(send, p, send_order);
  for (int i = 0; i + 1 < nr; ++i)
    if (recv.begin(order[i + 1]) < recv.end(order[i]))
      return invalid_argument(
          "[all_to_all_v] recv blocks of ranks {} and {} overlap (elements [{}, {}) and [{}, {}))",
          order[i], order[i + 1], recv.displs[order[i]],
          recv.displs[order[i]] + recv.counts[order[i]], recv.displs[order[i + 1]],
          recv.displs[order[i + 1]] + recv.counts[order[i + 1]]);
  // Both lists by start: a block starting before the furthest end of the other side's blocks
  // seen so far overlaps the block that reached it (which starts no later).
  uintptr_t send_reach = 0, recv_reach = 0;
  int send_at = -1, recv_at = -1;
  for (int is = 0, ir = 0; is < ns || ir < nr;) {
    const bool take_send =
        ir == nr || (is < ns && addr(send.begin(send_order[is])) < addr(recv.begin(order[ir])));
    const int j = take_send ? send_order[is++] : order[ir++];
    const Side& s = take_send ? send : recv;
    const int other = take_send ? recv_at : send_at;
    if (addr(s.begin(j)) < (take_send ? recv_reach : send_reach))
      return invalid_argument(
          "[all_to_all_v] the recv block of rank {} overlaps the send block of rank {}: a "
          "received block would overwrite data still to be sent",
          take_send ? other : j, take_send ? j : other);
    uintptr_t& reach = take_send ? send_reach : recv_reach;
    if (addr(s.end(j)) > reach) {
      reach = addr(s.end(j));
      (take_send ? send_at : recv_at) = j;
    }
  }
  return Status::ok_status();
}

Status check_alltoallv(Communicator& comm, const Side& send, const Side& recv, DType dtype) {
  KILN_RETURN_IF_ERROR(detail::check_dtype("all_to_all_v", dtype));
  const int p = comm.size(), r = comm.rank();
  KILN_RETURN_IF_ERROR(check_side(send, p, r, dtype));
  KILN_RETURN_IF_ERROR(check_side(recv, p, r, dtype));
  if (send.data == recv.data && send.data != nullptr)
    return invalid_argument(
        "[all_to_all_v] send == recv: in place is not supported (blocks of other sizes and "
        "places would overwrite data still to be sent); pass separate buffers");
  if (send.counts[r] != recv.counts[r])
    return invalid_argument(
        "[all_to_all_v] send_counts[{}] = {} but recv_counts[{}] = {}: the block a rank sends "
        "itself must match what it receives from itself",
        r, send.counts[r], r, recv.counts[r]);
  return check_overlaps(comm, send, recv);
}

// The exchanges of one window of steps: at most kAllToAllWindow receives, then as many sends.
struct Window {
  std::array<MPI_Request, 2 * detail::kAllToAllWindow> reqs;
  std::array<MPI_Status, 2 * detail::kAllToAllWindow> statuses;
  std::array<int, 2 * detail::kAllToAllWindow> peer;
  std::array<int64_t, 2 * detail::kAllToAllWindow> count;  // elements
  int num_recvs = 0, num = 0;
};

// What a receive of `w` got against what it expected, appended to `mismatch`.
void check_receive(const Window& w, int i, bool failed, const Side& recv, std::string& mismatch) {
  const int j = w.peer[i];
  const MPI_Status& st = w.statuses[i];
  std::string what;
  if (failed && st.MPI_ERROR == MPI_ERR_TRUNCATE) {
    what =
        fmt::format("rank {} sent more than recv_counts[{}] = {} elements", j, j, recv.counts[j]);
  } else if (failed && st.MPI_ERROR != MPI_SUCCESS) {
    abort_job(fmt::format("all_to_all_v: the receive from rank {} failed (MPI error {})", j,
                          st.MPI_ERROR));
  } else {
    int nbytes = 0;
    MPI_Get_count(&st, MPI_BYTE, &nbytes);
    if (static_cast<int64_t>(nbytes) == recv.counts[j] * static_cast<int64_t>(recv.es)) return;
    what = fmt::format("rank {} sent {} bytes ({} elements), recv_counts[{}] = {} elements", j,
                       nbytes, static_cast<double>(nbytes) / recv.es, j, recv.counts[j]);
  }
  mismatch += (mismatch.empty() ? "" : "; ") + what;
}

// Every step s = 1..p-1 pairs this rank with two peers: it receives from r - s and sends to
// r + s. Each step is a permutation of the ranks (every rank is the target of exactly one
// sender), so as the ranks go through their posts in step order no rank is a hot spot, as
// rank 0 would be in a plain j = 0, 1, ... order, with every rank's first message bound for it.
// Receives are posted before the sends of their window (a message that finds its receive
// posted is copied at once instead of queued), and the own block is copied while the first
// window is in flight. Zero-count peers are skipped on each side.
Status exchange_v(Communicator& c, const Side& send, std::byte* recv_data, const Side& recv) {
  const int p = c.size(), r = c.rank();
  const size_t es = send.es;
  auto copy_own = [&] {
    if (send.counts[r] > 0)
      std::memcpy(recv_data + recv.displs[r] * es, send.begin(r), send.counts[r] * es);
  };
  if (p == 1) {
    copy_own();
    return Status::ok_status();
  }
  Window w;
  std::string mismatch;
  const std::function<std::string(int)> describe = [&w](int i) {
    return fmt::format("rank {} (all_to_all_v {} of {} elements)", w.peer[i],
                       i < w.num_recvs ? "receive" : "send", w.count[i]);
  };
  for (int first = 1; first < p; first += detail::kAllToAllWindow) {
    const int last = std::min(p, first + detail::kAllToAllWindow);
    w.num = 0;
    for (int step = first; step < last; ++step) {
      const int from = detail::mod(r - step, p);
      if (recv.counts[from] == 0) continue;
      w.peer[w.num] = from;
      w.count[w.num] = recv.counts[from];
      w.reqs[w.num++] = c.irecv(recv_data + recv.displs[from] * es, recv.counts[from] * es, from,
                                detail::kTagAllToAllV);
    }
    w.num_recvs = w.num;
    for (int step = first; step < last; ++step) {
      const int to = detail::mod(r + step, p);
      if (send.counts[to] == 0) continue;
      w.peer[w.num] = to;
      w.count[w.num] = send.counts[to];
      w.reqs[w.num++] = c.isend(send.begin(to), send.counts[to] * es, to, detail::kTagAllToAllV);
    }
    if (first == 1) copy_own();
    const int rc = wait_all_bounded(w.num, w.reqs.data(), w.statuses.data(), describe);
    const bool failed = rc == MPI_ERR_IN_STATUS;
    for (int i = 0; i < w.num_recvs; ++i) check_receive(w, i, failed, recv, mismatch);
    for (int i = w.num_recvs; failed && i < w.num; ++i)
      if (w.statuses[i].MPI_ERROR != MPI_SUCCESS)
        abort_job(fmt::format("all_to_all_v: the send to rank {} failed (MPI error {})", w.peer[i],
                              w.statuses[i].MPI_ERROR));
  }
  if (!mismatch.empty())
    return invalid_argument(
        "[all_to_all_v] count mismatch on rank {}: {} (recv_counts[j] must be rank j's "
        "send_counts[{}])",
        r, mismatch, r);
  return Status::ok_status();
}

}  // namespace

Status all_to_all_v(Communicator& comm, const void* send, std::span<const int64_t> send_counts,
                    std::span<const int64_t> send_displs, void* recv,
                    std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                    DType dtype) {
  if (Status routed; detail::run_on_comm_thread(comm, routed, [&] {
        return all_to_all_v(comm, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                            dtype);
      }))
    return routed;
  const size_t es = static_cast<size_t>(std::max(dtype_bits(dtype) / 8, 1));
  const Side s{true, static_cast<const std::byte*>(send), send_counts, send_displs, es};
  const Side r{false, static_cast<const std::byte*>(recv), recv_counts, recv_displs, es};
  KILN_RETURN_IF_ERROR(check_alltoallv(comm, s, r, dtype));
  trace::Scope ts(trace::Category::kComm, "alltoallv", [&](trace::Event& e) {
    int64_t n = 0;  // elements this rank sends and receives
    for (size_t j = 0; j < send_counts.size(); ++j) n += send_counts[j] + recv_counts[j];
    describe_comm(e, comm, "alltoallv", "scattered", static_cast<double>(n) * static_cast<double>(es));
  });
  return exchange_v(comm, s, static_cast<std::byte*>(recv), r);
}

Status all_to_all_counts(Communicator& comm, std::span<const int64_t> send_counts,
                         std::span<int64_t> recv_counts) {
  if (Status routed; detail::run_on_comm_thread(
          comm, routed, [&] { return all_to_all_counts(comm, send_counts, recv_counts); }))
    return routed;
  const int p = comm.size();
  KILN_RETURN_IF_ERROR(check_per_rank("all_to_all_counts", "send_counts", send_counts.size(), p));
  KILN_RETURN_IF_ERROR(check_per_rank("all_to_all_counts", "recv_counts", recv_counts.size(), p));
  KILN_RETURN_IF_ERROR(check_non_negative("all_to_all_counts", "send_counts", send_counts));
  const auto* in = reinterpret_cast<const std::byte*>(send_counts.data());
  auto* out = reinterpret_cast<std::byte*>(recv_counts.data());
  const uintptr_t nbytes = p * sizeof(int64_t);
  if (in != out && addr(in) < addr(out) + nbytes && addr(out) < addr(in) + nbytes)
    return invalid_argument(
        "[all_to_all_counts] send_counts and recv_counts overlap without being the same memory");
  // p int64 per rank: the fixed-size all-to-all on bytes (in place when in == out).
  detail::alltoall_scattered(comm, in, out, 1, sizeof(int64_t));
  return Status::ok_status();
}

}  // namespace kiln::comm
