"""What a grid point costs, before and while it runs: :mod:`~tasks.costs.model` predicts seconds,
memory and store size from the shipped cost data (``costs.json``); :mod:`~tasks.costs.plan` holds
a sweep's plan to the cluster's limits (the cost table, the refusals); :mod:`~tasks.costs.guard`
stops a fit that runs far past its prediction; :mod:`~tasks.costs.calibrate` is the tool that
measures the models and writes ``costs.json`` (and scales the predictions to this machine)."""

from tasks.costs.guard import (
    WIDTH_MARGIN,
    PointOverrun,
    overrun_guard,
    point_guard,
    point_limit,
    within_measured_width,
)
from tasks.costs.model import (
    COSTS_PATH,
    Prediction,
    calibration_path,
    costs_path,
    evaluate_terms,
    fmt_bytes,
    fmt_seconds,
    load_costs,
    point_variables,
    predict,
    regime,
    speed_factor,
)
from tasks.costs.plan import (
    DEFAULT_MAX_POINT_HOURS,
    HIGH_DIM_GROWTH,
    check_plan,
    cluster_limits,
    graph_growth,
    grid_seconds,
    plan_costs,
    plan_table,
    predicted_seconds,
    refusal,
)

__all__ = [
    "COSTS_PATH",
    "DEFAULT_MAX_POINT_HOURS",
    "HIGH_DIM_GROWTH",
    "WIDTH_MARGIN",
    "PointOverrun",
    "Prediction",
    "calibration_path",
    "check_plan",
    "cluster_limits",
    "costs_path",
    "evaluate_terms",
    "graph_growth",
    "fmt_bytes",
    "fmt_seconds",
    "grid_seconds",
    "load_costs",
    "overrun_guard",
    "plan_costs",
    "plan_table",
    "point_guard",
    "point_limit",
    "point_variables",
    "predict",
    "predicted_seconds",
    "refusal",
    "regime",
    "speed_factor",
    "within_measured_width",
]
