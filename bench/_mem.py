"""Peak resident memory of this process (Linux /proc), for the benchmarks that report it per stage
or per fit: :func:`reset_peak` sets the high-water mark to the current resident size, and
:func:`status_mb` reads it (``VmHWM``) or another field of /proc/self/status."""


def reset_peak() -> None:
    """VmHWM := VmRSS now (``clear_refs`` 5), so the next reading is the peak from here on."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def status_mb(field: str = "VmHWM") -> float:
    """The field of /proc/self/status in MiB (nan where it is absent)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")
