/* Pair-exponential sums of the RBF psi2 statistic (see lvmcore/psi/native.py for the algebra).

   For rows n < N and the pairs p = (m, m2), m <= m2 < M, in np.triu_indices(M) order:

       x[p, n] = U[n, m] + U[n, m2] + sum_q A[n, q] Zc[p, q],      E[p, n] = exp(x[p, n])

   pairs_fwd:  acc[p] = sum_n E[p, n]; if Es != NULL it also stores the exponentials there
               (pairs_store_len(N, M) doubles, tile-major) for the backward pass.
   pairs_bwd:  for a cotangent c (P,) of acc, the gradients of L = sum_p c_p acc_p:
               gU[n, m] = sum over pairs p containing m of c_p E[p, n] (the pair (m, m) twice),
               gA[n, q] = sum_p c_p E[p, n] Zc[p, q],   gZc[p, q] = c_p sum_n E[p, n] A[n, q].
               With Es (the forward pass's store) the exponentials are read, else recomputed per
               tile; acc != NULL (only without Es) also returns acc.

   Rows go in tiles of NB, transposed into a workspace so that the vector lanes run over rows; a
   tile's exponentials of one pair row (m, m..M-1) are kept in an L1-sized buffer for the three
   contractions of the backward pass. All arrays are C-contiguous float64. Portable C: GCC/Clang
   vector extensions (4 doubles: one AVX2 register, two NEON/SSE registers). Single-threaded and
   reentrant (the workspace is allocated per call). Returns 0, or -1 if the workspace could not
   be allocated. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef double v4d __attribute__((vector_size(32)));
typedef int64_t v4i __attribute__((vector_size(32)));
typedef double v4du __attribute__((vector_size(32), aligned(8))); /* for the caller's store: any alignment */

#define NB 64          /* rows per tile */
#define NV (NB / 4)    /* vectors per tile row */
#define PAD_U -1000.0  /* U of a padding row: its exponentials are exactly 0 */

static inline v4d splat(double x) { return (v4d){x, x, x, x}; }
static inline double hsum(v4d v) { return (v[0] + v[1]) + (v[2] + v[3]); }
static inline v4d blend(v4i mask, v4d yes, v4d no) { return (v4d)(((v4i)yes & mask) | ((v4i)no & ~mask)); }

/* exp(x) to about 1 ulp, in place on XB vectors at once (independent instruction chains, which
   the out-of-order core overlaps: about 15% faster than one vector at a time here): x = k ln2 + r
   (Cody-Waite, |r| <= ln2 / 2), the degree-12 Taylor polynomial of exp(r) (truncation < 2e-16
   relative), times 2^k built in the exponent bits. Below -708 the result is 0 (the true value is
   under 3.4e-308); above 709, +inf; NaN stays NaN. */
#define XB 8
static const double EXP_TAYLOR[13] = {1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,
                                      1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0,
                                      1.0 / 6.0, 0.5, 1.0, 1.0};

static inline __attribute__((always_inline)) void vexp_batch(v4d *x) {
    const v4d lo = splat(-708.0), hi = splat(709.0);
    const v4d magic = splat(6755399441055744.0); /* 1.5 * 2^52: adding it rounds to an integer */
    v4i under[XB], over[XB], ki[XB];
    v4d r[XB], p[XB];
    for (int k = 0; k < XB; k++) {
        under[k] = x[k] < lo;
        over[k] = x[k] > hi;
        v4d xk = blend(over[k], hi, blend(under[k], lo, x[k]));
        v4d t = xk * splat(1.4426950408889634) + magic;
        v4d kd = t - magic;
        ki[k] = (v4i)t - (v4i)magic;
        r[k] = (xk - kd * splat(6.93147180369123816490e-01)) - kd * splat(1.90821492927058770002e-10);
        p[k] = splat(EXP_TAYLOR[0]);
    }
    for (int i = 1; i < 13; i++)
        for (int k = 0; k < XB; k++) p[k] = p[k] * r[k] + splat(EXP_TAYLOR[i]);
    for (int k = 0; k < XB; k++) {
        v4d y = p[k] * (v4d)((ki[k] + 1023) << 52);
        y = (v4d)((v4i)y & ~under[k]);
        x[k] = blend(over[k], splat(__builtin_inf()), y);
    }
}

/* length of the forward pass's store of the exponentials: whole tiles of NB rows */
long long pairs_store_len(int N, int M) { return (long long)((N + NB - 1) / NB) * (M * (M + 1) / 2) * NB; }

