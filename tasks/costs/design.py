"""What the cost calibration measures (:mod:`tasks.costs.calibrate`): per cost entry (a model key, or
key/regime where ``auto`` picks a path) the model, its options, the iteration budgets (I1, I2) whose
difference gives the per-iteration cost, the sizes fitted on ((N, D, extra options)), the sizes only
validated on, and the monomials of each stage (the algorithm's complexity per fixed stage, per
iteration, per generation, and of its memory); then the later rounds, each a set of changes to
``PLAN`` chosen by ``--round`` (1, the default: ``PLAN`` itself)."""

from __future__ import annotations

#: per cost entry: the model key, options, iteration budgets (I1, I2), the sizes fitted on
#: ((N, D, extra options)), the sizes only validated on, and the monomials of each stage
#: (the algorithm's complexity per fixed stage, per iteration, per generation, and of its memory)
GP_ITER = ["1", "N*M^2*Q", "N*M*D", "M^3"]
PLAN = {
    "ppca": dict(
        key="ppca",
        iters=None,
        fit=[(20000, 3), (100000, 3), (300000, 3), (100000, 30), (100000, 50)],
        validate=[(1000000, 3)],
        fixed=["1", "N*D^2"],
        memory=["1", "N*D"],
    ),
    "lllvm/dense": dict(
        warm=False,
        key="lllvm",
        opts={"solver": "dense"},
        iters=(2, 4),
        fit=[(250, 3), (400, 3), (600, 3), (400, 30)],
        validate=[(900, 3)],
        fixed=["1", "N^2*Q^2"],
        iteration=["1", "N*k*D", "N^3*Q^3"],
        memory=["1", "N^2*Q^2"],
    ),
    "lllvm/factorised": dict(
        warm=False,
        key="lllvm",
        opts={"solver": "factorised"},
        iters=(2, 4),
        fit=[(500, 3), (1000, 3), (2000, 3), (4000, 3), (1000, 30)],
        validate=[(8000, 3)],
        fixed=["1", "N*k*Q^2"],
        iteration=["1", "N*k*Q^2", "N^1.5*Q^3", "N*k*D"],
        # the level blocks of the block-tridiagonal factor: sum_l (s_l Q)^2 with level widths
        # s_l ~ N^0.5 on a 2-D manifold (9.3 GB at 10^5, where the N-linear terms said 3.2)
        memory=["1", "N*k*Q^2", "N*k*D", "N^1.5*Q^2"],
    ),
    "glle_em": dict(
        warm=False,
        key="glle_em",
        iters=(5, 15),
        fit=[(2000, 3), (5000, 3), (10000, 3), (5000, 30), (5000, 50), (20000, 50)],
        validate=[(40000, 3), (50000, 50)],
        fixed=["1", "N*k^3", "N*k^2*D", "N^1.5"],
        iteration=["1", "N*k"],
        # the pinned LU's fill: constant per point on a 3-D roll, growing like N^0.75 per point on
        # the 50-D one above 10^5 (ROUND5): its memory, and the solves of each eigenproblem
        generation=["1", "N*k^2", "N^1.5", "N^1.75"],
        memory=["1", "N*k^2", "N^1.75"],
    ),
    # GLLE on data of high intrinsic dimension (an atlas's PCA, k = 15): the LU's fill and time
    # grow like N^1.75 and N^2.6 there (bench/README.md, "GLLE at scale"); fitted into glle_em's
    # ``upper`` terms
    "glle_em/high_dim": dict(
        warm=False,
        key="glle_em",
        upper_of="glle_em",
        iters=(3, 6),
        fit=[(s, 50, {"data": "atlas", "k": 15}) for s in (5000, 10000, 20000, 30000)],
        validate=[(50000, 50, {"data": "atlas", "k": 15})],
        fixed=["1", "N*k^2*D", "N^2.5"],
        iteration=["1", "N*k"],
        generation=["1", "N*k^2", "N^2.5"],
        memory=["1", "N^1.75"],
    ),
    "glle_direct": dict(
        warm=False,
        key="glle_direct",
        iters=(5, 15),
        fit=[(2000, 3), (5000, 3), (10000, 3)],
        validate=[(40000, 3)],
        fixed=["1", "N*k^3", "N*k^2*D", "N^1.5"],
        iteration=["1", "N*k"],
        generation=["1", "N*k^2", "N^1.5", "N^1.75"],  # as glle_em's
        memory=["1", "N*k^2", "N^1.75"],
    ),
    "bgplvm_rbf": dict(
        key="bgplvm_rbf",
        opts={"init_iters": 0},
        iters=(5, 15),
        fit=[(500, 3), (1000, 3), (2000, 3), (1000, 30), (1000, 3, {"n_inducing": 60})],
        validate=[(5000, 3)],
        fixed=["1", "N*D"],
        iteration=GP_ITER,
        memory=["1", "N*M", "N*D"],
        budget=["max_iter", "init_iters"],
    ),
    "bgplvm_linear": dict(
        key="bgplvm_linear",
        opts={"init_iters": 0},
        iters=(5, 15),
        fit=[(500, 3), (1000, 3), (2000, 3), (1000, 30)],
        validate=[(5000, 3)],
        fixed=["1", "N*D"],
        iteration=GP_ITER,
        memory=["1", "N*M", "N*D"],
        budget=["max_iter", "init_iters"],
    ),
    "bgplvm_svi": dict(
        key="bgplvm_svi",
        opts={"init_epochs": 0},
        iters=(1, 3),
        fit=[(2000, 3), (4000, 3), (8000, 3), (4000, 30), (4000, 3, {"n_inducing": 60}), (4000, 50)],
        validate=[(20000, 3)],
        fixed=["1", "N*D"],
        iteration=GP_ITER,
        memory=["1", "N*M", "N*D"],
    ),
    "mrd": dict(
        key="mrd",
        opts={"init_iters": 0},
        iters=(5, 15),
        fit=[(200, 30), (400, 30), (800, 30), (400, 30, {"n_inducing": 60})],
        validate=[(1600, 30)],
        fixed=["1", "N*D"],
        iteration=["1", "N*M^2*Q*V", "N*M*D", "M^3*V"],
        memory=["1", "N*M*V", "N*D"],
        budget=["max_iter", "init_iters"],
    ),
    "hgplvm_point": dict(
        key="hgplvm_point",
        iters=(10, 30),
        fit=[(150, 3), (300, 3), (600, 3), (300, 30)],
        validate=[(1000, 3)],
        fixed=["1", "N^2*D"],
        iteration=["1", "N^2*D", "N^3"],
        memory=["1", "N^2"],
    ),
    # the sparse hGP-LVM's full-batch fit (training="auto" takes it up to 5,000 points; the sizes
    # above force it); its rows before the minibatch fit existed are entry "hgplvm_sparse" (``was``)
    "hgplvm_sparse/full": dict(
        key="hgplvm_sparse",
        opts={"training": "full"},
        was="hgplvm_sparse",
        iters=(10, 30),
        fit=[(500, 3), (1000, 3), (2000, 3), (1000, 30), (1000, 50)],
        validate=[(4000, 3)],
        fixed=["1", "N*M*D"],
        # N M: the kernel rows and their gradient, which dominate at the sweep's M (measured at
        # fixed M = 64 and 256: time linear in N M, not N M^2)
        iteration=["1", "N*M", "N*M^2", "N*M*D", "M^3"],
        memory=["1", "N*M"],
    ),
    # its minibatch fit (point latents, lvmcore.models.hgplvm.minibatch): the fixed part holds the PCA
    # start, the per-point pass (local_iter steps over every row: N M^2, N M D) and the final pass;
    # a step is one batch. 100 steps for the per-step difference (milliseconds each)
    "hgplvm_sparse/minibatch": dict(
        key="hgplvm_sparse",
        iters=(5, 105),
        fit=[
            (2000, 3, {"training": "minibatch"}),
            (6000, 3),
            (12000, 3),
            (6000, 50),
            (20000, 50),
            (6000, 3, {"batch_size": 500}),
        ],
        validate=[(30000, 50)],
        fixed=["1", "N*M^2", "N*M*D"],
        iteration=["1", "B*M^2", "B*M*D"],
        memory=["1", "N*M", "N*D"],
    ),
    "hgplvm_bayesian/full": dict(
        key="hgplvm_bayesian",
        iters=(10, 30),
        fit=[(500, 3), (1000, 3), (2000, 3), (1000, 30), (1000, 50)],
        validate=[(4000, 3)],
        fixed=["1", "N*M*D"],
        iteration=["1", "N*M^2", "N*M*D", "M^3"],
        memory=["1", "N*M"],
    ),
    "hgplvm_bayesian/minibatch": dict(
        key="hgplvm_bayesian",
        iters=(5, 15),
        # N = 2,000 by training="minibatch" (auto takes it above 5,000): sizes the 5-minute cap allows
        fit=[(2000, 3, {"training": "minibatch"}), (6000, 3), (6000, 30), (6000, 3, {"batch_size": 500})],
        validate=[(12000, 3)],
        fixed=["1", "N*M^2", "N*M*D"],
        iteration=["1", "B*M^2", "B*M*D"],
        memory=["1", "N*M", "N*D"],
    ),
}
#: the measured grid point's latent dimensions and neighbours
Q, K = 2, 10

