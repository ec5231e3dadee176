/* Pair-exponential sums of the RBF psi2 statistic (see lvmcore/psi/native.py for the algebra).

   For rows n < N and the pairs p = (m, m2), m <= m2 < M, in np.triu_indices(M) order:

       x[p, n] = U[n, m] + U[n, m2] + sum_q A[n, q] Zc[p, q],      E[p, n] = exp(x[p, n])

   with U (N x M), A (N x Q) and Zc (P x Q) made from q(X) (mu, S, l2, Z; see qx_t) per tile.
   pairs_qx_fwd:  acc[p] = sum_n E[p, n].
   pairs_qx_bwd:  for a cotangent c (P,) of acc, the gradients of L = sum_p c_p acc_p with respect
               to mu, S, l2 and Z, through those with respect to U, A and Zc:
               gU[n, m] = sum over pairs p containing m of c_p E[p, n] (the pair (m, m) twice),
               gA[n, q] = sum_p c_p E[p, n] Zc[p, q],   gZc[p, q] = c_p sum_n E[p, n] A[n, q].
               The exponentials are recomputed per tile; acc != NULL also returns acc.

   Rows go in tiles of NB, transposed into a workspace so that the vector lanes run over rows; a
   tile's exponentials of one pair row (m, m..M-1) are kept in an L1-sized buffer for the three
   contractions of the backward pass. All arrays are C-contiguous float64. Portable C: GCC/Clang
   vector extensions of VW doubles (8 where the build targets AVX-512, one register; else 4: one
   AVX2 register, two NEON/SSE registers). Single-threaded and
   reentrant (the workspace is allocated per call). Returns 0, or -1 if the workspace could not
   be allocated. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __AVX512F__
#include <immintrin.h>
#define VW 8 /* doubles per vector: one AVX-512 register */
#else
#define VW 4 /* one AVX2 register, two NEON/SSE registers */
#endif
typedef double vd __attribute__((vector_size(8 * VW)));
typedef int64_t vi __attribute__((vector_size(8 * VW)));

#define NB 64          /* rows per tile */
#define NV (NB / VW)   /* vectors per tile row */
#define PAD_U -1000.0  /* U of a padding row: its exponentials are exactly 0 */

static inline vd splat(double x) { return (vd){} + x; }
static inline double hsum(vd v) {
#if VW == 8 /* the two halves first, then as the 4-wide sum */
    typedef double h4 __attribute__((vector_size(32)));
    union {
        vd v;
        h4 h[2];
    } u = {v};
    h4 h = u.h[0] + u.h[1];
    return (h[0] + h[1]) + (h[2] + h[3]);
#else
    return (v[0] + v[1]) + (v[2] + v[3]);
#endif
}
static inline vd blend(vi mask, vd yes, vd no) { return (vd)(((vi)yes & mask) | ((vi)no & ~mask)); }

/* exp(x) to about 1 ulp, in place on XB vectors at once (independent instruction chains, which
   the out-of-order core overlaps: about 15% faster than one vector at a time here). Below -708 the
   result is 0 (the true value is under 3.4e-308); NaN stays NaN. */
#define XB 8

#ifdef __AVX512F__
/* On AVX-512, fewer operations (17 per vector against 26): x = (16 k + j) ln2 / 16 + r with
   |r| <= ln2 / 32, exp(x) = 2^k 2^(j / 16) e^r: 2^(j / 16) from a 16-entry table (one two-register
   permute, indexed by the low bits of the rounded k), e^r = 1 + r s(r) with s of degree 5 (the
   Taylor polynomial of degree 6 with its last term economised by the Chebyshev polynomial T6 on
   [-ln2 / 32, ln2 / 32]: error < 1.5e-17 relative), the table entry times e^r in one FMA
   (T + T (e^r - 1): the rounding of the polynomial enters only its small part), and 2^k by
   vscalefpd, which also gives +inf on overflow. Within about 1 ulp of the true value (the tests
   hold it to numpy's exp within 5e-16 relative); below -708, 0 as the portable version (no
   subnormal results, which would slow every later product); NaN stays NaN. */
