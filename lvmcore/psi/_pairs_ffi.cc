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
}

namespace {
// The forward pass's exponentials, kept here between the forward and the backward call rather than
// returned as an XLA buffer: a fresh output of that size (204 MB at N = 20,000, M = 50) is mapped
// and page-faulted at every call (about 2.5 us per 4 KiB page on the machines measured), which cost
// more than recomputing. One store per process, reused across calls (grown, never shrunk, until
// pairs_store_release). The forward call hands out a generation number; the backward call reads
// the store only if it still holds that generation, and otherwise recomputes, so a store
// overwritten in between (another chunk, a vmapped call, another thread) costs time, never
// correctness. try_lock: a thread never waits on another's store; it recomputes instead.
struct Store {
  std::mutex mu;
  double *buf = nullptr;
  size_t cap = 0;    // doubles
  int64_t gen = 0;   // generation of the exponentials in buf (0: none)
  int64_t last = 0;  // last generation handed out
};
Store store;
}  // namespace

extern "C" {
void pairs_store_release(void) {
  std::lock_guard<std::mutex> lk(store.mu);
  std::free(store.buf);
  store.buf = nullptr;
  store.cap = 0;
  store.gen = 0;
}

long long pairs_store_bytes(void) {
  std::lock_guard<std::mutex> lk(store.mu);
  return static_cast<long long>(store.cap) * 8;
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

// acc, and the generation number of the store it wrote (0: none; the backward pass recomputes)
static ffi::Error PairsFwdStoreImpl(F64 U, F64 A, F64 Zc, F64Out acc, F64Out token) {
  auto u = U.dimensions();
  double *es = nullptr;
  int64_t gen = 0;
  std::unique_lock<std::mutex> lk(store.mu, std::try_to_lock);
  if (lk.owns_lock() && u.size() == 2) {
    size_t len = static_cast<size_t>(pairs_store_len(static_cast<int>(u[0]), static_cast<int>(u[1])));
    if (store.cap < len) {
      std::free(store.buf);
      store.buf = static_cast<double *>(std::aligned_alloc(64, (len * sizeof(double) + 63) / 64 * 64));
      store.cap = store.buf ? len : 0;
    }
    if (store.buf) {
      es = store.buf;
      store.gen = 0;  // being written
      gen = ++store.last;
    }
  }
  ffi::Error err = Fwd(U, A, Zc, acc, es);
  if (es && err.success()) store.gen = gen;
  token->typed_data()[0] = err.success() ? static_cast<double>(gen) : 0.0;
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

// from the store if it still holds the forward call's generation (token), else recomputing
static ffi::Error PairsBwdStoredImpl(F64 U, F64 A, F64 Zc, F64 c, F64 token, F64Out gU, F64Out gA,
                                     F64Out gZc) {
  const int64_t gen = static_cast<int64_t>(token.typed_data()[0]);
  std::unique_lock<std::mutex> lk(store.mu, std::try_to_lock);
  const double *es = lk.owns_lock() && gen != 0 && store.gen == gen ? store.buf : nullptr;
  if (!es && lk.owns_lock()) lk.unlock();
  return Bwd(U, A, Zc, c, es, gU, gA, gZc, nullptr);
}

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
                              ffi::Ffi::Bind().Arg<F64>().Arg<F64>().Arg<F64>().Ret<F64>().Ret<F64>());

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
