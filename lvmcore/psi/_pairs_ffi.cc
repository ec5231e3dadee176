// XLA FFI handlers (jax.ffi) around the pair kernel of _pairs.c: XLA calls them on its own thread
// with its buffers, no Python and no copies. Shapes were checked by lvmcore/psi/native.py; they are
// read here from the buffers.
#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

extern "C" {
int pairs_qx_fwd(int N, int M, int Q, const double *mu, const double *S, const double *l2, const double *Z,
                 double *acc);
int pairs_qx_bwd(int N, int M, int Q, const double *mu, const double *S, const double *l2, const double *Z,
                 const double *c, double *gmu, double *gS, double *gl2, double *gZ, double *acc);
}

using F64 = ffi::Buffer<ffi::F64>;
using F64Out = ffi::ResultBuffer<ffi::F64>;

// from q(X): mu, S (N x Q), l2 (Q), Z (M x Q)
static ffi::Error PairsQxFwdImpl(F64 mu, F64 S, F64 l2, F64 Z, F64Out acc) {
  auto n = mu.dimensions(), z = Z.dimensions();
  if (n.size() != 2 || z.size() != 2) return ffi::Error::InvalidArgument("pairs_qx_fwd: mu and Z must be 2-D");
  int rc = pairs_qx_fwd(static_cast<int>(n[0]), static_cast<int>(z[0]), static_cast<int>(n[1]), mu.typed_data(),
                        S.typed_data(), l2.typed_data(), Z.typed_data(), acc->typed_data());
  if (rc) return ffi::Error(ffi::ErrorCode::kResourceExhausted, "pairs_qx_fwd: workspace allocation failed");
  return ffi::Error::Success();
}

// the gradients, and acc (its sums over the rows) where with_acc, else zeros, not computed
static ffi::Error PairsQxBwdImpl(F64 mu, F64 S, F64 l2, F64 Z, F64 c, F64Out gmu, F64Out gS, F64Out gl2,
                                 F64Out gZ, F64Out acc, bool with_acc) {
  double *accp = acc->typed_data();
  if (!with_acc) {
    for (int64_t i = 0, n = acc->element_count(); i < n; i++) accp[i] = 0.0;
    accp = nullptr;
  }
  auto n = mu.dimensions(), z = Z.dimensions();
  if (n.size() != 2 || z.size() != 2) return ffi::Error::InvalidArgument("pairs_qx_bwd: mu and Z must be 2-D");
  int rc = pairs_qx_bwd(static_cast<int>(n[0]), static_cast<int>(z[0]), static_cast<int>(n[1]), mu.typed_data(),
                        S.typed_data(), l2.typed_data(), Z.typed_data(), c.typed_data(), gmu->typed_data(),
                        gS->typed_data(), gl2->typed_data(), gZ->typed_data(), accp);
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
                                  .Ret<F64>()
                                  .Ret<F64>()
                                  .Attr<bool>("with_acc"));