static const double EXP2_16TH[16] = {
    1.0, 1.0442737824274138, 1.0905077326652577, 1.1387886347566916, 1.189207115002721, 1.241857812073484,
    1.2968395546510096, 1.3542555469368927, 1.4142135623730951, 1.4768261459394993, 1.5422108254079407,
    1.6104903319492543, 1.681792830507429, 1.7562521603732995, 1.8340080864093424, 1.9152065613971474};
static const double EXP_S5[6] = {1.0000000000000007, 0.5, 0.1666666666420973, 0.041666666666666664,
                                 0.008333472973927501, 0.001388888888888889};
static inline __attribute__((always_inline)) void vexp_batch(vd *x) {
    const __m512d lo = _mm512_set1_pd(-708.0), hi = _mm512_set1_pd(710.0);
    const __m512d magic = _mm512_set1_pd(6755399441055744.0); /* 1.5 * 2^52: adding it rounds to an integer */
    const __m512d tlo = _mm512_loadu_pd(EXP2_16TH), thi = _mm512_loadu_pd(EXP2_16TH + 8);
    __mmask8 keep[XB];
    __m512d t[XB], kd[XB], r[XB], s[XB];
    for (int k = 0; k < XB; k++) {
        __m512d xv = (__m512d)x[k];
        keep[k] = _mm512_cmp_pd_mask(xv, lo, _CMP_NLT_UQ); /* x >= -708, or NaN */
        __m512d xk = _mm512_min_pd(hi, xv);                /* NaN: the second operand, x */
        t[k] = _mm512_fmadd_pd(xk, _mm512_set1_pd(23.083120654223414), magic); /* 16 / ln2 */
        kd[k] = _mm512_sub_pd(t[k], magic);
        r[k] = _mm512_fnmadd_pd(kd[k], _mm512_set1_pd(1.1926343307941173e-11),
                                _mm512_fnmadd_pd(kd[k], _mm512_set1_pd(0.04332169877307024), xk));
        s[k] = _mm512_set1_pd(EXP_S5[5]);
    }
    for (int i = 4; i >= 0; i--)
        for (int k = 0; k < XB; k++) s[k] = _mm512_fmadd_pd(s[k], r[k], _mm512_set1_pd(EXP_S5[i]));
    for (int k = 0; k < XB; k++) {
        /* the table's index: the low 4 bits of the integer in t's mantissa, kd mod 16 */
        __m512d T = _mm512_permutex2var_pd(tlo, _mm512_castpd_si512(t[k]), thi);
        __m512d y = _mm512_fmadd_pd(T, _mm512_mul_pd(r[k], s[k]), T);
        /* times 2^floor(kd / 16) */
        x[k] = (vd)_mm512_maskz_scalef_pd(keep[k], y, _mm512_mul_pd(kd[k], _mm512_set1_pd(0.0625)));
    }
}
#else
/* Portable: x = k ln2 + r (Cody-Waite, |r| <= ln2 / 2), the degree-12 Taylor polynomial of exp(r)
   (truncation < 2e-16 relative), times 2^k built in the exponent bits; above 709, +inf. */
static const double EXP_TAYLOR[13] = {1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,
                                      1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0,
                                      1.0 / 6.0, 0.5, 1.0, 1.0};
