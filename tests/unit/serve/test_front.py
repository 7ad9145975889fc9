"""The shared HTTP port of serve.run's applications: which application answers which path."""

from modelplex.serve.front import route


def test_the_longest_matching_route_prefix_answers():
    routes = {"/": "http://root", "/a": "http://a", "/a/b": "http://ab"}
    assert route(routes, "/a") == "http://a"
    assert route(routes, "/a/x") == "http://a"
    assert route(routes, "/a/b/c") == "http://ab"
    assert route(routes, "/ab") == "http://root"  # /a holds /a and /a/..., not /ab
    assert route(routes, "/") == "http://root"


def test_without_a_root_application_other_paths_have_no_answer():
    assert route({"/a": "http://a"}, "/b") is None
    assert route({}, "/") is None