/* rows n0 .. n0 + nb of U (N x M) and A (N x Q) into UT[m][row], AT[q][row] (NB rows, padded) */
static void load_tile(int n0, int nb, int M, int Q, const double *U, const double *A, double *ut, double *at) {
    for (int m = 0; m < M; m++)
        for (int j = 0; j < NB; j++) ut[m * NB + j] = j < nb ? U[(size_t)(n0 + j) * M + m] : PAD_U;
    for (int q = 0; q < Q; q++)
        for (int j = 0; j < NB; j++) at[q * NB + j] = j < nb ? A[(size_t)(n0 + j) * Q + q] : 0.0;
}

/* The tile's exponentials of the pair with rows um, um2 of UT and cross factors zc (Q):
   e[j] = exp(um[j] + um2[j] + sum_q AT[q][j] zc[q]), j < NV; returns their sum (a vector). The
   exponent is accumulated q by q over the whole tile (NV independent chains), then exponentiated
   XB vectors at a time. */
static inline __attribute__((always_inline)) v4d pair_exps(const v4d *restrict um, const v4d *restrict um2,
                                                          const v4d *restrict AT, const double *zc, const int Q,
                                                          v4d *restrict e) {
    for (int j = 0; j < NV; j++) e[j] = um[j] + um2[j];
    for (int q = 0; q < Q; q++) {
        const v4d z = splat(zc[q]);
        for (int j = 0; j < NV; j++) e[j] += AT[q * NV + j] * z;
    }
    v4d s = splat(0.0);
    for (int j = 0; j < NV; j += XB) {
        vexp_batch(e + j);
        for (int k = 0; k < XB; k++) s += e[j + k];
    }
    return s;
}

static inline __attribute__((always_inline)) int fwd_impl(int N, int M, const int Q, const double *U,
                                                          const double *A, const double *Zc, double *acc,
                                                          double *Es) {
    const int P = M * (M + 1) / 2;
    v4d *UT = aligned_alloc(32, sizeof(v4d) * (size_t)(M + Q) * NV);
    if (!UT) return -1;
    v4d *AT = UT + (size_t)M * NV;
    memset(acc, 0, sizeof(double) * P);
    for (int n0 = 0; n0 < N; n0 += NB) {
        int nb = N - n0 < NB ? N - n0 : NB;
        load_tile(n0, nb, M, Q, U, A, (double *)UT, (double *)AT);
        int p = 0;
        for (int m = 0; m < M; m++) {
            const v4d *restrict um = UT + (size_t)m * NV;
            for (int m2 = m; m2 < M; m2++, p++) {
                const v4d *restrict um2 = UT + (size_t)m2 * NV;
                v4d e[NV];
                acc[p] += hsum(pair_exps(um, um2, AT, Zc + (size_t)p * Q, Q, e));
                if (Es) {
                    v4du *restrict es = (v4du *)Es + ((size_t)(n0 / NB) * P + p) * NV;
                    for (int j = 0; j < NV; j++) es[j] = e[j];
                }
            }
        }
    }
    free(UT);
    return 0;
}