static inline __attribute__((always_inline)) void vexp_batch(vd *x) {
    const vd lo = splat(-708.0), hi = splat(709.0);
    const vd magic = splat(6755399441055744.0); /* 1.5 * 2^52: adding it rounds to an integer */
    vi under[XB], over[XB], ki[XB];
    vd r[XB], p[XB];
    for (int k = 0; k < XB; k++) {
        under[k] = x[k] < lo;
        over[k] = x[k] > hi;
        vd xk = blend(over[k], hi, blend(under[k], lo, x[k]));
        vd t = xk * splat(1.4426950408889634) + magic;
        vd kd = t - magic;
        ki[k] = (vi)t - (vi)magic;
        r[k] = (xk - kd * splat(6.93147180369123816490e-01)) - kd * splat(1.90821492927058770002e-10);
        p[k] = splat(EXP_TAYLOR[0]);
    }
    for (int i = 1; i < 13; i++)
        for (int k = 0; k < XB; k++) p[k] = p[k] * r[k] + splat(EXP_TAYLOR[i]);
    for (int k = 0; k < XB; k++) {
        vd y = p[k] * (vd)((ki[k] + 1023) << 52);
        y = (vd)((vi)y & ~under[k]);
        x[k] = blend(over[k], splat(__builtin_inf()), y);
    }
}
#endif

/* q(X) (pairs_qx_fwd / pairs_qx_bwd): the kernel's inputs are made per
   tile from mu, S (N x Q), l2 (Q) and Z (M x Q), and the backward pass maps its gradients back
   onto them, so that no N x M array and no XLA operation lies between q(X) and the kernel:
       a = 1 / (l2 + 2 S),  r_n = -1/2 sum_q log1p(2 S_nq / l2_q) - sum_q a_nq mu_nq^2,
       U[n, m] = sum_q a_nq (mu_nq z_mq - z_mq^2 / 4) + r_n / 2,  Zc[p, q] = -z_mq z_m'q / 2. */
typedef struct {
    const double *mu, *S, *l2, *Z;
    double *gmu, *gS, *gl2, *gZ; /* the backward pass's outputs */
} qx_t;

/* rows n0 .. n0 + nb of U and A into UT[m][row], AT[q][row] (NB rows, padded), from q(X); MT, ST:
   mu and S transposed */
static inline __attribute__((always_inline)) void load_tile_qx(int n0, int nb, int M, const int Q, const qx_t *x,
                                                               vd *UT, vd *AT, vd *MT, vd *ST) {
    double *at = (double *)AT, *mt = (double *)MT, *st = (double *)ST;
    vd half_r[NV];
    double *hr = (double *)half_r;
    for (int j = 0; j < NB; j++) {
        double r = 0.0;
        for (int q = 0; q < Q; q++) {
            double a = 0.0, mu = 0.0, s = 0.0;
            if (j < nb) {
                mu = x->mu[(size_t)(n0 + j) * Q + q];
                s = x->S[(size_t)(n0 + j) * Q + q];
                a = 1.0 / (x->l2[q] + 2.0 * s);
                r += -0.5 * log1p(2.0 * s / x->l2[q]) - a * mu * mu;
            }
            at[q * NB + j] = a;
            mt[q * NB + j] = mu;
            st[q * NB + j] = s;
        }
        hr[j] = j < nb ? 0.5 * r : PAD_U; /* a padding row: a = mu = 0, so U = PAD_U */
    }
    for (int m = 0; m < M; m++) {
        vd u[NV];
        for (int v = 0; v < NV; v++) u[v] = half_r[v];
        for (int q = 0; q < Q; q++) {
            const double z = x->Z[(size_t)m * Q + q];
            const vd zv = splat(z), z2 = splat(-0.25 * z * z);
            for (int v = 0; v < NV; v++) u[v] += AT[q * NV + v] * (MT[q * NV + v] * zv + z2);
        }
        for (int v = 0; v < NV; v++) UT[(size_t)m * NV + v] = u[v];
    }
}

/* The tile's gradients with respect to U (T, M x NV) and A (K, Q x NV) onto q(X): gmu, gS of its
   rows, and added to gl2 (Q) and gZ (M x Q) */
