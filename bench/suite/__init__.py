"""The test suite's time: where its CPU goes, and the file order for the two pytest processes."""