#: a shorter round (``--round 2``): fewer sizes and iterations, for a machine whose load leaves each
#: measurement a small share of a core (the 5-minute cap per size)
ROUND2 = {
    "glle_em": dict(iters=(3, 8), fit=[(2000, 3), (5000, 3)], validate=[(10000, 3)]),
    "hgplvm_bayesian/full": dict(iters=(3, 8), fit=[(500, 3), (1000, 3)], validate=[(2000, 3)]),
    "bgplvm_svi": dict(iters=(1, 2), fit=[(1000, 3), (2000, 3)], validate=[(4000, 3)]),
    # MRD's iterations take milliseconds: a longer difference than (3, 8) to measure them
    "mrd": dict(iters=(10, 60), fit=[(200, 30), (400, 30), (800, 30)], validate=[(1600, 30)]),
    "hgplvm_point": dict(iters=(3, 8), fit=[], validate=[(1000, 3)]),
    "lllvm/factorised": dict(iters=(1, 2), fit=[], validate=[(6000, 3)]),
    "bgplvm_rbf": dict(iters=(3, 8), fit=[], validate=[(4000, 3)]),
    "hgplvm_sparse/full": dict(iters=(3, 8), fit=[(2000, 3)], validate=[(3000, 3)]),
    "glle_direct": dict(iters=(3, 8), fit=[], validate=[(20000, 3)]),
}
#: a third round (``--round 3``): one larger size each, so the memory terms are set by more than
#: the constant (compilation, imports) that dominates the small sizes
ROUND3 = {
    "bgplvm_rbf": dict(iters=(1, 2), fit=[(100000, 3)], validate=[]),
    "glle_em": dict(iters=(3, 8), fit=[(30000, 3)], validate=[]),
}


