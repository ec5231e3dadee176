"""kNN graph engines by regime against scikit-learn, faiss and pynndescent."""
