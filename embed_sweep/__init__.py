"""embed-sweep's Python API: open a result store, choose each model's setting, hand the chosen
embeddings to AnnData (scanpy's format).

    >>> from embed_sweep import open_store, select, to_anndata
    >>> tree = open_store("results/scurve.zarr")    # an xarray DataTree, one group per model
    >>> best = select(tree, "glle_em")              # chosen setting, the criterion, metrics
    >>> adata = to_anndata("results/scurve.zarr")   # obsm["X_glle_em"], obsm["X_bgplvm_rbf_var"], ...
    >>> export("results/scurve.zarr", "scurve.h5ad")  # the same, written to a new file
    >>> est = load_model("results/scurve.zarr", "bgplvm_rbf")  # the chosen setting's fitted model
    >>> X_new, var = est.transform(Y_new, return_var=True)      # new points, each on its own

The command line (``embed-sweep run / show / export / report / verify / map``) runs and reads the same
stores."""

from tasks.results.export import export, to_anndata
from tasks.results.models import load_model
from tasks.results.selection import open_store, select

__all__ = ["export", "load_model", "open_store", "select", "to_anndata"]
