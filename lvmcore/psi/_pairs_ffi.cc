// XLA FFI handlers (jax.ffi) around the pair kernel of _pairs.c: XLA calls them on its own thread
// with its buffers, no Python and no copies. Shapes were checked by lvmcore/psi/native.py; they are
// read here from the buffers.
#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

extern "C" {
int pairs_fwd(int N, int M, int Q, const double *U, const double *A, const double *Zc, double *acc, double *Es);
int pairs_bwd(int N, int M, int Q, const double *U, const double *A, const double *Zc, const double *c,
              const double *Es, double *gU, double *gA, double *gZc, double *acc);
long long pairs_store_len(int N, int M);
int pairs_qx_fwd(int N, int M, int Q, const double *mu, const double *S, const double *l2, const double *Z,
                 double *acc);
int pairs_qx_bwd(int N, int M, int Q, const double *mu, const double *S, const double *l2, const double *Z,
                 const double *c, double *gmu, double *gS, double *gl2, double *gZ);
}

namespace {
// The forward pass's exponentials, kept here between the forward and the backward call rather than
// returned as an XLA buffer: a fresh output of that size (204 MB at N = 20,000, M = 50) is mapped
// and page-faulted at every call (about 2.4 us per 4 KiB page on the machines measured), which
// cost more than recomputing. A few slots per process (one per view of an MRD bound), reused
// across calls, grown as needed within a total cap, freed by pairs_store_release. A forward call
// takes an idle slot (see claim_for_write) and hands out a generation number; the backward call
// reads the slot still holding that generation, or recomputes if none does (overwritten by later
// calls: other chunks, vmapped calls, other threads), so an eviction costs time, never
// correctness. The mutex guards the slots' bookkeeping only, never a computation.
constexpr int kSlots = 4;
struct Slot {
  double *buf = nullptr;
  size_t cap = 0;   // doubles
  int64_t gen = 0;  // generation of the exponentials held (0: none, or being written)
  int users = 0;    // calls writing or reading it now
};
struct Store {
  std::mutex mu;
  Slot slots[kSlots];
  int64_t last = 0;  // last generation handed out
};
Store store;

size_t total_doubles() {
  size_t t = 0;
  for (const Slot &s : store.slots) t += s.cap;
  return t;
}

void free_slot(Slot &s) {
  std::free(s.buf);
  s.buf = nullptr;
  s.cap = 0;
  s.gen = 0;
}

// An idle slot of at least len doubles, marked as being written, and its generation; null if
// every slot is busy or the total would exceed max_total doubles even after freeing idle ones.
Slot *claim_for_write(size_t len, size_t max_total, int64_t *gen) {
  std::lock_guard<std::mutex> lk(store.mu);
  // among the idle slots: consumed contents before live ones, a buffer large enough before one to
  // grow, then the oldest contents (a one-view fit thus keeps reusing one slot)
  auto better = [len](const Slot &a, const Slot *b) {
    if (!b) return true;
    if ((a.gen == 0) != (b->gen == 0)) return a.gen == 0;
    if ((a.cap >= len) != (b->cap >= len)) return a.cap >= len;
    return a.gen < b->gen;
  };
  Slot *slot = nullptr;
  for (Slot &s : store.slots)
    if (s.users == 0 && better(s, slot)) slot = &s;
  if (!slot) return nullptr;
  if (slot->cap < len) {
    free_slot(*slot);
    for (;;) {  // make room: free the idle slots with the oldest contents first
      if (total_doubles() + len <= max_total) break;
      Slot *old = nullptr;
      for (Slot &s : store.slots)
        if (s.users == 0 && s.cap > 0 && (!old || s.gen < old->gen)) old = &s;
      if (!old) return nullptr;
      free_slot(*old);
    }
    slot->buf = static_cast<double *>(std::aligned_alloc(64, (len * sizeof(double) + 63) / 64 * 64));
    if (!slot->buf) return nullptr;
    slot->cap = len;
  }
  slot->gen = 0;
  slot->users = 1;
  *gen = ++store.last;
  return slot;
}

void finish_write(Slot *slot, int64_t gen) {
  std::lock_guard<std::mutex> lk(store.mu);
  slot->gen = gen;
  slot->users = 0;
}

Slot *claim_for_read(int64_t gen) {
  std::lock_guard<std::mutex> lk(store.mu);
  if (gen == 0) return nullptr;
  for (Slot &s : store.slots)
    if (s.gen == gen) {
      s.users++;
      return &s;
    }
  return nullptr;
}

// one backward pass per forward pass: once read, the contents are consumed and the slot is free
// for the next forward pass (a second read of the same generation recomputes)
void finish_read(Slot *slot) {
  std::lock_guard<std::mutex> lk(store.mu);
  if (--slot->users == 0) slot->gen = 0;
}
}  // namespace

