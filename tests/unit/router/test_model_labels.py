"""``spec.metrics.modelLabel``: a model gets series of its own only once a replica has loaded
it, and at most MAX_MODEL_LABELS do; every other id counts under ``model="other"``."""

from __future__ import annotations

from modelplex_router.metrics import MAX_MODEL_LABELS, RouterMetrics
from modelplex_router.policy import Kind


def _series(metrics: RouterMetrics) -> set[str]:
    return {line.split("{", 1)[1].split("}", 1)[0] for line in metrics.render().decode().splitlines()
            if line.startswith("modelplex_router_requests_total{")}


def test_ids_no_replica_has_loaded_share_one_other_series():
    metrics = RouterMetrics("d", model_label=True)
    loaded = {"m1"}
    metrics.label_loaded_only(lambda model: model in loaded)
    for number in range(300):
        metrics.observe(404, 0.01, f"bogus-{number}")
        metrics.routed(Kind.MISS, f"bogus-{number}")
    metrics.observe(200, 0.01, "m1")
    series = _series(metrics)
    assert series == {'code="404",deployment="d",model="other",protocol="http"',
                      'code="200",deployment="d",model="m1",protocol="http"'}
    assert "bogus" not in metrics.render().decode()


def test_the_model_label_values_are_bounded_even_for_loaded_models():
    metrics = RouterMetrics("d", model_label=True)
    for number in range(MAX_MODEL_LABELS + 50):
        metrics.observe(200, 0.01, f"m{number}")
    models = {label.split('model="')[1].split('"')[0] for label in _series(metrics)}
    assert len(models) <= MAX_MODEL_LABELS + 1 and "other" in models