static inline __attribute__((always_inline)) void finish_tile_qx(int n0, int nb, int M, const int Q, const qx_t *x,
                                                                 const vd *T, const vd *K, const vd *AT,
                                                                 const vd *MT, const vd *ST) {
    vd gl2[Q], gmu[Q * NV], gS[Q * NV];
    for (int q = 0; q < Q; q++) gl2[q] = splat(0.0);
    for (int v = 0; v < NV; v++) {
        vd su = splat(0.0), hz[Q], hz2[Q];
        for (int q = 0; q < Q; q++) hz[q] = hz2[q] = splat(0.0);
        for (int m = 0; m < M; m++) {
            const vd t = T[(size_t)m * NV + v];
            su += t;
            for (int q = 0; q < Q; q++) {
                const double z = x->Z[(size_t)m * Q + q];
                hz[q] += t * z;
                hz2[q] += t * (z * z);
            }
        }
        for (int q = 0; q < Q; q++) {
            const vd a = AT[q * NV + v], mu = MT[q * NV + v], s = ST[q * NV + v];
            const vd ga = K[q * NV + v] + mu * hz[q] - 0.25 * hz2[q] - 0.5 * su * mu * mu;
            gmu[q * NV + v] = a * (hz[q] - su * mu);
            gS[q * NV + v] = -0.5 * su * a - 2.0 * a * a * ga;
            gl2[q] += (0.5 / x->l2[q]) * su * s * a - a * a * ga;
        }
    }
    const double *pm = (const double *)gmu, *ps = (const double *)gS;
    for (int j = 0; j < nb; j++)
        for (int q = 0; q < Q; q++) {
            x->gmu[(size_t)(n0 + j) * Q + q] = pm[q * NB + j];
            x->gS[(size_t)(n0 + j) * Q + q] = ps[q * NB + j];
        }
    for (int q = 0; q < Q; q++) x->gl2[q] += hsum(gl2[q]); /* padding rows: a = 0, so 0 */
    /* gZ[m, q] += sum_rows T[m] (a mu - a z_mq / 2) */
    for (int m = 0; m < M; m++) {
        const vd *t = T + (size_t)m * NV;
        for (int q = 0; q < Q; q++) {
            vd s1 = splat(0.0), s2 = splat(0.0);
            for (int v = 0; v < NV; v++) {
                const vd ta = t[v] * AT[q * NV + v];
                s1 += ta * MT[q * NV + v];
                s2 += ta;
            }
            x->gZ[(size_t)m * Q + q] += hsum(s1) - 0.5 * x->Z[(size_t)m * Q + q] * hsum(s2);
        }
    }
}

/* Zc (P x Q) from Z, in np.triu_indices order */
static void pair_factors(int M, int Q, const double *Z, double *Zc) {
    for (int m = 0, p = 0; m < M; m++)
        for (int m2 = m; m2 < M; m2++, p++)
            for (int q = 0; q < Q; q++) Zc[(size_t)p * Q + q] = -0.5 * Z[(size_t)m * Q + q] * Z[(size_t)m2 * Q + q];
}

/* The tile's exponentials of the pair with rows um, um2 of UT and cross factors zc (Q):
   e[j] = exp(um[j] + um2[j] + sum_q AT[q][j] zc[q]), j < NV; returns their sum (a vector). The
   exponent is accumulated q by q over the whole tile (NV independent chains), then exponentiated
   XB vectors at a time. */
static inline __attribute__((always_inline)) vd pair_exps(const vd *restrict um, const vd *restrict um2,
                                                          const vd *restrict AT, const double *zc, const int Q,
                                                          vd *restrict e) {
    for (int j = 0; j < NV; j++) e[j] = um[j] + um2[j];
    for (int q = 0; q < Q; q++) {
        const vd z = splat(zc[q]);
        for (int j = 0; j < NV; j++) e[j] += AT[q * NV + j] * z;
    }
    vd s = splat(0.0);
    for (int j = 0; j < NV; j += XB) {
        vexp_batch(e + j);
        for (int k = 0; k < XB; k++) s += e[j + k];
    }
    return s;
}

