"""``spec.router.endpointPicker``: off by default; its port apart from the router's others, the
pods' default (9002) included."""

import pytest

from modelplex.wire.spec import DEFAULT_ENDPOINT_PICKER_PORT, SpecError, parse_spec

MINIMAL = {"image": "repo/img:1", "modelSource": {"uri": "s3://models/{model_id}/model.pt"}}


def test_the_picker_is_off_by_default_and_closes_on_failure():
    picker = parse_spec(MINIMAL).router.endpoint_picker
    assert (picker.enabled, picker.port, picker.failure_mode, picker.gateway_from, picker.envoy) == (
        False, None, "FailClose", (), False)


@pytest.mark.parametrize("router", [{"grpcPort": DEFAULT_ENDPOINT_PICKER_PORT},
                                    {"controlPort": DEFAULT_ENDPOINT_PICKER_PORT},
                                    {"port": DEFAULT_ENDPOINT_PICKER_PORT}])
def test_a_router_port_on_the_pods_default_picker_port_needs_the_picker_port_set(router):
    with pytest.raises(SpecError, match="router.endpointPicker.port: pods serve the picker on 9002 by default"):
        parse_spec({**MINIMAL, "router": {**router, "endpointPicker": {"enabled": True}}})
    # Off, or on a port of its own: fine.
    parse_spec({**MINIMAL, "router": router})
    parse_spec({**MINIMAL, "router": {**router, "endpointPicker": {"enabled": True, "port": 9102}}})


def test_a_picker_port_on_another_router_port_is_refused():
    with pytest.raises(SpecError, match="router.endpointPicker.port must differ from the router's other ports"):
        parse_spec({**MINIMAL, "router": {"grpcPort": 9100, "endpointPicker": {"enabled": True, "port": 9100}}})


def test_fallbacks_name_none_by_default_and_at_most_seven():
    assert parse_spec(MINIMAL).router.endpoint_picker.fallbacks == 0
    picker = {"enabled": True, "fallbacks": 2}
    assert parse_spec({**MINIMAL, "router": {"endpointPicker": picker}}).router.endpoint_picker.fallbacks == 2
    for wrong in (-1, 8):
        with pytest.raises(SpecError, match="fallbacks"):
            parse_spec({**MINIMAL, "router": {"endpointPicker": {"fallbacks": wrong}}})