extern "C" {
// frees the idle slots (a slot in use by a running call is left to it)
void pairs_store_release(void) {
  std::lock_guard<std::mutex> lk(store.mu);
  for (Slot &s : store.slots)
    if (s.users == 0) free_slot(s);
}

// 1 if a slot holds the exponentials of generation gen (for the tests)
int pairs_store_holds(long long gen) {
  if (gen == 0) return 0;
  std::lock_guard<std::mutex> lk(store.mu);
  for (const Slot &s : store.slots)
    if (s.gen == gen) return 1;
  return 0;
}

long long pairs_store_bytes(void) {
  std::lock_guard<std::mutex> lk(store.mu);
  return static_cast<long long>(total_doubles()) * 8;
}
}

using F64 = ffi::Buffer<ffi::F64>;
using F64Out = ffi::ResultBuffer<ffi::F64>;

static ffi::Error Fwd(F64 U, F64 A, F64 Zc, F64Out acc, double *Es) {
  auto u = U.dimensions(), a = A.dimensions();
  if (u.size() != 2 || a.size() != 2) return ffi::Error::InvalidArgument("pairs_fwd: U and A must be 2-D");
  int rc = pairs_fwd(static_cast<int>(u[0]), static_cast<int>(u[1]), static_cast<int>(a[1]), U.typed_data(),
                     A.typed_data(), Zc.typed_data(), acc->typed_data(), Es);
  if (rc) return ffi::Error(ffi::ErrorCode::kResourceExhausted, "pairs_fwd: workspace allocation failed");
  return ffi::Error::Success();
}

static ffi::Error PairsFwdImpl(F64 U, F64 A, F64 Zc, F64Out acc) { return Fwd(U, A, Zc, acc, nullptr); }

// acc, and the generation number of the stored exponentials (0: none; the backward pass recomputes)
static ffi::Error PairsFwdStoreImpl(F64 U, F64 A, F64 Zc, F64Out acc, F64Out token, int64_t max_doubles) {
  auto u = U.dimensions();
  int64_t gen = 0;
  Slot *slot = nullptr;
  if (u.size() == 2 && max_doubles > 0) {
    size_t len = static_cast<size_t>(pairs_store_len(static_cast<int>(u[0]), static_cast<int>(u[1])));
    slot = claim_for_write(len, static_cast<size_t>(max_doubles), &gen);
  }
  ffi::Error err = Fwd(U, A, Zc, acc, slot ? slot->buf : nullptr);
  if (!err.success()) gen = 0;
  if (slot) finish_write(slot, gen);
  token->typed_data()[0] = static_cast<double>(slot ? gen : 0);
  return err;
}

static ffi::Error Bwd(F64 U, F64 A, F64 Zc, F64 c, const double *Es, F64Out gU, F64Out gA, F64Out gZc,
                      double *acc) {
  auto u = U.dimensions(), a = A.dimensions();
  if (u.size() != 2 || a.size() != 2) return ffi::Error::InvalidArgument("pairs_bwd: U and A must be 2-D");
  int rc = pairs_bwd(static_cast<int>(u[0]), static_cast<int>(u[1]), static_cast<int>(a[1]), U.typed_data(),
                     A.typed_data(), Zc.typed_data(), c.typed_data(), Es, gU->typed_data(), gA->typed_data(),
                     gZc->typed_data(), acc);
  if (rc) return ffi::Error(ffi::ErrorCode::kResourceExhausted, "pairs_bwd: workspace allocation failed");
  return ffi::Error::Success();
}

static ffi::Error PairsBwdImpl(F64 U, F64 A, F64 Zc, F64 c, F64Out gU, F64Out gA, F64Out gZc, F64Out acc,
                               bool with_acc) {
  double *accp = acc->typed_data();
  if (!with_acc) {
    for (int64_t i = 0, n = acc->element_count(); i < n; i++) accp[i] = 0.0;
    accp = nullptr;
  }
  return Bwd(U, A, Zc, c, nullptr, gU, gA, gZc, accp);
}