static inline __attribute__((always_inline)) int fwd_impl(int N, int M, const int Q, double *acc,
                                                          const qx_t *x) {
    const int P = M * (M + 1) / 2;
    /* UT: M x NV vectors; AT, MT, ST: Q x NV; Zc: P x Q doubles */
    size_t nvec = (size_t)(M + 3 * Q) * NV + ((size_t)P * Q + VW - 1) / VW;
    vd *UT = aligned_alloc(8 * VW, sizeof(vd) * nvec);
    if (!UT) return -1;
    vd *AT = UT + (size_t)M * NV, *MT = AT + (size_t)Q * NV, *ST = MT + (size_t)Q * NV;
    double *Zc = (double *)(ST + (size_t)Q * NV);
    pair_factors(M, Q, x->Z, Zc);
    memset(acc, 0, sizeof(double) * P);
    for (int n0 = 0; n0 < N; n0 += NB) {
        int nb = N - n0 < NB ? N - n0 : NB;
        load_tile_qx(n0, nb, M, Q, x, UT, AT, MT, ST);
        int p = 0;
        for (int m = 0; m < M; m++) {
            const vd *restrict um = UT + (size_t)m * NV;
            for (int m2 = m; m2 < M; m2++, p++) {
                const vd *restrict um2 = UT + (size_t)m2 * NV;
                vd e[NV];
                acc[p] += hsum(pair_exps(um, um2, AT, Zc + (size_t)p * Q, Q, e));
            }
        }
    }
    free(UT);
    return 0;
}

