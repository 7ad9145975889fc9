"""Model ids: any printable string names a model; a source sees it escaped, never able to escape."""

import posixpath
from urllib.parse import unquote, urlsplit

import pytest

from modelplex.wire.errors import BadRequest
from modelplex.wire.ids import (MAX_MODEL_ID_LENGTH, InvalidModelId, has_dot_segment, safe_join, source_key,
                                validate_model_id)

TRICKY = [
    "/etc/passwd", "a//b", "a/", "C:\\x", "%2F", "a?b=c", "a#frag", "http://evil.example/x", "a b", "é/ü", "~root",
    "...", "a/.../b", "%2e%2e%2e", "%2F%2Fevil.example",
]
#: Ids with a "." or ".." segment, as they stand or once a store or client percent-decodes them.
DOT_SEGMENTS = [
    "..", ".", "../etc/passwd", "a/../b", "org/./name", "a/..", "..\\windows", "a\\..\\b", "%2e%2e", "%2E%2E/x",
    "..%2Fsecret", "%2e%2e%2fsecret", "a%2F..%2Fb", "%2e", "%252e%252e", "%25252e%25252e", ".%2e", "%2e./x",
    "..%5Cwin", "x/%2E",
]


@pytest.mark.parametrize(
    "model_id",
    ["model-01", "user_42", "llama.v2", "A", "0", "meta-llama/Llama-2-7b-hf", "model:v2", "user@tenant",
     ".hidden", "-rf", "a..b", "é", "x" * MAX_MODEL_ID_LENGTH, *TRICKY],
)
def test_printable_ids_are_accepted_as_ray_accepts_them(model_id):
    assert validate_model_id(model_id) == model_id


@pytest.mark.parametrize(
    "model_id",
    ["", "tab\there", "new\nline", "abc\n", "nul\x00", "del\x7f", "bidi\u202etxt", "zero\u200bwidth",
     "line\u2028sep", " padded", "padded ", "x" * (MAX_MODEL_ID_LENGTH + 1), b"bytes", None, 7],
)
def test_ids_no_source_can_use_are_refused(model_id):
    with pytest.raises(InvalidModelId):
        validate_model_id(model_id)


@pytest.mark.parametrize("model_id", DOT_SEGMENTS)
def test_ids_with_a_dot_segment_after_decoding_are_refused_as_400(model_id):
    assert has_dot_segment(model_id)
    with pytest.raises(InvalidModelId) as refused:
        validate_model_id(model_id)
    assert isinstance(refused.value, BadRequest) and refused.value.status == 400
    assert "'.' or '..' segment" in str(refused.value)


@pytest.mark.parametrize("model_id", ["a..b", ".hidden", "llama.v2", "...", "a/.x/b", "x%2E"])
def test_dots_inside_a_segment_are_no_dot_segment(model_id):
    assert not has_dot_segment(model_id)


def test_safe_join_keeps_folders_and_stays_under_its_root(tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    assert safe_join(root, "org/name", ".pt") == str(root / "org" / "name.pt")
    assert safe_join(root, "a b?", ".pt") == str(root / "a%20b%3F.pt")
    for model_id in ["../secret", "..", "%2e%2e/x", "a/../../x"]:
        with pytest.raises(InvalidModelId):
            safe_join(root, model_id, ".pt")
    (root / "link").symlink_to(tmp_path)  # a link inside the root that points out of it
    with pytest.raises(InvalidModelId):
        safe_join(root, "link/secret", ".pt")


@pytest.mark.parametrize(
    ("model_id", "key"),
    [
        ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-hf"),
        ("model:v2", "model:v2"),
        ("user@tenant", "user@tenant"),
        ("a b?c#d%", "a%20b%3Fc%23d%25"),
        ("/etc/passwd", "%2Fetc%2Fpasswd"),
        ("a//b", "a%2F%2Fb"),
    ],
)
def test_source_keys_keep_folders_and_escape_the_rest(model_id, key):
    assert source_key(model_id) == key


@pytest.mark.parametrize("model_id", TRICKY)
def test_no_source_key_leaves_its_folder_or_changes_the_url(model_id):
    key = source_key(model_id)
    assert not key.startswith("/")
    assert ".." not in key.split("/") and "." not in key.split("/") and "" not in key.split("/")
    joined = posixpath.normpath(posixpath.join("/models", key))
    assert joined.startswith("/models/")
    url = urlsplit(f"https://store.example/models/{key}.pt")
    assert (url.netloc, url.query, url.fragment) == ("store.example", "", "")
    assert posixpath.normpath(url.path).startswith("/models/")
    assert unquote(key) == model_id  # reversible: two ids never share a key


def test_different_ids_get_different_keys():
    keys = {source_key(model_id) for model_id in TRICKY}
    assert len(keys) == len(TRICKY)