static inline __attribute__((always_inline)) int bwd_impl(int N, int M, const int Q, const double *U,
                                                          const double *A, const double *Zc, const double *c,
                                                          const double *Es, double *gU, double *gA, double *gZc,
                                                          double *acc) {
    const int P = M * (M + 1) / 2;
    /* UT, T, E: M x NV each; AT, K: Q x NV; cz: M x Q doubles */
    size_t nvec = (size_t)(3 * M + 2 * Q) * NV + ((size_t)M * Q + 3) / 4;
    v4d *UT = aligned_alloc(32, sizeof(v4d) * nvec);
    if (!UT) return -1;
    v4d *T = UT + (size_t)M * NV, *Ebuf = T + (size_t)M * NV, *AT = Ebuf + (size_t)M * NV, *K = AT + (size_t)Q * NV;
    double *cz = (double *)(K + (size_t)Q * NV);
    memset(gZc, 0, sizeof(double) * P * Q);
    if (acc) memset(acc, 0, sizeof(double) * P);
    if (Es) acc = NULL; /* the sums come with the store's forward pass */
    const size_t nstore = (size_t)pairs_store_len(N, M) / 4; /* vectors in the store */
    for (int n0 = 0; n0 < N; n0 += NB) {
        int nb = N - n0 < NB ? N - n0 : NB;
        load_tile(n0, nb, M, Q, U, A, (double *)UT, (double *)AT);
        memset(T, 0, sizeof(v4d) * (size_t)M * NV);
        memset(K, 0, sizeof(v4d) * (size_t)Q * NV);
        int p0 = 0;
        for (int m = 0; m < M; m++) {
            const v4d *restrict um = UT + (size_t)m * NV;
            const int np = M - m;
            for (int i = 0; i < np; i++)
                for (int q = 0; q < Q; q++) cz[i * Q + q] = c[p0 + i] * Zc[(size_t)(p0 + i) * Q + q];
            /* the exponentials of the pairs (m, m + i), i < np, for the tile's rows: from the forward
               pass's store, or computed into the buffer E */
            const v4du *E = Es ? (const v4du *)Es + ((size_t)(n0 / NB) * P + p0) * NV : (const v4du *)Ebuf;
            for (int i = 0; i < np && !Es; i++) {
                const int p = p0 + i;
                v4d s = pair_exps(um, UT + (size_t)(m + i) * NV, AT, Zc + (size_t)p * Q, Q, Ebuf + (size_t)i * NV);
                if (acc) acc[p] += hsum(s);
            }
            /* gU (rows m and m + i) and gA: contractions over the pairs */
            for (int j = 0; j < NV; j++) {
                v4d k[Q];
                for (int q = 0; q < Q; q++) k[q] = splat(0.0);
                v4d tm = splat(0.0);
                for (int i = 0; i < np; i++) {
                    v4d ej = E[(size_t)i * NV + j];
                    v4d w = ej * c[p0 + i];
                    tm += w;
                    T[(size_t)(m + i) * NV + j] += w;
                    for (int q = 0; q < Q; q++) k[q] += ej * cz[i * Q + q];
                }
                T[(size_t)m * NV + j] += tm;
                for (int q = 0; q < Q; q++) K[q * NV + j] += k[q];
            }
            /* gZc: contractions over the tile's rows */
            for (int i = 0; i < np; i++) {
                /* the store is read in order: fetch its next block (the next pairs, or the next tile)
                   while this one is used (the bwd pass from the store: 40% faster here) */
                const size_t next = ((size_t)(n0 / NB) * P + p0 + np + i) * NV;
                if (Es && next < nstore)
                    for (int l = 0; l < NV * 4; l += 8) __builtin_prefetch(Es + next * 4 + l);
                v4d r[Q];
                for (int q = 0; q < Q; q++) r[q] = splat(0.0);
                for (int j = 0; j < NV; j++) {
                    v4d ej = E[(size_t)i * NV + j];
                    for (int q = 0; q < Q; q++) r[q] += ej * AT[q * NV + j];
                }
                double *gz = gZc + (size_t)(p0 + i) * Q;
                for (int q = 0; q < Q; q++) gz[q] += c[p0 + i] * hsum(r[q]);
            }
            p0 += np;
        }
        const double *t = (const double *)T, *k = (const double *)K;
        for (int j = 0; j < nb; j++) {
            for (int m = 0; m < M; m++) gU[(size_t)(n0 + j) * M + m] = t[m * NB + j];
            for (int q = 0; q < Q; q++) gA[(size_t)(n0 + j) * Q + q] = k[q * NB + j];
        }
    }
    free(UT);
    return 0;
}

/* Q known at compile time for the common latent dimensions (unrolled, register-resident); any
   other Q takes the generic loop. */
#define DISPATCH(CALL)        \
    switch (Q) {              \
        case 1: return CALL(1);   \
        case 2: return CALL(2);   \
        case 3: return CALL(3);   \
        case 4: return CALL(4);   \
        case 5: return CALL(5);   \
        case 6: return CALL(6);   \
        case 7: return CALL(7);   \
        case 8: return CALL(8);   \
        case 10: return CALL(10); \
        default: return CALL(Q);  \
    }

int pairs_fwd(int N, int M, int Q, const double *U, const double *A, const double *Zc, double *acc, double *Es) {
#define FWD(q) fwd_impl(N, M, q, U, A, Zc, acc, Es)
    DISPATCH(FWD)
#undef FWD
}

int pairs_bwd(int N, int M, int Q, const double *U, const double *A, const double *Zc, const double *c,
              const double *Es, double *gU, double *gA, double *gZc, double *acc) {
#define BWD(q) bwd_impl(N, M, q, U, A, Zc, c, Es, gU, gA, gZc, acc)
    DISPATCH(BWD)
#undef BWD
}

/* the vectorised exp alone, for the tests: y[i] = exp(x[i]) */
void vexp_array(int n, const double *x, double *y) {
    for (int i = 0; i < n; i += 4 * XB) {
        v4d b[XB];
        double *d = (double *)b;
        for (int l = 0; l < 4 * XB; l++) d[l] = i + l < n ? x[i + l] : 0.0;
        vexp_batch(b);
        for (int l = 0; l < 4 * XB && i + l < n; l++) y[i + l] = d[l];
    }
}