static inline __attribute__((always_inline)) int bwd_impl(int N, int M, const int Q, const double *c,
                                                          double *acc, const qx_t *x) {
    const int P = M * (M + 1) / 2;
    /* UT, T, E: M x NV each; AT, K, MT, ST: Q x NV; cz: M x Q doubles; Zc and gZc: P x Q doubles each */
    const size_t pq = ((size_t)P * Q + VW - 1) / VW;
    size_t nvec = (size_t)(3 * M + 4 * Q) * NV + ((size_t)M * Q + VW - 1) / VW + 2 * pq;
    vd *UT = aligned_alloc(8 * VW, sizeof(vd) * nvec);
    if (!UT) return -1;
    vd *T = UT + (size_t)M * NV, *Ebuf = T + (size_t)M * NV, *AT = Ebuf + (size_t)M * NV, *K = AT + (size_t)Q * NV;
    vd *MT = K + (size_t)Q * NV, *ST = MT + (size_t)Q * NV;
    double *cz = (double *)(ST + (size_t)Q * NV);
    double *Zc = (double *)(ST + (size_t)Q * NV + ((size_t)M * Q + VW - 1) / VW);
    pair_factors(M, Q, x->Z, Zc);
    double *gZc = Zc + pq * VW;
    memset(x->gl2, 0, sizeof(double) * Q);
    memset(x->gZ, 0, sizeof(double) * M * Q);
    memset(gZc, 0, sizeof(double) * P * Q);
    if (acc) memset(acc, 0, sizeof(double) * P);
    for (int n0 = 0; n0 < N; n0 += NB) {
        int nb = N - n0 < NB ? N - n0 : NB;
        load_tile_qx(n0, nb, M, Q, x, UT, AT, MT, ST);
        memset(T, 0, sizeof(vd) * (size_t)M * NV);
        memset(K, 0, sizeof(vd) * (size_t)Q * NV);
        int p0 = 0;
        for (int m = 0; m < M; m++) {
            const vd *restrict um = UT + (size_t)m * NV;
            const int np = M - m;
            for (int i = 0; i < np; i++)
                for (int q = 0; q < Q; q++) cz[i * Q + q] = c[p0 + i] * Zc[(size_t)(p0 + i) * Q + q];
            /* the exponentials of the pairs (m, m + i), i < np, for the tile's rows, into the buffer E */
            const vd *E = Ebuf;
            for (int i = 0; i < np; i++) {
                const int p = p0 + i;
                vd s = pair_exps(um, UT + (size_t)(m + i) * NV, AT, Zc + (size_t)p * Q, Q, Ebuf + (size_t)i * NV);
                if (acc) acc[p] += hsum(s);
            }
            /* gU (rows m and m + i) and gA: contractions over the pairs */
            for (int j = 0; j < NV; j++) {
                vd k[Q];
                for (int q = 0; q < Q; q++) k[q] = splat(0.0);
                vd tm = splat(0.0);
                for (int i = 0; i < np; i++) {
                    vd ej = E[(size_t)i * NV + j];
                    vd w = ej * c[p0 + i];
                    tm += w;
                    T[(size_t)(m + i) * NV + j] += w;
                    for (int q = 0; q < Q; q++) k[q] += ej * cz[i * Q + q];
                }
                T[(size_t)m * NV + j] += tm;
                for (int q = 0; q < Q; q++) K[q * NV + j] += k[q];
            }
            /* gZc: contractions over the tile's rows */
            for (int i = 0; i < np; i++) {
                vd r[Q];
                for (int q = 0; q < Q; q++) r[q] = splat(0.0);
                for (int j = 0; j < NV; j++) {
                    vd ej = E[(size_t)i * NV + j];
                    for (int q = 0; q < Q; q++) r[q] += ej * AT[q * NV + j];
                }
                double *gz = gZc + (size_t)(p0 + i) * Q;
                for (int q = 0; q < Q; q++) gz[q] += c[p0 + i] * hsum(r[q]);
            }
            p0 += np;
        }
        finish_tile_qx(n0, nb, M, Q, x, T, K, AT, MT, ST);
    }
    /* gZ from gZc: Zc[p, q] = -z_mq z_m'q / 2 */
    for (int m = 0, p = 0; m < M; m++)
        for (int m2 = m; m2 < M; m2++, p++)
            for (int q = 0; q < Q; q++) {
                const double g = -0.5 * gZc[(size_t)p * Q + q];
                x->gZ[(size_t)m * Q + q] += g * x->Z[(size_t)m2 * Q + q];
                x->gZ[(size_t)m2 * Q + q] += g * x->Z[(size_t)m * Q + q];
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

/* acc, and for a cotangent c of acc the gradients with respect to mu, S (N x Q), l2 (Q) and Z
   (M x Q) (and acc itself where acc != NULL) */
int pairs_qx_fwd(int N, int M, int Q, const double *mu, const double *S, const double *l2, const double *Z,
                 double *acc) {
    const qx_t x = {mu, S, l2, Z, NULL, NULL, NULL, NULL};
#define FWD(q) fwd_impl(N, M, q, acc, &x)
    DISPATCH(FWD)
#undef FWD
}

int pairs_qx_bwd(int N, int M, int Q, const double *mu, const double *S, const double *l2, const double *Z,
                 const double *c, double *gmu, double *gS, double *gl2, double *gZ, double *acc) {
    const qx_t x = {mu, S, l2, Z, gmu, gS, gl2, gZ};
#define BWD(q) bwd_impl(N, M, q, c, acc, &x)
    DISPATCH(BWD)
#undef BWD
}

/* the vectorised exp alone, for the tests: y[i] = exp(x[i]) */
void vexp_array(int n, const double *x, double *y) {
    for (int i = 0; i < n; i += VW * XB) {
        vd b[XB];
        double *d = (double *)b;
        for (int l = 0; l < VW * XB; l++) d[l] = i + l < n ? x[i + l] : 0.0;
        vexp_batch(b);
        for (int l = 0; l < VW * XB && i + l < n; l++) y[i + l] = d[l];
    }
}