#: a fourth round (``--round 4``): LL-LVM's factorised solver at sizes where its level blocks,
#: not the per-edge terms, set the memory; validated at 10^5
ROUND4 = {
    "lllvm/factorised": dict(iters=(1, 2), fit=[(16000, 3), (32000, 3)], validate=[(100000, 3)]),
    # 50-D sizes where the table's 10^4 x 50 points were over-predicted 8x and 3x (their D terms
    # rested on 3-D sizes and one 30-D size at N = 1,000)
    "glle_direct": dict(fit=[(5000, 50), (20000, 50)], validate=[]),
    "bgplvm_rbf": dict(fit=[(2000, 50), (4000, 50), (20000, 50), (50000, 50)], validate=[]),
    # MRD's sizes stopped at N = 800; the table's 10^4 point was over-predicted 2.7x
    "mrd": dict(iters=(10, 60), fit=[(2000, 30), (4000, 30)], validate=[]),
    # the sparse hGP-LVM's M grows with N (N / 10 in [64, 256]) at every earlier size, so N M^2 and
    # M^3 could not be told apart: the table's 10^4 x 50 point ran 3x its prediction. Sizes at a
    # fixed M separate them; validated at the table's point
    "hgplvm_sparse/full": dict(
        fit=[
            (5000, 3, {"n_inducing": 64}),
            (10000, 3, {"n_inducing": 64}),
            (5000, 50, {"n_inducing": 64}),
            (2000, 3, {"n_inducing": 256}),
        ],
        validate=[(10000, 50)],
    ),
    # the minibatch Bayesian hGP-LVM's fixed part (PCA start, the final q(u) and per-point passes
    # over all N rows) grows with N: sizes up to 12,000 fitted it as a constant, and the table's
    # 10^6 x 50 point ran 6x its prediction; 100 steps for the per-step difference (10 were noise)
    "hgplvm_bayesian/minibatch": dict(iters=(5, 105), fit=[(50000, 50), (100000, 50)], validate=[]),
}


#: a fifth round (``--round 5``): GLLE on the 50-D roll above 10^5, where the pinned LU's fill
#: per point stops being constant (96 entries per point at 10^5, 185 at 3 x 10^5, 437 at 10^6:
#: bench/README.md, "GLLE at scale") and sizes up to 5 x 10^4 predicted the 10^6 x 50 point at half
#: its time and memory (glle_direct: 0.48 and 7.5 GB against 4.6); validated at 10^6 by the table
ROUND5 = {
    "glle_em": dict(iters=(3, 8), fit=[(100000, 50), (200000, 50), (300000, 50)], validate=[]),
    "glle_direct": dict(iters=(3, 8), fit=[(100000, 50), (200000, 50), (300000, 50)], validate=[]),
}
#: the linear kernel's terms rested on 3-D sizes up to 2,000 and one 30-D size at N = 1,000: the
#: table's 10^5 and 10^6 x 50 points ran 1.9x and 2.5x their prediction (as bgplvm_rbf's in ROUND4);
#: 50 iterations apart, since an iteration costs milliseconds below 10^5
ROUND6 = {
    "bgplvm_linear": dict(
        iters=(10, 60), fit=[(4000, 50), (20000, 50), (50000, 50), (100000, 50)], validate=[]
    ),
}


#: ``--round`` -> its changes to ``PLAN``
ROUNDS = {"2": ROUND2, "3": ROUND3, "4": ROUND4, "5": ROUND5, "6": ROUND6}


def entry_plan(entry: str, round_: str = "1") -> dict:
    """The entry's plan in round ``round_`` (1, the default: ``PLAN``)."""
    return dict(PLAN[entry], **ROUNDS.get(str(round_), {}).get(entry, {}))
