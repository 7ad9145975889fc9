"""What the router tells a replica about the request it forwards, and route prefixes (pure)."""

from __future__ import annotations

import pytest

from modelplex.wire.forwarded import (METHOD_HEADER, NO_ROUTE, PATH_HEADER, check_route_prefix, forwarded_headers,
                                      original, under_prefix)


def test_the_clients_end_to_end_headers_travel_with_the_method_and_raw_path():
    sent = [("Host", "api.example"), ("Connection", "keep-alive"), ("Content-Type", "application/json"),
            ("Cookie", "a=1"), ("cookie", "b=2"), ("X-Tag", "x"), ("x-tag", "y"), ("Content-Length", "9"),
            ("Transfer-Encoding", "chunked"), (METHOD_HEADER, "forged")]
    headers = forwarded_headers("PUT", "/items/a%2Fb?q=1", sent, skip=("content-type",))
    assert headers == {"Host": "api.example", "Cookie": "a=1; b=2", "X-Tag": "x, y",
                       METHOD_HEADER: "PUT", PATH_HEADER: "/items/a%2Fb?q=1"}
    assert original(headers) == ("PUT", "/items/a%2Fb?q=1")


def test_a_request_sent_to_the_replica_directly_is_its_own_method_on_the_root():
    assert original({}, "GET") == ("GET", "/")


@pytest.mark.parametrize("prefix", ["/", "/api", "/api/v1", "/a-b_c.d"])
def test_ray_route_prefixes_are_accepted(prefix):
    assert check_route_prefix(prefix) == prefix


def test_no_route_prefix_means_handles_only():
    assert check_route_prefix(None) == NO_ROUTE
    assert not under_prefix("/", NO_ROUTE)


@pytest.mark.parametrize(("prefix", "reason"), [
    ("api", "must start with '/'"), ("/api/", "must not end with '/'"), ("/a?b", "plain path"),
    ("/a b", "plain path"), (7, "must start with '/'"),
])
def test_a_bad_route_prefix_is_refused_with_the_reason(prefix, reason):
    with pytest.raises(ValueError, match=reason):
        check_route_prefix(prefix)


@pytest.mark.parametrize(("path", "inside"), [
    ("/api", True), ("/api/", True), ("/api/x/y", True), ("/apix", False), ("/", False), ("/other/api", False),
])
def test_a_prefix_holds_itself_and_the_paths_below_it(path, inside):
    assert under_prefix(path, "/api") is inside
    assert under_prefix(path, "/")
