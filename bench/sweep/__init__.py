"""The pipeline: sweep overhead and speed-up, the sweep at scale (time and memory per
stage), the bound as a selection criterion."""
