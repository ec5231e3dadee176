"""GLLE (paper 001): fits against scikit-learn's LLE, and GLLE at scale."""
