from modelplex.wire.hosts import base_url, dial_host, url_host


def test_an_ipv6_pod_ip_is_bracketed_in_a_url():
    assert base_url("fd00:10:244::7", 9001) == "http://[fd00:10:244::7]:9001"


def test_an_ipv4_address_and_a_dns_name_are_left_as_they_are():
    assert url_host("10.244.0.7") == "10.244.0.7"
    assert base_url("router.ns.svc", 8000) == "http://router.ns.svc:8000"


def test_an_already_bracketed_literal_is_not_bracketed_twice():
    assert url_host("[::1]") == "[::1]"


def test_a_wildcard_bind_is_dialled_on_loopback_of_its_family():
    assert dial_host("0.0.0.0") == "127.0.0.1"
    assert dial_host("") == "127.0.0.1"
    assert dial_host("::") == "[::1]"
    assert base_url("::", 8000) == "http://[::1]:8000"
