// XLA FFI handlers (jax.ffi) around the pair kernel of _pairs.c: XLA calls them on its own thread
// with its buffers, no Python and no copies. Shapes were checked by lvmcore/psi/native.py; they are
// read here from the buffers.
#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

extern "C" {
int pairs_fwd(int N, int M, int Q, const double *U, const double *A, const double *Zc, double *acc, double *Es);
int pairs_bwd(int N, int M, int Q, const double *U, const double *A, const double *Zc, const double *c,
              const double *Es, double *gU, double *gA, double *gZc, double *acc);
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

static ffi::Error PairsFwdStoreImpl(F64 U, F64 A, F64 Zc, F64Out acc, F64Out Es) {
  return Fwd(U, A, Zc, acc, Es->typed_data());
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

static ffi::Error PairsBwdStoredImpl(F64 U, F64 A, F64 Zc, F64 c, F64 Es, F64Out gU, F64Out gA, F64Out gZc) {
  return Bwd(U, A, Zc, c, Es.typed_data(), gU, gA, gZc, nullptr);
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