// from the store if a slot still holds the forward call's generation (token), else recomputing
static ffi::Error PairsBwdStoredImpl(F64 U, F64 A, F64 Zc, F64 c, F64 token, F64Out gU, F64Out gA,
                                     F64Out gZc) {
  Slot *slot = claim_for_read(static_cast<int64_t>(token.typed_data()[0]));
  ffi::Error err = Bwd(U, A, Zc, c, slot ? slot->buf : nullptr, gU, gA, gZc, nullptr);
  if (slot) finish_read(slot);
  return err;
}

// from q(X): mu, S (N x Q), l2 (Q), Z (M x Q)
static ffi::Error PairsQxFwdImpl(F64 mu, F64 S, F64 l2, F64 Z, F64Out acc) {
  auto n = mu.dimensions(), z = Z.dimensions();
  if (n.size() != 2 || z.size() != 2) return ffi::Error::InvalidArgument("pairs_qx_fwd: mu and Z must be 2-D");
  int rc = pairs_qx_fwd(static_cast<int>(n[0]), static_cast<int>(z[0]), static_cast<int>(n[1]), mu.typed_data(),
                        S.typed_data(), l2.typed_data(), Z.typed_data(), acc->typed_data());
  if (rc) return ffi::Error(ffi::ErrorCode::kResourceExhausted, "pairs_qx_fwd: workspace allocation failed");
  return ffi::Error::Success();
}

static ffi::Error PairsQxBwdImpl(F64 mu, F64 S, F64 l2, F64 Z, F64 c, F64Out gmu, F64Out gS, F64Out gl2,
                                 F64Out gZ) {
  auto n = mu.dimensions(), z = Z.dimensions();
  if (n.size() != 2 || z.size() != 2) return ffi::Error::InvalidArgument("pairs_qx_bwd: mu and Z must be 2-D");
  int rc = pairs_qx_bwd(static_cast<int>(n[0]), static_cast<int>(z[0]), static_cast<int>(n[1]), mu.typed_data(),
                        S.typed_data(), l2.typed_data(), Z.typed_data(), c.typed_data(), gmu->typed_data(),
                        gS->typed_data(), gl2->typed_data(), gZ->typed_data());
  if (rc) return ffi::Error(ffi::ErrorCode::kResourceExhausted, "pairs_qx_bwd: workspace allocation failed");
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(EmbedSweepPairsQxFwd, PairsQxFwdImpl,
                              ffi::Ffi::Bind().Arg<F64>().Arg<F64>().Arg<F64>().Arg<F64>().Ret<F64>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(EmbedSweepPairsQxBwd, PairsQxBwdImpl,
                              ffi::Ffi::Bind()
                                  .Arg<F64>()
                                  .Arg<F64>()
                                  .Arg<F64>()
                                  .Arg<F64>()
                                  .Arg<F64>()
                                  .Ret<F64>()
                                  .Ret<F64>()
                                  .Ret<F64>()
                                  .Ret<F64>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(EmbedSweepPairsFwd, PairsFwdImpl,
                              ffi::Ffi::Bind().Arg<F64>().Arg<F64>().Arg<F64>().Ret<F64>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(EmbedSweepPairsBwd, PairsBwdImpl,
                              ffi::Ffi::Bind()
                                  .Arg<F64>()
                                  .Arg<F64>()
                                  .Arg<F64>()
                                  .Arg<F64>()
                                  .Ret<F64>()
                                  .Ret<F64>()
                                  .Ret<F64>()
                                  .Ret<F64>()
                                  .Attr<bool>("with_acc"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(EmbedSweepPairsFwdStore, PairsFwdStoreImpl,
                              ffi::Ffi::Bind()
                                  .Arg<F64>()
                                  .Arg<F64>()
                                  .Arg<F64>()
                                  .Ret<F64>()
                                  .Ret<F64>()
                                  .Attr<int64_t>("max_doubles"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(EmbedSweepPairsBwdStored, PairsBwdStoredImpl,
                              ffi::Ffi::Bind()
                                  .Arg<F64>()
                                  .Arg<F64>()
                                  .Arg<F64>()
                                  .Arg<F64>()
                                  .Arg<F64>()
                                  .Ret<F64>()
                                  .Ret<F64>()
                                  .Ret<F64>());
